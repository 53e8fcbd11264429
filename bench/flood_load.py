"""A QoS 0 flood: P publishers write M messages each as fast as the broker takes them, to one subscriber.

The publishers are P connections in one process; each writes its M pre-encoded PUBLISH frames (topic
`flood/<nn>`, all frames of one length) into its transport at once and the loop sends them as fast as the
broker reads: what the broker does not read waits in the kernel's buffers and then in the publisher's, so
the flood is as fast as the broker lets it be and the load generator spends almost nothing on it. One
subscriber on `flood/+` (QoS 0) in another process counts the frames with `FrameScanner` and notes its
first and last delivery. A run ends once the subscriber has every message, or `idle_s` after its last
delivery once the publishers are done, or at `timeout_s`.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Any, cast

import uvloop

from bench import frames, net
from bench.stream import FrameScanner
from bench.sysinfo import cpu_seconds

PAYLOAD_SIZE = 64
KEEPALIVE_S = 120
_CTX = multiprocessing.get_context("spawn")


@dataclass
class FloodResult:
    """What one flood did."""

    sent: int
    delivered: int
    seconds: float
    """From the publishers' start to the subscriber's last delivery."""
    subscriber_cpu_pct: float
    """The subscriber process's CPU over `seconds` (100 = one core): near 100, it may have set the pace."""
    publisher_cpu_pct: float
    publishers_lost: int
    """Publisher connections the broker closed during the flood."""
    subscriber_lost: bool
    """Whether the broker closed the subscriber's connection."""

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    @property
    def delivered_pct(self) -> float:
        return 100.0 * self.delivered / self.sent if self.sent else 0.0


def topic(index: int) -> str:
    return f"flood/{index:02}"


class _Client(asyncio.Protocol):
    """CONNECT once connected; `ready` once CONNACK (and, for the subscriber, SUBACK) came."""

    def __init__(self, scanner: FrameScanner, connect: bytes, subscribe: bytes | None = None) -> None:
        self.scanner = scanner
        self.connect = connect
        self.subscribe = subscribe
        self.subscribed = False
        self.ready = asyncio.get_running_loop().create_future()
        self.lost = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.first = 0.0
        self.last = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream transport: it writes
        self.transport.write(self.connect)

    def data_received(self, data: bytes) -> None:
        before = self.scanner.publishes
        self.scanner.feed(data)
        if self.scanner.publishes != before:
            now = time.monotonic()
            self.first = self.first or now
            self.last = now
        if self.ready.done():
            return
        if self.scanner.connack_code not in (None, 0):
            self.ready.set_exception(ConnectionRefusedError(f"CONNACK {self.scanner.connack_code}"))
        elif (self.scanner.connack_code == 0 and self.subscribe is None) or self.scanner.suback_codes:
            self.ready.set_result(None)
        elif self.scanner.connack_code == 0 and not self.subscribed:
            assert self.transport is not None and self.subscribe is not None
            self.transport.write(self.subscribe)
            self.subscribed = True

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"closed before ready: {exc}"))
        if not self.lost.done():
            self.lost.set_result(None)


async def _connect(port: int, client: _Client) -> _Client:
    loop = asyncio.get_running_loop()
    await asyncio.wait_for(loop.create_connection(lambda: client, net.HOST, port), 30)
    await asyncio.wait_for(client.ready, 30)
    return client


async def _subscriber(
    port: int, expected: int, go: Any, publishers_done: Any, idle_s: float, out: Any
) -> None:
    header, length, _ = frames.publish_layout(topic(0), PAYLOAD_SIZE, 0)
    sub = await _connect(
        port,
        _Client(
            FrameScanner(header, length),
            frames.connect(f"flood-sub-{os.getpid()}", keepalive=KEEPALIVE_S),
            frames.subscribe(1, "flood/+", 0),
        ),
    )
    out.send("ready")
    while not go.is_set():
        await asyncio.sleep(0.01)
    cpu0 = time.process_time()
    began = time.monotonic()
    deadline = began + float(go_timeout(expected))
    while sub.scanner.publishes < expected and not sub.lost.done() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        quiet_since = sub.last or began
        if publishers_done.is_set() and time.monotonic() - quiet_since > idle_s:
            break
    cpu = time.process_time() - cpu0
    seconds = (sub.last or time.monotonic()) - began
    out.send((sub.scanner.publishes, seconds, cpu, sub.lost.done()))
    if sub.transport is not None:
        sub.transport.write(frames.DISCONNECT_FRAME)
        sub.transport.close()


