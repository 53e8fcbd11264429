"""MQTT over WebSocket (subprotocol ``mqtt``, binary messages) through aiohttp, plain or TLS (wss).

aiohttp gives each WebSocket a handler task, so a WebSocket client costs a task (plain TCP clients do not).
The bytes of each binary message are fed to a connection exactly as TCP bytes are: MQTT packets may
span messages or share one. Every byte the socket reads, frames and all, is taken from the loop's turn
before aiohttp parses it (``turns.SocketTurns``, the rest kept for later turns as a TCP read's is), and a
message's packets are handled only while the turn has packets left, else in a later turn; so is a ping
(answered here, not by aiohttp, counted as ``PING_PACKETS``). Writes are
batched into one binary message per loop iteration. A closed connection whose socket is still open
``CLOSE_GRACE_S`` later (a client that stopped reading: the last messages or the close frame wait for it)
is aborted, and an abort ends the socket at once: a client that never reads cannot keep its socket, its
handler or the broker's stop waiting. aiohttp gathers a message whole, up to ``limits.max_packet_size`` +
16 bytes; a larger one is a packet too large, as on TCP: the connection's DISCONNECT (v5: 0x95) goes
before aiohttp's close (``MqttWebSocket``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from aiohttp import WSCloseCode, WSMsgType, web

from broker_edge.engine.connection.states import NEW
from broker_edge.http.guard import GuardedRunner, reads_of, start_guarded_site, watch_bytes
from broker_edge.http.json_errors import refuse
from broker_edge.protocol.errors import PacketTooLarge
from broker_edge.runtime.peer_certificate import note_peer_certificate, refuse_resumed, resumed_refusal
from broker_edge.runtime.transports.stream import StreamConnection
from broker_edge.runtime.transports.tcp import TurnsHost, report_tls_failures
from broker_edge.runtime.transports.turns import ReadTurns, SocketTurns

if TYPE_CHECKING:
    from collections.abc import Iterable

    from broker_edge.engine.connection.connection import ConnectionHost
    from broker_edge.engine.connection.terms import ListenerRuntime

__all__ = ["WebSocketTransport", "start_websocket_listener"]

log = logging.getLogger(__name__)

CLOSE_GRACE_S = 2.0
"""How long a closed WebSocket connection may take to send what it has left before its socket is aborted."""
HELD_CHECK_S = 1.0
"""How often a held connection's reader looks whether its client is still there while it waits."""


