"""asyncio Protocols of the load generator: subscribers, publishers and idle clients.

Nothing here encodes a packet on the hot path: publishers write slices of blobs built before the run, and
subscribers count with `FrameScanner` and write the PUBACK frames it assembles. One `ClientGroup` holds the
counters of all clients of a worker process.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from bench import frames
from bench.stream import FrameScanner

_PINGRESP_HEADER = bytes((0xD0, 0))  # idle clients expect nothing but their CONNACK (parsed in full)
_PUBACK_HEADER = bytes((frames.PUBACK, 2))


@dataclass
class ClientGroup:
    """Counters shared by the clients of one worker process."""

    sent: int = 0
    acked: int = 0
    received: int = 0
    last_receive: float = 0.0  # monotonic time of the last PUBLISH received by any subscriber
    errors: list[str] = field(default_factory=list)

    def error(self, message: str) -> None:
        """Record a client error (the first few only: they go into the results)."""
        if len(self.errors) < 20:
            self.errors.append(message)


class MqttClient(asyncio.Protocol):
    """Sends CONNECT once connected; each subclass decides what follows the CONNACK."""

    def __init__(self, group: ClientGroup, connect_frame: bytes, scanner: FrameScanner) -> None:
        self.group = group
        self.connect_frame = connect_frame
        self.scanner = scanner
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._closing = False

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # a stream transport: it writes
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=256 * 1024)
        transport.write(self.connect_frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"connection lost before ready: {exc}"))
        elif not self._closing:
            self.group.error(f"the broker closed a connection during the run ({exc or 'EOF'})")

    def _check_connack(self) -> bool:
        """True once a successful CONNACK arrived; fails `ready` on a refused one."""
        code = self.scanner.connack_code
        if code is None:
            return False
        if code != 0 and not self.ready.done():
            self.ready.set_exception(ConnectionRefusedError(f"CONNACK return code {code}"))
        return code == 0

    def close(self) -> None:
        """DISCONNECT and close."""
        self._closing = True
        if self.transport is not None and not self.closed:
            self.transport.write(frames.DISCONNECT_FRAME)
            self.transport.close()


class Subscriber(MqttClient):
    """Subscribes once connected, then counts the PUBLISH frames it receives and PUBACKs QoS 1 ones."""

    def __init__(
        self,
        group: ClientGroup,
        connect_frame: bytes,
        subscribe_frame: bytes,
        publish_header: bytes,
        publish_len: int,
        pid_offset: int | None,
        on_received: Callable[[int], None],
    ) -> None:
        super().__init__(group, connect_frame, FrameScanner(publish_header, publish_len, pid_offset))
        self.subscribe_frame = subscribe_frame
        self.on_received = on_received
        self.received = 0
        self._subscribe_sent = False
        self._subscribed = False

    def data_received(self, data: bytes) -> None:
        scanner = self.scanner
        before = scanner.publishes
        acks = scanner.feed(data)
        if acks:
            assert self.transport is not None  # data comes after connection_made
            self.transport.write(acks)
        got = scanner.publishes - before
        if got:
            self.received += got
            self.on_received(got)
        if not self._subscribed:
            self._progress_handshake()

    def _progress_handshake(self) -> None:
        if self.ready.done():
            return
        if not self._check_connack():
            return
        if not self.scanner.counts[9]:
            if not self._subscribe_sent:
                self._subscribe_sent = True
                assert self.transport is not None
                self.transport.write(self.subscribe_frame)
            return
        self._subscribed = True
        code = self.scanner.suback_codes[-1]
        if code == 0x80:
            self.ready.set_exception(ConnectionRefusedError("SUBACK refused the subscription"))
        else:
            self.ready.set_result(None)


class Limiter:
    """Keeps the publishers of a worker at most `ahead` messages ahead of the average subscriber.

    Without it a broker that reads faster than it delivers queues without bound (or drops), and the run
    measures its queue rather than its throughput. `delivered()` reads the subscribers' shared counters. If
    the subscribers make no progress for `stall_s` (a broker that drops QoS 0 messages), the missing messages
    are written off (counted in `stalls`) and the publishers go on; the drain still waits for them.
    """

    def __init__(
        self, ahead: int, subscribers: int, delivered: Callable[[], int], stall_s: float = 0.25
    ) -> None:
        self.ahead = ahead
        self.subscribers = max(subscribers, 1)
        self.delivered = delivered
        self.stall_s = stall_s
        self.written_off = 0
        self.stalls = 0  # times the publishers resumed after `stall_s` without any delivery
        self._last_seen = -1
        self._last_progress = time.monotonic()

    def allowance(self, sent: int) -> int:
        """How many more messages the publishers may send now, given `sent` so far."""
        delivered = self.delivered() // self.subscribers
        allowed = self.ahead - (sent - delivered - self.written_off)
        if allowed > 0:
            return allowed
        now = time.monotonic()
        if delivered != self._last_seen:
            self._last_seen, self._last_progress = delivered, now
        elif now - self._last_progress > self.stall_s:
            self.written_off += -allowed + self.ahead // 2
            self.stalls += 1
            self._last_progress = now
            return self.ahead // 2
        return 0


class Publisher(MqttClient):
    """Writes pre-built PUBLISH frames as fast as flow control allows.

    QoS 0: slices of a blob of identical frames, while the transport is not paused and the limiter allows.
    QoS 1: frames with consecutive packet ids sliced from a blob of `blob_frames` frames, at most `window`
    unacknowledged; each batch of PUBACKs releases the next batch of PUBLISHes.
    """

    def __init__(
        self,
        group: ClientGroup,
        connect_frame: bytes,
        blob: bytes,
        frame_len: int,
        qos: int,
        window: int,
        limiter: Limiter,
    ) -> None:
        super().__init__(group, connect_frame, FrameScanner(_PUBACK_HEADER, 4))
        self.blob = memoryview(blob)
        self.frame_len = frame_len
        self.blob_frames = len(blob) // frame_len
        self.qos = qos
        self.window = window
        self.limiter = limiter
        self.sent = 0
        self.acked = 0
        self.running = False
        self.stop_at = 0.0
        self._paused = False
        self._retry: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    def start(self, stop_at: float) -> None:
        """Publish until the monotonic clock reaches `stop_at`."""
        self.stop_at = stop_at
        self.running = True
        self._pump()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._pump()

    def data_received(self, data: bytes) -> None:
        scanner = self.scanner
        before = scanner.counts[4]
        scanner.feed(data)
        acked = scanner.counts[4] - before
        if acked:
            self.acked += acked
            self.group.acked += acked
            if self.qos:
                self._pump()
        if not self.ready.done() and self._check_connack():
            self.ready.set_result(None)

    def flushed(self) -> bool:
        """True when nothing written is still waiting in the transport's buffer."""
        return self.transport is None or self.transport.get_write_buffer_size() == 0

    def _pump(self, from_timer: bool = False) -> None:
        if from_timer:
            self._retry = None
        if not self.running or self._paused or self.closed:
            return
        if time.monotonic() >= self.stop_at:
            self.running = False
            return
        n = min(self.limiter.allowance(self.group.sent), self.blob_frames)
        if self.qos:
            n = min(n, self.window - (self.sent - self.acked))
            if n <= 0:
                if self.sent - self.acked < self.window:  # blocked by the limiter, not by the window
                    self._retry_later()
                return
            self._write_frames(n)
            return
        if n <= 0:
            self._retry_later()
            return
        assert self.transport is not None
        self.transport.write(self.blob[: n * self.frame_len])
        self.sent += n
        self.group.sent += n
        self._loop.call_soon(self._pump)

    def _write_frames(self, n: int) -> None:
        """Write the next `n` QoS 1 frames (consecutive packet ids, wrapping around the blob)."""
        start = self.sent % self.blob_frames
        first = min(n, self.blob_frames - start)
        length = self.frame_len
        transport = self.transport
        assert transport is not None
        transport.write(self.blob[start * length : (start + first) * length])
        if first < n:
            transport.write(self.blob[: (n - first) * length])
        self.sent += n
        self.group.sent += n

    def _retry_later(self) -> None:
        if self._retry is None:
            self._retry = self._loop.call_later(0.002, self._pump, True)


class IdleClient(MqttClient):
    """Connects and then does nothing (keepalive is set large in its CONNECT)."""

    def __init__(self, group: ClientGroup, connect_frame: bytes) -> None:
        super().__init__(group, connect_frame, FrameScanner(_PINGRESP_HEADER, 2))

    def data_received(self, data: bytes) -> None:
        self.scanner.feed(data)
        if not self.ready.done() and self._check_connack():
            self.ready.set_result(None)
