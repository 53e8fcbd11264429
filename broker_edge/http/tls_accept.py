"""TLS listeners that know who failed a handshake: the broker accepts their sockets itself.

An event loop serving TLS (``create_server(ssl=...)``) runs the handshake before it tells the protocol
anything, and drops a connection whose handshake fails without a word: neither the peer's address nor why
ever reach the broker. So a TLS listener's socket is accepted here (``loop.sock_accept``, the address in
hand) and each connection's handshake is run by ``loop.connect_accepted_socket``, whose failure is an
exception: ``on_failure(peer, listener's reason, error)`` is told, the socket closed. A peer that hung up
without sending a byte is told with reason ``PROBE``: a port check, which its listener does not call a
refusal. Both the MQTT TLS
listeners (``transports.tcp``) and the HTTPS sites of the guard (``http.guard``: WSS listeners, the offsets
API and admin endpoints with TLS) serve this way.

Accepting costs one task for the listener and one per handshake in progress (until it ends, within the
handshake timeout). Handshakes in progress are bounded by ``room()`` (what the listener's connection limit
leaves): a socket accepted beyond it is closed at once and told to ``on_full(peer)``, so silent sockets
that never send a ClientHello hold no more descriptors than the limit allows. A process out of
descriptors (EMFILE, ENFILE) pauses accepting for ``ACCEPT_PAUSE_S``, as asyncio's own servers do, the
connections waiting in the kernel's backlog meanwhile.

A handshake that begins with a plain HTTP request (``http://`` for ``https://``) is answered a 400 in JSON
saying that the port speaks TLS, where an HTTP client could not read an alert. A handshake that fails
otherwise sends the peer OpenSSL's alert (``certificate required``, ``unknown ca``,
``certificate expired``, ``certificate revoked``, ...) before the socket is closed: asyncio's TLS layer and
uvloop's leave that alert in their outgoing buffer and close without it, so the client saw a bare closed
connection, as from a broker that is down. The server context's ``sslobject_class`` is ``AlertingSSLObject``,
which writes what OpenSSL left to send to the connection's socket (one non-blocking ``send``) when its
handshake fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import logging
import socket
import ssl
import time
from collections.abc import Callable
from functools import partial

from broker_edge.observe.refusal_log import RefusalLog
from broker_edge.process.sockets import listening_sockets

__all__ = [
    "ACCEPT_PAUSE_S",
    "CLIENT_NOT_VERIFIED",
    "NO_CRL",
    "NO_CRL_HINT",
    "PROBE",
    "AlertingSSLObject",
    "Full",
    "HandshakeFailure",
    "TlsServer",
    "failure_reason",
    "not_verified_hint",
    "refusal_hints",
    "start_tls_server",
    "tls_failure_lines",
]

log = logging.getLogger(__name__)

ACCEPT_PAUSE_S = 1.0
"""How long accepting pauses when the process has no descriptor left for a new socket."""
ACCEPT_BATCH = 100
"""Connections accepted at once beyond the one awaited, when that many wait (as the loop's servers do)."""

HandshakeFailure = Callable[[str, str, BaseException], None]
"""``on_failure(peer "host:port", reason, error)``: a handshake failed (``reason``: ``failure_reason``)."""
Full = Callable[[str], None]
"""``on_full(peer "host:port")``: a socket was closed at accept, the handshakes in progress at ``room()``."""


PROBE = "probe"
"""The reason of a handshake whose peer hung up without sending a byte: a TCP port check (a load balancer's
health check, a process waiting for the port): counted, said at DEBUG, not a refusal."""

NO_CRL = "unable_to_get_certificate_crl"
"""The reason of a client certificate refused because a CA of its chain has no CRL in ``tls.crlfile``
(OpenSSL's X509_V_ERR_UNABLE_TO_GET_CRL, which the TLS reason calls ``certificate_verify_failed``)."""
NO_CRL_HINT = (
    "a CA of the client's chain (an intermediate it sent, with tls.crl_check: chain) has no CRL in the "
    "endpoint's tls.crlfile: add that CA's CRL (timestone pki crl --ca DIR), then SIGHUP"
)
"""What the refusal line of a ``NO_CRL`` handshake adds (``hint``)."""
CLIENT_NOT_VERIFIED = "certificate_verify_failed"
"""OpenSSL's reason for a client certificate the server refused (not of its CAs, expired, not yet valid)."""
_UNABLE_TO_GET_CRL = 3


class _Handshake:
    """The socket whose handshake a ``TlsServer`` task runs, and whether its peer sent anything yet."""

    __slots__ = ("heard", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.heard = False


_HANDSHAKE: contextvars.ContextVar[_Handshake | None] = contextvars.ContextVar("tls_handshake", default=None)
"""The handshake a ``TlsServer`` task runs; the loop creates that connection's ``SSLObject`` in a copy of the
task's context, where ``AlertingSSLObject`` finds it."""


class AlertingSSLObject(ssl.SSLObject):
    """A server ``SSLObject`` whose failed handshake sends the alert OpenSSL wrote (see the module docstring).

    The alert goes straight to the socket: nothing of the connection waits in the transport's buffer then,
    since a handshake fails on what the client sent after reading all the server had written (or on its
    first message, before the server wrote anything). A socket with no room for it (never at that point in
    practice) is closed without it, as before; nothing waits for the socket."""

    _alert_socket: socket.socket | None
    _alert_outgoing: ssl.MemoryBIO
    _alert_incoming: ssl.MemoryBIO
    _alert_handshake: _Handshake | None

    @classmethod
    def _create(
        cls, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO, *args: object, **kwargs: object
    ) -> AlertingSSLObject:
        base_create = vars(ssl.SSLObject)["_create"].__func__  # a classmethod typeshed does not declare
        created: AlertingSSLObject = base_create(cls, incoming, outgoing, *args, **kwargs)
        created._alert_outgoing = outgoing
        created._alert_incoming = incoming
        handshake = created._alert_handshake = _HANDSHAKE.get()
        created._alert_socket = handshake.sock if handshake is not None else None
        return created

    def do_handshake(self) -> None:
        handshake = self._alert_handshake
        if handshake is not None and not handshake.heard and self._alert_incoming.pending:
            handshake.heard = True
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as error:
            self._send_alert(error)
            raise
        self._alert_socket = None

    def _send_alert(self, error: ssl.SSLError) -> None:
        sock, self._alert_socket = self._alert_socket, None
        if sock is None:
            return
        alert = self._alert_outgoing.read()
        if error.reason in _PLAIN_HTTP:  # a client of http:// reads no TLS alert: tell it in HTTP
            alert = _USE_TLS
        if alert:
            with contextlib.suppress(OSError):  # the peer is gone, or no room: closed without it
                sock.send(alert)


_PLAIN_HTTP = frozenset({"HTTP_REQUEST", "HTTPS_PROXY_REQUEST"})
"""OpenSSL's reasons for a handshake that began with a plain HTTP request."""
_USE_TLS_BODY = (
    b'{"error": "bad_request", "message": "this port speaks TLS: use https:// (wss://, mqtts://)"}'
)
_USE_TLS = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_USE_TLS_BODY), _USE_TLS_BODY)
)
"""The answer to a plain HTTP request on a TLS port, in place of OpenSSL's alert."""


