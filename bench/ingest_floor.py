"""What one ingested message costs the broker in CPython, next to the least a Python broker must spend on it.

    .venv/bin/python -m bench.ingest_floor [--rounds 7] [--output FILE]

The broker's engine (a real ``Broker``: router, PUBLISH path, commitlog, sessions; connections fed bytes
with no socket, their output taken as a transport would take it) runs the ingest shapes of the fan-in and
fleet benches on the event loop, its garbage collector tuned as the broker's process tunes it (the
``runtime`` section: the start-up heap frozen, rarer young collections), in CPU microseconds per message
(the loop thread's CPU time, the median of ``--rounds`` rounds after a warm-up):

- **QoS 0 fan-in**: 16 publishers, 700 messages each per round (64-byte payloads, a topic each), one QoS 0
  subscriber on all of them;
- **QoS 1 fan-in, logged**: the same at QoS 1 with the commitlog (``durability: none``: the append and its
  bookkeeping, not the disk), PUBACKs to the publishers, one QoS 1 subscriber PUBACKing its deliveries;
- **QoS 1 ingest**: 48 publishers at QoS 1, 64 messages each a round on a topic each, logged and acknowledged,
  no subscriber (the many-core kit's cluster shape: telemetry read by offset);
- **the fleet**: 2,000 devices, each one QoS 1 message on its own topic per round, one QoS 1 consumer;
  and the same with no subscriber for them (telemetry read by offset, each PUBACK "no matching subscribers").

Beside them, parts of the QoS 0 path alone (the decoder turning the bytes into packets) and a **floor**:
what any Python broker spends to route a QoS 0 message at the least (split the frames by their remaining
length, slice the topic, one dict lookup of its subscribers, the frame appended to each one's output), with
no validation, no objects and no I/O. What a broker does per message that no Python design avoids; the
rest is what the design spends on top. Nothing here reads a socket: the figures leave out the system calls
and the event loop's own turns, which the socket benches include.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import frames
from bench.report import RESULTS_DIR, write_result
from bench.stream import FrameScanner
from bench.sysinfo import machine_info
from broker_edge.config import load_dataclass
from broker_edge.engine.connection.connection import Connection
from broker_edge.engine.connection.terms import ListenerRuntime
from broker_edge.process.gc_tuning import tune_garbage_collector
from broker_edge.protocol.decoder import MAX_PACKET_SIZE, shared_decoder
from broker_edge.runtime.broker import Broker
from broker_edge.settings.broker import BrokerConfig

PUBLISHERS = 16
PER_PUBLISHER = 700
PAYLOAD = bytes(64)
DEVICES = 2_000
INGEST_PUBLISHERS = 48


class Fed(Connection):
    """A client connection with no transport: bytes in with ``receive``; its output, when the broker flushes
    it (as a transport adapter would write it), handed to ``sink``."""

    __slots__ = ("sink",)

    def __init__(self, broker: Broker, listener: ListenerRuntime) -> None:
        super().__init__(broker, listener)
        self.sink: Callable[[list[bytes]], None] = lambda out: None

    def flush(self) -> None:
        out = self.take_output()
        if out:
            self.sink(out)

    def peer_address(self) -> tuple[str, int] | None:
        return ("127.0.0.1", 50000)


def _config(directory: Path) -> BrokerConfig:
    return load_dataclass(
        BrokerConfig,
        {
            "listeners": [{"name": "tcp", "port": 0}],
            "admin_http": {"enabled": False},
            "offsets_api": {"enabled": False},
            "sys_topics": {"enabled": False},
            "storage": {"directory": str(directory), "durability": "none"},
            "limits": {
                "messages_per_second_per_client": 0,
                "new_connections_per_second": 0,
                "max_topics_per_client": 0,
                "max_topics_per_identity": 0,
                "max_offline_messages": 1_000_000,
            },
            "logging": {"level": "WARNING"},
        },
    )


class Engine:
    """A started broker and connections to it made by hand."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.listener = broker.listeners[0]

    def client(self, client_id: str, subscription: str | None = None, qos: int = 0) -> Fed:
        conn = Fed(self.broker, self.listener)
        conn.opened()
        conn.receive(frames.connect(client_id, keepalive=600))
        if subscription is not None:
            conn.receive(frames.subscribe(1, subscription, qos))
        return conn


