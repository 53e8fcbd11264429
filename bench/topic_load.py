"""QoS 1 publishers and a PINGREQ probe for the topic benchmarks (many topics, many devices).

`publish_rounds` runs in a spawned process pinned to the load generator's CPUs: each connection publishes its
share of the messages (a topic each, pre-encoded with `bench.frames`) keeping `window` unacknowledged, and the
figure is PUBACKs per second from the first PUBLISH to the last PUBACK. `Pinger` runs in its own process and
measures PINGREQ round trips every few milliseconds while the rest of the benchmark works.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from bench import frames, net

__all__ = ["Pinger", "PublishResult", "device_fleet", "publish_rounds"]


@dataclass(frozen=True)
class PublishResult:
    """One round: PUBACKs received, seconds from the first PUBLISH to the last PUBACK, load generator CPU."""

    acked: int
    seconds: float
    cpu_seconds: float
    connect_seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.acked / self.seconds if self.seconds else 0.0


class _Connection(asyncio.Protocol):
    """One MQTT 3.1.1 client sending pre-encoded QoS 1 PUBLISH frames, at most `window` unacknowledged."""

    def __init__(
        self, client_id: str, messages: list[bytes], window: int, done: asyncio.Future[None]
    ) -> None:
        self.client_id = client_id
        self.messages = messages
        self.window = window
        self.done = done
        self.connected: asyncio.Future[None] = done.get_loop().create_future()
        self.sent = 0
        self.acked = 0
        self._buffer = b""
        self._transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.WriteTransport, transport)  # (uvloop's is no subclass of it)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._transport.write(frames.connect(self.client_id))

    def start(self) -> None:
        self._send()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer + data
        if not self.connected.done():
            if len(buffer) < 4:
                self._buffer = buffer
                return
            if buffer[0] != frames.CONNACK or buffer[3] != 0:
                self.connected.set_exception(RuntimeError(f"CONNACK refused: {buffer[:4]!r}"))
                return
            self.connected.set_result(None)
            buffer = buffer[4:]
        whole = len(buffer) // 4 * 4  # nothing but PUBACKs comes now: 4 bytes each
        if whole and buffer[0] != frames.PUBACK:
            raise RuntimeError(f"{self.client_id}: expected PUBACKs, got {buffer[:8]!r}")
        self.acked += whole // 4
        self._buffer = buffer[whole:]
        if self.acked >= len(self.messages):
            if not self.done.done():
                self.done.set_result(None)
            return
        if self.connected.done() and self.sent:
            self._send()

    def _send(self) -> None:
        room = self.acked + self.window - self.sent
        if room <= 0 or self.sent >= len(self.messages) or self._transport is None:
            return
        upto = min(len(self.messages), self.sent + room)
        self._transport.write(b"".join(self.messages[self.sent : upto]))
        self.sent = upto

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(
                RuntimeError(f"{self.client_id}: connection lost after {self.acked} PUBACKs")
            )


def _factory(connection: _Connection) -> Callable[[], _Connection]:
    return lambda: connection


def _encode(topics: Sequence[str], payload: bytes) -> list[bytes]:
    return [frames.publish(topic, payload, 1, number % 65535 + 1) for number, topic in enumerate(topics)]


async def _run(port: int, shares: list[list[str]], payload: bytes, window: int) -> PublishResult:
    loop = asyncio.get_running_loop()
    began_connect = time.perf_counter()
    connections: list[_Connection] = []
    for number, share in enumerate(shares):
        done: asyncio.Future[None] = loop.create_future()
        connection = _Connection(f"bench-{os.getpid()}-{number}", _encode(share, payload), window, done)
        await loop.create_connection(_factory(connection), net.HOST, port)
        connections.append(connection)
        if len(connections) % 500 == 0:
            await asyncio.gather(*(c.connected for c in connections[-500:]))
    await asyncio.wait_for(asyncio.gather(*(c.connected for c in connections)), 120)
    connect_seconds = time.perf_counter() - began_connect
    cpu_before = time.process_time()
    began = time.perf_counter()
    for connection in connections:
        connection.start()
    await asyncio.wait_for(asyncio.gather(*(c.done for c in connections)), 1800)
    seconds = time.perf_counter() - began
    for connection in connections:
        if connection._transport is not None:
            connection._transport.write(frames.DISCONNECT_FRAME)
            connection._transport.close()
    acked = sum(c.acked for c in connections)
    return PublishResult(acked, seconds, time.process_time() - cpu_before, connect_seconds)


def _child(port: int, shares: list[list[str]], payload: bytes, window: int, cpus, result) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    from bench.sysinfo import raise_fd_limit

    raise_fd_limit()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        result.send(asyncio.run(_run(port, shares, payload, window)))
    except Exception as error:  # the parent raises it
        result.send(RuntimeError(f"the publishers failed: {error!r}"))


def publish_rounds(
    port: int, shares: list[list[str]], payload: bytes, window: int = 64, cpus: set[int] | None = None
) -> PublishResult:
    """Publish each share's topics once, in order, on a connection of its own (a spawned process)."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(port, shares, payload, window, cpus, child), daemon=True)
    process.start()
    try:
        if not parent.poll(3600):
            raise RuntimeError("the publishers did not finish within an hour")
        answer = parent.recv()
        if isinstance(answer, Exception):
            raise answer
        return answer
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()


def device_fleet(devices: int, messages: int, prefix: str = "fleet") -> list[list[str]]:
    """One share per device: `messages` publishes to its own topic."""
    return [[f"{prefix}/device-{number:05}/telemetry"] * messages for number in range(devices)]


# -- PINGREQ probe -----------------------------------------------------------------------------------------


def _ping_main(port: int, interval_s: float, cpus, stop, result) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    with contextlib.suppress(PermissionError, OSError):
        os.nice(-10)  # the probe must measure the broker, not wait for a CPU itself
    rtts: list[float] = []
    with socket.create_connection((net.HOST, port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(frames.connect(f"bench-ping-{os.getpid()}", keepalive=0))
        if sock.recv(4)[:1] != bytes((frames.CONNACK,)):
            raise RuntimeError("the probe's CONNECT was refused")
        while not stop.is_set():
            began = time.perf_counter()
            sock.sendall(frames.PINGREQ_FRAME)
            got = b""
            while len(got) < 2:
                chunk = sock.recv(2 - len(got))
                if not chunk:
                    raise RuntimeError("the broker closed the probe's connection")
                got += chunk
            rtts.append(time.perf_counter() - began)
            time.sleep(interval_s)
        sock.sendall(frames.DISCONNECT_FRAME)
    result.send(rtts)


class Pinger:
    """PINGREQ round trips every `interval_s` in a process of its own, between `start()` and `stop()`."""

    def __init__(self, port: int, interval_s: float = 0.005, cpus: set[int] | None = None) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._parent, child = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_ping_main, args=(port, interval_s, cpus, self._stop, child), daemon=True
        )

    def start(self) -> Pinger:
        self._process.start()
        return self

    def stop(self) -> list[float]:
        """The round trips measured, in seconds."""
        self._stop.set()
        try:
            return self._parent.recv() if self._parent.poll(60) else []
        finally:
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()


def percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
