"""HTTP endpoints bounded like the MQTT listeners: a cap on open connections, a time limit for a request,
one memory budget for what requests hold.

``start_guarded_site`` serves an aiohttp app on its own asyncio server whose connections pass through a
guard:

- **Connections.** At ``max_connections`` open, a new connection takes the place of the oldest idle one
  that has not authenticated (``mark_authenticated``: a request of it carried valid credentials), which is
  closed; when every open connection has authenticated or is busy, the kept-alive connection that has
  waited the longest for its next request is closed instead (as nginx does with its idle keep-alive
  connections), else the request that has waited the longest in ``waiting`` (a long poll) answers at once
  with what it has and its connection is closed after it; only when every one is handling a request (or
  receiving one) that is not waiting is the new one answered 503 (a JSON error) and closed. So strangers
  holding connections open cannot keep readers out: they only push each other out; and readers idle
  between requests, or many long polls of one reader, make room for a reader with a request to send. (A
  member of a cluster has its own endpoint, which strangers cannot even finish a TLS handshake with.)
  With ``max_per_reader``, one named reader (``mark_authenticated``) holds at most that many open
  connections: a request of a reader at its share closes that reader's own connection idle the longest,
  else has its own longest waiting request give way, else is answered 503 ``too_many_connections``
  (``Retry-After``) and its connection closed; so one token whose requests trickle their bodies or headers
  cannot hold every connection and keep the other readers at 503.
  With TLS, at most ``max_connections`` handshakes are in progress besides: a socket accepted beyond them
  is closed at once and counted as refused, so silent sockets hold no more.
- **Time.** A connection must deliver each request's headers within ``request_timeout_s`` of its first
  byte (or of the connection opening), and a TLS client its handshake, or it is closed; an idle kept-alive
  connection is closed after ``keepalive_s``, one answered before its body arrived right after the answer
  (``http.unread_bodies``). Handlers bound their reads of bodies (``read_body``); requests being handled
  are not timed: a long poll may wait. With ``send_timeout_s``, a connection whose peer takes none of what
  is written to it for that long (its writing paused all along: a reader that stopped reading a large
  answer) is aborted, so that its answer and the budget it holds are freed; with ``min_read_bytes_per_s``,
  so is one whose answer of N bytes is not taken within ``request_timeout_s`` + N / that many seconds (a
  reader taking a few KiB now and then, never stalled that long, one WARNING); an answer streamed as it is
  made holds its writes to the same rate (``Pace``).
- **Bodies.** A body is read as sent, never decoded: one in a ``Content-Encoding`` is refused (415, one
  WARNING, ``http.json_errors.refuse``) before any handler runs, whether or not its handler reads bodies;
  so is one in a transfer coding other than ``chunked`` (501), and a request line of another version than
  HTTP/1.0 and 1.1 (505).
  ``read_body`` says why a body could not be read (``UnreadBody``): too late, broken framing, or a client
  that closed its connection first (nobody to answer: one DEBUG line).
- **Bytes of an upgraded socket.** ``watch_bytes`` hands every byte count the socket reads (after TLS) to a
  callable, before aiohttp buffers them: a WebSocket listener bounds what a client sends before its CONNECT
  that way, whatever its frames declare. With ``read_turns`` every read goes to an ``Intake``
  (``http.read_gate``), which hands it to aiohttp as the loop's turns have room (one-byte HTTP chunks),
  and every request waits for its turn of the loop's HTTP work before it is handled (``work_turn``), in
  the strangers' line unless its connection authenticated or ``vouch`` says its credentials are valid.
- **Memory.** With a ``MemoryBudget`` (``broker_edge.security.http_budget``), every request holds a
  ``Reservation``: handlers ``hold`` what they are about to read or build, and the answer is written inside
  the request's share, which is given back once it is sent (a share counted as its reader's when
  ``mark_authenticated`` named one). A request the budget cannot take is answered 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import Any

from aiohttp import web

from broker_edge.http.json_errors import BODY_ERRORS, answer_errors_in_json, body_error_text, refuse
from broker_edge.http.peer_certificates import CertificateCheck, PeerCertificate, peer_certificate
from broker_edge.http.read_gate import HeldTransport, Intake, ReadGate, ReadTaker
from broker_edge.http.tls_accept import HandshakeFailure, TlsServer, start_tls_server, tls_failure_lines
from broker_edge.http.unread_bodies import closed_before_unread_bodies
from broker_edge.http.unserved import uninvited_without_route, unserved_request
from broker_edge.observe.refusal_log import RefusalLog
from broker_edge.security.http_budget import BudgetExhausted, MemoryBudget, Reservation
from broker_edge.security.limits import check_http_limits

__all__ = [
    "ByteWatch",
    "GuardedRunner",
    "Pace",
    "UnreadBody",
    "check_http_limits",
    "hold",
    "mark_authenticated",
    "over_budget_response",
    "read_body",
    "reads_of",
    "settle",
    "start_guarded_site",
    "tls_failure_lines",
    "waiting",
    "watch_bytes",
]

log = logging.getLogger(__name__)

ByteWatch = Callable[[int], bool | None]
"""What ``watch_bytes`` calls with each read's size: True aborts the connection, None stops the calls."""

