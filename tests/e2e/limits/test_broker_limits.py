"""Every configurable limit, enforced: connections, rates, sizes, quotas, queues, slow subscribers."""

from __future__ import annotations

import socket

import pytest

from broker_edge.protocol.codec import PacketDecoder, encode
from broker_edge.protocol.packets import (
    ConnAck,
    Connect,
    PubAck,
    Publish,
    Subscribe,
    Subscription,
)
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import TIMEOUT, PahoClient, RawClient, raw_client_from, wait_for
from tests.e2e.broker_clients import stalled_subscriber as stalled


def test_max_connections(start_broker):
    broker = start_broker(limits={"max_connections": 2})
    a = RawClient(broker.port, 5)
    assert a.connect("a").reason_code == 0
    b = RawClient(broker.port, 5)
    assert b.connect("b").reason_code == 0
    c = RawClient(broker.port, 5)
    assert c.closed()
    assert broker.refused("max_connections") == 1
    a.close()
    assert wait_for(lambda: broker.call(lambda: len(broker.broker.connections)) == 1)
    d = RawClient(broker.port, 5)
    assert d.connect("d").reason_code == 0


def test_new_connection_rate_v5_gets_0x9f_v3_is_closed(start_broker):
    broker = start_broker(limits={"new_connections_per_second": 0.001, "new_connections_burst": 1})
    first = RawClient(broker.port, 5)
    assert first.connect("first").reason_code == 0
    v5 = RawClient(broker.port, 5)
    ack = v5.connect("second")
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x9F
    assert ack.properties.reason_string
    v3 = RawClient(broker.port, 4)
    v3.send_packet(Connect(client_id="third"))
    assert v3.recv() is None
    assert broker.refused("rate") == 2
    first.send_packet(Publish("still/served", b"x", 1, packet_id=1))
    assert isinstance(first.recv(), PubAck)


def test_new_connection_rate_is_per_source_address(start_broker):
    broker = start_broker(
        limits={
            "new_connections_per_second": 0.001,
            "new_connections_burst": 5,
            "new_connections_per_second_per_address": 0.001,
            "new_connections_burst_per_address": 2,
        }
    )
    flood = [raw_client_from(broker.port, "127.0.0.66").connect(f"flood{i}").reason_code for i in range(6)]
    assert flood == [0, 0] + [0x9F] * 4, "the flooding address is refused on its own bucket"
    assert raw_client_from(broker.port, "127.0.0.2").connect("device-a").reason_code == 0
    assert raw_client_from(broker.port, "127.0.0.3").connect("device-b").reason_code == 0
    assert raw_client_from(broker.port, "127.0.0.4").connect("device-c").reason_code == 0
    fifth = raw_client_from(broker.port, "127.0.0.5").connect("device-d")
    assert fifth.reason_code == 0x9F, "the overall cap holds"
    assert broker.refused("rate") == 5


def test_connect_timeout(start_broker):
    broker = start_broker(limits={"connect_timeout_s": 0.5})
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=TIMEOUT)
    assert sock.recv(10) == b""  # closed without a CONNECT (the sweep runs once a second)
    sock.close()
    assert broker.refused("connect_timeout") == 1
    assert RawClient(broker.port, 5).connect("in-time").reason_code == 0


def test_max_packet_size_v5_0x95_v3_closed(start_broker):
    broker = start_broker(limits={"max_packet_size": 1024})
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("ok", 0)
    raw = RawClient(broker.port, 5)
    assert raw.connect("big").properties.maximum_packet_size == 1024
    raw.send_packet(Publish("ok", b"x" * 1000))  # 1000 + header: fits
    assert sub.expect(1)[0].payload == b"x" * 1000
    raw.send(b"\x30\x88\x10")  # announces 2056 bytes: refused before the body arrives
    raw.expect_disconnect(0x95)
    v3 = RawClient(broker.port, 4)
    v3.connect("big3")
    v3.send_packet(Publish("ok", b"y" * 2000))
    assert v3.closed()
    PahoClient(broker.port, "pub").publish("ok", b"fine")
    assert sub.expect(1)[0].payload == b"fine"


