"""One load-generator process: a group of publishers, subscribers or idle clients on one uvloop.

The parent talks to it over a Pipe:
    worker -> ("ready", connected, errors)       once every client is connected (and subscribed)
    parent -> ("go", start, stop, end_by)         publishers publish in [start, stop); everyone reports
                                                  by end_by at the latest (monotonic clock, system-wide)
    parent -> ("expect", n)                       subscribers: each is owed n messages (what the publishers
                                                  reported); report once all have them, or after
                                                  `idle_gap_s` without any delivery, or at end_by
    parent -> ("close",)                          idle clients: disconnect and report
    worker -> ("done", report dict) | ("failed", message)

Subscribers add what they receive to their slot of a shared counter array, which the publishers' `Limiter`
reads across processes. Every `sample_interval_s` the worker samples its counters and its own CPU time, so
the parent can compute rates over exactly the measurement window.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from bench import frames, net
from bench.loadgen.clients import ClientGroup, IdleClient, Limiter, MqttClient, Publisher, Subscriber
from bench.sysinfo import raise_fd_limit

#: frames per pre-built publish blob (QoS 0: identical frames; QoS 1: consecutive packet ids)
BLOB_FRAMES = 4096


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker process does."""

    role: str  # "publish", "subscribe" or "idle"
    port: int
    clients: int
    client_prefix: str
    qos: int = 0
    topics: tuple[str, ...] = ("bench/t",)
    subscription: str = "bench/t"
    payload_size: int = 64
    window: int = 64
    ahead: int = 1000
    subscribers_total: int = 1
    publisher_share: float = 1.0  # this process's share of all publishers (several publisher processes)
    shared_index: int = 0
    connect_concurrency: int = 200
    connect_timeout_s: float = 60.0
    keepalive: int = 600
    cpus: tuple[int, ...] | None = None
    sample_interval_s: float = 0.02
    idle_gap_s: float = 2.0
    blob_frames: int = BLOB_FRAMES  # frames per pre-built blob of each topic (more than `window`)


@dataclass
class WorkerReport:
    """What a worker sends back: totals and (time, sent, acked, received, cpu seconds) samples."""

    role: str
    connected: int
    sent: int = 0
    acked: int = 0
    received: int = 0
    per_client_min: int = 0
    per_client_max: int = 0
    stalls: int = 0
    redelivered: int = 0  # PUBLISH packets received with the DUP flag (not counted in `received`)
    errors: list[str] = field(default_factory=list)
    samples: list[tuple[float, int, int, int, float]] = field(default_factory=list)


def worker_main(spec: WorkerSpec, conn: Connection, shared: Sequence[int] | Any) -> None:
    """Process entry point (spawned): pin, raise the fd limit, run the group on uvloop, report."""
    try:
        if spec.cpus:
            os.sched_setaffinity(0, set(spec.cpus))
        raise_fd_limit()
        import uvloop

        report = uvloop.run(_run(spec, conn, shared))
        conn.send(("done", asdict(report)))
    except BaseException as exc:  # the parent must hear about any failure, then the process ends
        with contextlib.suppress(OSError, ValueError):
            conn.send(("failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"))
    finally:
        conn.close()


async def _run(spec: WorkerSpec, conn: Connection, shared: Any) -> WorkerReport:
    loop = asyncio.get_running_loop()
    group = ClientGroup()
    factory = _factory(spec, group, shared)
    clients = await _connect_all(factory, spec, group)
    conn.send(("ready", len(clients), group.errors[:5]))
    command = await loop.run_in_executor(None, conn.recv)
    try:
        if command[0] == "close":
            return WorkerReport(role=spec.role, connected=len(clients), errors=group.errors)
        _, start, stop, end_by = command
        samples: list[tuple[float, int, int, int, float]] = []
        sampler = asyncio.create_task(_sample(group, samples, spec.sample_interval_s, end_by))
        await _sleep_until(start)
        if spec.role == "publish":
            await _publish(clients, stop, end_by)
        else:
            expected = loop.run_in_executor(None, _expected_count, conn, end_by)
            subscribers = [c for c in clients if isinstance(c, Subscriber)]
            await _until_delivered(subscribers, expected, group, spec, end_by)
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        samples.append(_sample_now(group))
        counts = [getattr(c, "received", 0) for c in clients]
        limiters = {id(c.limiter): c.limiter for c in clients if isinstance(c, Publisher)}
        return WorkerReport(
            role=spec.role,
            connected=len(clients),
            sent=group.sent,
            acked=group.acked,
            received=group.received,
            per_client_min=min(counts, default=0),
            per_client_max=max(counts, default=0),
            stalls=sum(limiter.stalls for limiter in limiters.values()),
            redelivered=sum(c.scanner.redeliveries for c in clients if isinstance(c, Subscriber)),
            errors=group.errors,
            samples=samples,
        )
    finally:
        for client in clients:
            client.close()
        await asyncio.sleep(0.05)


