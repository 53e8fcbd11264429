"""Every configurable limit, enforced: connections, rates, sizes, quotas, queues, slow subscribers."""

from __future__ import annotations

import socket
import time

from broker_edge.protocol.packets import ConnAck, Publish, Subscribe, Subscription
from broker_edge.protocol.properties import Properties
from tests.broker.broker_test_clients import PahoClient, RawClient


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
    deadline = time.monotonic() + 5
    while broker.call(lambda: len(broker.broker.connections)) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    d = RawClient(broker.port, 5)
    assert d.connect("d").reason_code == 0


def test_new_connection_rate_v5_gets_0x9f_v3_is_closed(start_broker):
    broker = start_broker(limits={"new_connections_per_second": 0.001, "new_connections_burst": 1})
    first = RawClient(broker.port, 5)
    assert first.connect("first").reason_code == 0
    v5 = RawClient(broker.port, 5)
    ack = v5.connect("second")
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x9F
    v3 = RawClient(broker.port, 4)
    v3.send_packet(
        __import__("broker_edge.protocol.packets", fromlist=["Connect"]).Connect(client_id="third")
    )
    assert v3.recv() is None
    assert broker.refused("rate") == 2


def test_connect_timeout(start_broker):
    broker = start_broker(limits={"connect_timeout_s": 0.5})
    sock = socket.create_connection(("127.0.0.1", broker.port))
    sock.settimeout(5)
    assert sock.recv(10) == b""  # closed without a CONNECT
    assert broker.refused("connect_timeout") == 1


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
    raw.send_packet(Subscribe(1, [Subscription("a/b/c"), Subscription("a/b/c/d"), Subscription("x" * 17)]))
    assert raw.recv().reason_codes == [0, 0x8F, 0x8F]
    sub = PahoClient(broker.port, "ok")
    sub.subscribe("a/#", 0)
    raw.send_packet(Publish("a/b/c/d", b"deep"))
    packet = raw.recv()
    assert packet.reason_code == 0x90
    PahoClient(broker.port, "p").publish("a/b", b"fine")
    assert sub.expect(1)[0].payload == b"fine"


def test_client_id_length_v5_0x85_v3_0x02(start_broker):
    broker = start_broker(limits={"max_client_id_length": 23})
    assert RawClient(broker.port, 5).connect("x" * 24).reason_code == 0x85
    assert RawClient(broker.port, 4).connect("x" * 24).reason_code == 0x02
    assert RawClient(broker.port, 5).connect("x" * 23).reason_code == 0


def test_offline_queue_bounded_by_messages_and_bytes(start_broker):
    broker = start_broker(limits={"max_offline_messages": 3, "max_offline_bytes": 1000})
    sub = PahoClient(broker.port, "off", clean=False, session_expiry=300)
    sub.subscribe("q", 1)
    sub.disconnect()
    pub = PahoClient(broker.port, "p")
    for i in range(5):
        pub.publish("q", f"{i}", 1)
    assert broker.drops("queue_full") == 2
    again = PahoClient(broker.port, "off", clean=False, session_expiry=300)
    assert [m.payload for m in again.expect(3)] == [b"0", b"1", b"2"]
    again.expect_none(0.2)
    again.disconnect()
    pub.publish("q", b"x" * 900, 1)
    pub.publish("q", b"y" * 200, 1)  # over the byte bound
    assert broker.drops("queue_full") == 3


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


def test_slow_subscriber_qos0_dropped_others_unaffected(start_broker):
    broker = start_broker(limits={"outgoing_buffer_bytes": 1024, "slow_subscriber_policy": "drop_qos0"})
    stalled = socket.create_connection(("127.0.0.1", broker.port))
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw = RawClient.__new__(RawClient)
    raw.sock, raw.version, raw.pending = stalled, 5, []
    from broker_edge.protocol.codec import PacketDecoder

    raw.decoder = PacketDecoder(role="client", protocol_version=5)
    raw.connect("stalled")
    raw.subscribe("firehose", 0)
    healthy = PahoClient(broker.port, "healthy")
    healthy.subscribe("firehose", 0)
    pub = PahoClient(broker.port, "p")
    for _ in range(600):  # 12 MB: more than the kernel buffers of a stalled loopback socket hold
        pub.publish("firehose", b"z" * 20_000)
    pub.publish("firehose", b"last", 1)
    got = healthy.expect(601, timeout=20)
    assert got[-1].payload == b"last"
    assert broker.drops("slow_subscriber") > 0


def test_slow_subscriber_disconnect_policy(start_broker):
    broker = start_broker(limits={"outgoing_buffer_bytes": 1024, "slow_subscriber_policy": "disconnect"})
    stalled = socket.create_connection(("127.0.0.1", broker.port))
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    from broker_edge.protocol.codec import encode
    from broker_edge.protocol.packets import Connect

    stalled.sendall(encode(Connect(protocol_version=5, client_id="stalled"), 5))
    stalled.sendall(encode(Subscribe(1, [Subscription("firehose")]), 5))
    healthy = PahoClient(broker.port, "healthy")
    healthy.subscribe("firehose", 0)
    pub = PahoClient(broker.port, "p")
    for _ in range(600):
        pub.publish("firehose", b"z" * 20_000)
    assert len(healthy.expect(600, timeout=20)) == 600
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and broker.call(
        lambda: any(c.client_id == "stalled" for c in broker.broker.connections)
    ):
        time.sleep(0.02)
    assert not broker.call(lambda: any(c.client_id == "stalled" for c in broker.broker.connections))


def test_message_rate_per_client_pauses_reading_and_loses_nothing(start_broker):
    broker = start_broker(limits={"messages_per_second_per_client": 50, "messages_burst_per_client": 5})
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("rate", 0)
    pub = PahoClient(broker.port, "p")
    for i in range(20):
        pub.publish("rate", f"{i}")
    assert [m.payload for m in sub.expect(20)] == [str(i).encode() for i in range(20)]
    assert (
        broker.call(
            lambda: broker.broker.metrics.registry.get_sample_value("timestone_broker_client_throttled_total")
        )
        >= 1
    )
