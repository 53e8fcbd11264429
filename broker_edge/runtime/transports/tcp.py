"""MQTT over TCP and TLS: the ``asyncio.Protocol`` of each socket is its connection's adapter (``stream``).

No task per connection: the transport calls ``data_received`` and the connection handles the packets in
place. A plain TCP listener runs on the event loop's transport unless its ``transport`` is ``native``
(``transports.native``, the broker's own); TLS listeners always run on the event loop's. The transport's
write-buffer high-water mark is ``limits.outgoing_buffer_bytes``, so ``pause_writing`` marks a slow
subscriber exactly when its unsent bytes pass that bound. TLS listeners accept their sockets themselves
(``http.tls_accept``), the handshake bounded by the CONNECT timeout, so that a failed handshake is
known with its peer and reason: counted (``tls_error``, and ``tls_handshake_failures_total`` by listener
and reason) and logged as a refusal (``report_tls_failures``). Sockets in their handshake count against
``limits.max_connections`` with the connections open (``tls_room``), as a plain TCP socket that has not
sent its CONNECT does: one beyond it is closed at accept and counted as a ``max_connections`` refusal.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
from asyncio.trsock import TransportSocket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from broker_edge.engine.connection.handover import claim_of, connect_of, may_move, record_of, unread_of
from broker_edge.engine.connection.outgoing import Closing
from broker_edge.engine.connection.reading import forget_unfinished
from broker_edge.engine.connection.states import CLOSED, HELD_FOR_HANDOVER, HELD_FOR_TURN, NEW
from broker_edge.engine.handlers.connect import accept_handed_in
from broker_edge.http.tls_accept import PROBE, HandshakeFailure, refusal_hints, start_tls_server
from broker_edge.runtime.peer_certificate import note_peer_certificate, refuse_resumed, resumed_refusal
from broker_edge.runtime.transports.native import start_native_server
from broker_edge.runtime.transports.stream import StreamConnection
from broker_edge.runtime.transports.turns import ReadTurns

if TYPE_CHECKING:
    from broker_edge.engine.connection.connection import ConnectionHost
    from broker_edge.engine.connection.terms import ListenerRuntime
    from broker_edge.engine.handlers.context import BrokerContext
    from broker_edge.protocol.packets import Connect
    from broker_edge.security.limits import ConnectionAdmission
    from broker_edge.security.tls import TlsConfig

__all__ = [
    "BACKLOG",
    "HandedInConnection",
    "TcpConnection",
    "TcpServer",
    "TurnsHost",
    "report_tls_failures",
    "start_accepting",
    "start_tcp_listener",
    "tls_room",
]

_log = logging.getLogger("broker_edge.connection")

BACKLOG = 1024
"""Connections the kernel queues for a listener before the broker accepts them."""


class TurnsHost(Protocol):
    """What a TCP connection reads of its broker besides ``ConnectionHost``: the loop's read turns."""

    read_turns: ReadTurns


class AdmittingHost(Protocol):
    """What a TLS listener reads of its broker besides ``ConnectionHost``: its connection admission."""

    admission: ConnectionAdmission


def tls_room(broker: ConnectionHost) -> int:
    """How many TLS handshakes may be in progress on a listener: the connection limit the admission holds
    (``limits.max_connections``) less the connections open, all listeners together."""
    admission = cast(AdmittingHost, broker).admission
    return admission.max_connections - admission.active


