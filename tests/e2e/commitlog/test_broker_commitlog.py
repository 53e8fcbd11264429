"""The commitlog wired into the broker: offsets on deliveries, ack after durable, replays, offline cursors."""

from __future__ import annotations

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker_edge.protocol.packets import PubAck, Publish, Subscribe, Subscription
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import PahoClient, RawClient
from tests.e2e.commitlog.e2e_helpers import OPTED_IN


def offset_of(message) -> int:
    return int(dict(message.properties.UserProperty)["offset"])


def logged_broker(start_broker, **extra):
    return start_broker(storage={"persist": [{"pattern": "#", "qos": [1, 2]}]}, **extra)


def test_qos1_publish_is_logged_and_deliveries_carry_the_offset(start_broker):
    broker = logged_broker(start_broker)
    sub = PahoClient(broker.port, "sub", connect_properties=OPTED_IN)
    sub.subscribe("t/#", 1)
    v3 = PahoClient(broker.port, "v3", version=4)
    v3.subscribe("t/#", 1)
    pub = PahoClient(broker.port, "pub")
    for i in range(3):
        pub.publish("t/a", f"m{i}", 1)
    assert [offset_of(m) for m in sub.expect(3)] == [0, 1, 2]
    assert [m.payload for m in v3.expect(3)] == [b"m0", b"m1", b"m2"]  # v3 gets no properties
    info = broker.call(lambda: broker.broker.store.log_info("t/a"))
    assert (info.start_offset, info.end_offset) == (0, 3)
    records = broker.call(lambda: broker.broker.store.read("t/a", 0, 10))
    assert [r.payload for r in records] == [b"m0", b"m1", b"m2"]
    assert records[0].client_id == "pub"
    assert broker.metric("timestone_broker_log_appends_total") == 3
    assert broker.metric("timestone_broker_log_bytes_total") == 6


def test_qos0_not_logged_by_default_rules(start_broker):
    broker = logged_broker(start_broker)
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("t", 0)
    PahoClient(broker.port, "pub").publish("t", b"q0", 0)
    [message] = sub.expect(1)
    assert not any(k == "offset" for k, _ in (getattr(message.properties, "UserProperty", None) or []))
    assert broker.call(lambda: "t" in broker.broker.store) is False


def test_puback_comes_after_the_record_is_durable(start_broker):
    broker = logged_broker(start_broker)
    raw = RawClient(broker.port, 5)
    raw.connect("pub")
    raw.send_packet(Publish("d", b"x", 1, packet_id=3))
    ack = raw.recv()
    assert isinstance(ack, PubAck) and ack.packet_id == 3
    # by the time PUBACK arrives, the record is readable (reads serve durable records only)
    assert [r.payload for r in broker.call(lambda: broker.broker.store.read("d", 0, 10))] == [b"x"]


def replay_props(start: str) -> PahoProperties:
    props = PahoProperties(PacketTypes.SUBSCRIBE)
    props.UserProperty = [("offset", start)]
    return props


def fill(broker, topic: str, count: int) -> None:
    pub = PahoClient(broker.port, f"filler-{topic}")
    for i in range(count):
        pub.publish(topic, f"{i}", 1)
    pub.disconnect()


def test_v5_replay_from_earliest_then_live_without_gap_or_duplicate(start_broker):
    broker = logged_broker(start_broker)
    fill(broker, "log/a", 5)
    sub = PahoClient(broker.port, "replayer")
    sub.subscribe("log/a", 1, properties=replay_props("earliest"))
    pub = PahoClient(broker.port, "live")
    for i in range(5, 8):
        pub.publish("log/a", f"{i}", 1)
    got = sub.expect(8)
    assert [offset_of(m) for m in got] == list(range(8))
    assert [m.payload for m in got] == [str(i).encode() for i in range(8)]
    sub.expect_none(0.2)


def test_v5_replay_from_offset_and_latest_and_time(start_broker):
    broker = logged_broker(start_broker)
    fill(broker, "log/b", 4)
    mid = PahoClient(broker.port, "mid")
    mid.subscribe("log/b", 1, properties=replay_props("2"))
    assert [offset_of(m) for m in mid.expect(2)] == [2, 3]
    latest = PahoClient(broker.port, "latest")
    latest.subscribe("log/b", 1, properties=replay_props("latest"))
    timed = PahoClient(broker.port, "timed")
    timed.subscribe("log/b", 1, properties=replay_props("time:0"))
    assert [offset_of(m) for m in timed.expect(4)] == [0, 1, 2, 3]
    PahoClient(broker.port, "p").publish("log/b", b"new", 1)
    assert [offset_of(m) for m in latest.expect(1)] == [4]


