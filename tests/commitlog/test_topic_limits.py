"""Topic limits: a client creating topics without end is refused (v5 0x97 quota exceeded), and counted.

Per client (`limits.max_topics_per_client`) and per broker (`storage.max_topics`). The refused publish
creates no log, so neither memory nor file descriptors grow with it; topics that already have a log
keep working for everyone.
"""

from __future__ import annotations

from broker_edge.protocol.packets import PubAck, Publish
from tests.broker.broker_test_clients import RawClient
from tests.commitlog.e2e_helpers import offsets_client

QUOTA_EXCEEDED = 0x97


def _publish(client: RawClient, topic: str, packet_id: int) -> PubAck:
    client.send_packet(Publish(topic, b"reading", 1, packet_id=packet_id))
    ack = client.recv()
    assert isinstance(ack, PubAck) and ack.packet_id == packet_id
    return ack


def _logs(broker) -> list[str]:
    with offsets_client(broker) as api:
        return [info.topic for info in api.list_logs()]


def test_a_client_over_its_topic_quota_gets_0x97_and_creates_no_log(brokers):
    broker = brokers(limits={"max_topics_per_client": 3})
    runaway = RawClient(broker.port, 5)
    runaway.connect("runaway")

    codes = [_publish(runaway, f"junk/{n}", n + 1).reason_code for n in range(6)]
    again = _publish(runaway, "junk/0", 7).reason_code  # a topic it already has a log for

    assert codes[:3] == [0x10, 0x10, 0x10]  # accepted (logged; no subscriber yet)
    assert codes[3:] == [QUOTA_EXCEEDED] * 3
    assert again == 0x10
    assert broker.drops("topic_quota") == 3
    assert _logs(broker) == ["junk/0", "junk/1", "junk/2"]


def test_reconnecting_does_not_reset_a_clients_topic_quota(brokers):
    broker = brokers(limits={"max_topics_per_client": 2})
    for attempt in range(3):
        runaway = RawClient(broker.port, 5)
        runaway.connect("runaway", clean_start=True)
        code = _publish(runaway, f"junk/{attempt}", 1).reason_code
        runaway.close()
        assert code == (QUOTA_EXCEEDED if attempt >= 2 else 0x10), attempt

    assert _logs(broker) == ["junk/0", "junk/1"]


def test_other_clients_may_still_use_topics_that_have_a_log(brokers):
    broker = brokers(limits={"max_topics_per_client": 1})
    first = RawClient(broker.port, 5)
    first.connect("first")
    _publish(first, "shared/topic", 1)
    other = RawClient(broker.port, 5)
    other.connect("other")

    assert _publish(other, "shared/topic", 1).reason_code == 0x10
    assert _publish(other, "own/topic", 2).reason_code == 0x10
    assert _publish(other, "own/second", 3).reason_code == QUOTA_EXCEEDED


def test_the_broker_wide_topic_limit_answers_0x97_to_v5_and_closes_v311(brokers):
    broker = brokers(storage={"max_topics": 2}, limits={"max_topics_per_client": 0})
    v5 = RawClient(broker.port, 5)
    v5.connect("device-a")
    _publish(v5, "a/1", 1)
    _publish(v5, "a/2", 2)

    refused = _publish(v5, "a/3", 3).reason_code
    v311 = RawClient(broker.port, 4)
    v311.connect("device-b")
    v311.send_packet(Publish("b/1", b"reading", 1, packet_id=1))

    assert refused == QUOTA_EXCEEDED
    assert v311.closed()  # it cannot be told why: it resends after reconnecting
    assert broker.drops("log_failed") == 2
    assert _logs(broker) == ["a/1", "a/2"]
    assert _publish(v5, "a/1", 4).reason_code == 0x10