@pytest.mark.mqtt5("MQTT-3.3.4-9", "MQTT-4.9.0-1", "MQTT-4.9.0-2")
@pytest.mark.parametrize(
    ("version", "limits", "receive_maximum"),
    [
        (4, {"max_inflight_out": 2}, None),  # v3: the broker's bound
        (5, {}, 2),  # v5: the client's Receive Maximum
        (5, {"max_inflight_out": 2}, 100),  # v5: whichever is lower
    ],
)
def test_outgoing_window_of_unacknowledged_deliveries(start_broker, version, limits, receive_maximum):
    broker = start_broker(limits=limits)
    raw = RawClient(broker.port, version)
    props = Properties(receive_maximum=receive_maximum) if receive_maximum else None
    raw.connect("window", properties=props)
    raw.subscribe("w", 1)
    pub = PahoClient(broker.port, "p")
    for i in range(4):
        pub.publish("w", str(i), 1)
    first = [raw.recv(), raw.recv()]
    assert [p.payload for p in first] == [b"0", b"1"]
    raw.recv_none()  # the third waits for a free slot
    assert broker.metric("timestone_broker_inflight_messages") == 2
    raw.send_packet(PubAck(first[0].packet_id))
    assert raw.recv().payload == b"2"
    raw.recv_none()
    raw.send_packet(PubAck(first[1].packet_id))
    assert raw.recv().payload == b"3"


@pytest.mark.mqtt5("MQTT-3.8.4-7")
def test_max_subscriptions_per_client_v5_0x97_v3_0x80(start_broker):
    broker = start_broker(limits={"max_subscriptions_per_client": 2})
    raw = RawClient(broker.port, 5)
    raw.connect("s")
    raw.send_packet(Subscribe(1, [Subscription("a"), Subscription("b"), Subscription("c")]))
    assert raw.recv().reason_codes == [0, 0, 0x97]
    raw.send_packet(Subscribe(2, [Subscription("a", 1)]))  # replacing one is not a new one
    assert raw.recv().reason_codes == [1]
    v3 = PahoClient(broker.port, "v3", version=4)
    v3.subscribe("x", 0)
    v3.subscribe("y", 0)
    assert v3.subscribe("z", 0) == [0x80]


def test_topic_length_and_levels(start_broker):
    broker = start_broker(limits={"max_topic_length": 16, "max_topic_levels": 3})
    raw = RawClient(broker.port, 5)
    raw.connect("t")
    filters = ["a/b/c", "a/b/c/d", "x" * 17, "é" * 9, "$share/group/a/b/c"]
    raw.send_packet(Subscribe(1, [Subscription(f) for f in filters]))
    assert raw.recv().reason_codes == [0, 0x8F, 0x8F, 0x8F, 0]  # 9 characters, 18 bytes: too long
    sub = PahoClient(broker.port, "ok")
    sub.subscribe("#", 0)
    for bad_topic in ("a/b/c/d", "y" * 17, "é" * 9):
        bad = RawClient(broker.port, 5)
        bad.connect("bad")
        bad.send_packet(Publish(bad_topic, b"refused"))
        bad.expect_disconnect(0x90)
    v3 = RawClient(broker.port, 4)
    v3.connect("v3")
    v3.send_packet(Publish("q" * 17, b"refused"))
    assert v3.closed()
    PahoClient(broker.port, "p").publish("a/" + "é" * 7, b"fine")  # 16 bytes, 2 levels
    [message] = sub.expect(1)
    assert message.payload == b"fine"
    assert broker.disconnects("topic_name_invalid") == 4


@pytest.mark.mqtt311("MQTT-3.1.3-9")
@pytest.mark.mqtt5("MQTT-3.1.3-8", "MQTT-3.2.2-8", "MQTT-4.13.2-1")
def test_client_id_length_v5_0x85_v3_0x02(start_broker):
    broker = start_broker(limits={"max_client_id_length": 23})
    assert RawClient(broker.port, 5).connect("x" * 24).reason_code == 0x85
    assert RawClient(broker.port, 4).connect("x" * 24).reason_code == 0x02
    assert RawClient(broker.port, 5).connect("é" * 12).reason_code == 0x85  # 24 bytes
    assert RawClient(broker.port, 5).connect("x" * 23).reason_code == 0
    assert broker.refused("client_id_invalid") == 3