def test_v5_replay_below_log_start_starts_at_start_and_past_end_at_end(start_broker):
    broker = logged_broker(start_broker)
    fill(broker, "log/c", 2)
    far = PahoClient(broker.port, "far")
    assert far.subscribe("log/c", 1, properties=replay_props("99")) == [1]
    PahoClient(broker.port, "p").publish("log/c", b"next", 1)
    assert [offset_of(m) for m in far.expect(1)] == [2]


def test_v3_offset_filter_form(start_broker):
    broker = logged_broker(start_broker)
    fill(broker, "log/v3", 3)
    sub = PahoClient(broker.port, "v3r", version=4)
    assert sub.subscribe("$offset/1/log/+", 1) == [1]
    assert [m.payload for m in sub.expect(2)] == [b"1", b"2"]
    PahoClient(broker.port, "p").publish("log/v3", b"live", 1)
    assert [m.payload for m in sub.expect(1)] == [b"live"]
    bad = PahoClient(broker.port, "bad", version=4)
    assert bad.subscribe("$offset/nope/log/+", 1) == [0x80]


def test_replay_respects_the_client_receive_maximum(start_broker):
    broker = logged_broker(start_broker)
    fill(broker, "log/w", 6)
    raw = RawClient(broker.port, 5)
    raw.connect("narrow", properties=Properties(receive_maximum=2))
    raw.send_packet(
        Subscribe(1, [Subscription("log/w", 1)], Properties(user_properties=[("offset", "earliest")]))
    )
    raw.recv()  # SUBACK
    got = [raw.recv(), raw.recv()]
    try:
        extra = raw.recv(timeout=0.3)
    except TimeoutError:
        extra = None
    assert extra is None
    seen = [p.payload for p in got]
    while len(seen) < 6:
        raw.send_packet(PubAck(got.pop(0).packet_id))
        got.append(raw.recv())
        seen.append(got[-1].payload)
    assert seen == [str(i).encode() for i in range(6)]


def test_offline_persistent_session_reads_missed_messages_from_the_log(start_broker):
    broker = logged_broker(start_broker, limits={"max_offline_messages": 2})
    sub = PahoClient(broker.port, "offline", clean=False, session_expiry=300, connect_properties=OPTED_IN)
    sub.subscribe("fleet/#", 1)
    sub.disconnect()
    fill(broker, "fleet/x", 10)  # more than the in-memory queue bound: the log holds them, nothing dropped
    cursors = broker.call(lambda: dict(broker.broker.router.sessions["offline"].cursors or {}))
    assert cursors == {"fleet/x": 0}
    again = PahoClient(broker.port, "offline", clean=False, session_expiry=300, connect_properties=OPTED_IN)
    got = again.expect(10)
    assert [m.payload for m in got] == [str(i).encode() for i in range(10)]
    assert [offset_of(m) for m in got] == list(range(10))
    assert broker.drops("queue_full") == 0
    PahoClient(broker.port, "p").publish("fleet/x", b"live", 1)
    assert again.expect(1)[0].payload == b"live"


def test_many_subscribers_catch_up_on_one_topic(start_broker):
    broker = logged_broker(start_broker)
    fill(broker, "shared/log", 20)
    subs = [PahoClient(broker.port, f"c{i}") for i in range(5)]
    for sub in subs:
        sub.subscribe("shared/log", 1, properties=replay_props("earliest"))
    for sub in subs:
        assert [offset_of(m) for m in sub.expect(20)] == list(range(20))


def test_retained_from_logged_publish_keeps_offset(start_broker):
    broker = logged_broker(start_broker)
    PahoClient(broker.port, "p").publish("cfg/x", b"v1", 1, retain=True)
    sub = PahoClient(broker.port, "s", connect_properties=OPTED_IN)
    sub.subscribe("cfg/#", 1)
    [message] = sub.expect(1)
    assert message.retain and offset_of(message) == 0


def test_replay_without_commitlog_is_refused(broker):
    raw = RawClient(broker.port, 5)
    raw.connect("r")
    raw.send_packet(
        Subscribe(1, [Subscription("a", 1)], Properties(user_properties=[("offset", "earliest")]))
    )
    assert raw.recv().reason_codes == [0x83]


def test_store_survives_broker_restart(start_broker, tmp_path):
    first = logged_broker(start_broker)
    fill(first, "keep", 3)
    first.stop()
    second = logged_broker(start_broker)
    sub = PahoClient(second.port, "after")
    sub.subscribe("keep", 1, properties=replay_props("earliest"))
    assert [m.payload for m in sub.expect(3)] == [b"0", b"1", b"2"]