def failure_reason(error: BaseException) -> str:
    """A short label for why a handshake failed: ``timeout``, ``closed`` (the peer hung up), OpenSSL's
    reason in lower case (``wrong_version_number``: not TLS at all; ``tlsv1_alert_unknown_ca``: the client
    does not trust the broker; ``peer_did_not_return_a_certificate``, ``certificate_verify_failed``, ...),
    ``NO_CRL`` for a chain whose CA has no CRL, else ``error``."""
    if isinstance(error, TimeoutError | asyncio.TimeoutError) or (
        isinstance(error, ConnectionAbortedError) and "handshake" in str(error)
    ):
        return "timeout"
    if isinstance(error, ssl.SSLEOFError | ssl.SSLZeroReturnError | ConnectionResetError | BrokenPipeError):
        return "closed"
    if isinstance(error, ssl.SSLCertVerificationError) and error.verify_code == _UNABLE_TO_GET_CRL:
        return NO_CRL
    if isinstance(error, ssl.SSLError) and error.reason:
        return str(error.reason).lower()
    return "error"


class TlsServer:
    """A listening TLS socket accepted by the broker (see the module docstring); ``close`` stops it."""

    def __init__(
        self,
        sockets: list[socket.socket],
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        ssl_context: ssl.SSLContext,
        handshake_timeout_s: float,
        on_failure: HandshakeFailure,
        serving: bool = True,
        room: Callable[[], int] | None = None,
        on_full: Full | None = None,
    ) -> None:
        self.sockets = sockets
        self._room = room
        self._on_full = on_full
        self._protocol_factory = protocol_factory
        self._ssl_context = ssl_context
        ssl_context.sslobject_class = AlertingSSLObject
        self._handshake_timeout_s = handshake_timeout_s
        self._on_failure = on_failure
        self._handshakes: set[asyncio.Task[None]] = set()
        self._accepting: list[asyncio.Task[None]] = []
        if serving:
            self.start_serving()

    def start_serving(self) -> None:
        """Accept what arrives (a server made with ``serving=False`` has its sockets bound, not served)."""
        if not self._accepting:
            loop = asyncio.get_running_loop()
            self._accepting = [loop.create_task(self._accept(sock)) for sock in self.sockets]

    def close(self) -> None:
        for task in (*self._accepting, *self._handshakes):
            task.cancel()
        for sock in self.sockets:
            sock.close()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._accepting, *self._handshakes, return_exceptions=True)

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(sock)
            except OSError as error:
                if error.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if sock.fileno() < 0:
                        return  # closed
                    log.warning("accepting a TLS connection failed: %s", error)
                else:
                    log.warning("accepting paused for %.0f s: %s", ACCEPT_PAUSE_S, error.strerror)
                await asyncio.sleep(ACCEPT_PAUSE_S)
                continue
            self._start_handshake(conn, address)
            for _ in range(ACCEPT_BATCH):  # the others already waiting, without a wait each
                try:
                    conn, address = sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break  # said by sock_accept on the next turn
                self._start_handshake(conn, address)

    def _start_handshake(self, conn: socket.socket, address: tuple[str, int] | str) -> None:
        if self._room is not None and len(self._handshakes) >= self._room():
            conn.close()
            if self._on_full is not None:
                self._on_full(_peer(address))
            return
        conn.setblocking(False)
        task = asyncio.get_running_loop().create_task(self._handshake(conn, address))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket, address: tuple[str, int] | str) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handshake = _Handshake(conn)
        _HANDSHAKE.set(handshake)  # this task's own context: see AlertingSSLObject
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                self._protocol_factory,
                conn,
                ssl=self._ssl_context,
                ssl_handshake_timeout=self._handshake_timeout_s,
            )
        except (OSError, TimeoutError) as error:
            conn.close()
            reason = failure_reason(error)
            if reason == "closed" and not handshake.heard:
                reason = PROBE
            self._on_failure(_peer(address), reason, error)


