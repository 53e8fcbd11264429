"""One client connection as a sans-IO MQTT state machine: bytes and time in, packets and the end out.

A ``Connection`` never touches a socket, the event loop or a clock of its own. Its transport adapter
(``runtime.transports.stream``: TCP, TLS, the broker's own transport, WebSocket) feeds it what happens:
``receive(bytes)``, ``writing_paused``/``writing_resumed`` (the transport's buffer), ``transport_closed``;
the broker's sweep gives it the time (``check_timers(now)``). What it decides comes out as output
(``outgoing``): the packets to write, batched per loop turn (``take_output``), whether reading is held
(``held``: the transport stops reading while it is not 0) and how it ends (``closing``). The broker tells
the adapter to take them (``schedule_flush``, then ``flush``); the adapter also applies a hold or an end as
soon as ``receive`` returns. So every rule of the protocol is a unit test that feeds bytes and reads bytes
(``tests/unit/broker_edge/engine/connection/test_machine.py``), as h11's are.

The connection owns what belongs to the network connection (protocol version, keepalive, the will, topic
aliases both ways, the incoming receive-maximum count, the rate limiter) and writes for its ``Session``,
which owns what survives a reconnect. Packets go to the handler of their type
(``broker_edge.engine.handlers``): before CONNACK only ``handle_connect``, afterwards the connected handlers,
which are given the session (never None once connected). Handlers see the broker through ``BrokerContext``
and ask the connection for effects: write, close, refuse, hold reading. A connection refused before
CONNACK 0 always goes through ``refuse``.

Idle connections are small: every attribute is a slot, containers (topic aliases, the write batch) are
created on first use, and what most connections never set (a will, topic aliases, a refusal, packets held
back, ...) are ``RareField`` attributes, kept in a side object made by the first write of one of them. What
CONNECT settles (protocol level, keep alive, the client's limits) and where the connection is in its life
(``state``) are a ``Terms`` shared by every connection that settled the same, which also leads to the broker
and the listener; the client id is the session's. The rate limiter and the count of unanswered publishes
come with the client's first PUBLISH (``Inbound``): a device that only subscribes holds neither.
Past CONNECT the decoder is shared (``SharedDecoder``, see ``reading``) except while a packet is half-read,
and keep-alive deadlines are shared floats (``states.keepalive_deadline``).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, cast

from broker_edge.engine.connection.inbound import Inbound
from broker_edge.engine.connection.outgoing import ABORT, CLOSE, Closing, ConnectionRare, Outgoing
from broker_edge.engine.connection.reading import (
    OwnDecoder,
    PacketTurn,
    PeerPartial,
    forget_unfinished,
    own_decoder,
    settle_decoder,
    unfinished_since,
)
from broker_edge.engine.connection.states import (
    AUTHENTICATING,
    CLOSED,
    CONNECTED,
    HEARD_FROM,
    HELD_FOR_ACKS,
    HELD_FOR_HANDOVER,
    HELD_FOR_RATE,
    HELD_FOR_SUBACK,
    NEW,
    TIMERS_CHECKED_EVERY_S,
    keepalive_deadline,
)
from broker_edge.engine.connection.terms import Terms
from broker_edge.engine.handlers import dispatch_connected, handle_connect, handle_publish, handle_publish_run
from broker_edge.engine.handlers.context import BrokerContext
from broker_edge.engine.publish_run import each_apart, plain_run_end
from broker_edge.engine.rare_fields import RareField
from broker_edge.protocol.codec import PacketDecoder, encode
from broker_edge.protocol.errors import MQTTError, PacketTooLarge, TooManyElements, UnsupportedProtocolVersion
from broker_edge.protocol.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    PubAck,
    PubAckRun,
    Publish,
    PublishesAlike,
    Subscribe,
    Unsubscribe,
)
from broker_edge.protocol.properties import Properties
from broker_edge.protocol.reason_codes import CONNACK_REASON_CODES, ConnectReturnCode, ReasonCode

if TYPE_CHECKING:
    from collections.abc import Callable

    from broker_edge.engine.connection.terms import ListenerRuntime
    from broker_edge.engine.ports import MovedClaim
    from broker_edge.engine.sessions.session import Session
    from broker_edge.engine.slow_subscribers import SlowSubscribers
    from broker_edge.protocol.packets import Packet, Will
    from broker_edge.security.limits import TokenBucket

__all__ = ["Connection", "ConnectionHost"]

_ANSWERED_LATER = frozenset((Subscribe, Unsubscribe))
"""Packets whose answer may wait for work in later loop turns (``HELD_FOR_SUBACK``): the packets read after
one wait for it too."""
_OVER_MAXIMUM = "receive_maximum_exceeded"
_HELD_OVER = "receive maximum exceeded: more unacknowledged QoS 1/2 PUBLISHes, read once half are answered"
_PROTOCOL_ERROR = ReasonCode.PROTOCOL_ERROR

log = logging.getLogger("broker_edge.connection")


class ConnectionHost(BrokerContext, Protocol):
    """The broker as a ``Connection`` sees it (``engine.core.BrokerCore`` is one): its handlers' context plus
    admission, flushing and timers."""

    partial_bytes: int
    """Bytes of packets not fully arrived, over all connections (``limits.max_partial_packet_bytes``)."""
    partial_peers: dict[str, PeerPartial]
    """Client address → its packets not fully arrived (``reading``: the one holding the most gives way)."""
    slow_subscribers: SlowSubscribers
    """What becomes of QoS 0 messages for a connection whose write buffer is full."""

    def connection_opened(self, conn: Connection) -> None:
        """Admit (or refuse) a new connection and start its CONNECT deadline."""

    def connection_closed(self, conn: Connection, was_connected: bool) -> None: ...

    def connection_attached(self, conn: Connection) -> None:
        """``conn`` became its session's connection (CONNECT accepted)."""

    def connection_detached(self, conn: Connection) -> None:
        """``conn`` let go of its session while still open (taken over)."""

    def schedule_flush(self, conn: Outgoing) -> None:
        """Have ``conn``'s transport take its output at the end of this loop turn."""

    def call_soon(self, callback: Callable[[], None]) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> None: ...


