"""MQTT over TCP and TLS: the ``asyncio.Protocol`` of each socket is its ``Connection``.

No task per connection: the transport calls ``data_received`` and the connection handles the packets in
place. A plain TCP listener runs on the event loop's transport unless its ``transport`` is ``native``
(``transports.native``, the broker's own); TLS listeners always run on the event loop's. The transport's
write-buffer high-water mark is ``limits.outgoing_buffer_bytes``, so ``pause_writing`` marks a slow
subscriber exactly when its unsent bytes pass that bound. For TLS the loop runs the handshake before
``connection_made``; ``ssl_handshake_timeout`` bounds it by the CONNECT timeout; a failed handshake is
counted as a refusal (``tls_error``).
"""

from __future__ import annotations

import asyncio
import socket
from asyncio.trsock import TransportSocket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from broker_edge.engine.connection.connection import Connection
from broker_edge.engine.connection.states import NEW
from broker_edge.runtime.transports.native import start_native_server
from broker_edge.security.tls import peer_common_name

if TYPE_CHECKING:
    from broker_edge.engine.connection.connection import ConnectionHost
    from broker_edge.engine.connection.terms import ListenerRuntime

__all__ = ["BACKLOG", "TcpConnection", "TcpServer", "start_tcp_listener"]

BACKLOG = 1024
"""Connections the kernel queues for a listener before the broker accepts them."""


class TcpConnection(Connection):
    """A ``Connection`` whose transport is an asyncio TCP (or TLS) transport."""

    __slots__ = ()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        limit = self.host.config.limits.outgoing_buffer_bytes
        cast(asyncio.WriteTransport, transport).set_write_buffer_limits(high=limit, low=limit // 2)
        if self.listener.tls:
            self.peer_cn = peer_common_name(transport.get_extra_info("ssl_object"))
        super().connection_made(transport)

    def __del__(self) -> None:
        # The loop creates the protocol at accept, before the TLS handshake, and calls connection_made
        # only once it succeeded: a TLS connection dropped without ever being made failed its handshake
        # (bad or missing client certificate, not TLS at all, or no handshake within connect_timeout_s).
        if self.state == NEW and self.transport is None and self.listener.tls:
            self.host.counters.refused("tls_error")


class TcpServer(Protocol):
    """What the broker uses of a listener's server (an ``asyncio.Server`` or a ``NativeServer``)."""

    @property
    def sockets(self) -> Sequence[socket.socket | TransportSocket]: ...

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


async def start_tcp_listener(broker: ConnectionHost, listener: ListenerRuntime) -> TcpServer:
    """Bind the listener (plain or TLS) and start accepting; returns its server."""
    config = listener.config
    ssl_context = listener.ssl_context
    if ssl_context is None and config.transport == "native":
        limit = broker.config.limits.outgoing_buffer_bytes
        return start_native_server(
            lambda: TcpConnection(broker, listener), config.host, config.port, BACKLOG, (limit, limit // 2)
        )
    loop = asyncio.get_running_loop()
    kwargs: dict[str, Any] = {}
    if ssl_context is not None:
        kwargs["ssl_handshake_timeout"] = broker.config.limits.connect_timeout_s
    return await loop.create_server(
        lambda: TcpConnection(broker, listener),
        config.host,
        config.port,
        ssl=ssl_context,
        reuse_address=True,
        backlog=BACKLOG,
        **kwargs,
    )