def _peer(address: tuple[str, int] | str) -> str:
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


async def start_tls_server(
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    host: str,
    port: int,
    ssl_context: ssl.SSLContext,
    handshake_timeout_s: float,
    on_failure: HandshakeFailure,
    backlog: int = 1024,
    sock: socket.socket | None = None,
    reuse_port: bool = False,
    serving: bool = True,
    room: Callable[[], int] | None = None,
    on_full: Full | None = None,
) -> TlsServer:
    """Listen on every address of ``host:port``, as ``loop.create_server`` does (or on the listening
    ``sock``; ``reuse_port``: shared with other processes), and serve TLS connections (``serving=False``:
    once ``start_serving`` is called); ``OSError`` if it cannot bind. ``room()``: how many handshakes may
    be in progress now (None: any number); a socket beyond it is closed and told to ``on_full``."""
    if sock is not None:
        sock.setblocking(False)
    sockets = [sock] if sock is not None else listening_sockets(host, port, backlog, reuse_port)
    return TlsServer(
        sockets, protocol_factory, ssl_context, handshake_timeout_s, on_failure, serving, room, on_full
    )


_tls_refusals = RefusalLog()
"""The lines of failed TLS handshakes of a site told no ``on_tls_failure``."""


def not_verified_hint(setting: str, cafile: str) -> str:
    """What the refusal line of a ``CLIENT_NOT_VERIFIED`` handshake adds (``hint``): the CA file the client's
    certificate was checked against, and the setting (``setting``) that names it."""
    return (
        f"the client's certificate did not verify against {setting} ({cafile}): not issued by a CA there, "
        "expired or not yet valid, as the error says (timestone pki show names a certificate's issuer and "
        "validity)"
    )


def refusal_hints(setting: str, cafile: str) -> dict[str, str]:
    """What the refusal line of a failed handshake adds (``hint``), by reason: a chain lacking a CRL's
    ``NO_CRL_HINT``; a client certificate that did not verify, the CA file ``setting`` names (if any)."""
    hints = {NO_CRL: NO_CRL_HINT}
    if cafile:
        hints[CLIENT_NOT_VERIFIED] = not_verified_hint(setting, cafile)
    return hints


def tls_failure_lines(
    site: str, quiet: frozenset[str] = frozenset(), cafile: tuple[str, str] | None = None
) -> HandshakeFailure:
    """What a site does with a failed TLS handshake: one WARNING naming the peer and why (limited per
    reason); a port check (``PROBE``) and the reasons in ``quiet`` are DEBUG lines. ``cafile``: the setting
    and the file client certificates are checked against, named in the line of one that did not verify."""
    return partial(_tls_failed, site, quiet, refusal_hints(*(cafile or ("", ""))))


def _tls_failed(
    site: str, quiet: frozenset[str], hints: dict[str, str], peer: str, reason: str, error: BaseException
) -> None:
    if reason == PROBE:
        log.debug("a port check on the %s: %s hung up without a byte", site, peer)
        return
    if reason in quiet:
        log.debug("TLS handshake with the %s ended: %s (peer %s)", site, reason, peer)
        return
    text = f"TLS handshake with the {site} failed: {reason}"
    fields = {"hint": hints[reason]} if reason in hints else {}
    _tls_refusals.write(
        log,
        time.monotonic(),
        "tls_handshake",
        text,
        peer=peer,
        tls_reason=reason,
        error=str(error) or type(error).__name__,
        **fields,
    )