class TcpConnection(StreamConnection):
    """A connection whose transport is an asyncio TCP (or TLS) transport, its reads bounded per turn of the
    event loop in bytes and packets (``turns.ReadTurns``: bytes kept for a later turn hold its reading,
    ``HELD_FOR_TURN``)."""

    __slots__ = ()

    def data_received(self, data: bytes) -> None:
        turns = cast(TurnsHost, self.terms.host).read_turns
        now = turns.take(self, data)
        if now is not None:
            unread = self.handle_read(now, turns)
            if unread:  # past the turn's packets
                turns.keep_unread(self, now[-unread:])

    def handle_bytes(self, data: bytes) -> int:
        return self.handle_read(data, cast(TurnsHost, self.terms.host).read_turns)

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

    def may_move(self) -> bool:
        """Whether this connection may move to another member on this host once its publishes read are
        answered (``engine.connection.handover``): plain TCP, its session holding nothing."""
        return not self.terms.listener.tls and self.transport is not None and may_move(self)

    def hold_for_handover(self) -> None:
        """Read nothing more here: the connection moves once what it sent is answered."""
        self.hold(HELD_FOR_HANDOVER)

    def handover_record(self) -> dict[str, Any] | None:
        """What moves with this connection, or None while it cannot move now (``handover.record_of``)."""
        return record_of(self)

    def handover_socket(self) -> tuple[int, bytes] | None:
        """Its socket's file descriptor, reading paused, and the bytes read and not yet handled (the start
        of a packet, bytes kept for a later turn), taken out, once everything written is sent; None
        otherwise."""
        transport = cast("asyncio.Transport | None", self.transport)
        if (
            transport is None
            or self._out is not None
            or self.terms.listener.tls
            or transport.is_closing()
            or transport.get_write_buffer_size()
        ):
            return None
        sock = transport.get_extra_info("socket")
        if sock is None:
            return None
        if transport.is_reading():
            transport.pause_reading()
        forget_unfinished(self)
        unread = self.decoder.take_pending() + cast(TurnsHost, self.terms.host).read_turns.take_back(self)
        return int(sock.fileno()), unread

    def resume_after_handover(self, unread: bytes = b"") -> None:
        """It does not move: handle ``unread`` (what ``handover_socket`` took out), then read it again
        (unless something else holds its reading)."""
        self.release(HELD_FOR_HANDOVER)
        if unread and self.terms.state != CLOSED:
            self.data_received(unread)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        limit = self.terms.host.config.limits.outgoing_buffer_bytes
        cast(asyncio.WriteTransport, transport).set_write_buffer_limits(high=limit, low=limit // 2)
        refused = None
        if self.terms.listener.tls:
            ssl_object = transport.get_extra_info("ssl_object")
            note_peer_certificate(self, self.terms.listener, ssl_object, self.terms.host.call_later)
            refused = resumed_refusal(self, self.terms.listener, ssl_object)
            address = transport.get_extra_info("peername")
            if address:  # the TLS transport forgets it at close
                self.peer = f"{address[0]}:{address[1]}"
        super().connection_made(transport)
        if refused is not None:  # a TLS session resumed after a reload that no longer accepts it
            refuse_resumed(self, *refused)


class HandedInConnection(TcpConnection):
    """A connection another member on this host moved here (``engine.connection.handover``), taken in
    (``accept_handed_in``) as its transport is made, before anything is read from it, then given the bytes
    the member it left read and did not handle. ``BadRecord`` for a record not as that member makes it."""

    __slots__ = ("_connect", "_unread", "_username")

    def __init__(
        self, host: ConnectionHost, listener: ListenerRuntime, record: dict[str, Any], origin: str
    ) -> None:
        super().__init__(host, listener)
        connect, self._username = connect_of(record)
        self.handed_in = origin  # admitted by the member it left: no new connection's rate
        self.moved_claim = claim_of(record, origin)
        self._connect: Connect | None = connect
        self._unread = unread_of(record)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        connect, self._connect = self._connect, None
        if connect is None or self.terms.state != NEW or type(self._out) is Closing:
            return  # closed at admission
        if self.refused is not None:  # over a limit: counted at admission; closed without a CONNACK
            self.refuse(None, None)
        else:
            host = cast("BrokerContext", self.terms.host)
            accept_handed_in(host, self, connect, self._username, self.handed_in)
            unread, self._unread = self._unread, b""
            if unread and self.terms.state != CLOSED:
                self.data_received(unread)  # what the member it left read and did not handle, first
        if type(self._out) is Closing:
            self.flush()


_REFUSED_BY_THE_CLIENT = frozenset(
    f"{version}_alert_{alert}"
    for version in ("sslv3", "tlsv1")
    for alert in ("bad_certificate", "unknown_ca", "certificate_unknown", "certificate_expired")
)
"""OpenSSL's reasons for an alert the client sent about the broker's certificate."""


def report_tls_failures(broker: ConnectionHost, listener: str, tls: TlsConfig | None) -> HandshakeFailure:
    """What a TLS listener does with a failed handshake (a bad or missing client certificate, not TLS at
    all, none within ``limits.connect_timeout_s``): count it by reason and write a refusal line naming the
    listener, the peer and why; when the client refused the broker's certificate (``tls.certfile``), it says
    so (``refused_by``), and when the broker refused the client's, it names the CA file it checked against
    (``tls.cafile``, the ``hint``)."""
    certfile, cafile = (tls.certfile, tls.cafile) if tls is not None else ("", None)
    refused_by = (
        f"the client: the broker's certificate ({certfile}) does not name the host it dialled, is not of a "
        "CA it trusts, or has expired (timestone pki show)"
    )
    hints = refusal_hints("the listener's tls.cafile", cafile or "")

    def failed(peer: str, reason: str, error: BaseException) -> None:
        counters = broker.counters
        counters.tls_failed(listener, reason)
        if reason == PROBE:
            _log.debug("a port check on listener %s: %s hung up without a byte", listener, peer)
            return
        fields = {"refused_by": refused_by} if reason in _REFUSED_BY_THE_CLIENT else {}
        if reason in hints:
            fields["hint"] = hints[reason]
        counters.refusal_log.write(
            _log,
            broker.now(),
            "tls_error",
            f"TLS handshake failed: {reason}",
            listener=listener,
            peer=peer,
            tls_reason=reason,
            error=str(error) or type(error).__name__,
            **fields,
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
            report_tls_failures(broker, listener.name, config.tls),
            BACKLOG,
            reuse_port=config.reuse_port,
            serving=serving,
            room=lambda: tls_room(broker),
            on_full=lambda _peer: broker.counters.refused("max_connections"),
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
