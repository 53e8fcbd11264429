"""Overload without stalls or silent loss: a QoS 0 flood from many publishers, a subscriber that cannot keep
up, one that stops reading altogether.

The broker reads a bounded number of bytes per turn of its loop (``limits.read_bytes_per_turn``), so a flood
is read over many turns with everything else served between them; a subscriber whose buffer is full holds
its publishers (``slow_subscriber_policy: backpressure``) until it drains, and one that stops reading for
``slow_subscriber_hold_s`` lets them go, its QoS 0 messages then dropped, counted and logged naming it.
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.request

from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import PingReq, PingResp, Publish, Subscription
from tests.e2e.broker_clients import TIMEOUT, PahoClient, RawClient, stalled_subscriber, wait_for

NO_RATE_LIMITS = {"messages_per_second_per_client": 0, "new_connections_per_second": 0}
PUBLISHERS = 16
FLOOD = 3_000
"""QoS 0 messages per publisher in the flood."""


def publish_frames(topic: str, count: int, payload: bytes = b"p" * 64) -> bytes:
    return encode(Publish(topic=topic, payload=payload, qos=0), 4) * count


class Counter(threading.Thread):
    """Reads a subscriber's socket in a thread, counting PUBLISH packets (in order, per topic)."""

    def __init__(self, client: RawClient) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.payloads: dict[str, list[bytes]] = {}
        self.count = 0
        self.other: list[object] = []

    def run(self) -> None:
        while True:
            try:
                packet = self.client.recv()
            except (TimeoutError, OSError):
                return
            if packet is None:
                return
            if isinstance(packet, Publish):
                self.payloads.setdefault(packet.topic, []).append(packet.payload)
                self.count += 1
            else:
                self.other.append(packet)


def flood(port: int, topic: str, count: int) -> threading.Thread:
    """A v3.1.1 publisher on its own socket writing ``count`` QoS 0 messages at once, in a thread."""
    publisher = RawClient(port, 4)
    publisher.connect(f"flood-{topic.replace('/', '-')}")
    frames = publish_frames(topic, count)
    writer = threading.Thread(target=publisher.sock.sendall, args=(frames,), daemon=True)
    writer.start()
    return writer


def ping(client: RawClient) -> bool:
    client.send_packet(PingReq())
    return isinstance(client.recv(), PingResp)


def metrics_answer(broker) -> bool:
    url = f"http://127.0.0.1:{broker.broker.admin_port}/metrics"
    with urllib.request.urlopen(url, timeout=TIMEOUT) as answer:
        return answer.status == 200 and b"messages_dropped_total" in answer.read()


def test_a_qos0_flood_from_16_publishers_reaches_its_subscriber_while_the_broker_answers(start_broker):
    broker = start_broker(limits=NO_RATE_LIMITS)
    subscriber = RawClient(broker.port, 4)
    subscriber.connect("subscriber")
    subscriber.subscribe("flood/+", 0)
    counter = Counter(subscriber)
    counter.start()
    prober = RawClient(broker.port, 4)
    prober.connect("prober")
    writers = [flood(broker.port, f"flood/{n:02}", FLOOD) for n in range(PUBLISHERS)]
    answered = 0
    while counter.count < PUBLISHERS * FLOOD and answered < 100:  # PINGREQ and /metrics, all the way through
        assert ping(prober)
        assert metrics_answer(broker)
        answered += 1
    assert wait_for(lambda: counter.count == PUBLISHERS * FLOOD)
    for writer in writers:
        writer.join(TIMEOUT)
    assert sorted(counter.payloads) == [f"flood/{n:02}" for n in range(PUBLISHERS)]
    assert all(len(payloads) == FLOOD for payloads in counter.payloads.values())
    assert broker.metric("timestone_broker_messages_dropped_total", reason="slow_subscriber") == 0
    assert broker.metric("timestone_broker_read_turns_cut_total") > 0  # the flood was read over many turns


MANY = 16_000
BIG = b"b" * 1024


def test_a_slow_subscriber_slows_its_publishers_down_and_loses_nothing(start_broker):
    broker = start_broker(limits={**NO_RATE_LIMITS, "outgoing_buffer_bytes": 65_536})
    slow = stalled_subscriber(broker.port, "slow", [Subscription("data/#", 0)], 4)
    publisher = RawClient(broker.port, 4)
    publisher.connect("publisher")
    publisher.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65_536)
    frames = publish_frames("data/x", MANY, BIG)
    writer = threading.Thread(target=publisher.sock.sendall, args=(frames,), daemon=True)
    writer.start()
    # The subscriber's buffer fills: its publisher is no longer read, and its socket backs up.
    assert wait_for(lambda: broker.call(lambda: broker.broker.slow_subscribers.held_count) == 1)
    writer.join(0.5)
    assert writer.is_alive()  # TCP pushes back on the publisher
    # Everyone else goes on: a client on other topics publishes and receives, PINGREQ is answered.
    other = PahoClient(broker.port, "other")
    other.subscribe("elsewhere", 0)
    other.publish("elsewhere", b"still here")
    assert [m.payload for m in other.expect(1)] == [b"still here"]
    pinger = RawClient(broker.port, 4)
    pinger.connect("pinger")
    assert ping(pinger)
    # The subscriber reads: every message arrives, in order, and the publisher finishes.
    counter = Counter(slow)
    counter.start()
    assert wait_for(lambda: counter.count == MANY, timeout=60)
    writer.join(TIMEOUT)
    assert not writer.is_alive()
    assert counter.payloads["data/x"] == [BIG] * MANY
    assert broker.drops("slow_subscriber") == 0
    assert broker.call(lambda: broker.broker.slow_subscribers.held_count) == 0


def test_a_subscriber_that_stops_reading_lets_its_publishers_go_and_every_drop_is_said(start_broker, caplog):
    broker = start_broker(
        limits={**NO_RATE_LIMITS, "outgoing_buffer_bytes": 65_536, "slow_subscriber_hold_s": 0.5}
    )
    stuck = stalled_subscriber(broker.port, "stuck", [Subscription("data/#", 0)], 4)
    healthy = PahoClient(broker.port, "healthy")
    healthy.subscribe("data/#", 0)
    publisher = PahoClient(broker.port, "publisher")
    with caplog.at_level(logging.WARNING, logger="broker_edge.connection"):
        sent = 0
        while broker.drops("slow_subscriber") == 0:  # a message at a time: the healthy one keeps up
            publisher.publish("data/y", BIG)
            healthy.expect(1)
            sent += 1
            assert sent < 20_000, "the stuck subscriber never dropped a message"
        assert wait_for(lambda: broker.call(lambda: broker.broker.slow_subscribers.held_count) == 0)
    # Its publisher was held for the hold time, then let go; the healthy subscriber got every message.
    lines = [r for r in caplog.records if "stuck" in r.__dict__.get("client_id", "")]
    assert any("not reading for" in r.getMessage() for r in lines)
    drop = next(r for r in lines if r.__dict__.get("reason") == "slow_subscriber")
    assert drop.__dict__["topic"] == "data/y" and "'stuck'" in drop.getMessage()
    assert broker.connected("stuck")
    stuck.close()