class Connection(Outgoing):
    """The broker side of one network connection (see the module docstring)."""

    __slots__ = ("deadline", "decoder", "inbound", "session", "terms")

    aliases_in: RareField[dict[int, str] | None] = RareField(ConnectionRare, None)
    """Topic aliases the client has set towards the broker."""
    backlog: RareField[list[Packet] | None] = RareField(ConnectionRare, None)
    """Packets read but not handled yet, while reading is held (``hold``)."""
    held: RareField[int] = RareField(ConnectionRare, 0)
    """Why reading is paused: ``states.HELD_*`` bits; it resumes once none is left (``release``)."""
    held_error: RareField[MQTTError | None] = RareField(ConnectionRare, None)
    """A protocol error read behind the backlog: raised once the packets before it are handled."""
    refused: RareField[str | None] = RareField(ConnectionRare, None)
    """Why admission refused this connection (it is closed, or answered once its CONNECT arrives)."""
    peer_cn: RareField[str | None] = RareField(ConnectionRare, None)
    """The common name of the client's TLS certificate."""
    peer_uri: RareField[str] = RareField(ConnectionRare, "")
    """The ``timestone://`` URI (a cluster member's, a site's) its client certificate names: not a device."""
    peer_certificate: RareField[tuple[bytes, int] | None] = RareField(ConnectionRare, None)
    """The issuer (DER) and serial number of the client's TLS certificate, on a listener checking CRLs: a
    reload whose CRL lists it closes the connection (``runtime.revoked_peers``)."""
    peer_cas: RareField[frozenset[tuple[bytes, int]] | None] = RareField(ConnectionRare, None)
    """The CAs of the client's certificate chain, each by issuer and serial number, on a listener checking
    the chain against CRLs (``tls.crl_check: chain``): a reload whose CRL lists one closes the connection."""
    peer_trust: RareField[frozenset[bytes] | None] = RareField(ConnectionRare, None)
    """The CAs the client's certificate chain needs trusted (``security.peer_chain``), on a listener verifying
    client certificates: a reload whose ``cafile`` lacks one closes it (``runtime.untrusted_peers``)."""
    peer: RareField[str] = RareField(ConnectionRare, "")
    """``host:port`` of the client, kept by transports that lose it at close (TLS): the log lines of a
    closing connection name the peer too."""
    named: RareField[str] = RareField(ConnectionRare, "")
    """The client id while the connection has no session (a refused CONNECT, after it let go of one)."""
    will: RareField[Will | None] = RareField(ConnectionRare, None)
    will_delay: RareField[int] = RareField(ConnectionRare, 0)
    expiry_lowered: RareField[bool] = RareField(ConnectionRare, False)
    """The v5 CONNECT asked for a Session Expiry Interval the broker lowered to 0: its DISCONNECT may still
    carry one (an error only after a CONNECT with 0)."""
    handed_in: RareField[str] = RareField(ConnectionRare, "")
    """The member that moved this connection here (``handover``; "": it connected here): it is not moved
    again, and its CONNECT is not answered."""
    moved_claim: RareField[MovedClaim | None] = RareField(ConnectionRare, None)
    """The registry record the member that moved it here wrote of its session (``handover.claim_of``)."""

    def __init__(self, host: ConnectionHost, listener: ListenerRuntime) -> None:
        limits = host.config.limits
        self.terms = Terms.initial(host, listener, limits.max_inflight_out)
        """What its CONNECT settled (protocol level, keep alive, the client's limits), shared."""
        self.decoder: PacketDecoder = OwnDecoder(limits)
        """An ``OwnDecoder`` until CONNECT; past it a ``SharedDecoder`` while no packet is half-read."""
        self.session: Session | None = None
        self.deadline = 0.0
        """While connected: when a silent client is closed (``states.keepalive_deadline``), ``HEARD_FROM``
        once it sent something since the last sweep; before CONNECT: when it must have arrived."""
        self._out = None
        self.inbound: Inbound | None = None
        """The client's PUBLISH rate limiter and unanswered count, made by its first PUBLISH."""
        self._rare: ConnectionRare | None = None

    @property
    def client_id(self) -> str:
        """The client id: its session's, else the one its CONNECT gave ("" before it)."""
        session = self.session
        return session.client_id if session is not None else self.named

    @property
    def state(self) -> int:
        """``states.NEW``, ``AUTHENTICATING``, ``CONNECTED`` or ``CLOSED``: one of the connection's terms,
        the same for nearly all connections (the hot paths read ``terms.state``)."""
        return self.terms.state

    @state.setter
    def state(self, value: int) -> None:
        self.terms = self.terms.settle(state=value)

    def attached(self) -> None:
        """Its CONNECT was accepted: it is its session's connection from now on (the broker reaches it through
        the session, no longer in a table of its own)."""
        self.terms.host.connection_attached(self)

    def let_go_of_session(self) -> Session | None:
        """Drop the session (keeping its client id for what follows); the session it had, if any."""
        session = self.session
        if session is not None:
            self.named = session.client_id
            self.session = None
        return session

    def __repr__(self) -> str:
        terms = self.terms
        return f"Connection({self.client_id!r}, listener={terms.listener.name!r}, state={terms.state})"

    # -- what the transport says ---------------------------------------------------------------------------

    def opened(self) -> None:
        """The transport is connected: the broker admits (or refuses) the connection and starts its CONNECT
        deadline."""
        self.terms.host.connection_opened(self)

    def receive(self, data: bytes, turn: PacketTurn | None = None) -> int:
        """Bytes from the client, in any split: every packet they complete is handled, in order. With
        ``turn``, at most ``turn.packets_left`` of them, counted off it: the number of bytes at the end of
        ``data`` past those is returned, not handled (the caller hands them in again); else 0."""
        if type(self._out) is Closing:
            return 0  # its end is decided: nothing it sends is handled (or counted) any more
        state = self.terms.state
        if state == CONNECTED:
            self.deadline = HEARD_FROM
        elif state == CLOSED:
            return 0
        decoder = self.decoder
        unread = 0
        try:
            if turn is None:
                packets = decoder.feed(data)
            else:
                packets, unread = decoder.feed_some(data, turn.packets_left)
                turn.packets_left -= decoder.decoded
        except MQTTError as error:
            packets = error.packets_before
            self.held_error = error
            if decoder.shared:
                decoder = own_decoder(self)
        # A shared decoder holds nothing before a read, and bytes counted as unfinished are in an OwnDecoder.
        self.terms.stats.bytes_in += len(data) - unread
        if (decoder.buffered or not decoder.shared) and not settle_decoder(self, bool(packets)):
            return 0
        if self._rare is None or (self.backlog is None and self.held_error is None):
            # Nothing waits and no error is held: dispatch alone. Most connections set no ``RareField``,
            # so this costs them one slot read; every ``RareField`` read is a descriptor call, and a QoS 1
            # subscriber sends about one PUBACK per read, so they would be paid once per delivery.
            self._dispatch_all(packets)
        elif self.backlog is not None:  # earlier packets still wait (reading is held): keep their order
            self.backlog.extend(packets)
        elif self._dispatch_all(packets) and self.backlog is None:
            self._raise_held_error()
        return unread

    def transport_closed(self, exc: Exception | None) -> None:
        """The connection is gone (closed by either side): the session is let go of, the will published."""
        was_connected = self.terms.state == CONNECTED
        forget_unfinished(self)
        if was_connected and log.isEnabledFor(logging.INFO):
            self.log().info("disconnected%s", f" ({exc})" if exc is not None else "")
        self.state = CLOSED
        self._out = None
        host = self.terms.host
        host.connection_closed(self, was_connected)
        session = self.let_go_of_session()
        if session is not None and session.connection is self:
            host.router.connection_closed(session, self.will, self.will_delay, host.now())
        self.will = None

    def writing_paused(self) -> None:
        """The transport's buffer passed ``limits.outgoing_buffer_bytes``: this subscriber is slow. QoS 1/2
        wait in the session until the buffer drains; its QoS 0 messages go as the broker's slow-subscriber
        policy says (``engine.slow_subscribers``: its publishers held, or dropped, or it is disconnected)."""
        self.terms = self.terms.settle(paused=True)
        if self.terms.state != CLOSED:
            self.terms.host.slow_subscribers.paused(self)

    def writing_resumed(self) -> None:
        """The transport's buffer drained: its publishers are read again, what waited in the session is
        written."""
        self.terms = self.terms.settle(paused=False)
        self.terms.host.slow_subscribers.resumed(self)
        if self.session is not None and self.terms.state == CONNECTED:
            self.session.drain()

    def peer_address(self) -> tuple[str, int] | None:
        """The client's address as its transport tells it (None: it does not; see the adapter)."""
        return None

    def peer_host(self) -> str:
        """The client's IP address ("" when the transport does not say)."""
        address = self.peer_address()
        return str(address[0]) if address else ""

    # -- handling packets ----------------------------------------------------------------------------------

    def _dispatch_all(self, packets: list[Packet]) -> bool:
        """Handle ``packets`` in order; False once the connection is closed or closing (a packet closed it:
        the packets read after it are dropped, never half taken: a PUBLISH routed but never acknowledged would
        come again on the client's next connection).

        A PUBLISH finding the client's message bucket empty stops the loop: it and the packets after it wait
        in ``backlog``, reading pauses (TCP pushes back on the client) and they are handled, in order, once
        the bucket has refilled (a timer releases ``HELD_FOR_RATE``). So a client never gets more publishes
        accepted than ``messages_per_second_per_client`` x seconds + ``messages_burst_per_client``, and none
        is lost.

        A SUBSCRIBE or UNSUBSCRIBE whose answer waits (``HELD_FOR_SUBACK``: replays being positioned, log
        cursors being dropped) stops it the same way: what the client sent after it is handled once it is
        answered, so a pipelined flood of them costs one at a time.

        An MQTT 3.1.1 client (no Receive Maximum of its own) whose QoS 1/2 publishes read and not yet
        answered reach ``limits.receive_maximum`` stops the loop the same way, until the PUBLISH path has
        answered half of them (``acknowledged``): a broker behind on its log holds at most that many of a
        client's publishes, not whatever the client sends. An MQTT 5 client is told the number in CONNACK;
        one that sends more is held the same way (``Inbound.holds_at_maximum``), or disconnected
        (0x93, ``handle_publish``).

        A handler that raises is a broker bug: it is logged and closes only this connection (0x83).
        """
        limits = self.terms.host.config.limits
        unanswered_max = limits.receive_maximum
        last = len(packets) - 1
        index = -1
        single_until = 0  # the packets before it are handled one by one (a run of them was not taken)
        try:
            while index < last:
                index += 1
                packet = packets[index]
                if type(packet) is Publish and self.terms.state == CONNECTED:  # maybe CONNECTed this batch
                    inbound = self.inbound or self._start_inbound()
                    bucket = inbound.bucket
                    run = 0  # the packets from ``index`` taken as one run (``engine.publish_run``)
                    if index < last and packet.frame is not None and packet.qos < 2 and index >= single_until:
                        run, single_until, grown = self._run_from(packets, index, inbound, bucket)
                        last += grown
                    if run:
                        index += run - 1
                    else:
                        if bucket is not None:
                            now = self.terms.host.now()
                            if not bucket.try_acquire(now):
                                self._hold(packets[index:], bucket.seconds_until(now))
                                return True
                        session = self.session
                        assert session is not None, "a connected connection has a session"
                        handle_publish(self.terms.host, self, session, packet)  # not through ``_dispatch``
                elif type(packet) is PublishesAlike and self.terms.state == CONNECTED:
                    inbound = self.inbound or self._start_inbound()
                    run = 0
                    if packet.frame is not None and packet.qos < 2 and index >= single_until:
                        run, single_until, grown = self._run_from(packets, index, inbound, inbound.bucket)
                        last += grown
                    if run:
                        index += run - 1
                    else:  # each of them on its own, from the first: handled again as PUBLISHes
                        grown = each_apart(packets, index, index + 1)
                        last += grown
                        single_until = max(single_until + grown, index + 1 + grown)
                        index -= 1
                        continue
                elif (
                    type(packet) is PubAck
                    and index < last
                    and type(packets[index + 1]) is PubAck
                    and self.terms.state == CONNECTED
                ):  # a subscriber's PUBACKs read together: its window refilled once, after them all
                    end = index + 2
                    while end <= last and type(packets[end]) is PubAck:
                        end += 1
                    session = self.session
                    assert session is not None, "a connected connection has a session"
                    session.on_pubacks([cast("PubAck", ack).packet_id for ack in packets[index:end]])
                    index = end - 1
                else:
                    if type(packet) is Subscribe and self._after_cursor_work(packets, index):
                        return True
                    self._dispatch(packet)
                    if (
                        type(packet) in _ANSWERED_LATER
                        and self.held & HELD_FOR_SUBACK
                        and self.terms.state != CLOSED
                    ):
                        self.backlog = packets[index + 1 :]  # (empty: what later reads bring waits there)
                        return True
                if self.terms.state == CLOSED or type(self._out) is Closing:
                    return False  # closing for this packet: nothing read after it is taken [MQTT-3.14.4-1]
                held, v5 = self.inbound, self.terms.v5  # (a CONNECT of this read may have set it)
                if held is not None and held.pending >= unanswered_max and held.holds_at_maximum(v5, limits):
                    self._hold_for_acks(packets[index + 1 :])
                    return True
        except Exception:
            self.log().exception("internal error while handling a packet, closing the connection")
            self.close(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "internal error")
            return False
        return True

    def _run_from(
        self, packets: list[Packet], index: int, inbound: Inbound, bucket: TokenBucket | None
    ) -> tuple[int, int, int]:
        """Take the run of plain PUBLISHes that starts at ``packets[index]`` (``engine.publish_run``) when
        ``handle_publish_run`` accepts it. Returns the packets taken (0: none, each is handled on its own),
        where the packets looked at end (those before are not looked at for a run again) and how many
        packets were added to ``packets``: an MQTT 3.1.1 client's run is cut where its unanswered publishes
        would pass ``limits.receive_maximum`` (reading is held there), its ``PublishesAlike`` made into a
        PUBLISH each."""
        first = packets[index]
        assert type(first) is Publish or type(first) is PublishesAlike, "a run starts with a PUBLISH"
        end, count = plain_run_end(packets, index, first.topic, first.qos)
        looked_at, grown = end, 0
        limits = self.terms.host.config.limits
        if first.qos and inbound.holds_at_maximum(self.terms.v5, limits):
            allowed = limits.receive_maximum - inbound.pending
            if count > allowed:
                grown = each_apart(packets, index, end)
                looked_at = index + count
                count = allowed
                end = index + count
        session = self.session
        assert session is not None, "a connected connection has a session"
        parts = cast("list[Any]", packets[index:end])
        if count > 1 and handle_publish_run(self.terms.host, self, session, parts, count, bucket):
            return end - index, looked_at, grown
        return 0, looked_at, grown

    def _after_cursor_work(self, packets: list[Packet], index: int) -> bool:
        """Whether the SUBSCRIBE ``packets[index]`` waits, with what follows it, until the session's log
        cursors are done being dropped or positioned (an unsubscribe the client did not send, such as of a
        filter the ACL no longer allows; a replay a connection it took over from asked for): so a new
        subscription never reads a cursor left by an old one."""
        replays = self.terms.host.replays
        session = self.session
        if replays is None or session is None or self.terms.state != CONNECTED:
            return False
        if not replays.when_forgotten(session, partial(self.release, HELD_FOR_SUBACK)):
            return False
        self.backlog = packets[index:]
        self.hold(HELD_FOR_SUBACK)
        return True

    def _start_inbound(self) -> Inbound:
        """The client's first PUBLISH: its rate limiter (``limits.client_message_bucket``), a zero count."""
        session = self.session
        username = session.username if session is not None else None
        inbound = self.inbound = Inbound(self.terms.host.config.limits.client_message_bucket(username))
        return inbound

    @property
    def incoming_pending(self) -> int:
        """The client's QoS 1/2 publishes read and not yet answered (``Inbound.pending``, see
        ``Publisher.inbound``)."""
        inbound = self.inbound
        return inbound.pending if inbound is not None else 0

    def _raise_held_error(self) -> None:
        """A malformed packet followed the packets just handled: close for it now."""
        error, self.held_error = self.held_error, None
        if error is not None and self.terms.state != CLOSED:
            self.protocol_error(error)

    def _dispatch(self, packet: Packet) -> None:
        state = self.terms.state
        if state == CONNECTED:
            session = self.session
            assert session is not None, "a connected connection has a session"
            # The packets of every message, straight to their handlers, no dispatch hop: a PUBLISH per
            # message in, a PUBACK per QoS 1 delivery out.
            if type(packet) is Publish:
                handle_publish(self.terms.host, self, session, packet)
            elif type(packet) is PubAck:
                session.on_puback(packet.packet_id)  # ``handle_puback``'s whole work, a call fewer
            elif type(packet) is PubAckRun:  # a read of PUBACKs: the window refilled once, after them all
                session.on_pubacks(packet.packet_ids)
            else:
                dispatch_connected(self.terms.host, self, session, packet)
            return
        if state == AUTHENTICATING:
            if self.backlog is None:
                self.backlog = []
            self.backlog.append(packet)
            return
        if self.refused is not None:
            self._refuse_admission(packet)
            return
        assert isinstance(packet, Connect), "the decoder lets only CONNECT in first"
        handle_connect(self.terms.host, self, packet)

    def release_qos2(self, packet_id: int) -> None:
        """Forget a held incoming QoS 2 id (its publish was refused): a resend is a new publish."""
        session = self.session
        released = session is not None and session.release_incoming(packet_id)
        if released and self.v5 and self.inbound is not None:  # counted until PUBCOMP; no PUBREL will come
            self.inbound.uncount_qos2(packet_id)

    @property
    def started_inbound(self) -> Inbound:
        """Its ``Inbound``, made now if none was yet."""
        return self.inbound or self._start_inbound()

    # -- reading ------------------------------------------------------------------------------------------

    def hold(self, reason: int) -> None:
        """Stop reading for ``reason`` (a ``states.HELD_*`` bit) until ``release(reason)``."""
        held = self.held
        self.held = held | reason
        if not held:
            self.terms.host.schedule_flush(self)  # the transport stops reading

    def release(self, reason: int) -> None:
        """``reason`` no longer holds reading; once no reason does, the packets read meanwhile are handled
        in order (which may hold reading again), then reading resumes. A connection held for moving to
        another member (``HELD_FOR_HANDOVER``) handles them too, and reads nothing more."""
        held = self.held & ~reason
        self.held = held
        if held & ~HELD_FOR_HANDOVER or self.terms.state == CLOSED:
            return
        backlog, self.backlog = self.backlog, None
        if backlog is not None and (not self._dispatch_all(backlog) or self.held):
            return
        self._raise_held_error()
        if self.terms.state != CLOSED:
            self.terms.host.schedule_flush(self)  # the transport reads again

    # -- closing ------------------------------------------------------------------------------------------

    def close(
        self, reason_code: int | None = None, reason_string: str | None = None, counted_as: str = ""
    ) -> None:
        """Close after writing what is pending; a v5 client first gets DISCONNECT with ``reason_code``.

        The reason string is left out when it would make the DISCONNECT larger than the client accepts.
        An error code (0x80 and above) counts as a disconnect by the broker, by reason (``counted_as``, or
        the code's name).
        """
        terms = self.terms
        if terms.state == CLOSED:
            return
        if reason_code is not None and terms.state == CONNECTED:
            if reason_code >= 0x80:
                terms.host.counters.disconnect(counted_as or ReasonCode(reason_code).name.lower())
            if terms.v5:
                frame = encode(Disconnect(reason_code, Properties(reason_string=reason_string)), MQTT_5)
                if not reason_string or len(frame) > terms.max_packet_out:
                    frame = encode(Disconnect(reason_code), MQTT_5)
                self.write(frame)
        self._seal(CLOSE)

    def abort(self) -> None:
        """End the connection at once, writing nothing more."""
        self._seal(ABORT)

    def protocol_error(self, error: MQTTError) -> None:
        """A packet broke the protocol: tell a v5 client why (DISCONNECT or CONNACK), then close."""
        if isinstance(error, TooManyElements):
            _too_many_elements(self, error)
            return
        if self.terms.state != NEW:
            self.log().info("protocol error, closing: %s (0x%02X)", error.message, error.reason_code)
        elif not isinstance(error, PacketTooLarge):  # that one has its own refusal line
            _refusal_line(self, "protocol_error", f"{error.message}, 0x{error.reason_code:02X}")
        if self.terms.state == NEW:
            if isinstance(error, UnsupportedProtocolVersion):
                if error.protocol_version == MQTT_5:
                    self.refuse("protocol_error", ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, version=MQTT_5)
                else:
                    self.refuse("protocol_error", ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION, version=4)
            elif isinstance(error, PacketTooLarge):
                v5 = MQTT_5 in (self.decoder.protocol_version, error.protocol_level)
                self.refuse_connect_too_large(error.message, error.reason_code if v5 else None)
            elif MQTT_5 in (self.decoder.protocol_version, error.protocol_level):  # a CONNECT's level read
                code = error.reason_code if error.reason_code in CONNACK_REASON_CODES else _PROTOCOL_ERROR
                self.refuse("protocol_error", code, version=MQTT_5)
            else:
                self.refuse("protocol_error", None)
            return
        self.close(error.reason_code, error.message)

    def refuse_connect_too_large(self, detail: str, code: int | None = None, **fields: Any) -> None:
        """More than ``limits.max_connect_packet_size`` before the CONNECT was read (a first packet declaring
        more, a WebSocket client's frames): a refusal counted and logged as ``connect_too_large``, then
        closed (``code``: the v5 CONNACK's, when the client's protocol level is known)."""
        limit = self.terms.host.config.limits.max_connect_packet_size
        _refusal_line(self, "connect_too_large", detail, limit=limit, **fields)
        self.refuse("connect_too_large", code, version=MQTT_5 if code is not None else None)

    def refuse(
        self,
        reason: str | None,
        code: int | None,
        text: str | None = None,
        version: int | None = None,
        server_reference: str | None = None,
    ) -> None:
        """Refuse the connection before CONNACK 0: CONNACK with ``code`` (None: close without one), close.

        The one place a connection is refused. ``reason`` labels ``connections_refused_total`` (None: it
        was counted already); ``text`` goes to a v5 client as the reason string when the CONNACK still
        fits its Maximum Packet Size; so does ``server_reference``, the broker to connect to instead (a
        CONNACK 0x9C's), before the text when both do not fit; ``version`` is the protocol level to answer
        in (default: the CONNECT's).
        """
        if reason is not None:
            self.terms.host.counters.refused(reason)
        if code is not None:
            version = version if version is not None else self.version
            frame = encode(ConnAck(False, code), version)
            if version == MQTT_5:
                frame = self._fitting_refusal(code, text, server_reference) or frame
            self.write(frame)
        self._seal(CLOSE)
        self.state = CLOSED

    def _fitting_refusal(self, code: int, text: str | None, server_reference: str | None) -> bytes | None:
        """The v5 refusal CONNACK with as much of the reference, then the text, as fits the client's
        Maximum Packet Size [MQTT-3.2.2-19]; None when neither is given or fits."""
        tries = [(server_reference, text), (server_reference, None), (None, text)]
        for reference, reason_string in tries:
            if reference is None and reason_string is None:
                continue
            properties = Properties(reason_string=reason_string)
            properties.server_reference = reference
            frame = encode(ConnAck(False, code, properties), MQTT_5)
            if len(frame) <= self.terms.max_packet_out:
                return frame
        return None

    def redirect(self, server_reference: str, reason_string: str) -> None:
        """Send an MQTT 5 client to another broker: DISCONNECT 0x9C "use another server" with the Server
        Reference and the reason string (counted as a ``use_another_server`` disconnect), then close."""
        properties = Properties(reason_string=reason_string)
        properties.server_reference = server_reference
        self.write(encode(Disconnect(ReasonCode.USE_ANOTHER_SERVER, properties), MQTT_5))
        self.terms.host.counters.disconnect("use_another_server")
        self.close()

    def handed_over(self, node: str) -> None:
        """Its socket went to member ``node``, which took its will too: end it here without a word to the
        client (counted as a ``handed_over`` disconnect); its session ends as a clean one does."""
        self.log().info("connection handed over to %s", node)
        self.terms.host.counters.disconnect("handed_over")
        self.will = None
        self.abort()

    def taken_over(self) -> None:
        """Another connection claimed this client id (MQTT 3.1.4-3): DISCONNECT 0x8E, let go of the session.

        The will follows the normal rule (sent now unless delayed; a delayed will is cancelled if the new
        connection resumes the session, sent at once if it starts clean).
        """
        self.log().info("session taken over by a new connection")
        session = self.let_go_of_session()
        if session is not None and session.connection is self:
            session.detach()
            self.terms.host.connection_detached(self)
            will, self.will = self.will, None
            if will is not None:
                if self.will_delay <= 0:
                    self.terms.host.router.publish_will(will, self.client_id)
                else:
                    session.will = will
                    session.will_at = self.terms.host.now() + self.will_delay
        self.close(ReasonCode.SESSION_TAKEN_OVER, "another connection took over this client id")

    def _refuse_admission(self, packet: Packet) -> None:
        """Refused for rate (counted at admission): a v5 client learns why from CONNACK 0x9F; a v3 client
        is just closed."""
        if getattr(packet, "protocol_version", 0) == MQTT_5:
            text = "connection rate exceeded, retry later"
            self.refuse(None, ReasonCode.CONNECTION_RATE_EXCEEDED, text, version=MQTT_5)
        else:
            self.refuse(None, None)

    # -- timers (called by the broker's sweep, about once a second) ----------------------------------------

    def check_timers(self, now: float) -> None:
        state = self.terms.state
        keepalive = self.terms.keepalive
        since = unfinished_since(self)
        if since and now - since > self.terms.host.config.limits.partial_packet_timeout_s:
            if state == CONNECTED:
                self.log().info("a packet took longer than partial_packet_timeout_s to arrive")
                self.close(ReasonCode.KEEP_ALIVE_TIMEOUT, "a packet took too long to arrive")
            else:
                self.terms.host.counters.refused("partial_timeout")
                _refusal_line(self, "partial_timeout", "a packet took longer than partial_packet_timeout_s")
                self.abort()
            return
        if state == CONNECTED:
            deadline = self.deadline
            if deadline == HEARD_FROM or self.held:  # a client whose reading is held is not idle either
                self.deadline = keepalive_deadline(now, keepalive)
            elif keepalive and now >= deadline:
                keep_alive_expired(self)
            elif keepalive and deadline - now < TIMERS_CHECKED_EVERY_S:  # due before the next sweep
                self.terms.host.call_later(deadline - now, partial(keep_alive_due, self, deadline))
        elif state == NEW and now >= self.deadline:
            self.terms.host.counters.refused("connect_timeout")
            _refusal_line(
                self,
                "connect_timeout",
                f"no CONNECT within {self.terms.host.config.limits.connect_timeout_s:.1f} s",
            )
            self.abort()

    # -- flow control of incoming publishes ----------------------------------------------------------------

    def _hold(self, packets: list[Packet], delay: float) -> None:
        """Over its message rate: keep ``packets`` and stop reading until the bucket has a token again."""
        self.backlog = list(packets)
        self.terms.host.counters.throttled += 1
        self.hold(HELD_FOR_RATE)
        self.terms.host.call_later(min(max(delay, 0.001), 60.0), partial(self.release, HELD_FOR_RATE))

    def _hold_for_acks(self, packets: list[Packet]) -> None:
        """``limits.receive_maximum`` publishes wait for their answer: keep ``packets`` (the rest of the
        read), read on at half; an MQTT 5 client past its Receive Maximum is said in a refusal line."""
        self.backlog = packets
        host = self.terms.host
        inbound = self.started_inbound
        if self.terms.v5 and not inbound.over_said and any(getattr(p, "qos", 0) for p in packets):
            inbound.over_said = True  # (once a connection; only PUBLISHes have a qos)
            host.counters.refusal_log.write(self.log, host.now(), _OVER_MAXIMUM, _HELD_OVER, action="publish")
        host.counters.held_for_acks += 1
        self.hold(HELD_FOR_ACKS)
        host.publish_path.wait_for_answers(self)

    def acknowledged(self) -> bool:
        """The PUBLISH path answered publishes of this client while it waits (``wait_for_answers``): read on
        (True) once at most half of ``limits.receive_maximum`` are left unanswered."""
        if self.terms.state == CLOSED:
            return True
        if self.incoming_pending > self.terms.host.config.limits.receive_maximum // 2:
            return False
        self.release(HELD_FOR_ACKS)
        return True

    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        from broker_edge.observe.logs import connection_logger

        peer = self.peer
        if not peer:
            address = self.peer_address()
            if address:
                peer = f"{address[0]}:{address[1]}"
        return connection_logger(self.client_id or "-", self.terms.listener.name, peer)


