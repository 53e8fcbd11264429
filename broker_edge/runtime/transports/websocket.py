"""MQTT over WebSocket (subprotocol ``mqtt``, binary messages) through aiohttp, plain or TLS (wss).

aiohttp gives each WebSocket a handler task, so a WebSocket client costs a task (plain TCP clients do not).
The bytes of each binary message are fed to a ``Connection`` exactly as TCP bytes are: MQTT packets may
span messages or share one. Writes are batched into one binary message per loop iteration.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from broker_edge.engine.connection.connection import Connection
from broker_edge.security.tls import peer_common_name

if TYPE_CHECKING:
    from collections.abc import Iterable

    from broker_edge.engine.connection.connection import ConnectionHost
    from broker_edge.engine.connection.terms import ListenerRuntime

__all__ = ["WebSocketTransport", "start_websocket_listener"]

log = logging.getLogger(__name__)


class WebSocketTransport:
    """The part of the asyncio transport interface ``Connection`` uses, over an aiohttp WebSocket."""

    __slots__ = (
        "_buffered",
        "_closing",
        "_connection",
        "_pending",
        "_request",
        "_sending",
        "_ws",
        "high_water",
    )

    def __init__(self, ws: web.WebSocketResponse, request: web.Request, high_water: int) -> None:
        self._ws = ws
        self._request = request
        self._pending: list[bytes] = []
        self._buffered = 0
        self._sending = False
        self._closing = False
        self._connection: Connection | None = None
        self.high_water = high_water

    def write(self, data: bytes) -> None:
        self.writelines((data,))

    def writelines(self, parts: Iterable[bytes]) -> None:
        if self._closing:
            return
        for part in parts:
            self._pending.append(part)
            self._buffered += len(part)
        if (
            self._buffered > self.high_water
            and self._connection is not None
            and not self._connection.terms.paused
        ):
            self._connection.pause_writing()
        if not self._sending:
            self._sending = True
            asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        try:
            while self._pending and not self._ws.closed:
                data = b"".join(self._pending)
                self._pending.clear()
                self._buffered = 0
                await self._ws.send_bytes(data)
        except (ConnectionError, RuntimeError) as exc:
            log.debug("websocket send failed: %s", exc)
        finally:
            self._sending = False
        if self._connection is not None and self._connection.terms.paused:
            self._connection.resume_writing()
        if self._closing and not self._ws.closed:
            await self._ws.close()

    def get_write_buffer_size(self) -> int:
        return self._buffered

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if not self._sending:
            asyncio.get_running_loop().create_task(self._ws.close())

    def abort(self) -> None:
        self._closing = True
        self._pending.clear()
        asyncio.get_running_loop().create_task(self._ws.close())

    def pause_reading(self) -> None:
        """Reading is paused by not taking the next message (see ``_serve``)."""

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        transport = self._request.transport
        return transport.get_extra_info(name, default) if transport is not None else default


async def start_websocket_listener(broker: ConnectionHost, listener: ListenerRuntime) -> web.AppRunner:
    """Serve ``listener.config.path`` on the listener's address; ``runner.cleanup()`` stops it."""
    config = listener.config
    limits = broker.config.limits

    async def serve(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=("mqtt", "mqttv3.1"), max_msg_size=limits.max_packet_size + 16)
        await ws.prepare(request)
        transport = WebSocketTransport(ws, request, limits.outgoing_buffer_bytes)
        connection = Connection(broker, listener)
        transport._connection = connection
        if listener.tls and request.transport is not None:
            connection.peer_cn = peer_common_name(request.transport.get_extra_info("ssl_object"))
        connection.attach_transport(transport)
        try:
            async for message in ws:
                if message.type == WSMsgType.BINARY:
                    while connection.held and not ws.closed:
                        await asyncio.sleep(0.01)
                    connection.data_received(message.data)
                elif message.type == WSMsgType.TEXT:
                    connection.abort()  # MQTT over WebSocket is binary only
                    break
                elif message.type == WSMsgType.ERROR:
                    break
        finally:
            connection.connection_lost(None)
        return ws

    app = web.Application()
    app.router.add_get(config.path, serve)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, ssl_context=listener.ssl_context, reuse_address=True)
    await site.start()
    return runner