class WebSocketTransport:
    """The part of the asyncio transport interface ``StreamConnection`` uses, over an aiohttp WebSocket."""

    __slots__ = (
        "_buffered",
        "_closing",
        "_connection",
        "_peername",
        "_pending",
        "_readable",
        "_request",
        "_sending",
        "_ws",
        "high_water",
    )

    def __init__(self, ws: web.WebSocketResponse, request: web.Request, high_water: int) -> None:
        self._ws = ws
        self._request = request
        transport = request.transport
        self._peername = transport.get_extra_info("peername") if transport is not None else None
        """The client's address, kept: aiohttp lets go of the request's transport at close, and the log
        lines of a closing connection name the peer too."""
        self._pending: list[bytes] = []
        self._buffered = 0
        self._sending = False
        self._closing = False
        self._connection: StreamConnection | None = None
        self._readable = asyncio.Event()
        """Set while the connection reads (``pause_reading``/``resume_reading``), and once it ends."""
        self._readable.set()
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

    async def too_large(self) -> None:
        """A message over ``max_packet_size``, which aiohttp is about to close the socket for: end the
        connection as for a packet too large, sending its last words (v5: DISCONNECT 0x95) first."""
        connection = self._connection
        if connection is None or self._closing or self._ws.closed:
            return
        self._sending = True  # the last words are sent here, before aiohttp's close frame
        try:
            connection.protocol_error(PacketTooLarge("a WebSocket message over max_packet_size + 16 bytes"))
            connection.flush()
            data = b"".join(self._pending)
            self._pending.clear()
            if data:
                await self._ws.send_bytes(data)
        except (ConnectionError, RuntimeError) as exc:
            log.debug("websocket send failed: %s", exc)
        finally:
            self._sending = False

    def get_write_buffer_size(self) -> int:
        return self._buffered

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._readable.set()  # a reader waiting for a release sees the end
        asyncio.get_running_loop().call_later(CLOSE_GRACE_S, self._abort_unclosed)
        if not self._sending:  # else closed once the send ends
            asyncio.get_running_loop().create_task(self._ws.close())

    def _abort_unclosed(self) -> None:
        transport = self._request.transport
        if transport is not None and not transport.is_closing():
            self.abort()

    def abort(self) -> None:
        self._closing = True
        self._readable.set()
        self._pending.clear()
        transport = self._request.transport
        if transport is not None:
            transport.abort()  # at once: a send waiting for the client to read ends with it
        asyncio.get_running_loop().create_task(self._ws.close())

    def is_reading(self) -> bool:
        return self._readable.is_set()

    def pause_reading(self) -> None:
        """Reading is paused by not taking the next message (``_read`` waits in ``until_readable``)."""
        if not self._closing:
            self._readable.clear()

    def resume_reading(self) -> None:
        self._readable.set()

    @property
    def open(self) -> bool:
        """Whether the WebSocket is still there: not closed, its client not gone."""
        return not self._ws.closed and self._request.transport is not None

    async def until_readable(self) -> None:
        """Wait until reading resumes (or the connection ends), at most ``HELD_CHECK_S``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._readable.wait(), HELD_CHECK_S)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self._peername if self._peername is not None else default
        transport = self._request.transport
        return transport.get_extra_info(name, default) if transport is not None else default


class MqttWebSocket(web.WebSocketResponse):
    """aiohttp's WebSocket whose close for a message too big (``WSCloseCode.MESSAGE_TOO_BIG``) ends the MQTT
    connection first (``WebSocketTransport.too_large``)."""

    mqtt: WebSocketTransport | None = None

    async def close(self, *, code: int = WSCloseCode.OK, message: bytes = b"", drain: bool = True) -> bool:
        transport, self.mqtt = self.mqtt, None
        if code == WSCloseCode.MESSAGE_TOO_BIG and transport is not None:
            await transport.too_large()
        return await super().close(code=code, message=message, drain=drain)


FRAME_HEAD_MAX = 14
"""The longest WebSocket frame header a client sends (2 bytes, 8 of length, 4 of mask)."""


class PreConnectBytes:
    """What a WebSocket client may send before its CONNECT is read: ``limits.max_connect_packet_size`` and
    one frame header, counted as the socket reads them (frames and all), before aiohttp gathers a message.
    A TCP client can send no more: its first packet's length prefix is checked as it arrives. Past it the
    connection is refused as ``connect_too_large``; once the CONNECT is read the count stops."""

    __slots__ = ("budget", "connection", "received")

    def __init__(self, connection: StreamConnection, budget: int) -> None:
        self.connection = connection
        self.budget = budget + FRAME_HEAD_MAX
        self.received = 0

    def __call__(self, size: int) -> bool | None:
        connection = self.connection
        if connection.state != NEW:
            return None
        self.received += size
        if self.received <= self.budget:
            return False
        connection.refuse_connect_too_large(
            f"{self.received} bytes before CONNECT on a WebSocket", bytes=self.received
        )
        return True


PING_PACKETS = 8
"""What a ping counts of a turn's packets: its pong is a write of its own, about eight PINGREQs' work (a
flood of pings counted as one packet each held a turn about 10 ms)."""


async def _read(transport: WebSocketTransport, connection: StreamConnection, turns: ReadTurns) -> None:
    """Hand ``connection`` the bytes of each binary message and answer each ping (``PING_PACKETS`` packets
    of the turn), each within a turn's budget: a flood of pings is read over many turns, as a flood of
    packets is. While the connection holds its reading (over its message rate, owing acknowledgements, ...)
    the next message waits, untaken."""
    ws = transport._ws
    async for message in ws:
        if message.type in (WSMsgType.PING, WSMsgType.PONG):
            while not turns.spend_packets(PING_PACKETS):
                await turns.next_turn()
            if message.type == WSMsgType.PING:
                await ws.pong(message.data)
        elif message.type == WSMsgType.BINARY:
            await _hand_message(transport, connection, turns, message.data)
        elif message.type == WSMsgType.TEXT:
            connection.abort()  # MQTT over WebSocket is binary only
            connection.flush()
            return
        elif message.type == WSMsgType.ERROR:
            return


async def _hand_message(
    transport: WebSocketTransport, connection: StreamConnection, turns: ReadTurns, data: bytes
) -> None:
    """Hand ``connection`` a binary message within the turns' budget: a message holding more packets than
    a turn has left is handled over several turns (the rest waits, as a TCP read's rest does)."""
    while True:
        while connection.held and transport.open:
            await transport.until_readable()
        while not turns.spend_packets(0):  # this turn's packets are handled: the next one
            await turns.next_turn()
        unread = connection.handle_read(data, turns)
        if not unread:
            return
        data = data[-unread:]
        await turns.next_turn()


def _owes_acknowledgements(connection: StreamConnection) -> bool:
    """Whether deliveries to ``connection`` wait for its acknowledgements (its socket's reads go first)."""
    session = connection.session
    return session is not None and bool(session.inflight)


SUBPROTOCOLS = ("mqtt", "mqttv3.1")
"""The WebSocket subprotocols a listener selects (``mqttv3.1``: MQTT 3.1's clients)."""


def _other_subprotocols(request: web.Request) -> web.Response | None:
    """The 400 to an upgrade offering subprotocols none of which is MQTT's (a client of something else), in
    JSON and logged at a bounded rate (upgraded without one, it spoke nothing the broker reads); None when it
    offers one of ``SUBPROTOCOLS``, or none at all (upgraded, as other brokers do)."""
    offered = [
        name.strip()
        for header in request.headers.getall("Sec-WebSocket-Protocol", ())
        for name in header.split(",")
        if name.strip()
    ]
    if not offered or any(name in SUBPROTOCOLS for name in offered):
        return None
    shown = ", ".join(offered)
    shown = shown if len(shown) <= 60 else shown[:60] + "..."
    return refuse(
        request, f"the upgrade offers no subprotocol mqtt ({shown!r}): MQTT over WebSocket is 'mqtt'"
    )


async def start_websocket_listener(broker: ConnectionHost, listener: ListenerRuntime) -> GuardedRunner:
    """Serve ``listener.config.path`` on the listener's address; ``runner.cleanup()`` stops it.

    The same bounds as a TCP listener's before CONNECT: behind the HTTP guard (``broker_edge.http.guard``), a
    TLS handshake and the upgrade request must arrive within ``limits.connect_timeout_s`` (counted in
    ``timed_out``; a failed handshake is counted and logged with its peer and reason as a TCP listener's
    is), at most ``limits.max_connections`` sockets are open (more are answered 503), once
    upgraded the connection goes through the broker's admission and CONNECT timeout like any other, and it
    may send no more than ``PreConnectBytes`` before its CONNECT is read."""
    config = listener.config
    limits = broker.config.limits
    turns = cast(TurnsHost, broker).read_turns

    async def serve(request: web.Request) -> web.StreamResponse:
        refusal = _other_subprotocols(request)
        if refusal is not None:
            return refusal
        ws = MqttWebSocket(
            protocols=SUBPROTOCOLS,
            max_msg_size=limits.max_packet_size + 16,
            autoping=False,
            compress=False,  # no permessage-deflate: a zlib state per connection, every message compressed
        )
        await ws.prepare(request)
        transport = WebSocketTransport(ws, request, limits.outgoing_buffer_bytes)
        ws.mqtt = transport
        connection = StreamConnection(broker, listener)
        transport._connection = connection
        refused = None
        if listener.tls and request.transport is not None:
            ssl_object = request.transport.get_extra_info("ssl_object")
            note_peer_certificate(connection, listener, ssl_object, broker.call_later)
            refused = resumed_refusal(connection, listener, ssl_object)
        connection.attach_transport(transport)
        if refused is not None:  # a TLS session resumed after a reload that no longer accepts it
            refuse_resumed(connection, *refused)
        watch_bytes(request, PreConnectBytes(connection, limits.max_connect_packet_size))
        gate = reads_of(request)
        if gate is not None and isinstance(gate.intake, SocketTurns):
            gate.intake.owes_acknowledgements = partial(_owes_acknowledgements, connection)
        try:
            await _read(transport, connection, turns)
        except ConnectionError as exc:  # the client went while a pong or a close frame was being written
            log.debug("websocket of %s ended: %s", connection.peer_address(), exc)
        finally:
            connection.connection_lost(None)
        return ws

    app = web.Application()
    app.router.add_get(config.path, serve)
    return await start_guarded_site(
        app,
        config.host,
        config.port,
        listener.ssl_context,
        limits.max_connections,
        limits.connect_timeout_s,  # the TLS handshake and the upgrade request, as a TCP listener's CONNECT
        read_turns=partial(SocketTurns, turns=turns),
        on_tls_failure=report_tls_failures(broker, listener.name, config.tls),
        reuse_port=config.reuse_port,
    )
