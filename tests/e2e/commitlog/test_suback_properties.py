"""The SUBACK of a replay that starts elsewhere than asked tells why, within what the client accepts: nothing
when it set Request Problem Information to 0 [MQTT-3.1.2-29], and no properties that would make the SUBACK
larger than its Maximum Packet Size [MQTT-3.9.2-1, -2]."""

from __future__ import annotations

import pytest

from broker_edge.protocol.packets import SubAck
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import RawClient
from tests.e2e.commitlog.e2e_helpers import publish_numbered

PAST_THE_END = Properties(user_properties=[("offset", "99")])


def replay_suback(broker, client_id: str, connect_properties: Properties | None) -> SubAck:
    raw = RawClient(broker.port, 5)
    assert raw.connect(client_id, properties=connect_properties).reason_code == 0
    suback = raw.subscribe("log/a", 1, properties=PAST_THE_END)
    assert isinstance(suback, SubAck) and suback.reason_codes == [1]
    return suback


@pytest.mark.mqtt5("MQTT-3.1.2-29", "MQTT-3.9.2-1", "MQTT-3.9.2-2")
def test_a_replay_suback_says_why_only_to_clients_that_accept_it(brokers):
    broker = brokers()
    publish_numbered(broker, "log/a", 3)

    told = replay_suback(broker, "curious", None)
    quiet = replay_suback(broker, "quiet", Properties(request_problem_information=0))
    small = replay_suback(broker, "small", Properties(maximum_packet_size=16))

    assert told.properties.reason_string and told.properties.user_properties
    assert quiet.properties is None
    assert small.properties is None


def refused_suback(broker, topic_filter: str, offset: str, connect_properties: Properties | None = None):
    raw = RawClient(broker.port, 5)
    assert raw.connect("refused", properties=connect_properties).reason_code == 0
    return raw.subscribe(topic_filter, 1, properties=Properties(user_properties=[("offset", offset)]))


@pytest.mark.mqtt5("MQTT-3.1.2-29")
def test_a_replay_refused_says_why_in_its_suback(brokers, start_broker):
    """A device that asked for a replay the broker cannot give got a bare 0x8F or 0x83: nothing said that
    its ``offset`` was malformed, that the broker keeps no log, or that a shared subscription is not
    replayed. The SUBACK's reason string says which (to a client that accepts one [MQTT-3.1.2-29])."""
    broker = brokers()
    malformed = refused_suback(broker, "log/a", "12x")
    shared = refused_suback(broker, "$share/g/log/a", "earliest")
    quiet = refused_suback(broker, "log/a", "12x", Properties(request_problem_information=0))
    no_log = refused_suback(start_broker(), "log/a", "earliest")

    assert malformed.reason_codes == [0x8F]
    assert "invalid offset start '12x'" in malformed.properties.reason_string
    assert shared.reason_codes == [0x83]
    assert "shared subscription" in shared.properties.reason_string
    assert quiet.reason_codes == [0x8F] and quiet.properties is None
    assert no_log.reason_codes == [0x83]
    assert "commitlog" in no_log.properties.reason_string