def keep_alive_due(conn: Connection, deadline: float) -> None:
    """The keep-alive ``deadline`` a sweep saw due before the next one has come: ``conn`` is closed unless it
    sent something since (or its reading is held)."""
    if conn.terms.state == CONNECTED and conn.deadline == deadline and not conn.held:
        keep_alive_expired(conn)


def keep_alive_expired(conn: Connection) -> None:
    """``conn`` sent nothing within 1.5 times its keep alive: closed (MQTT 3.1.2.10)."""
    conn.log().info("keep alive timeout (%d s)", conn.terms.keepalive)
    conn.close(ReasonCode.KEEP_ALIVE_TIMEOUT, "no packet within 1.5 times the keep alive")


def _too_many_elements(conn: Connection, error: TooManyElements) -> None:
    """A packet with more filters or user properties than the limits allow: a rate-limited line naming the
    client, the refusal or disconnect counted as ``too_many_<element>``, 0x97 to a v5 client, closed."""
    host = conn.terms.host
    reason = f"too_many_{error.element}"
    message = f"packet refused, closing: {error.message}"
    host.counters.refusal_log.write(conn.log, host.now(), reason, message, action="decode", limit=error.limit)
    if conn.terms.state != NEW:
        conn.close(error.reason_code, error.message, counted_as=reason)
    elif error.protocol_level == MQTT_5:
        conn.refuse(reason, error.reason_code, version=MQTT_5)
    else:
        conn.refuse(reason, None)


def _refusal_line(conn: Connection, reason: str, detail: str, **fields: Any) -> None:
    """Say a refusal before CONNECT in the broker's rate-limited refusal lines (``RefusalLog``): a stranger
    opening connection after connection cannot fill the log."""
    host = conn.terms.host
    message = f"connection refused: {reason} ({detail})"
    host.counters.refusal_log.write(conn.log, host.now(), reason, message, action="connect", **fields)
