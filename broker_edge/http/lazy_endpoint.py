"""An HTTP endpoint that listens from the start but loads aiohttp and builds its app on the first connection.

The broker's side ports (the admin endpoint, the offsets API) must accept connections as soon as the broker
runs, yet most edge brokers serve MQTT for hours before anyone scrapes or fetches, and aiohttp is a large
part of a bare broker's memory and start-up time. So the socket is bound and listening at once; the first
connection only wakes a reader callback, which runs the endpoint's `serve(sock)`: it imports aiohttp, builds
the app and serves it on the listening socket (behind `http_guard`), so the waiting connection is then
accepted like any other. The modules it needs are imported in the loop's executor first: importing aiohttp
(its client's TLS context reads the system's CA certificates) held the event loop for over 100 ms, a
stall every MQTT client of the broker saw when the first reader came.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["LazyHttpEndpoint", "Serve", "listening_socket"]

log = logging.getLogger(__name__)


class _Running(Protocol):
    async def cleanup(self) -> None: ...


Serve = Callable[[socket.socket], Awaitable[_Running]]
"""Starts serving on a listening socket; what it returns is stopped with ``await cleanup()``."""


def listening_socket(family: int, address: Any) -> socket.socket:
    """A non-blocking TCP socket bound to ``address`` and listening (``OSError`` if it cannot bind)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class LazyHttpEndpoint:
    """`host:port` listening now, served by `serve(sock)` from the first connection on.

    `await LazyHttpEndpoint.start(...)` binds (port 0 picks a free one, read back from `port`);
    `await endpoint.cleanup()` stops it, whether or not it was ever served.
    """

    def __init__(self, serve: Serve, sock: socket.socket, modules: tuple[str, ...] = ()) -> None:
        self._serve_on = serve
        self._modules = modules
        """What `serve` imports: imported off the loop before it runs."""
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._serving: asyncio.Task[Any] | None = None
        self._running: _Running | None = None
        self.port: int = sock.getsockname()[1]

    @classmethod
    async def start(
        cls, serve: Serve, host: str, port: int, modules: tuple[str, ...] = ()
    ) -> LazyHttpEndpoint:
        """Bind and listen on `host:port`; nothing of aiohttp is loaded yet. `modules`: what `serve` imports
        (loaded in the loop's executor when the first connection comes, before `serve` runs)."""
        loop = asyncio.get_running_loop()
        family, _, _, _, address = (
            await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        )[0]
        sock = listening_socket(family, address)
        endpoint = cls(serve, sock, modules)
        loop.add_reader(sock.fileno(), endpoint._first_connection)
        return endpoint

    def _first_connection(self) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._serving = self._loop.create_task(self._serve())

    async def _serve(self) -> None:
        try:
            for module in self._modules:
                await self._loop.run_in_executor(None, importlib.import_module, module)
            self._running = await self._serve_on(self._sock)
        except Exception:
            log.exception("HTTP endpoint on port %d could not start", self.port)
            raise
        log.debug("HTTP endpoint on port %d: started by its first connection", self.port)

    async def cleanup(self) -> None:
        """Stop listening and close the endpoint's connections."""
        if self._serving is None:
            self._loop.remove_reader(self._sock.fileno())
        else:
            with contextlib.suppress(Exception):
                await self._serving
        if self._running is not None:
            await self._running.cleanup()
        self._sock.close()