async def _rounds(
    rounds: int, one: Callable[[], Awaitable[int]], warmed: Callable[[], None] | None = None
) -> float:
    """Median CPU microseconds per message of ``one()`` (which returns how many messages it moved);
    ``warmed`` is called between the warm-up and the measured rounds (``bench/gc_fleet_cpu.py`` starts
    counting collections there)."""
    await one()  # warm-up: topics and sessions made, caches filled
    if warmed is not None:
        warmed()
    runs = []
    for _ in range(rounds):
        began = time.thread_time()
        count = await one()
        runs.append((time.thread_time() - began) / count * 1e6)
    return statistics.median(runs)


async def _until(done: Callable[[], bool]) -> None:
    while not done():
        await asyncio.sleep(0)


async def qos0_fan_in(engine: Engine, rounds: int) -> float:
    subscriber = engine.client("subscriber", "flood/+", 0)
    publishers = [engine.client(f"publisher-{n}") for n in range(PUBLISHERS)]
    blobs = [frames.publish(f"flood/{n:02}", PAYLOAD) * PER_PUBLISHER for n in range(PUBLISHERS)]
    header, length, _ = frames.publish_layout("flood/00", len(PAYLOAD), 0)

    async def one() -> int:
        scanner = FrameScanner(header, length)

        def delivered(out: list[bytes]) -> None:
            scanner.feed(b"".join(out))

        subscriber.sink = delivered
        expected = PUBLISHERS * PER_PUBLISHER
        for publisher, blob in zip(publishers, blobs, strict=True):
            publisher.receive(blob)
        while scanner.publishes < expected:
            await asyncio.sleep(0)
        return expected

    return await _rounds(rounds, one)


async def qos1(
    engine: Engine,
    rounds: int,
    topics: list[str],
    per_topic: int,
    subscription: str,
    warmed: Callable[[], None] | None = None,
    matched: bool = True,
) -> float:
    """QoS 1 publishers (one per topic), each ``per_topic`` messages a round, acknowledged once logged; one
    QoS 1 subscriber on ``subscription`` PUBACKing what it gets (``warmed``: as ``_rounds`` takes it; not
    ``matched``: the subscription matches none of ``topics``, nothing is delivered, telemetry read by
    offset)."""
    subscriber = engine.client("consumer", subscription, 1)
    publishers = [engine.client(f"device-{n}") for n in range(len(topics))]
    blobs = [frames.publish_run(topic, PAYLOAD, 1, 1, per_topic) for topic in topics]
    header, length, pid_offset = frames.publish_layout(topics[0], len(PAYLOAD), 1)

    async def one() -> int:
        scanner = FrameScanner(header, length, pid_offset)
        acked = [0]

        def delivered(out: list[bytes]) -> None:
            answer = scanner.feed(b"".join(out))
            if answer:
                subscriber.receive(answer)  # its PUBACKs, as its next read

        def acknowledged(out: list[bytes]) -> None:
            acked[0] += sum(map(len, out)) // 4  # PUBACKs, 4 bytes each

        subscriber.sink = delivered
        for publisher in publishers:
            publisher.sink = acknowledged
        expected = len(topics) * per_topic
        for publisher, blob in zip(publishers, blobs, strict=True):
            publisher.receive(blob)
        deliveries = expected if matched else 0
        while scanner.publishes < deliveries or acked[0] < expected:
            await asyncio.sleep(0)
        return expected

    return await _rounds(rounds, one, warmed)


def decode_only(rounds: int) -> float:
    blobs = [frames.publish(f"flood/{n:02}", PAYLOAD) * PER_PUBLISHER for n in range(PUBLISHERS)]
    decoder = shared_decoder(MAX_PACKET_SIZE, 4)  # a broker's: PUBLISHes alike come out as one packet
    runs = []
    for _ in range(rounds + 1):
        began = time.thread_time()
        for blob in blobs:
            decoder.feed(blob)
        runs.append((time.thread_time() - began) / (PUBLISHERS * PER_PUBLISHER) * 1e6)
    return statistics.median(runs[1:])