def _factory(spec: WorkerSpec, group: ClientGroup, shared: Any) -> Callable[[int], MqttClient]:
    """A function making client number i of this worker."""
    prefix = spec.client_prefix
    if spec.role == "idle":
        return lambda i: IdleClient(group, frames.connect(f"{prefix}{i}", spec.keepalive))
    if spec.role == "subscribe":
        header, length, pid_offset = frames.publish_layout(spec.topics[0], spec.payload_size, spec.qos)
        subscribe = frames.subscribe(1, spec.subscription, spec.qos)
        slot = spec.shared_index

        def on_received(n: int) -> None:
            group.received += n
            group.last_receive = time.monotonic()
            shared[slot] += n

        return lambda i: Subscriber(
            group,
            frames.connect(f"{prefix}{i}", spec.keepalive),
            subscribe,
            header,
            length,
            pid_offset,
            on_received,
        )
    if spec.role == "publish":
        share = spec.publisher_share
        # this process's publishers keep their share of the lead over their share of the deliveries
        limiter = Limiter(
            max(1, round(spec.ahead * share)), spec.subscribers_total, lambda: int(sum(shared) * share)
        )
        payload = bytes(spec.payload_size)
        blobs = [frames.publish_run(topic, payload, spec.qos, 1, spec.blob_frames) for topic in spec.topics]
        return lambda i: Publisher(
            group,
            frames.connect(f"{prefix}{i}", spec.keepalive),
            blobs[i % len(blobs)],
            len(blobs[i % len(blobs)]) // spec.blob_frames,  # its own topic's frames: topics differ in length
            spec.qos,
            spec.window,
            limiter,
        )
    raise ValueError(f"unknown role {spec.role!r}")


async def _connect_all(
    factory: Callable[[int], MqttClient], spec: WorkerSpec, group: ClientGroup
) -> list[MqttClient]:
    """Connect (and subscribe) every client, `connect_concurrency` at a time, within `connect_timeout_s`."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(spec.connect_concurrency)
    deadline = time.monotonic() + spec.connect_timeout_s

    async def one(i: int) -> MqttClient | None:
        async with gate:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                _, client = await asyncio.wait_for(
                    loop.create_connection(lambda: factory(i), net.HOST, spec.port), timeout=min(left, 15)
                )
                await asyncio.wait_for(asyncio.shield(client.ready), timeout=min(left, 15))
                return client
            except (OSError, TimeoutError, ConnectionError) as exc:
                group.error(f"client {i}: {type(exc).__name__}: {exc}")
                return None

    results = await asyncio.gather(*(one(i) for i in range(spec.clients)))
    return [client for client in results if client is not None]


async def _publish(clients: list[MqttClient], stop: float, end_by: float) -> None:
    """Run the publishers until `stop`, then wait (until `end_by`) until everything written has left the
    process and every PUBACK owed has arrived: what is still buffered when the process exits never reaches
    the broker, and would count as lost."""
    publishers = [c for c in clients if isinstance(c, Publisher)]
    for publisher in publishers:
        publisher.start(stop)
    await _sleep_until(stop)
    for publisher in publishers:
        publisher.running = False
    while time.monotonic() < end_by:
        if all(p.closed or (p.flushed() and (p.qos == 0 or p.acked >= p.sent)) for p in publishers):
            break
        await asyncio.sleep(0.01)


def _expected_count(conn: Connection, end_by: float) -> int | None:
    """Wait (in a thread) for the parent's ("expect", n); None if it does not come by `end_by`."""
    if conn.poll(max(end_by - time.monotonic(), 0)):
        message = conn.recv()
        if message[0] == "expect":
            return int(message[1])
    return None


async def _until_delivered(
    subscribers: list[Subscriber],
    expected: asyncio.Future[int | None],
    group: ClientGroup,
    spec: WorkerSpec,
    end_by: float,
) -> None:
    """Receive until every subscriber has what it is owed, or nothing arrived for `idle_gap_s` once the
    count is known (a broker that dropped messages), or `end_by`."""
    while time.monotonic() < end_by:
        if expected.done():
            owed = expected.result()
            if owed is not None and all(s.received >= owed for s in subscribers):
                return
            if time.monotonic() - group.last_receive >= spec.idle_gap_s:
                return
        await asyncio.sleep(0.01)


async def _sample(group: ClientGroup, samples: list, interval: float, end_by: float) -> None:
    while time.monotonic() < end_by:
        samples.append(_sample_now(group))
        await asyncio.sleep(interval)


def _sample_now(group: ClientGroup) -> tuple[float, int, int, int, float]:
    return (time.monotonic(), group.sent, group.acked, group.received, time.process_time())


async def _sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