_GUARD_KEY: web.AppKey[_Guard] = web.AppKey("http_guard")
_slow_readers = RefusalLog()
"""The lines of answers abandoned because they were taken too slowly (``_too_slow``)."""
_RESERVATION: web.RequestKey[Reservation] = web.RequestKey("reservation", Reservation)
"""Where a request's ``Reservation`` is kept (``request[_RESERVATION]``)."""
_GUARDED: web.RequestKey[_GuardedProtocol] = web.RequestKey("guarded")
"""The request's connection as it began (``_request_started``), kept for it once the connection is gone."""
_BUSY = 503
_REFUSAL = json.dumps({"error": "too_many_connections", "message": "too many open connections"}).encode()
_OVER_BUDGET = json.dumps(
    {"error": "busy", "message": "the broker holds as much as it may for HTTP requests now; retry later"}
)


class _Guard:
    """What the connections of one site share: the count, the limits, the protocols by transport."""

    def __init__(
        self,
        max_connections: int,
        request_timeout_s: float,
        send_timeout_s: float | None = None,
        min_read_bytes_per_s: int = 0,
        max_per_reader: int | None = None,
        read_turns: ReadTaker | None = None,
        certificates: CertificateCheck | None = None,
        vouch: Callable[[web.Request], bool] | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.vouch = vouch
        """Whether a request's credentials are valid, before its turn (None: the site asks for none)."""
        self.certificates = certificates
        """Checks each request's client certificate (``peer_certificates``; None: not checked)."""
        self.read_turns = read_turns
        """Makes each connection's ``Intake`` (None: aiohttp parses every read at once)."""
        self.max_per_reader = max_per_reader
        """Open connections one named reader may hold (None: no bound of its own)."""
        self.request_timeout_s = request_timeout_s
        self.send_timeout_s = send_timeout_s
        self.min_read_bytes_per_s = min_read_bytes_per_s
        self.open: dict[Any, _GuardedProtocol] = {}
        """Open connections, oldest first."""
        self.closing = 0
        """Connections pushed out for a newcomer whose close has not completed yet."""
        self.refused = 0
        self.pushed_out = 0
        """Idle connections closed to make room for a new one."""
        self.timed_out = 0
        """Connections closed because a request (or a TLS handshake) did not arrive in time."""
        self.stalled = 0
        """Connections aborted because their peer took nothing written to them for ``send_timeout_s``."""
        self.too_slow = 0
        """Answers abandoned (their connections aborted) because they were taken slower than
        ``min_read_bytes_per_s``."""
        self.over_share = 0
        """Requests refused because their reader held ``max_per_reader`` connections, all busy."""

    def time_to_take(self, size: int) -> float | None:
        """Seconds a reader has to take an answer of ``size`` bytes (None: as long as it likes)."""
        if not self.min_read_bytes_per_s:
            return None
        return self.request_timeout_s + size / self.min_read_bytes_per_s

    def refused_handshake(self) -> None:
        """A socket closed at accept: ``max_connections`` TLS handshakes were in progress."""
        self.refused += 1

    def admit(self) -> bool:
        """Whether a new connection may open: there is room, or an idle connection is closed to make some:
        the oldest of those that never authenticated, else the kept-alive one idle the longest."""
        if len(self.open) - self.closing < self.max_connections:
            return True
        idle = self._stranger() or self._longest_idle()
        if idle is not None:
            idle.push_out()
        else:
            waiting = self._longest_waiting()
            if waiting is None:
                return False
            waiting.give_way()
        self.pushed_out += 1
        return True

    def _stranger(self) -> _GuardedProtocol | None:
        """The oldest open connection that never authenticated and has no request being handled."""
        for protocol in self.open.values():
            if not protocol.authenticated and not protocol.busy and not protocol.closing:
                return protocol
        return None

    def _longest_idle(self, among: Iterable[_GuardedProtocol] | None = None) -> _GuardedProtocol | None:
        """The kept-alive connection (of ``among``, else of all) that has waited the longest for its next
        request (None: every one is busy, or has begun to send a request)."""
        candidates = self.open.values() if among is None else among
        idle = [p for p in candidates if p.idle_since is not None and not p.busy and not p.closing]
        return min(idle, key=lambda protocol: protocol.idle_since or 0.0, default=None)

    def _longest_waiting(self, among: Iterable[_GuardedProtocol] | None = None) -> _GuardedProtocol | None:
        """The connection (of ``among``, else of all) whose request has waited the longest for something to
        answer (``waiting``)."""
        candidates = self.open.values() if among is None else among
        waits = [p for p in candidates if p.waiting is not None and not p.closing]
        return min(waits, key=lambda protocol: protocol.waiting_since, default=None)

    def room_for_reader(self, protocol: _GuardedProtocol, name: str) -> bool:
        """Whether ``protocol`` may become one of ``name``'s connections: the reader holds fewer than
        ``max_per_reader``, or one of its own makes room (its idle one, else its waiting request)."""
        if self.max_per_reader is None:
            return True
        own = [
            p
            for p in self.open.values()
            if p is not protocol and p.who == name and p.authenticated and not p.closing
        ]
        if len(own) < self.max_per_reader:
            return True
        idle = self._longest_idle(own)
        if idle is not None:
            idle.push_out()
        else:
            waiting = self._longest_waiting(own)
            if waiting is None:
                self.over_share += 1
                return False
            waiting.give_way()
        self.pushed_out += 1
        return True


class _GuardedProtocol(asyncio.Protocol):
    """aiohttp's request handler behind a timer: closed when a request does not arrive in time."""

    def __init__(self, inner: Any, guard: _Guard) -> None:
        self.inner = inner
        self.guard = guard
        self.transport: Any = None
        self.busy = False
        self.authenticated = False
        """A request on this connection carried valid credentials: it makes room for a newcomer only once no
        connection that never authenticated can."""
        self.known = False
        """Its request's work waits in the known clients' line of turns (``read_gate.WorkTurns``)."""
        self.who: str | None = None
        """Whose connection it is, for logs and the budget's shares: the name its credentials gave
        (``mark_authenticated``)."""
        self.closing = False
        self.idle_since: float | None = None
        """When its last answer was sent, while no byte of a next request has arrived (None otherwise)."""
        self.waiting: asyncio.Event | None = None
        """Set to have its request, which only waits (``waiting``), answer now with what it has."""
        self.waiting_since = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.stall: asyncio.TimerHandle | None = None
        """Runs out while writing is paused (``send_timeout_s``)."""
        self.watch: ByteWatch | None = None
        """Told of every read's size (``watch_bytes``) until it answers None."""
        self.seen: HeldTransport | None = None
        """The transport aiohttp sees, when an intake takes the reads (else the transport itself)."""
        self.intake: Intake | None = None
        """Given every read instead of aiohttp (the site's ``read_turns``); it hands them on with ``feed``."""
        self.peer: PeerCertificate | None = None
        """Its client certificate, noted at the handshake when the site checks them."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if self.guard.certificates is not None:
            self.peer = peer_certificate(transport)
        if self.guard.read_turns is not None:  # aiohttp's resumes must not undo the intake's holds
            self.seen = HeldTransport(transport)
            self.intake = self.guard.read_turns(self)
        self.guard.open[self.seen or transport] = self  # as requests find it (``request.transport``)
        self.inner.connection_made(self.seen or transport)
        self.arm()

    def data_received(self, data: bytes) -> None:
        self.idle_since = None
        if not self.busy and self.timer is None:
            self.arm()
        watch = self.watch
        if watch is not None:
            verdict = watch(len(data))
            if verdict is None:
                self.watch = None
            elif verdict:
                self.watch = None
                self.transport.abort()  # over its bound: nothing of this read is handed on
                return
        if self.intake is not None:
            self.intake(data)
            return
        self.inner.data_received(data)

    def feed(self, data: bytes) -> None:
        """Hand aiohttp ``data``, a read its intake took, unless the socket is gone."""
        if self.transport is not None and not self.transport.is_closing():
            self.inner.data_received(data)

    def hold_reading(self) -> None:
        """Stop reading the socket (for its intake), whatever aiohttp's own flow control does meanwhile."""
        if self.seen is not None:
            self.seen.hold()

    def release_reading(self) -> None:
        """Read the socket again, unless aiohttp's own flow control holds it."""
        if self.seen is not None:
            self.seen.release()

    def is_open(self) -> bool:
        """Whether the socket is still there (not closing)."""
        return self.transport is not None and not self.transport.is_closing()

    def eof_received(self) -> bool | None:
        if self.intake is not None:
            self.intake.drain()
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.intake is not None:
            self.intake.close()
        self.disarm()
        self._stop_stall()
        if self.closing:
            self.guard.closing -= 1
            self.closing = False
        self.guard.open.pop(self.seen or self.transport, None)
        self.inner.connection_lost(exc)

    def push_out(self) -> None:
        """Close this idle connection to make room for a new one."""
        self.closing = True
        self.guard.closing += 1
        self.transport.close()

    def give_way(self) -> None:
        """Have this connection's waiting request answer now, then close the connection, to make room for a
        new one (``_request_started`` closes it)."""
        self.closing = True
        self.guard.closing += 1
        if self.waiting is not None:
            self.waiting.set()

    def pause_writing(self) -> None:
        timeout = self.guard.send_timeout_s
        if timeout is not None and self.stall is None:
            self.stall = asyncio.get_running_loop().call_later(timeout, self._stalled)
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self._stop_stall()
        self.inner.resume_writing()

    def _stop_stall(self) -> None:
        if self.stall is not None:
            self.stall.cancel()
            self.stall = None

    def _stalled(self) -> None:
        """The peer took nothing of what was written for ``send_timeout_s``: drop the connection."""
        self.stall = None
        self.guard.stalled += 1
        peer = self.transport.get_extra_info("peername")
        log.info(
            "HTTP connection of %s aborted: it took none of its answer for %g s",
            peer[0] if peer else "a client",
            self.guard.send_timeout_s,
        )
        self.transport.abort()

    def arm(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(self.guard.request_timeout_s, self._expired)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        if not self.busy and self.transport is not None:
            self.guard.timed_out += 1
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
    """The request's headers arrived: stop its connection's timer while it is handled. A request HTTP/1.1
    cannot serve and a body in a ``Content-Encoding`` are refused first (``unserved_request``)."""
    unserved = unserved_request(request)
    if unserved is not None:
        return unserved
    guarded = request.app[_GUARD_KEY].open.get(request.transport)
    if guarded is None:
        if request.transport is None:  # its connection went before it began: nobody to answer, no work
            return web.Response(status=HTTPStatus.SERVICE_UNAVAILABLE)
        return await handler(request)
    request[_GUARDED] = guarded
    if guarded.peer is not None and guarded.guard.certificates is not None:
        ended = guarded.guard.certificates.refused(request, guarded.peer)
        if ended is not None:  # its certificate expired, or a reload no longer accepts it
            return ended
    guarded.busy = True
    guarded.disarm()
    vouch = guarded.guard.vouch
    guarded.known = guarded.authenticated or vouch is None or vouch(request)
    try:
        if guarded.intake is not None:  # requests begin one at a time, the loop resting between them
            await guarded.intake.work_turn()
        response = await handler(request)
        if guarded.closing:  # it gave way for a new connection (``waiting``): closed after its answer
            if response.prepared:
                guarded.transport.close()
            else:
                response.force_close()
        return response
    finally:
        guarded.busy = False
        if guarded.stall is None:
            guarded.idle_since = time.monotonic()


def mark_authenticated(request: web.Request, name: str | None = None) -> web.Response | None:
    """The request carried valid credentials (of ``name``, for logs and shares): its connection is a known
    client's from now on. Returns the answer to send instead of handling it when the named reader holds
    its share of the connections (``max_per_reader``) and none of them can make room: 503
    ``too_many_connections`` with ``Retry-After``, logged as refusals are, the connection closed after it."""
    guarded = request.get(_GUARDED)
    if guarded is None:
        return None
    guard = guarded.guard
    if name is not None and guarded.who != name and not guard.room_for_reader(guarded, name):
        text = f"reader {name!r} holds {guard.max_per_reader} connections, its share of them; retry later"
        answer = refuse(request, text, _BUSY, "too_many_connections")
        answer.headers["Retry-After"] = "1"
        return answer
    guarded.authenticated = True
    if name is not None:
        guarded.who = name
    return None


@contextlib.contextmanager
def waiting(request: web.Request) -> Iterator[asyncio.Event]:
    """While in this block the request only waits (a long poll, holding nothing but its connection): at the
    connection cap, with no idle connection to close, the one that has waited the longest gives way to a
    new connection: the event is set, the request answers with what it has, and its connection is closed
    after the answer."""
    give_way = asyncio.Event()
    guarded = request.get(_GUARDED)
    if guarded is None:
        yield give_way
        return
    if guarded.closing:
        give_way.set()
    guarded.waiting, guarded.waiting_since = give_way, time.monotonic()
    try:
        yield give_way
    finally:
        guarded.waiting = None


def watch_bytes(request: web.Request, watch: ByteWatch) -> None:
    """Tell ``watch`` the size of every read of the request's connection from now on: it answers True to
    have the connection aborted (the read is dropped), None to stop being told, False to go on."""
    guarded = request.get(_GUARDED)
    if guarded is not None:
        guarded.watch = watch


def reads_of(request: web.Request) -> ReadGate | None:
    """The reads of the request's connection, even once it is gone (None: the site is not guarded)."""
    return request.get(_GUARDED)


def hold(request: web.Request, size: int) -> None:
    """Take ``size`` more bytes of the memory budget for this request before reading or building them
    (``BudgetExhausted`` when the budget cannot take them; nothing when the site has no budget)."""
    reservation = request.get(_RESERVATION)
    if reservation is not None:
        reservation.grow(size)


def settle(request: web.Request, size: int) -> None:
    """This request holds ``size`` bytes from now on (what it read or built really is)."""
    reservation = request.get(_RESERVATION)
    if reservation is not None:
        reservation.settle(size)


def over_budget_response() -> web.Response:
    """The answer to a request the memory budget cannot take now."""
    return web.Response(
        status=_BUSY,
        text=_OVER_BUDGET,
        content_type="application/json",
        headers={"Retry-After": "1"},
    )


def _budget_middleware(budget: MemoryBudget, is_member: Callable[[web.Request], bool]) -> Any:
    """Hold each request's share of ``budget`` until its answer is written (inside it, so that a client
    slow to read keeps its answer counted), then give it back."""

    @web.middleware
    async def within_budget(request: web.Request, handler: Any) -> web.StreamResponse:
        guarded = request.app[_GUARD_KEY].open.get(request.transport)
        holder = guarded.who if guarded is not None and guarded.authenticated else None
        reservation = Reservation(budget, is_member(request), holder)
        request[_RESERVATION] = reservation
        try:
            try:
                response = await handler(request)
            except BudgetExhausted:
                return over_budget_response()
            if isinstance(response, web.Response) and not response.prepared:
                body = response.body
                if isinstance(body, bytes | bytearray | memoryview):
                    reservation.settle(memoryview(body).nbytes)
                response = await _send(request, response)

            return response
        finally:
            reservation.release()

    return within_budget


WRITE_PIECE = 256 * 1024
"""Bytes of an answer written at a time, each waiting for room on the connection (``_send``)."""


async def _send(request: web.Request, response: web.Response) -> web.StreamResponse:
    """Send ``response`` within the time its size gives (``_Guard.time_to_take``): an answer taken slower
    than that is abandoned and its connection aborted (``_too_slow``), so that a reader taking a few KiB
    now and then, never stalled long enough for ``send_timeout_s``, cannot hold its share of the budget for
    hours."""
    body = response.body
    size = memoryview(body).nbytes if isinstance(body, bytes | bytearray | memoryview) else 0
    limit = request.app[_GUARD_KEY].time_to_take(size)
    try:
        async with asyncio.timeout(limit):
            return await _write(request, response)
    except TimeoutError:
        _too_slow(request, size, limit or 0.0)
        return response


def _too_slow(request: web.Request, size: int, limit: float) -> None:
    """Abort the connection of ``request``, whose answer of ``size`` bytes was not taken within ``limit``
    seconds, and say so (one WARNING naming the reader, limited per 10 s)."""
    guard = request.app[_GUARD_KEY]
    guard.too_slow += 1
    guarded = guard.open.get(request.transport)
    reader = (guarded.who if guarded is not None else None) or "a client"
    _slow_readers.write(
        log,
        time.monotonic(),
        "http_slow_reader",
        f"HTTP answer to {reader} abandoned and its connection closed: {size} bytes not taken within "
        f"{limit:g} s (under {guard.min_read_bytes_per_s} bytes/s)",
        peer=request.remote,
        reader=reader,
    )
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a reset: what the kernel still holds of the answer is dropped too
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()


class Pace:
    """The writes of an answer streamed as it is made, its length unknown (a listing): what it has written
    must be taken within ``request_timeout_s`` + that many bytes / ``min_read_bytes_per_s`` of its first
    write, else it is abandoned as ``_send`` abandons an answer taken too slowly."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.guard = request.app.get(_GUARD_KEY)
        self.started = time.monotonic()
        self.written = 0

    async def write(self, response: web.StreamResponse, data: bytes) -> None:
        """``response.write(data)`` in time; ``ConnectionResetError`` once the connection is aborted."""
        self.written += len(data)
        limit = self.guard.time_to_take(self.written) if self.guard is not None else None
        if limit is None:
            await response.write(data)
            return
        try:
            async with asyncio.timeout(max(0.0, self.started + limit - time.monotonic())):
                await response.write(data)
        except TimeoutError:
            _too_slow(self.request, self.written, limit)
            raise ConnectionResetError("the answer was taken too slowly") from None


async def _write(request: web.Request, response: web.Response) -> web.StreamResponse:
    """Write ``response``; a body over ``WRITE_PIECE`` goes a piece at a time, each waiting for room on the
    connection. Written whole, a TLS connection encrypts it whole into its socket's buffer at once: the
    answer left the budget before the reader had it, and a reader that stopped reading left it there for
    as long as its connection lived, its writing never paused (so never timed, ``send_timeout_s``)."""
    body = response.body
    whole = memoryview(body).cast("B") if isinstance(body, bytes | bytearray | memoryview) else None
    if whole is None or whole.nbytes <= WRITE_PIECE or request.method == "HEAD":
        with contextlib.suppress(ConnectionError):  # gone: aiohttp ends the request as it would have
            await response.prepare(request)
            await response.write_eof()
        return response
    stream = web.StreamResponse(status=response.status, reason=response.reason, headers=response.headers)
    stream.content_length = whole.nbytes
    if response.keep_alive is False:
        stream.force_close()
    with contextlib.suppress(ConnectionError):
        await stream.prepare(request)
        for start in range(0, whole.nbytes, WRITE_PIECE):
            await stream.write(whole[start : start + WRITE_PIECE])  # (waits while writing is paused)
        await stream.write_eof()
    return stream


class GuardedRunner:
    """The running site: ``await cleanup()`` stops it (as ``web.AppRunner.cleanup`` does)."""

    def __init__(
        self, runner: web.AppRunner, server: asyncio.base_events.Server | TlsServer, guard: _Guard
    ) -> None:
        self.runner = runner
        self.server = server
        self.guard = guard

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def cleanup(self) -> None:
        """Stop serving: connections handling no request close at once, the others as aiohttp ends them."""
        self.server.close()
        lingering = []
        for protocol in list(self.guard.open.values()):
            if not protocol.busy and protocol.transport is not None:
                lingering.append(getattr(protocol.inner, "_task_handler", None))
                protocol.transport.abort()
        await asyncio.sleep(0)  # their ends are told: aiohttp's shutdown no longer counts them
        await self.runner.cleanup()
        pending = [task for task in lingering if task is not None and not task.done()]
        for task in pending:  # aiohttp's reading of a body's rest outlives its connection: ended here
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def start_guarded_site(
    app: web.Application,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    max_connections: int,
    request_timeout_s: float,
    keepalive_s: float = 60.0,
    sock: socket.socket | None = None,
    budget: MemoryBudget | None = None,
    is_member: Callable[[web.Request], bool] = lambda _request: False,
    on_tls_failure: HandshakeFailure | None = None,
    reuse_port: bool = False,
    send_timeout_s: float | None = None,
    max_line_size: int = 8190,
    min_read_bytes_per_s: int = 0,
    max_per_reader: int | None = None,
    read_turns: ReadTaker | None = None,
    name: str = "HTTPS endpoint",
    certificates: CertificateCheck | None = None,
    vouch: Callable[[web.Request], bool] | None = None,
) -> GuardedRunner:
    """Serve ``app`` on ``host:port`` (0: a free port), or on the listening ``sock`` when given, behind the
    guard; ``OSError`` if it cannot bind. With ``budget``, every request holds its share of it;
    ``is_member(request)`` tells (after the app's own middlewares authenticated it) whether it may use the
    members' reserve. With TLS the site accepts its sockets itself (``http.tls_accept``): a failed
    handshake is told to ``on_tls_failure`` with the peer and why. ``reuse_port``: the address is shared with
    other processes (``SO_REUSEPORT``). ``send_timeout_s``: a connection whose peer takes none of its
    answer for that long is aborted (None: never). ``max_line_size``: the longest request line or header
    taken (longer ones are answered 400). ``min_read_bytes_per_s``: an answer of N bytes not taken within
    ``request_timeout_s`` + N / this seconds is abandoned, its connection aborted (0: no minimum).
    ``max_per_reader``: open connections one named reader may hold (None: no bound of its own).
    ``read_turns``: makes each connection's ``Intake``, which takes its reads before aiohttp parses them.
    ``name``: the site in the lines of failed TLS handshakes, without ``on_tls_failure``. ``certificates``:
    a request on a connection whose client certificate has since ended is refused (``peer_certificates``).
    ``vouch``: whether a request's credentials are valid, asked before its first turn (None: none asked)."""
    guard = _Guard(
        max_connections,
        request_timeout_s,
        send_timeout_s,
        min_read_bytes_per_s,
        max_per_reader,
        read_turns,
        certificates,
        vouch,
    )
    app[_GUARD_KEY] = guard
    app.middlewares.insert(0, _request_started)
    uninvited_without_route(app)
    closed_before_unread_bodies(app)
    if budget is not None:
        app.middlewares.append(_budget_middleware(budget, is_member))
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=keepalive_s,
        lingering_time=0,  # a body not arrived by the answer is not waited for (``http.unread_bodies``)
        auto_decompress=False,  # bodies are read as sent (``_request_started`` refuses encoded ones)
        max_line_size=max_line_size,
    )
    await runner.setup()
    make_handler = runner.server

    def protocol() -> asyncio.Protocol:
        if not guard.admit():
            guard.refused += 1
            return _Refused()
        handler = answer_errors_in_json(make_handler())  # type: ignore[misc]  # runner.server is set by setup()
        return _GuardedProtocol(handler, guard)

    server: asyncio.base_events.Server | TlsServer
    try:
        loop = asyncio.get_running_loop()
        if ssl_context is not None:
            server = await start_tls_server(
                protocol,
                host,
                port,
                ssl_context,
                request_timeout_s,
                on_tls_failure or tls_failure_lines(name),
                sock=sock,
                reuse_port=reuse_port,
                room=lambda: max_connections,
                on_full=lambda _peer: guard.refused_handshake(),
            )
        elif sock is None:
            server = await loop.create_server(
                protocol, host, port, reuse_address=True, reuse_port=reuse_port or None
            )
        else:
            server = await loop.create_server(protocol, sock=sock)
    except BaseException:
        await runner.cleanup()
        raise
    return GuardedRunner(runner, server, guard)


class UnreadBody(Exception):
    """Why ``read_body`` has no body: ``status`` 408 when it did not arrive in time, 400 when it breaks its
    framing or when the client closed its connection before it arrived (said in one DEBUG line: nobody
    reads the answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_body(request: web.Request, timeout_s: float | None = None, length: int | None = None) -> bytes:
    """The request body, arrived within ``timeout_s`` (None: the site's ``request_timeout_s``), else
    ``UnreadBody``. With ``length``, exactly that many bytes, however large (a body over the app's
    ``client_max_size`` is otherwise refused with aiohttp's 413)."""
    if timeout_s is None:
        guard = request.app.get(_GUARD_KEY)
        timeout_s = guard.request_timeout_s if guard is not None else None
    reading = request.read() if length is None else request.content.readexactly(length)
    try:
        return await asyncio.wait_for(reading, timeout_s)
    except TimeoutError:
        raise UnreadBody(408, "the body did not arrive in time") from None
    except asyncio.IncompleteReadError:
        raise UnreadBody(400, "the body is shorter than its length") from None
    except BODY_ERRORS as error:  # (aiohttp's parser says it in its own refusal: one WARNING)
        raise UnreadBody(400, f"the body cannot be read: {body_error_text(error)}") from None
    except ConnectionError:
        log.debug("%s closed its connection before its request body arrived", request.remote)
        raise UnreadBody(400, "the connection closed before the body arrived") from None
