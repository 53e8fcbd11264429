"""The soak's load: devices publishing QoS 1 at a steady rate, subscribers, and reconnect churn.

One process runs every device, another every subscriber (`run_load` starts both), each an asyncio loop of
plain `asyncio.Protocol`s speaking MQTT 3.1.1 through `bench.frames` (not the broker's codec). Devices keep
persistent sessions (clean session 0) and publish one QoS 1 message per `interval_s` to
`soak/g<group>/<device>/telemetry`, spread evenly over the interval; every second `churn_per_s` of them
drop their connection (half with DISCONNECT, half by closing the socket) and come back 1-3 s later, taken
in rounds (`Rotation`): every device drops once per `devices / churn_per_s` seconds, so that after one
round every session has been resumed at least once (counted as `returned`), where picking devices at
random each second would leave some untouched for many rounds (after four, about one in fifty).
Subscribers: one on `soak/+/+/telemetry` at QoS 1 (an ingester that sees everything) and one per group at
QoS 0 (dashboards). Counters go to shared memory once a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import random
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.sharedctypes import SynchronizedArray
from multiprocessing.synchronize import Event
from typing import Generic, Protocol, TypeVar, cast

from bench import frames

HOST = "127.0.0.1"
GROUP_SIZE = 100
TICKS_PER_INTERVAL = 10

PUBLISHED, ACKED, DELIVERED, RECONNECTS, FAILED_CONNECTS, CONNECTED, RETURNED = range(7)
COUNTERS = ("published", "acked", "delivered", "reconnects", "failed_connects", "connected", "returned")


@dataclass(frozen=True)
class SoakLoad:
    """What the load generator does (see the module docstring)."""

    port: int
    devices: int = 5000
    interval_s: float = 1.0
    payload_bytes: int = 120
    churn_per_s: int = 25
    group_subscribers: bool = True

    @property
    def groups(self) -> int:
        return max(1, (self.devices + GROUP_SIZE - 1) // GROUP_SIZE)


def device_topic(index: int) -> str:
    return f"soak/g{index // GROUP_SIZE}/dev-{index:05d}/telemetry"


class _Client(asyncio.Protocol):
    """Frames in, callbacks out: CONNACK, SUBACK, PUBACK and PUBLISH, parsed from the byte stream."""

    def __init__(self, connect: bytes, on_lost: Callable[[_Client], None]) -> None:
        self.connect_frame = connect
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.connected = False
        self.buffer = b""

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # a stream transport: it writes
        self.transport = transport
        transport.write(self.connect_frame)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        pos, end = 0, len(buffer)
        while pos + 2 <= end:
            length, shift, i = 0, 0, pos + 1
            while i < end:
                byte = buffer[i]
                length |= (byte & 0x7F) << shift
                shift += 7
                i += 1
                if not byte & 0x80:
                    break
            else:
                break
            if i + length > end:
                break
            self.packet(buffer[pos] & 0xF0, buffer[pos], buffer, i, i + length)
            pos = i + length
        self.buffer = buffer[pos:]

    def packet(self, kind: int, first: int, buffer: bytes, start: int, stop: int) -> None:
        if kind == frames.CONNACK:
            self.connected = buffer[start + 1] == 0
            if not self.connected and self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connected = False
        self.transport = None
        self.on_lost(self)


class _Device(_Client):
    def __init__(self, index: int, on_lost: Callable[[_Client], None], counters: list[int]) -> None:
        super().__init__(frames.connect(f"soak-dev-{index:05d}", keepalive=60, clean_session=False), on_lost)
        self.index = index
        self.counters = counters
        self.next_id = 1
        self.sessions_resumed = 0

    def packet(self, kind: int, first: int, buffer: bytes, start: int, stop: int) -> None:
        if kind == frames.PUBACK:
            self.counters[ACKED] += 1
        else:
            super().packet(kind, first, buffer, start, stop)
            if kind == frames.CONNACK and self.connected and buffer[start] & 0x01:  # session present
                self.sessions_resumed += 1

    def publish(self, topic: bytes, payload: bytes) -> None:
        if not self.connected or self.transport is None:
            return
        packet_id = self.next_id
        self.next_id = packet_id % 65535 + 1
        body = topic + struct.pack("!H", packet_id) + payload
        self.transport.write(bytes((0x32,)) + frames.encode_remaining_length(len(body)) + body)
        self.counters[PUBLISHED] += 1


class _Subscriber(_Client):
    def __init__(self, name: str, topic_filter: str, qos: int, counters: list[int], on_lost) -> None:
        super().__init__(frames.connect(name, keepalive=60, clean_session=True), on_lost)
        self.subscribe_frame = frames.subscribe(1, topic_filter, qos)
        self.counters = counters

    def packet(self, kind: int, first: int, buffer: bytes, start: int, stop: int) -> None:
        if kind == frames.PUBLISH:
            self.counters[DELIVERED] += 1
            if first & 0x06:
                topic_end = start + 2 + int.from_bytes(buffer[start : start + 2], "big")
                assert self.transport is not None
                self.transport.write(bytes((frames.PUBACK, 2)) + buffer[topic_end : topic_end + 2])
        elif kind == frames.CONNACK:
            super().packet(kind, first, buffer, start, stop)
            if self.connected and self.transport is not None:
                self.transport.write(self.subscribe_frame)


class ChurnedDevice(Protocol):
    """What `Rotation` reads of a device: whether it is connected now."""

    connected: bool


DeviceT = TypeVar("DeviceT", bound=ChurnedDevice)


class Rotation(Generic[DeviceT]):
    """Which devices drop their connection: each once per round, in an order shuffled anew every round; a
    device still away at its turn (coming back from an earlier drop) goes at the next call instead."""

    def __init__(self, devices: Sequence[DeviceT], rng: random.Random) -> None:
        self.devices = devices
        self.rng = rng
        self.order: list[DeviceT] = []

    def next(self, count: int) -> list[DeviceT]:
        """Up to `count` connected devices whose turn it is."""
        taken: list[DeviceT] = []
        away: list[DeviceT] = []
        for _ in range(len(self.devices)):
            if len(taken) >= count:
                break
            if not self.order:
                self.order = self.rng.sample(list(self.devices), len(self.devices))
            device = self.order.pop()
            (taken if device.connected else away).append(device)
        self.order += away  # the end of the list is taken first
        return taken


async def _connect(loop: asyncio.AbstractEventLoop, port: int, client: _Client, counters: list[int]) -> None:
    try:
        await loop.create_connection(lambda: client, HOST, port)
    except OSError:
        counters[FAILED_CONNECTS] += 1
        client.on_lost(client)  # tries again later, like a device would


async def _devices(load: SoakLoad, shared: SynchronizedArray, stop: Event) -> None:
    loop = asyncio.get_running_loop()
    counters = [0] * len(COUNTERS)
    rng = random.Random(1)
    payload = bytes(rng.getrandbits(8) for _ in range(load.payload_bytes))
    topics = [struct.pack("!H", len(t)) + t.encode() for t in map(device_topic, range(load.devices))]
    pending: set[asyncio.Task] = set()

    def lost(client: _Client) -> None:
        if stop.is_set():
            return
        counters[RECONNECTS] += 1
        loop.call_later(1.0 + 2.0 * rng.random(), lambda: _spawn(_connect(loop, load.port, client, counters)))

    def _spawn(coro) -> None:
        task = loop.create_task(coro)
        pending.add(task)
        task.add_done_callback(pending.discard)

    devices = [_Device(i, lost, counters) for i in range(load.devices)]
    churn = Rotation(devices, rng)
    for start in range(0, len(devices), 200):  # connect in steps, as a fleet coming online
        await asyncio.gather(*(_connect(loop, load.port, d, counters) for d in devices[start : start + 200]))
    tick_s = load.interval_s / TICKS_PER_INTERVAL
    next_tick = loop.time()
    next_second = loop.time() + 1.0
    tick = 0
    while not stop.is_set():
        for device in devices[tick % TICKS_PER_INTERVAL :: TICKS_PER_INTERVAL]:
            device.publish(topics[device.index], payload)
        tick += 1
        if loop.time() >= next_second:
            next_second += 1.0
            for device in churn.next(load.churn_per_s):
                transport = device.transport
                if transport is not None:
                    if rng.random() < 0.5:
                        transport.write(frames.DISCONNECT_FRAME)
                        transport.close()
                    else:
                        transport.abort()
            counters[CONNECTED] = sum(1 for d in devices if d.connected)
            counters[RETURNED] = sum(1 for d in devices if d.sessions_resumed)
            shared[:] = counters
        next_tick += tick_s
        await asyncio.sleep(max(0.0, next_tick - loop.time()))
    shared[:] = counters
    for device in devices:
        if device.transport is not None:
            device.transport.write(frames.DISCONNECT_FRAME)
            device.transport.close()


async def _subscribers(load: SoakLoad, shared: SynchronizedArray, stop: Event) -> None:
    loop = asyncio.get_running_loop()
    counters = [0] * len(COUNTERS)

    def lost(client: _Client) -> None:
        if not stop.is_set():
            counters[RECONNECTS] += 1
            loop.call_later(1.0, lambda: loop.create_task(_connect(loop, load.port, client, counters)))

    subscribers = [_Subscriber("soak-ingest", "soak/+/+/telemetry", 1, counters, lost)]
    if load.group_subscribers:
        subscribers += [
            _Subscriber(f"soak-group-{g}", f"soak/g{g}/+/telemetry", 0, counters, lost)
            for g in range(load.groups)
        ]
    for subscriber in subscribers:
        await _connect(loop, load.port, subscriber, counters)
    while not stop.is_set():
        await asyncio.sleep(1.0)
        counters[CONNECTED] = sum(1 for s in subscribers if s.connected)
        shared[:] = counters
    shared[:] = counters
    for subscriber in subscribers:
        if subscriber.transport is not None:
            subscriber.transport.close()


def _process_main(role: str, load: SoakLoad, shared: SynchronizedArray, stop: Event, cpus) -> None:
    if cpus:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)
    import uvloop

    main = _devices if role == "devices" else _subscribers
    uvloop.run(main(load, shared, stop))


class LoadProcesses:
    """The two load processes; `totals()` adds up their counters (published, acked, delivered, ...)."""

    def __init__(self, load: SoakLoad, cpus: set[int] | None = None) -> None:
        context = mp.get_context("spawn")
        self.stop = context.Event()
        self.shared = {role: context.Array("q", len(COUNTERS)) for role in ("devices", "subscribers")}
        self.processes = [
            context.Process(
                target=_process_main, args=(role, load, self.shared[role], self.stop, cpus), daemon=True
            )
            for role in ("subscribers", "devices")
        ]

    def __enter__(self) -> LoadProcesses:
        for process in self.processes:
            process.start()
            time.sleep(0.5)  # subscribers first, so that they see the devices' first messages
        return self

    def totals(self) -> dict[str, int]:
        values = [list(array[:]) for array in self.shared.values()]
        return {name: sum(v[i] for v in values) for i, name in enumerate(COUNTERS)}

    def by_role(self, role: str) -> dict[str, int]:
        return dict(zip(COUNTERS, self.shared[role][:], strict=True))

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)
