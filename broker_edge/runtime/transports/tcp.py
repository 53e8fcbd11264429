"""MQTT over TCP and TLS: the ``asyncio.Protocol`` of each socket is its connection's adapter (``stream``).

No task per connection: the transport calls ``data_received`` and the connection handles the packets in
place. A plain TCP listener runs on the event loop's transport unless its ``transport`` is ``native``
(``transports.native``, the broker's own); TLS listeners always run on the event loop's. The transport's
write-buffer high-water mark is ``limits.outgoing_buffer_bytes``, so ``pause_writing`` marks a slow
subscriber exactly when its unsent bytes pass that bound. TLS listeners accept their sockets themselves
(``http.tls_accept``), the handshake bounded by the CONNECT timeout, so that a failed handshake is
known with its peer and reason: counted (``tls_error``, and ``tls_handshake_failures_total`` by listener
and reason) and logged as a refusal (``report_tls_failures``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
from asyncio.trsock import TransportSocket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast

from broker_edge.engine.connection.states import CLOSED, HELD_FOR_TURN
from broker_edge.http.tls_accept import HandshakeFailure, start_tls_server
from broker_edge.runtime.transports.native import start_native_server
from broker_edge.runtime.transports.stream import StreamConnection
from broker_edge.runtime.transports.turns import ReadTurns
from broker_edge.security.tls import peer_common_name

if TYPE_CHECKING:
    from broker_edge.engine.connection.connection import ConnectionHost
    from broker_edge.engine.connection.terms import ListenerRuntime

__all__ = [
    "BACKLOG",
    "TcpConnection",
    "TcpServer",
    "TurnsHost",
    "report_tls_failures",
    "start_accepting",
    "start_tcp_listener",
]

_log = logging.getLogger("broker_edge.connection")

BACKLOG = 1024
"""Connections the kernel queues for a listener before the broker accepts them."""


class TurnsHost(Protocol):
    """What a TCP connection reads of its broker besides ``ConnectionHost``: the loop's read turns."""

    read_turns: ReadTurns


class TcpConnection(StreamConnection):
    """A connection whose transport is an asyncio TCP (or TLS) transport, its reads bounded per turn of the
    event loop (``turns.ReadTurns``: bytes kept for a later turn hold its reading, ``HELD_FOR_TURN``)."""

    __slots__ = ()

    def data_received(self, data: bytes) -> None:
        now = cast(TurnsHost, self.terms.host).read_turns.take(self, data)
        if now is not None:
            StreamConnection.data_received(self, now)

    def handle_bytes(self, data: bytes) -> None:
        StreamConnection.data_received(self, data)

    def pause_for_turn(self) -> None:
        self.hold(HELD_FOR_TURN)
        self._follow_hold()

    def resume_after_turn(self) -> None:
        if self.held & HELD_FOR_TURN:
            self.release(HELD_FOR_TURN)
            self._follow_hold()

    def may_read(self) -> bool:
        return not self.held & ~HELD_FOR_TURN and self.terms.state != CLOSED

    def awaits_acknowledgements(self) -> bool:
        session = self.session
        return session is not None and bool(session.inflight)

    def release(self, reason: int) -> None:
        super().release(reason)
        if not self.held & ~HELD_FOR_TURN:  # its bytes kept are handed back from the next turn
            cast(TurnsHost, self.terms.host).read_turns.wake(self)

    def connection_lost(self, exc: Exception | None) -> None:
        cast(TurnsHost, self.terms.host).read_turns.forget(self)
        super().connection_lost(exc)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        limit = self.terms.host.config.limits.outgoing_buffer_bytes
        cast(asyncio.WriteTransport, transport).set_write_buffer_limits(high=limit, low=limit // 2)
        if self.terms.listener.tls:
            self.peer_cn = peer_common_name(transport.get_extra_info("ssl_object"))
            address = transport.get_extra_info("peername")
            if address:  # the TLS transport forgets it at close
                self.peer = f"{address[0]}:{address[1]}"
        super().connection_made(transport)


def report_tls_failures(broker: ConnectionHost, listener: str) -> HandshakeFailure:
    """What a TLS listener does with a failed handshake (a bad or missing client certificate, not TLS at
    all, none within ``limits.connect_timeout_s``): count it by reason and write a refusal line naming the
    listener, the peer and why."""

    def failed(peer: str, reason: str, error: BaseException) -> None:
        counters = broker.counters
        counters.tls_failed(listener, reason)
        counters.refusal_log.write(
            _log,
            broker.now(),
            "tls_error",
            f"TLS handshake failed: {reason}",
            listener=listener,
            peer=peer,
            tls_reason=reason,
            error=str(error) or type(error).__name__,
        )

    return failed


class TcpServer(Protocol):
    """What the broker uses of a listener's server (an ``asyncio.Server`` or a ``NativeServer``)."""

    @property
    def sockets(self) -> Sequence[socket.socket | TransportSocket]: ...

    def close(self) -> None: ...

    def start_serving(self) -> object: ...

    async def wait_closed(self) -> None: ...


async def start_tcp_listener(
    broker: ConnectionHost, listener: ListenerRuntime, serving: bool = True
) -> TcpServer:
    """Bind the listener (plain or TLS) and start accepting (``serving=False``: once ``start_accepting``
    says so); returns its server."""
    config = listener.config
    ssl_context = listener.ssl_context
    if ssl_context is None and config.transport == "native":
        limit = broker.config.limits.outgoing_buffer_bytes
        return start_native_server(
            lambda: TcpConnection(broker, listener),
            config.host,
            config.port,
            BACKLOG,
            (limit, limit // 2),
            config.reuse_port,
            serving,
        )
    if ssl_context is not None:
        return await start_tls_server(
            lambda: TcpConnection(broker, listener),
            config.host,
            config.port,
            ssl_context,
            broker.config.limits.connect_timeout_s,
            report_tls_failures(broker, listener.name),
            BACKLOG,
            reuse_port=config.reuse_port,
            serving=serving,
        )
    return await asyncio.get_running_loop().create_server(
        lambda: TcpConnection(broker, listener),
        config.host,
        config.port,
        reuse_address=True,
        reuse_port=config.reuse_port or None,
        backlog=BACKLOG,
        start_serving=serving,
    )


async def start_accepting(server: TcpServer) -> None:
    """Accept on a listener started with ``serving=False`` (the loop's servers start serving in a
    coroutine, the broker's own at once)."""
    started = server.start_serving()
    if inspect.isawaitable(started):
        await started
