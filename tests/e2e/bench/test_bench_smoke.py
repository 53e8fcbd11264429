"""Smoke test of the broker benchmark's load generator against a real Mosquitto it starts.

Short runs (about a second of traffic each) whose counts must add up: QoS 1 delivers every acknowledged
message to every subscriber, QoS 0 delivers something, and the frame scanner agrees with a byte-exact
reference. The whole file takes about 10 s.
"""

from __future__ import annotations

import dataclasses
import random

from bench import frames
from bench.brokers import Mosquitto
from bench.brokers.mosquitto import mosquitto_binary
from bench.loadgen.flow import FlowSpec, Timing, run_flow
from bench.loadgen.idle import run_idle
from bench.scenarios import fanin
from bench.stream import FrameScanner
from broker_edge.protocol.encoder import encode
from broker_edge.protocol.packets import MQTT_5, Disconnect
from broker_edge.protocol.properties import Properties
from broker_edge.protocol.reason_codes import ReasonCode


def test_mosquitto_is_installed() -> None:
    """The peer broker the benchmarks compare against (installed by .ci/system-deps) must be present."""
    assert mosquitto_binary() is not None, "install the Debian package mosquitto (make setup does)"


SHORT = Timing(warmup_s=0.3, measure_s=0.7, drain_s=4.0, connect_timeout_s=20.0)


def test_scanner_counts_and_acks_any_chunking() -> None:
    header, length, pid_offset = frames.publish_layout("bench/t/0", 64, qos=1)
    rng = random.Random(7)
    sent, dups = [], 0
    for i in range(3000):
        frame = frames.publish(rng.choice(["bench/t/1", "other"]), bytes(64), 1, i + 1)
        if rng.random() < 0.02:
            frame = bytes((frame[0] | 0x08,)) + frame[1:]  # a redelivery (DUP): takes the slow path
            dups += 1
        sent.append(frame)
    stream = b"".join(sent)
    scanner = FrameScanner(header, length, pid_offset)
    acks, pos = b"", 0
    while pos < len(stream):
        step = rng.choice([1, 2, 77, 1000, 40_000])
        acks += scanner.feed(stream[pos : pos + step])
        pos += step
    assert dups > 0
    # a DUP redelivery is acknowledged but not counted as a delivery: it could repeat one already counted
    assert scanner.redeliveries == dups
    assert scanner.publishes == 3000 - dups
    assert acks == b"".join(frames.puback(i + 1) for i in range(3000))


def test_scanner_reads_where_a_disconnect_sends_the_client() -> None:
    """The workers bench's MQTT 5 publishers follow a DISCONNECT 0x9C's Server Reference (as the broker
    encodes it, after a reason string), even when it arrives in pieces behind PUBACKs."""
    properties = Properties(reason_string="the member leading this topic's partition appends its publishes")
    properties.server_reference = "127.0.0.1:18831"
    stream = frames.puback(1) + encode(Disconnect(ReasonCode.USE_ANOTHER_SERVER, properties), MQTT_5)
    scanner = FrameScanner(bytes((frames.PUBACK, 2)), 4)
    for byte in range(len(stream)):
        scanner.feed(stream[byte : byte + 1])
    assert scanner.counts[4] == 1
    assert scanner.server_reference == "127.0.0.1:18831"


def test_fanin_qos1_delivers_every_acknowledged_message() -> None:
    spec = dataclasses.replace(fanin.spec(1), ahead=2000)
    with Mosquitto().running() as broker:
        result = run_flow(broker, spec, SHORT, cpus=None)
    assert result.sent > 0
    assert result.acked == result.sent
    assert result.delivered == result.expected == result.acked
    assert result.delivered_per_s > 0 and result.published_per_s > 0
    assert result.errors == []


def test_fanout_qos1_every_subscriber_gets_every_message() -> None:
    spec = FlowSpec(
        publishers=1, subscribers=20, qos=1, topics=("bench/fanout",), subscription="bench/fanout", ahead=100
    )
    with Mosquitto().running() as broker:
        result = run_flow(broker, spec, SHORT, cpus=None)
    assert result.acked == result.sent > 0
    assert result.delivered == 20 * result.acked
    assert result.min_per_subscriber == result.acked


def test_fanin_qos0_and_idle_connections_measure_something() -> None:
    spec = FlowSpec(publishers=2, subscribers=1, qos=0, topics=("bench/q0",), subscription="bench/q0")
    with Mosquitto().running() as broker:
        flow = run_flow(broker, spec, SHORT, cpus=None)
        idle = run_idle(broker, clients=200, settle_s=0.2)
    assert flow.sent > 0 and 0 < flow.delivered <= flow.sent
    assert flow.delivered_per_s > 0
    assert idle.connected == 200
    assert idle.rss_after > 0


def test_fanin_publishers_on_topics_of_different_lengths_each_send_whole_frames() -> None:
    """From 11 publishers on, `bench/fanin/<i>` topics differ in length: each publisher slices its own
    frames (a frame length taken from another topic's cut them, and the broker closed it)."""
    spec = dataclasses.replace(fanin.spec(1, 12), ahead=2000)
    with Mosquitto().running() as broker:
        result = run_flow(broker, spec, SHORT, cpus=None)
    assert result.errors == []
    assert result.sent > 0 and result.acked == result.sent
    assert result.delivered == result.expected == result.acked
