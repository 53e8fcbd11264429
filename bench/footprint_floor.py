"""The floor under any uvloop broker's memory per connection: a server that only answers CONNACK.

    python -m bench.footprint_floor PORT [--poll]

Each connection is a uvloop transport (with its libuv handle and its entry in the loop's map of transports)
and a protocol object with one slot, nothing else: whatever a broker keeps per connection comes on top.
The footprint benchmark runs it as a peer in the idle-connections table.

``--poll`` measures what a transport of the broker's own would start from instead: no uvloop transport,
each accepted socket's descriptor watched with ``loop.add_reader`` (a libuv poll handle and the loop's
callback handle) and read and written with ``os.read``/``os.write`` by an object with one slot.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import cast

from bench.brokers.base import BrokerUnderTest

CONNACK = bytes((0x20, 2, 0, 0))


class _AnswerConnect(asyncio.Protocol):
    __slots__ = ("transport",)

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # a stream transport: it writes
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if data[0] & 0xF0 == 0x10:  # CONNECT
            self.transport.write(CONNACK)
        elif data[0] == 0xE0:  # DISCONNECT
            self.transport.close()


class _PolledConnection:
    """One accepted socket watched by the loop: its descriptor is the only thing kept."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def readable(self) -> None:
        try:
            data = os.read(self.fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data and data[0] & 0xF0 == 0x10:  # CONNECT
            os.write(self.fd, CONNACK)
        elif not data or data[0] == 0xE0:  # closed, or DISCONNECT
            asyncio.get_running_loop().remove_reader(self.fd)
            os.close(self.fd)


async def _serve_polled(port: int) -> None:
    loop = asyncio.get_running_loop()
    listening = socket.create_server(("127.0.0.1", port), backlog=1024)
    listening.setblocking(False)

    def accept() -> None:
        for _ in range(64):
            try:
                sock, _address = listening.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _PolledConnection(sock.detach())
            loop.add_reader(connection.fd, connection.readable)

    loop.add_reader(listening.fileno(), accept)
    await asyncio.Event().wait()


async def _serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_AnswerConnect, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


class TransportFloor(BrokerUnderTest):
    """`python -m bench.footprint_floor` as a broker the benchmark can start, measure and stop (``poll``:
    with ``--poll``)."""

    def __init__(self, poll: bool = False) -> None:
        self.poll = poll
        self.name = "uvloop-poll-floor" if poll else "uvloop-floor"

    @property
    def label(self) -> str:
        if self.poll:
            return "uvloop poll floor (add_reader + 1-slot object)"
        return "uvloop floor (transport + 1-slot protocol)"

    def command(self, port: int, workdir: Path) -> list[str]:
        return [sys.executable, "-m", "bench.footprint_floor", str(port), *(["--poll"] if self.poll else [])]

    def env(self) -> dict[str, str] | None:
        return dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))

    def version(self) -> str:
        import uvloop

        return f"uvloop {uvloop.__version__}"


if __name__ == "__main__":
    import uvloop

    uvloop.run((_serve_polled if "--poll" in sys.argv[2:] else _serve)(int(sys.argv[1])))
