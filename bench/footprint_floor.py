"""The floor under any uvloop broker's memory per connection: a server that only answers CONNACK.

    python -m bench.footprint_floor PORT

Each connection is a uvloop transport (with its libuv handle, its copy of the context, its entry in the
loop's map of transports) and a protocol object with one slot, nothing else: whatever a broker keeps per
connection comes on top. The footprint benchmark runs it as a peer in the idle-connections table.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from bench.brokers.base import BrokerUnderTest

CONNACK = bytes((0x20, 2, 0, 0))


class _AnswerConnect(asyncio.Protocol):
    __slots__ = ("transport",)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if data[0] & 0xF0 == 0x10:  # CONNECT
            self.transport.write(CONNACK)
        elif data[0] == 0xE0:  # DISCONNECT
            self.transport.close()


async def _serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_AnswerConnect, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


class TransportFloor(BrokerUnderTest):
    """`python -m bench.footprint_floor` as a broker the benchmark can start, measure and stop."""

    name = "uvloop-floor"

    @property
    def label(self) -> str:
        return "uvloop floor (transport + 1-slot protocol)"

    def command(self, port: int, workdir: Path) -> list[str]:
        return [sys.executable, "-m", "bench.footprint_floor", str(port)]

    def env(self) -> dict[str, str] | None:
        return dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))

    def version(self) -> str:
        import uvloop

        return f"uvloop {uvloop.__version__}"


if __name__ == "__main__":
    import uvloop

    uvloop.run(_serve(int(sys.argv[1])))
