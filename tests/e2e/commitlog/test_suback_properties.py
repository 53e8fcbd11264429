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