def go_timeout(expected: int) -> float:
    """The longest a flood may take: generous (20,000 messages/s at the least), never unbounded."""
    return 30 + expected / 20_000


async def _publishers(port: int, publishers: int, messages: int, go: Any, out: Any) -> None:
    clients = [
        await _connect(
            port,
            _Client(
                FrameScanner(bytes((frames.PUBACK, 2)), 4), frames.connect(f"flood-pub-{n}", KEEPALIVE_S)
            ),
        )
        for n in range(publishers)
    ]
    blobs = [frames.publish(topic(n), bytes(PAYLOAD_SIZE)) * messages for n in range(publishers)]
    out.send("ready")
    while not go.is_set():
        await asyncio.sleep(0.001)
    cpu0 = time.process_time()
    for client, blob in zip(clients, blobs, strict=True):
        assert client.transport is not None
        client.transport.set_write_buffer_limits(high=len(blob) + 1)  # no pause_writing: all goes in
        client.transport.write(blob)
    del blobs
    deadline = time.monotonic() + go_timeout(publishers * messages)
    while time.monotonic() < deadline:
        if all(
            c.lost.done() or c.transport is None or not c.transport.get_write_buffer_size() for c in clients
        ):
            break
        await asyncio.sleep(0.01)
    lost = sum(1 for c in clients if c.lost.done())
    out.send((publishers * messages, time.process_time() - cpu0, lost))
    await asyncio.sleep(0.5)  # the broker reads the last bytes before the DISCONNECT ends the stream
    for client in clients:
        if client.transport is not None and not client.lost.done():
            client.transport.write(frames.DISCONNECT_FRAME)
            client.transport.close()


def _run_subscriber(port: int, expected: int, go: Any, done: Any, idle_s: float, out: Any, cpus: Any) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    uvloop.run(_subscriber(port, expected, go, done, idle_s, out))


def _run_publishers(port: int, publishers: int, messages: int, go: Any, out: Any, cpus: Any) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    uvloop.run(_publishers(port, publishers, messages, go, out))


def run_flood(
    port: int, publishers: int, messages: int, cpus: set[int] | None, idle_s: float = 3.0
) -> FloodResult:
    """One flood against the broker on `port` (see the module docstring)."""
    expected = publishers * messages
    go, done = _CTX.Event(), _CTX.Event()
    sub_end, sub_child = _CTX.Pipe(duplex=False)
    pub_end, pub_child = _CTX.Pipe(duplex=False)
    processes = [
        _CTX.Process(
            target=_run_subscriber, args=(port, expected, go, done, idle_s, sub_child, cpus), daemon=True
        ),
        _CTX.Process(
            target=_run_publishers, args=(port, publishers, messages, go, pub_child, cpus), daemon=True
        ),
    ]
    try:
        for process, end in zip(processes, (sub_end, pub_end), strict=True):
            process.start()
            if not end.poll(60) or end.recv() != "ready":
                raise RuntimeError("a flood process did not connect within 60 s")
        pub_cpu0 = cpu_seconds(processes[1].pid or 0)
        go.set()
        if not pub_end.poll(go_timeout(expected) + 10):
            raise RuntimeError("the publishers did not finish")
        sent, _, lost = pub_end.recv()
        pub_cpu = cpu_seconds(processes[1].pid or 0) - pub_cpu0
        done.set()
        if not sub_end.poll(go_timeout(expected) + idle_s + 10):
            raise RuntimeError("the subscriber did not finish")
        delivered, seconds, sub_cpu, sub_lost = sub_end.recv()
    finally:
        for process in processes:
            if process.pid is None:
                continue
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
    span = max(seconds, 1e-6)
    return FloodResult(
        sent=sent,
        delivered=delivered,
        seconds=seconds,
        subscriber_cpu_pct=100.0 * sub_cpu / span,
        publisher_cpu_pct=100.0 * pub_cpu / span,
        publishers_lost=lost,
        subscriber_lost=sub_lost,
    )
