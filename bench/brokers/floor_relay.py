"""The least a Python broker on uvloop does per message: a relay that frames, acknowledges and forwards.

    python bench/brokers/floor_relay.py --port PORT --log FILE [--window 64]

It answers CONNECT (MQTT 3.1.1 or 5), SUBSCRIBE and PINGREQ, and for each PUBLISH it reads: the frame goes to
every subscriber as received (one protocol version for all, nothing converted; no topic matched), at QoS 1
and 2 with a packet id of the subscriber's own and at most `--window` unacknowledged (64, as the brokers
measured beside it; the rest wait in a queue), and, at QoS 1, a PUBACK goes to its publisher. As a persisting
broker must, it acknowledges only after the turn's PUBLISH frames are written to `--log` (one `write` per
loop turn, no fsync) and writes each connection's replies and deliveries once per turn. Nothing is
validated, stored or counted: it is a floor to read a broker against (the system calls and the loop's turns
a Python process pays for the same sockets and frames), not a broker.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections import deque
from typing import cast

import uvloop

_CONNACK_V4 = bytes((0x20, 2, 0, 0))
_CONNACK_V5 = bytes((0x20, 3, 0, 0, 0))
_PINGRESP = bytes((0xD0, 0))
_CONNECT, _PUBLISH, _PUBACK, _SUBSCRIBE, _PINGREQ, _DISCONNECT = 1, 3, 4, 8, 12, 14


class Turn:
    """What one loop turn owes: PUBLISH frames to log, then every connection's pending bytes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, log_fd: int, window: int) -> None:
        self.loop = loop
        self.log_fd = log_fd
        self.window = window
        self.logged: list[bytes] = []
        self.owed: list[Relay] = []
        self.subscribers: list[Relay] = []
        self.scheduled = False

    def owe(self, relay: Relay) -> None:
        """`relay` has bytes to write at the end of this turn."""
        self.owed.append(relay)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Log the turn's frames, then write what every connection is owed."""
        self.scheduled = False
        if self.logged:
            os.write(self.log_fd, b"".join(self.logged))
            self.logged.clear()
        owed, self.owed = self.owed, []
        for relay in owed:
            relay.flush()


class Relay(asyncio.Protocol):
    """One client connection."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.buffer = bytearray()
        self.pending: list[bytes | bytearray] = []
        self.next_id = 0
        self.in_flight = 0
        self.waiting: deque[tuple[bytes, int]] = deque()
        self.level = 4
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream transport: it writes

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.turn.subscribers:
            self.turn.subscribers.remove(self)

    def send(self, data: bytes | bytearray) -> None:
        """Queue `data` for this turn's write to this connection."""
        if not self.pending:
            self.turn.owe(self)
        self.pending.append(data)

    def flush(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.pending))
        self.pending.clear()

    def deliver(self, received: bytes, id_at: int) -> None:
        """Send a QoS 1 or 2 frame with a packet id of this subscriber's own, once its window has room."""
        if self.in_flight >= self.turn.window:
            self.waiting.append((received, id_at))
            return
        self.in_flight += 1
        self.next_id = self.next_id % 0xFFFF + 1
        delivery = bytearray(received)
        delivery[id_at] = self.next_id >> 8
        delivery[id_at + 1] = self.next_id & 0xFF
        self.send(delivery)

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        size = len(buf)
        pos = 0
        while pos < size:
            start = pos + 1
            length = shift = 0
            while start < size:
                digit = buf[start]
                start += 1
                length |= (digit & 0x7F) << shift
                shift += 7
                if digit < 0x80:
                    break
            else:
                break
            end = start + length
            if end > size:
                break
            self._packet(buf[pos] >> 4, buf[pos] & 0x0F, buf, start, end, pos)
            pos = end
        del buf[:pos]

    def _packet(self, kind: int, flags: int, buf: bytearray, start: int, end: int, frame: int) -> None:
        if kind == _PUBLISH:
            qos = flags >> 1 & 3
            id_at = start + 2 + (buf[start] << 8 | buf[start + 1])
            received = bytes(buf[frame:end])
            self.turn.logged.append(received)
            if qos:
                self.send(bytes((0x40, 2, buf[id_at], buf[id_at + 1])))
            for subscriber in self.turn.subscribers:
                if qos:
                    subscriber.deliver(received, id_at - frame)
                else:
                    subscriber.send(received)
        elif kind == _PUBACK:
            self.in_flight -= 1
            if self.waiting:
                self.deliver(*self.waiting.popleft())
        elif kind == _CONNECT:
            self.level = buf[start + 6]  # after the protocol name "MQTT" and its 2-byte length
            self.send(_CONNACK_V5 if self.level == 5 else _CONNACK_V4)
        elif kind == _SUBSCRIBE:
            at = start + 2 + (1 + buf[start + 2] if self.level == 5 else 0)  # v5: properties (< 128 bytes)
            filters = 0
            while at < end:
                at += 2 + (buf[at] << 8 | buf[at + 1]) + 1
                filters += 1
            head = bytes((buf[start], buf[start + 1])) + (b"\x00" if self.level == 5 else b"")
            body = head + bytes((1,)) * filters  # every filter granted QoS 1
            self.send(bytes((0x90, len(body))) + body)
            self.turn.subscribers.append(self)
        elif kind == _PINGREQ:
            self.send(_PINGRESP)
        elif kind == _DISCONNECT and self.transport is not None:
            self.transport.close()


async def serve(port: int, log_path: str, window: int) -> None:
    loop = asyncio.get_running_loop()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    turn = Turn(loop, log_fd, window)
    server = await loop.create_server(lambda: Relay(turn), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True, help="file the PUBLISH frames are appended to")
    parser.add_argument("--window", type=int, default=64, help="QoS 1 and 2 deliveries in flight to a client")
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.log, args.window))


if __name__ == "__main__":
    main()
