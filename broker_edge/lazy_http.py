"""An HTTP endpoint that listens from the start but loads aiohttp and builds its app on the first connection.

The broker's side ports (the admin endpoint, the offsets API) must accept connections as soon as the broker
runs, yet most edge brokers serve MQTT for hours before anyone scrapes or fetches, and aiohttp is a large
part of a bare broker's memory and start-up time. So the socket is bound and listening at once; the first
connection only wakes a reader callback, which imports aiohttp, builds the app and hands the listening
socket to it: the waiting connection is then accepted by aiohttp like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["LazyHttpEndpoint"]

log = logging.getLogger(__name__)


class LazyHttpEndpoint:
    """`host:port` listening now, served by the aiohttp app `make_app()` returns from the first connection.

    `await LazyHttpEndpoint.start(...)` binds (port 0 picks a free one, read back from `port`);
    `await endpoint.cleanup()` stops it, whether or not the app was ever built.
    """

    def __init__(
        self, make_app: Callable[[], web.Application], sock: socket.socket, ssl_context: ssl.SSLContext | None
    ) -> None:
        self._make_app = make_app
        self._sock = sock
        self._ssl_context = ssl_context
        self._loop = asyncio.get_running_loop()
        self._serving: asyncio.Task[Any] | None = None
        self._runner: web.AppRunner | None = None
        self.port: int = sock.getsockname()[1]

    @classmethod
    async def start(
        cls,
        make_app: Callable[[], web.Application],
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> LazyHttpEndpoint:
        """Bind and listen on `host:port`; nothing of aiohttp is loaded yet."""
        loop = asyncio.get_running_loop()
        family, _, _, _, address = (
            await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        )[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        endpoint = cls(make_app, sock, ssl_context)
        loop.add_reader(sock.fileno(), endpoint._first_connection)
        return endpoint

    @property
    def app_loaded(self) -> bool:
        """Whether a connection has come and the app serves (or is being built)."""
        return self._serving is not None

    def _first_connection(self) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._serving = self._loop.create_task(self._serve())

    async def _serve(self) -> None:
        from aiohttp import web

        try:
            runner = web.AppRunner(self._make_app(), access_log=None)
            await runner.setup()
            self._runner = runner
            await web.SockSite(runner, self._sock, ssl_context=self._ssl_context).start()
        except Exception:
            log.exception("HTTP endpoint on port %d could not start", self.port)
            raise
        log.debug("HTTP endpoint on port %d: app started by its first connection", self.port)

    async def cleanup(self) -> None:
        """Stop listening and close the app's connections."""
        if self._serving is None:
            self._loop.remove_reader(self._sock.fileno())
        else:
            with contextlib.suppress(Exception):
                await self._serving
        if self._runner is not None:
            await self._runner.cleanup()
        self._sock.close()
