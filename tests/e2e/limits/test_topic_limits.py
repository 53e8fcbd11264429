"""Topic limits: a client creating topics without end is refused (v5 0x97 quota exceeded), and counted.

Per client (`limits.max_topics_per_client`) and per broker (`storage.max_topics`). The refused publish
creates no log, so neither memory nor file descriptors grow with it; topics that already have a log
keep working for everyone.
"""

from __future__ import annotations

import time

from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import PingReq, PingResp, PubAck, Publish
from tests.e2e.broker_clients import RawClient
from tests.e2e.commitlog.e2e_helpers import offsets_client

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


def test_new_topics_pipelined_in_one_read_are_held_to_the_quota_too(brokers):
    """Publishes read together are taken before the turn's append makes their logs: each new topic counts
    from the moment its publish is taken, where a client sending six at once with a quota of one had all
    six logs made. A second publish to a topic the same read creates takes nothing more."""
    broker = brokers(limits={"max_topics_per_client": 2})
    runaway = RawClient(broker.port, 5)
    runaway.connect("runaway")
    topics = ["junk/0", "junk/0", "junk/1", "junk/2", "junk/3", "junk/1"]
    publishes = [Publish(topic, b"reading", 1, packet_id=n + 1) for n, topic in enumerate(topics)]
    runaway.send(b"".join(encode(publish, 5) for publish in publishes))
    acks = [runaway.recv() for _ in topics]  # in the order of the publishes [MQTT-4.6.0-2]

    assert [(ack.packet_id, ack.reason_code) for ack in acks] == [
        (1, 0x10),
        (2, 0x10),
        (3, 0x10),
        (4, QUOTA_EXCEEDED),
        (5, QUOTA_EXCEEDED),
        (6, 0x10),
    ]
    assert _logs(broker) == ["junk/0", "junk/1"]
    assert _publish(runaway, "junk/4", 7).reason_code == QUOTA_EXCEEDED  # counted by the store from now on


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


def test_the_broker_wide_topic_limit_answers_0x97_to_v5_and_keeps_v311_unacknowledged_and_connected(brokers):
    """A v3.1.1 publisher cannot be told why: its publish is not acknowledged, and its connection stays open,
    so it keeps the message and sends it again only when it reconnects ([MQTT-4.4.0-1]), not for ever."""
    broker = brokers(storage={"max_topics": 2}, limits={"max_topics_per_client": 0})
    v5 = RawClient(broker.port, 5)
    v5.connect("device-a")
    _publish(v5, "a/1", 1)
    _publish(v5, "a/2", 2)

    refused = _publish(v5, "a/3", 3).reason_code
    v311 = RawClient(broker.port, 4)
    v311.connect("device-b")
    v311.send_packet(Publish("b/1", b"reading", 1, packet_id=1))
    v311.send_packet(PingReq())

    assert refused == QUOTA_EXCEEDED
    assert isinstance(v311.recv(), PingResp)  # no PUBACK came before it, and the connection is open
    assert _publish(v311, "a/1", 2).reason_code == 0  # its publishes to existing topics are acknowledged
    v311.recv_none()  # nor does the refused one come later
    assert broker.drops("topic_limit") == 2
    assert broker.drops("log_failed") == 0
    assert _logs(broker) == ["a/1", "a/2"]
    assert _publish(v5, "a/1", 4).reason_code == 0x10


def test_a_v311_publisher_refused_at_the_topic_limit_sends_once_per_connection(brokers):
    broker = brokers(storage={"max_topics": 1}, limits={"max_topics_per_client": 0})
    first = RawClient(broker.port, 4)
    first.connect("fills-the-broker")
    _publish(first, "only/topic", 1)
    for attempt in range(3):  # the device reconnects (as after a network loss) and resends, once each time
        device = RawClient(broker.port, 4)
        device.connect("device-c", clean_start=False)
        device.send_packet(Publish("device-c/status", b"up", 1, packet_id=7, dup=attempt > 0))
        device.send_packet(PingReq())
        assert isinstance(device.recv(), PingResp)
        device.close()
    assert broker.drops("topic_limit") == 3
    assert _logs(broker) == ["only/topic"]


def test_refusals_at_the_topic_limit_are_logged_once_per_interval_with_their_count(brokers, caplog):
    broker = brokers(
        storage={"max_topics": 1, "refusal_log_interval_s": 3600}, limits={"max_topics_per_client": 0}
    )
    v5 = RawClient(broker.port, 5)
    v5.connect("runaway")
    _publish(v5, "first", 1)
    codes = [_publish(v5, f"junk/{n}", n + 2).reason_code for n in range(50)]

    lines = [record for record in caplog.records if "appends to new topics refused" in record.getMessage()]
    assert codes == [QUOTA_EXCEEDED] * 50
    assert broker.drops("topic_limit") == 50
    assert len(lines) == 1  # one line for the interval, not one per refusal
    assert lines[0].getMessage().startswith("1 appends to new topics refused")
    assert "storage.max_topics" in lines[0].getMessage()


