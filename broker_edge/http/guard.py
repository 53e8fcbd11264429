"""HTTP endpoints bounded like the MQTT listeners: a cap on open connections, a time limit for a request.

``start_guarded_site`` serves an aiohttp app on its own asyncio server whose connections pass through a
guard: beyond ``max_connections`` a new connection is answered 503 (a JSON error) and closed; a connection
must deliver each request's headers within ``request_timeout_s`` of its first byte (or of the connection
opening) or it is closed; an idle kept-alive connection is closed after ``keepalive_s``, and the rest of a
body nobody waits for any more is read for at most ``request_timeout_s``. Handlers that read a
body bound that read themselves (``read_body``). Requests being handled are not timed: a long poll may wait.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from typing import Any

from aiohttp import web

from broker_edge.settings.broker import check_http_limits

__all__ = ["GuardedRunner", "check_http_limits", "read_body", "start_guarded_site"]

_GUARD_KEY: web.AppKey[_Guard] = web.AppKey("http_guard")
_BUSY = 503
_REFUSAL = json.dumps({"error": "too_many_connections", "message": "too many open connections"}).encode()


class _Guard:
    """What the connections of one site share: the count, the limits, the protocols by transport."""

    def __init__(self, max_connections: int, request_timeout_s: float) -> None:
        self.max_connections = max_connections
        self.request_timeout_s = request_timeout_s
        self.open: dict[Any, _GuardedProtocol] = {}
        self.refused = 0


class _GuardedProtocol(asyncio.Protocol):
    """aiohttp's request handler behind a timer: closed when a request does not arrive in time."""

    def __init__(self, inner: Any, guard: _Guard) -> None:
        self.inner = inner
        self.guard = guard
        self.transport: Any = None
        self.busy = False
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.guard.open[transport] = self
        self.inner.connection_made(transport)
        self.arm()

    def data_received(self, data: bytes) -> None:
        if not self.busy and self.timer is None:
            self.arm()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        self.guard.open.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def arm(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(self.guard.request_timeout_s, self._expired)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        if not self.busy and self.transport is not None:
            self.transport.close()  # a request that never finished arriving


class _Refused(asyncio.Protocol):
    """A connection beyond the cap: one 503 with a JSON error, then closed."""

    def connection_made(self, transport: Any) -> None:
        transport.write(
            f"HTTP/1.1 {_BUSY} Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(_REFUSAL)}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n".encode()
            + _REFUSAL
        )
        transport.close()


@web.middleware
async def _request_started(request: web.Request, handler: Any) -> web.StreamResponse:
    """The request's headers arrived: stop its connection's timer while it is handled."""
    guarded = request.app[_GUARD_KEY].open.get(request.transport)
    if guarded is None:
        return await handler(request)
    guarded.busy = True
    guarded.disarm()
    try:
        return await handler(request)
    finally:
        guarded.busy = False


class GuardedRunner:
    """The running site: ``await cleanup()`` stops it (as ``web.AppRunner.cleanup`` does)."""

    def __init__(self, runner: web.AppRunner, server: asyncio.base_events.Server, guard: _Guard) -> None:
        self.runner = runner
        self.server = server
        self.guard = guard

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    @property
    def open_connections(self) -> int:
        return len(self.guard.open)

    async def cleanup(self) -> None:
        self.server.close()
        await self.runner.cleanup()


async def start_guarded_site(
    app: web.Application,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    max_connections: int,
    request_timeout_s: float,
    keepalive_s: float = 60.0,
    sock: socket.socket | None = None,
) -> GuardedRunner:
    """Serve ``app`` on ``host:port`` (0: a free port), or on the listening ``sock`` when given, behind the
    guard; ``OSError`` if it cannot bind."""
    guard = _Guard(max_connections, request_timeout_s)
    app[_GUARD_KEY] = guard
    app.middlewares.insert(0, _request_started)
    runner = web.AppRunner(
        app, access_log=None, keepalive_timeout=keepalive_s, lingering_time=request_timeout_s
    )
    await runner.setup()
    make_handler = runner.server

    def protocol() -> asyncio.Protocol:
        if len(guard.open) >= guard.max_connections:
            guard.refused += 1
            return _Refused()
        return _GuardedProtocol(make_handler(), guard)  # type: ignore[misc]  # aiohttp's handler is a protocol

    try:
        loop = asyncio.get_running_loop()
        if sock is None:
            server = await loop.create_server(protocol, host, port, ssl=ssl_context, reuse_address=True)
        else:
            server = await loop.create_server(protocol, sock=sock, ssl=ssl_context)
    except BaseException:
        await runner.cleanup()
        raise
    return GuardedRunner(runner, server, guard)


async def read_body(request: web.Request, timeout_s: float) -> bytes | None:
    """The request body, or None when it did not arrive within ``timeout_s``."""
    try:
        return await asyncio.wait_for(request.read(), timeout_s)
    except TimeoutError:
        return None