def test_offline_queue_bounded_by_messages_and_bytes(start_broker):
    broker = start_broker(limits={"max_offline_messages": 3, "max_offline_bytes": 1000})
    sessions = broker.broker.router.sessions
    sub = PahoClient(broker.port, "off", clean=False, session_expiry=300)
    sub.subscribe("q", 1)
    sub.disconnect()
    # offline once the broker has read the DISCONNECT (a publish read before it would find it online)
    assert wait_for(lambda: broker.call(lambda: sessions["off"].connection is None))
    pub = PahoClient(broker.port, "p")
    for i in range(5):
        pub.publish("q", f"{i}", 1)
    assert broker.drops("queue_full") == 2
    again = PahoClient(broker.port, "off", clean=False, session_expiry=300)
    assert [m.payload for m in again.expect(3)] == [b"0", b"1", b"2"]
    again.expect_none(0.2)
    again.disconnect()
    assert wait_for(lambda: broker.call(lambda: sessions["off"].connection is None))
    pub.publish("q", b"x" * 900, 1)
    pub.publish("q", b"y" * 200, 1)  # over the byte bound
    assert broker.drops("queue_full") == 3
    last = PahoClient(broker.port, "off", clean=False, session_expiry=300)
    assert [len(m.payload) for m in last.expect(1)] == [900]
    last.expect_none(0.2)


def test_max_topics_per_client(start_broker):
    broker = start_broker(storage={}, limits={"max_topics_per_client": 2})
    raw = RawClient(broker.port, 5)
    raw.connect("runaway")
    codes = []
    for packet_id, topic in enumerate(["t/1", "t/2", "t/3", "t/1"], start=1):
        raw.send_packet(Publish(topic, b"x", 1, packet_id=packet_id))
        codes.append(raw.recv().reason_code)
    assert codes == [0x10, 0x10, 0x97, 0x10]  # a third log refused; the first topic still accepted
    assert broker.drops("topic_quota") == 1
    assert broker.call(lambda: sorted(info.topic for info in broker.broker.store.logs())) == ["t/1", "t/2"]
    other = RawClient(broker.port, 4)
    other.connect("another")
    other.send_packet(Publish("t/3", b"y", 1, packet_id=1))
    assert isinstance(other.recv(), PubAck)
    assert broker.call(lambda: "t/3" in broker.broker.store)


@pytest.mark.mqtt5("MQTT-3.1.2-24", "MQTT-3.1.2-25")
def test_publish_larger_than_client_maximum_packet_size_is_dropped_for_it(broker):
    small = RawClient(broker.port, 5)
    small.connect("small", properties=Properties(maximum_packet_size=64))
    small.subscribe("big", 0)
    large = PahoClient(broker.port, "large")
    large.subscribe("big", 0)
    pub = PahoClient(broker.port, "p")
    pub.publish("big", b"x" * 200)
    pub.publish("big", b"ok")
    assert [len(m.payload) for m in large.expect(2)] == [200, 2]
    assert small.recv().payload == b"ok"
    assert broker.drops("too_large") == 1


# -- slow subscribers ---------------------------------------------------------------------------------------

PAYLOAD = b"z" * 16_384
BATCH = 4


def stalled_subscriber(broker, client_id: str) -> RawClient:
    """A v5 client subscribed to ``firehose`` (QoS 0) and ``firehose/q1`` (QoS 1) that stops reading."""
    return stalled(broker.port, client_id, [Subscription("firehose", 0), Subscription("firehose/q1", 1)])


def flood_until(condition, pub: PahoClient, healthy: PahoClient, max_batches: int = 400) -> int:
    """Publish to ``firehose`` in batches, each only once ``healthy`` received the previous one, until
    ``condition()``; returns how many were published. The healthy subscriber is so never more than one
    batch behind, while the stalled one only accumulates."""
    for batch in range(max_batches):
        for _ in range(BATCH):
            pub.publish("firehose", PAYLOAD)
        assert len(healthy.expect(BATCH)) == BATCH
        if condition():
            return (batch + 1) * BATCH
    raise AssertionError("the stalled subscriber was never found slow")