def floor(rounds: int) -> float:
    """Frames split by their one-byte remaining length, the topic sliced, its subscribers looked up, the
    frame appended to each one's output: a QoS 0 message routed with nothing checked and nothing made."""
    blobs = [frames.publish(f"flood/{n:02}", PAYLOAD) * PER_PUBLISHER for n in range(PUBLISHERS)]
    output: list[bytes] = []
    subscribers = {f"flood/{n:02}".encode(): [output] for n in range(PUBLISHERS)}
    runs = []
    for _ in range(rounds + 1):
        output.clear()
        began = time.thread_time()
        for buf in blobs:
            pos, size = 0, len(buf)
            while pos < size:
                end = pos + 2 + buf[pos + 1]
                topic_end = pos + 4 + ((buf[pos + 2] << 8) | buf[pos + 3])
                targets = subscribers.get(buf[pos + 4 : topic_end])
                if targets:
                    frame = buf[pos:end]
                    for target in targets:
                        target.append(frame)
                pos = end
        runs.append((time.thread_time() - began) / (PUBLISHERS * PER_PUBLISHER) * 1e6)
    return statistics.median(runs[1:])


async def measure(rounds: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    cases: list[tuple[str, Callable[[Engine], Awaitable[float]]]] = [
        ("qos0 fan-in", lambda engine: qos0_fan_in(engine, rounds)),
        (
            "qos1 fan-in",
            lambda engine: qos1(engine, rounds, [f"fanin/{n:02}" for n in range(PUBLISHERS)], 64, "fanin/+"),
        ),
        (
            "fleet",
            lambda engine: qos1(
                engine, rounds, [f"fleet/d-{n:05}/telemetry" for n in range(DEVICES)], 1, "fleet/+/telemetry"
            ),
        ),
        (
            "qos1 ingest, unsubscribed",
            lambda engine: qos1(
                engine,
                rounds,
                [f"ingest/{n:02}" for n in range(INGEST_PUBLISHERS)],
                64,
                "other/#",
                matched=False,
            ),
        ),
        (
            "fleet, unsubscribed",
            lambda engine: qos1(
                engine,
                rounds,
                [f"fleet/d-{n:05}/telemetry" for n in range(DEVICES)],
                1,
                "fleet/+/status",
                matched=False,
            ),
        ),
    ]
    for name, case in cases:
        directory = Path(tempfile.mkdtemp(prefix="ingest-floor-"))
        try:
            broker = Broker(_config(directory))
            await broker.start()
            tune_garbage_collector(broker.config.runtime)  # as the broker's process does once started
            try:
                figures[name] = await case(Engine(broker))
            finally:
                await broker.stop()
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    figures["decode only"] = decode_only(rounds)
    figures["floor"] = floor(rounds)
    return figures


def render(figures: dict[str, float], rounds: int, load: tuple[float, float, float]) -> str:
    machine = machine_info()
    rows = [
        ("QoS 0 fan-in: 16 publishers to one subscriber", figures["qos0 fan-in"]),
        ("QoS 1 fan-in, logged (durability none), PUBACKed both ways", figures["qos1 fan-in"]),
        (
            "QoS 1 ingest, logged, no subscriber: 48 publishers, 64 messages each a round",
            figures["qos1 ingest, unsubscribed"],
        ),
        ("the fleet: 2,000 devices, one QoS 1 message each, one consumer", figures["fleet"]),
        (
            "the same fleet, no subscriber (read by offset; MQTT 5 would be told 0x10)",
            figures["fleet, unsubscribed"],
        ),
        ("a broker's decoder alone, on the QoS 0 fan-in's bytes", figures["decode only"]),
        ("floor: a QoS 0 message routed with nothing checked and nothing made", figures["floor"]),
    ]
    lines = [
        "## One ingested message in CPython: the engine against the floor",
        "",
        "CPU microseconds per message of the broker's engine (a real `Broker`, connections fed bytes without "
        "sockets: the system calls and the loop's own turns are left out), the median of "
        f"{rounds} rounds, and what one core of it would route at that cost.",
        "",
        "| what | µs per message | messages per CPU second |",
        "|---|---|---|",
    ]
    for what, micros in rows:
        lines.append(f"| {what} | {micros:.2f} | {1e6 / micros:,.0f} |")
    lines += [
        "",
        f"`bench/ingest_floor.py`, measured {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on "
        f"{machine.cpu_model}, {machine.cores} CPUs, Python {machine.python}; load average {load[0]:.2f} "
        "(the figures are the loop thread's own CPU time: other work on the machine slows them through "
        "shared caches, not by taking their time).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.ingest_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "ingest-floor.md")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    figures = asyncio.run(measure(args.rounds))
    write_result(render(figures, args.rounds, load), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