def test_each_publish_refused_at_the_topic_limit_is_counted_once_in_the_logged_count(brokers, caplog):
    """The WARNING's count is the publishes refused, where a refused batch tried again one publish at a
    time counted each refusal twice (1,012 said for 506 publishes)."""
    broker = brokers(
        storage={"max_topics": 1, "refusal_log_interval_s": 1.0}, limits={"max_topics_per_client": 0}
    )  # (ten round trips well within the interval, however loaded the machine)
    v5 = RawClient(broker.port, 5)
    v5.connect("runaway")
    _publish(v5, "first", 1)
    codes = [_publish(v5, f"junk/{n}", n + 2).reason_code for n in range(10)]
    time.sleep(1.1)  # the interval is over: the next refusal logs the count since the first line
    codes.append(_publish(v5, "junk/last", 12).reason_code)

    lines = [line.getMessage() for line in caplog.records if "new topics refused" in line.getMessage()]
    assert codes == [QUOTA_EXCEEDED] * 11
    assert broker.drops("topic_limit") == 11
    assert broker.call(lambda: broker.broker.store.refusals) == 11
    assert [line.split(" appends")[0] for line in lines] == ["1", "10"]


def test_in_a_batch_only_the_publish_that_cannot_be_stored_is_refused(brokers):
    broker = brokers(storage={"max_record_bytes": 300}, limits={"receive_maximum": 4})
    v5 = RawClient(broker.port, 5)
    v5.connect("device-c")
    subscriber = RawClient(broker.port, 5)
    subscriber.connect("watcher")
    subscriber.subscribe("c/#", 1)
    payloads = [b"first", b"x" * 400, b"third", b"fourth"]  # one read: one batch for the topic

    v5.send(b"".join(encode(Publish("c/1", p, 1, packet_id=n + 1), 5) for n, p in enumerate(payloads)))
    acks = [v5.recv() for _ in payloads]
    delivered = [subscriber.recv() for _ in range(3)]

    assert [(ack.packet_id, ack.reason_code) for ack in acks] == [(1, 0), (2, 0x80), (3, 0), (4, 0)]
    assert [message.payload for message in delivered] == [b"first", b"third", b"fourth"]
    assert broker.drops("log_failed") == 1
    with offsets_client(broker) as api:
        stored = api.fetch("c/1", 0).data
    assert stored.column("payload").to_pylist() == [b"first", b"third", b"fourth"]
    assert stored.column("offset").to_pylist() == [0, 1, 2]
    again = [Publish("c/1", b"more", 1, packet_id=n) for n in range(5, 9)]  # a full receive window
    v5.send(b"".join(encode(packet, 5) for packet in again))
    assert [v5.recv().reason_code for _ in again] == [0] * 4  # the refused publish gave its slot back


def test_many_client_ids_of_one_user_share_its_topic_quota_and_leave_room_for_others(brokers, tmp_path):
    """The attack: one user with 20 client ids tries to create 100 logs. Its identity's share stops it at 12,
    so another user's first publish to a new topic is still accepted; an exempt pipeline account is not
    bound by either quota."""
    from broker_edge.security.auth import PasswordFile

    passwords = tmp_path / "passwd"
    for user in ("mallory", "alice", "pipeline"):
        PasswordFile.set_password(passwords, user, f"pw-{user}", create=True)
    broker = brokers(
        listeners=[{"name": "tcp", "host": "127.0.0.1", "port": 0, "allow_anonymous": False}],
        auth={"password_file": str(passwords)},
        storage={"max_topics": 40},
        limits={
            "max_topics_per_client": 5,
            "max_topics_per_identity": 12,
            "exempt_users": ["pipeline"],
            "messages_per_second_per_client": 0,
        },
    )
    codes = []
    for n in range(20):
        client = RawClient(broker.port, 5)
        client.connect(f"mallory-{n}", username="mallory", password=b"pw-mallory")
        codes += [_publish(client, f"junk/{n}/{k}", k + 1).reason_code for k in range(5)]
        client.close()
    assert codes.count(0x10) == 12 and codes.count(QUOTA_EXCEEDED) == 88
    alice = RawClient(broker.port, 5)
    alice.connect("alice-1", username="alice", password=b"pw-alice")
    assert _publish(alice, "plant/1/temp", 1).reason_code == 0x10
    pipeline = RawClient(broker.port, 5)
    pipeline.connect("ota-engine", username="pipeline", password=b"pw-pipeline")
    assert [_publish(pipeline, f"actions/{n}", n + 1).reason_code for n in range(20)] == [0x10] * 20
    assert len(_logs(broker)) == 12 + 1 + 20


def test_a_gateway_publishing_for_a_thousand_devices_has_every_topic_logged_by_default(brokers):
    """A gateway (a Sparkplug B edge node: DBIRTH, DDATA and DDEATH per device) creates three logs per
    device from one client id. The default per-client quota takes a gateway of a thousand devices, where
    it refused every topic past the thousandth (at QoS 0 without a word to the gateway)."""
    broker = brokers()
    gateway = RawClient(broker.port, 5)
    gateway.connect("edge-node-1")
    topics = [f"spBv1.0/plant/{kind}/edge-node-1/d{n}" for n in range(1000) for kind in ("DBIRTH", "DDATA")]
    topics += [f"spBv1.0/plant/DDEATH/edge-node-1/d{n}" for n in range(1000)]
    gateway.send(b"".join(encode(Publish(topic, b"reading", 0), 5) for topic in topics))
    gateway.send_packet(PingReq())
    assert isinstance(gateway.recv(), PingResp)  # every publish before it was taken

    assert broker.drops("topic_quota") == 0
    assert len(_logs(broker)) == 3000