def test_slow_subscriber_qos0_dropped_qos1_kept_others_unaffected(start_broker):
    broker = start_broker(limits={"outgoing_buffer_bytes": 262_144, "slow_subscriber_policy": "drop_qos0"})
    stalled = stalled_subscriber(broker, "stalled")
    healthy = PahoClient(broker.port, "healthy")
    healthy.subscribe("firehose", 0)
    pub = PahoClient(broker.port, "p")
    flood_until(lambda: broker.drops("slow_subscriber") > 0, pub, healthy)
    pub.publish("firehose/q1", b"kept", 1)  # held for the stalled subscriber, not dropped
    for _ in range(3):
        pub.publish("firehose", PAYLOAD)
    assert len(healthy.expect(3)) == 3
    assert broker.connected("stalled") and broker.connected("healthy")
    assert broker.disconnects("slow_subscriber") == 0
    # The stalled subscriber reads again: it gets what fitted in its buffers, then the QoS 1 message.
    received = None
    while received is None or received.topic != "firehose/q1":
        received = stalled.recv()
        assert received is not None
    assert (received.qos, received.payload) == (1, b"kept")


def test_slow_subscriber_disconnect_policy(start_broker):
    broker = start_broker(limits={"outgoing_buffer_bytes": 262_144, "slow_subscriber_policy": "disconnect"})
    stalled_subscriber(broker, "stalled")
    healthy = PahoClient(broker.port, "healthy")
    healthy.subscribe("firehose", 0)
    pub = PahoClient(broker.port, "p")
    flood_until(lambda: not broker.connected("stalled"), pub, healthy)
    assert broker.disconnects("slow_subscriber") == 1
    assert broker.connected("healthy") and healthy.disconnects.empty()
    pub.publish("firehose", b"after")
    assert healthy.expect(1)[0].payload == b"after"


def test_message_rate_per_client_pauses_reading_and_loses_nothing(start_broker):
    broker = start_broker(limits={"messages_per_second_per_client": 50, "messages_burst_per_client": 5})
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("rate", 0)
    pub = PahoClient(broker.port, "p")
    for i in range(20):
        pub.publish("rate", f"{i}")
    assert [m.payload for m in sub.expect(20)] == [str(i).encode() for i in range(20)]
    assert broker.metric("timestone_broker_client_throttled_total") >= 1
    assert broker.drops("rate_limited") == 0


def _raw_connack(port: int, client_id: str, maximum_packet_size: int) -> tuple[bytes, ConnAck | None]:
    """The bytes of the broker's answer to a v5 CONNECT declaring ``maximum_packet_size``, and the CONNACK."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    try:
        properties = Properties(maximum_packet_size=maximum_packet_size)
        sock.sendall(encode(Connect(protocol_version=5, client_id=client_id, properties=properties), 5))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
            if len(data) >= 2 and len(data) >= 2 + data[1]:
                break
    finally:
        sock.close()
    packets = PacketDecoder(role="client", protocol_version=5).feed(data)
    if not packets:
        return data, None
    assert isinstance(packets[0], ConnAck)
    return data, packets[0]


@pytest.mark.parametrize("maximum", [10, 11, 13, 16, 100])
def test_connack_never_exceeds_the_clients_maximum_packet_size_MQTT_3_1_2_24(broker, maximum):
    """A v5 client declaring a tiny Maximum Packet Size gets a CONNACK that fits it [MQTT-3.1.2-24]: the
    topic alias maximum, then the maximum packet size, then the receive maximum are left out until it fits;
    a client with room for all of them gets all of them."""
    data, connack = _raw_connack(broker.port, "tiny", maximum)
    assert isinstance(connack, ConnAck) and connack.reason_code == 0
    assert len(data) <= maximum
    props = connack.properties
    if maximum >= 16:
        assert (props.receive_maximum, props.maximum_packet_size, props.topic_alias_maximum) == (
            64,
            1_048_576,
            64,
        )
    if maximum == 10:
        assert (props.receive_maximum, props.maximum_packet_size, props.topic_alias_maximum) == (
            64,
            None,
            None,
        )


def test_a_connack_that_cannot_fit_is_refused_in_a_bare_connack_MQTT_3_2_2_19(broker):
    """An empty client id needs an Assigned Client Identifier (more than 10 bytes): the connection is
    refused with 0x95 in a CONNACK without a reason string [MQTT-3.2.2-19], the only answer that fits."""
    data, connack = _raw_connack(broker.port, "", 10)
    assert isinstance(connack, ConnAck) and connack.reason_code == 0x95
    assert len(data) <= 10 and (connack.properties is None or connack.properties.reason_string is None)
    assert broker.refused("connack_too_large") == 1
