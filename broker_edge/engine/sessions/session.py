"""Session state: what survives a client's connection (MQTT 4.1) and the outgoing flow control.

A session owns its subscriptions, the packet ids of QoS 1/2 messages in flight towards the client (and
those past PUBREC), the ids of incoming QoS 2 messages not yet released, the queue of messages waiting for
a free in-flight slot or for the client to come back, and, for logged topics, the log cursors that replace
that queue while the client is away. It knows nothing about sockets or clocks: it writes through the
connection attached to it (an ``Outlet``: ``None`` while offline), asks its router through ``SessionOwner``
(both declared here, what the session uses of them) and is given times as numbers.

Every container is created on first use, and what a session holds only in some states (a delayed will, an
expiry deadline while offline, incoming QoS 2 ids, log cursors and the ``offset`` opt-in of a session reading
logs) are ``RareField`` attributes: an idle session with one subscription costs a few hundred bytes. The
fanout reads the log fields of a session that has the side object straight from it (``_rare``), one slot
read more, not a descriptor call.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from broker_edge.engine.message import Message
from broker_edge.engine.rare_fields import RareField, RareSlots

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from broker_edge.engine.publish_run import LoggedRun, PublishRun
    from broker_edge.engine.routing.subscriptions import SubscriptionOptions
    from broker_edge.protocol.packets import Will
    from broker_edge.security.limits import LimitsConfig

__all__ = [
    "NEVER_EXPIRES",
    "RELEASED",
    "Inflight",
    "Outlet",
    "Released",
    "Session",
    "SessionOwner",
    "SessionSubscription",
]

NEVER_EXPIRES = 0xFFFFFFFF
"""v5 Session Expiry Interval meaning "does not expire"."""


class Released:
    """Marks an outgoing QoS 2 packet id past PUBREC: PUBREL was sent, PUBCOMP is awaited."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "RELEASED"


RELEASED = Released()

# An in-flight or queued delivery: (message, qos, retain flag, subscription identifiers).
Delivery = tuple[Message, int, bool, tuple[int, ...]]


class OutletTerms(Protocol):
    """What a session reads of its connection's settled terms."""

    @property
    def paused(self) -> bool:
        """The connection's transport asked it to stop writing."""

    @property
    def send_quota(self) -> int:
        """QoS 1/2 messages in flight towards the client at most."""


class Outlet(Protocol):
    """The connection a session writes through (``engine.connection.connection.Connection`` is one), as the
    session and the readers of its log cursors use it."""

    @property
    def terms(self) -> OutletTerms: ...

    def send_message(
        self,
        message: Message,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...],
        packet_id: int | None,
        dup: bool = False,
    ) -> bool:
        """Write one delivery; False when it was dropped (too large for the client)."""

    def send_run(self, run: PublishRun | LoggedRun, subscription_ids: tuple[int, ...]) -> None:
        """Write a run of plain messages of one topic (``engine.publish_run``) at QoS 0."""

    def fits(self, message: Message, qos: int, retain: bool, subscription_ids: tuple[int, ...]) -> bool:
        """Whether this delivery is within the client's Maximum Packet Size (one that is not is dropped)."""

    def encode_while_framed(
        self, messages: Iterable[Message], qos: int, retain: bool, subscription_ids: tuple[int, ...]
    ) -> None:
        """Deliveries about to wait in the session's queue: their encodings made now where they are cut out of
        the frames the messages came in (``Message.frame``, let go of once routed)."""

    def send_pubrel(self, packet_id: int, reason_code: int = 0) -> None: ...

    def taken_over(self) -> None:
        """Another connection claimed the client id: DISCONNECT, and let go of the session."""


class LogCursors(Protocol):
    """The broker's log cursors (``engine.cursors.ReplayManager``), as far as a session asks."""

    def pump_soon(self, session: Session) -> None: ...


class SessionOwner(Protocol):
    """The router of a session's broker (``engine.routing.router.Router`` is one), as the session uses it."""

    persistent_count: int
    """Sessions with a Session Expiry Interval > 0 (kept by ``Session.expiry_interval``)."""

    @property
    def limits(self) -> LimitsConfig: ...

    @property
    def replays(self) -> LogCursors | None:
        """The log cursors; None without a commitlog (nothing is read from a log later)."""

    def count_drop(self, reason: str) -> None:
        """A message was not delivered, for ``reason``."""

    def drop_for(self, session: Session, reason: str, message: Message) -> None:
        """``message`` was not delivered to ``session`` for ``reason`` (counted and said)."""

    def pump_replays(self, session: Session) -> None: ...

    qos2_journal: Callable[[str, int, bool], None] | None
    """Told of every incoming QoS 2 id a persistent session holds or releases (client id, packet id, held),
    before its PUBREC or PUBCOMP leaves (``runtime.qos2_journal``); None: not kept between snapshots."""


class SessionSubscription:
    """One subscription as its session remembers it: where it sits in the trie and with which options."""

    __slots__ = ("group", "options", "topic_filter")

    def __init__(self, topic_filter: str, group: str | None, options: SubscriptionOptions) -> None:
        self.topic_filter = topic_filter
        self.group = group
        self.options = options


def _ended_by_puback(entry: Delivery | Released | None) -> bool:
    """Whether a PUBACK ends this in-flight entry: a QoS 1 delivery (not a QoS 2 one, nor a released id)."""
    return entry is not None and not isinstance(entry, Released) and entry[1] == 1


class Inflight(dict[int, "Delivery | Released"]):
    """A session's QoS 1/2 deliveries sent and not yet acknowledged, by packet id, and the id to try next
    (kept here, not on the session: an idle session has no window and pays no slot for it)."""

    __slots__ = ("next_id", "resend_as")

    next_id: int
    """Set when the window is made (``Session._send``): dict's own constructor, no Python call."""
    resend_as: dict[tuple[str, int], int] | None
    """(topic, offset) → packet id of the QoS 2 deliveries in flight before a restart or a move, whose log
    records the session reads again: each is sent again with that id and DUP [MQTT-4.4.0-1]."""


class RetainedDue:
    """The retained messages a new subscription matched that are still to be sent (``Session.retained_due``):
    references to the messages the retained store holds, taken in order as the in-flight window has room."""

    __slots__ = ("max_qos", "messages", "position", "subscription_ids")

    def __init__(self, messages: list[Message], max_qos: int, subscription_ids: tuple[int, ...]) -> None:
        self.messages = messages
        self.position = 0
        self.max_qos = max_qos
        self.subscription_ids = subscription_ids

    def __len__(self) -> int:
        return len(self.messages) - self.position


class HeldQueue(deque[Delivery]):
    """A session's queue of held deliveries and the payload bytes it holds (``max_offline_bytes``)."""

    __slots__ = ("bytes",)

    bytes: int
    """Set when the queue is made (``Session._queue_with_room``): deque's own constructor, no Python call."""


class _SessionRare(RareSlots):
    """The ``RareField`` attributes of a ``Session`` that has set one."""

    __slots__ = (
        "_expiry_interval",
        "answered_qos2",
        "cursors",
        "expires_at",
        "incoming_qos2",
        "log_offsets",
        "resends",
        "retained_due",
        "username",
        "will",
        "will_at",
    )
    defaults: ClassVar[dict[str, Any]] = {}
    cursors: dict[str, int] | None
    log_offsets: bool
    resends: deque[int] | None
    retained_due: deque[RetainedDue] | None


class Session:
    """The broker side of one client id.

    ``expiry_interval`` is seconds after disconnect until the session is discarded (0 = at disconnect,
    ``NEVER_EXPIRES`` = never, capped by the broker's maximum); ``expires_at`` is the deadline while offline.
    """

    __slots__ = (
        "_rare",
        "client_id",
        "connection",
        "inflight",
        "queue",
        "subscriptions",
    )

    router: ClassVar[SessionOwner]
    """The router of the broker the session belongs to: a class attribute of the class ``bound_to`` makes
    for each router, so ten thousand sessions do not hold a slot each for the one value they share."""

    expires_at: RareField[float | None] = RareField(_SessionRare, None)
    """When an offline session is discarded (loop time; None: online, or it never expires)."""
    incoming_qos2: RareField[set[int] | None] = RareField(_SessionRare, None)
    """Ids of incoming QoS 2 messages received and not yet released by PUBREL."""
    answered_qos2: RareField[dict[int, bool] | None] = RareField(_SessionRare, None)
    """Those of ``incoming_qos2`` whose PUBREC was sent (their messages are durable): what a snapshot keeps;
    True for one read back from disk or another member (``restore_incoming``)."""
    will: RareField[Will | None] = RareField(_SessionRare, None)
    """A will waiting for its v5 Will Delay Interval after the connection ended."""
    will_at: RareField[float | None] = RareField(_SessionRare, None)
    username: RareField[str | None] = RareField(_SessionRare, None)
    """Read per message only by an ACL check and when a publish creates a log."""
    _expiry_interval: RareField[int] = RareField(_SessionRare, 0)
    cursors: RareField[dict[str, int] | None] = RareField(_SessionRare, None)
    """Logged topic → next offset to deliver from the log (see ``broker_edge.engine.cursors``)."""
    resends: RareField[deque[int] | None] = RareField(_SessionRare, None)
    """Packet ids in flight before the client came back that are still to be sent again: more than its new
    Receive Maximum allows at once [MQTT-3.3.4-9]; sent, in order, as acknowledgements make room."""
    retained_due: RareField[deque[RetainedDue] | None] = RareField(_SessionRare, None)
    """Retained messages new subscriptions matched, sent before the queue as the window has room: however
    many there are, none waits in (or is dropped from) the bounded queue."""
    log_offsets: RareField[bool] = RareField(_SessionRare, False)
    """The client asked for log delivery (it subscribed from an offset, or opted in on CONNECT): its v5
    deliveries of logged messages carry the user property ``offset``. Kept until the session ends."""

    @classmethod
    def bound_to(cls, router: SessionOwner) -> type[Session]:
        """The session class of ``router``'s broker: ``Session`` with ``router`` as its class attribute."""
        namespace = {"__slots__": (), "router": router, "__module__": cls.__module__}
        bound: type[Session] = type(cls.__name__, (cls,), namespace)
        bound.__qualname__ = cls.__qualname__
        return bound

    def __init__(self, client_id: str, expiry_interval: int = 0) -> None:
        self.client_id = client_id
        self.connection: Outlet | None = None
        self._rare: _SessionRare | None = None
        self.expiry_interval = expiry_interval
        self.subscriptions: dict[str, SessionSubscription] | None = None
        """Full filter as subscribed (``$share/...`` included) → ``SessionSubscription``."""
        self.inflight: Inflight | None = None
        self.queue: HeldQueue | None = None

    def __repr__(self) -> str:
        state = "online" if self.connection is not None else "offline"
        return f"Session({self.client_id!r}, {state})"

    @property
    def expiry_interval(self) -> int:
        return self._expiry_interval

    @expiry_interval.setter
    def expiry_interval(self, value: int) -> None:
        """Persistent (> 0) or not: the router counts persistent sessions (``sessions.max_persistent``)."""
        self.router.persistent_count += (value > 0) - (self._expiry_interval > 0)
        self._expiry_interval = value

    @property
    def online(self) -> bool:
        return self.connection is not None

    def hold_incoming(self, packet_id: int) -> None:
        """An incoming QoS 2 id is held until its PUBREL (exactly once, MQTT 4.3.3)."""
        held = self.incoming_qos2
        if held is None:
            held = self.incoming_qos2 = set()
        held.add(packet_id)

    def answering_incoming(self, packet_id: int) -> None:
        """A PUBREC that accepts ``packet_id`` is about to leave: the journal keeps the id from now (not from
        the PUBLISH: until its message is durable, a broker killed must take the client's resend as new)."""
        held = self.incoming_qos2
        if held is None or packet_id not in held:
            return
        answered = self.answered_qos2
        if answered is None:
            answered = self.answered_qos2 = {}
        answered.setdefault(packet_id, False)
        journal = self.router.qos2_journal
        if journal is not None and self._expiry_interval > 0:
            journal(self.client_id, packet_id, True)

    def restore_incoming(self, packet_ids: Iterable[int]) -> None:
        """Hold ids the session held before a restart or a move: a PUBLISH with one and DUP 1 is the client's
        resend; one without DUP is a new message (``reused``), as the client may reuse an id whose PUBREL the
        saved state missed (a power cut)."""
        ids = set(packet_ids)
        if ids:
            self.incoming_qos2 = (self.incoming_qos2 or set()) | ids
            self.answered_qos2 = {**(self.answered_qos2 or {}), **dict.fromkeys(ids, True)}

    def reused(self, packet_id: int, dup: bool) -> bool:
        """Whether a PUBLISH with a held ``packet_id`` is a new message: one without DUP whose id was only
        restored (``restore_incoming``); the id is released then."""
        answered = self.answered_qos2
        if dup or answered is None or not answered.get(packet_id):
            return False
        return self.release_incoming(packet_id)

    def release_incoming(self, packet_id: int) -> bool:
        """Forget a held incoming QoS 2 id (its PUBREL came, or its publish was refused); False when it was
        not held."""
        held = self.incoming_qos2
        if held is None or packet_id not in held:
            return False
        held.discard(packet_id)
        if not held:
            self.incoming_qos2 = None
        answered = self.answered_qos2
        if answered is not None:
            answered.pop(packet_id, None)
            if not answered:
                self.answered_qos2 = None
        journal = self.router.qos2_journal
        if journal is not None and self._expiry_interval > 0:
            journal(self.client_id, packet_id, False)
        return True

    def inflight_count(self) -> int:
        return len(self.inflight) if self.inflight else 0

    # -- outgoing: the router calls deliver() for every matching subscription ----------------------------

    def deliver(
        self,
        message: Message,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...] = (),
        shared: bool = False,
    ) -> None:
        """Send now if the client is online and its in-flight window is open, else hold it (QoS 1/2).

        An online client's held messages wait in its queue, logged or not (cheap: the message and its
        encodings are already in memory). A logged message for an offline client, or one that does not fit the
        queue, is not copied: the session remembers its offset and reads the topic's log later
        (``broker_edge.engine.cursors``), so the log is the offline queue. Shared-subscription deliveries are
        always copied, since the log also holds what the other members of the group received.
        """
        conn = self.connection
        if qos == 0:
            if conn is not None:
                conn.send_message(message, 0, retain, subscription_ids, None)
            return
        if (
            conn is None
            or self.queue
            or conn.terms.paused
            or (self.inflight and len(self.inflight) >= conn.terms.send_quota)
        ):
            logged = message.offset is not None and not shared and self.router.replays is not None
            size = len(message.payload)
            if logged and conn is None:
                self._remember_offset(message)
            elif (queue := self._queue_with_room(size)) is not None:
                if conn is not None and message.frame is not None:
                    conn.encode_while_framed((message,), qos, retain, subscription_ids)
                queue.append((message, qos, retain, subscription_ids))
            elif logged:
                self._remember_offset(message)
            else:
                self.router.drop_for(self, "queue_full", message)
            return
        self._send(conn, message, qos, retain, subscription_ids)

    def deliver_logged(self, messages: list[Message], qos: int, subscription_ids: tuple[int, ...]) -> None:
        """``deliver`` of each of ``messages`` at ``qos`` (1 or 2), in order: logged messages of a publisher's
        run (``engine.publish_run.LoggedRun``), not retained, not shared. Those the in-flight window has room
        for are sent, and the rest held together: the queue's limits looked up once, their encodings made
        while framed in one call, no call per message."""
        conn = self.connection
        if conn is None:
            for message in messages:
                self.deliver(message, qos, False, subscription_ids)
            return
        start = 0
        count = len(messages)
        if not self.queue and not conn.terms.paused:
            quota = conn.terms.send_quota
            while start < count and (not self.inflight or len(self.inflight) < quota):
                self._send(conn, messages[start], qos, False, subscription_ids)
                start += 1
        if start == count:
            return
        limits = self.router.limits
        most = limits.max_offline_messages
        most_bytes = limits.max_offline_bytes
        logged = self.router.replays is not None
        queue = self.queue
        held = []
        for index in range(start, count):
            message = messages[index]
            size = len(message.payload)
            if queue is not None and len(queue) < most and queue.bytes + size <= most_bytes:
                queue.bytes += size
            elif queue is None and most and size <= most_bytes:
                queue = self.queue = HeldQueue()
                queue.bytes = size
            elif logged and message.offset is not None:
                self._remember_offset(message)
                continue
            else:
                self.router.drop_for(self, "queue_full", message)
                continue
            queue.append((message, qos, False, subscription_ids))
            held.append(message)
        conn.encode_while_framed(held, qos, False, subscription_ids)

    def _send(
        self, conn: Outlet, message: Message, qos: int, retain: bool, subscription_ids: tuple[int, ...]
    ) -> None:
        inflight = self.inflight
        if inflight is None:
            inflight = self.inflight = Inflight()
            inflight.next_id = 1
            inflight.resend_as = None
        elif inflight.resend_as is not None and self._resend_as(
            conn, inflight, message, qos, retain, subscription_ids
        ):
            return
        packet_id = inflight.next_id
        while packet_id in inflight:
            packet_id = packet_id % 0xFFFF + 1
        inflight.next_id = packet_id % 0xFFFF + 1
        if conn.send_message(message, qos, retain, subscription_ids, packet_id):
            inflight[packet_id] = (message, qos, retain, subscription_ids)

    @staticmethod
    def _resend_as(
        conn: Outlet,
        inflight: Inflight,
        message: Message,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...],
    ) -> bool:
        """Send ``message`` with the packet id it had in flight before a restart or a move, and DUP, when it
        is one of those (``Inflight.resend_as``); False when it is not."""
        resend_as = inflight.resend_as
        if resend_as is None or qos != 2 or message.offset is None:
            return False
        packet_id = resend_as.pop((message.topic, message.offset), None)
        if not resend_as:
            inflight.resend_as = None
        if packet_id is None or packet_id in inflight:
            return False
        if conn.send_message(message, qos, retain, subscription_ids, packet_id, dup=True):
            inflight[packet_id] = (message, qos, retain, subscription_ids)
        return True

    def _queue_with_room(self, size: int) -> HeldQueue | None:
        """The queue (made now if there is none), its bytes counting one more message of ``size`` payload
        bytes, when that one fits ``max_offline_messages`` / ``_bytes``; None when it does not (one call a
        held delivery: the fleet's consumer holds most of its deliveries)."""
        limits = self.router.limits
        queue = self.queue
        if queue is not None:
            if len(queue) >= limits.max_offline_messages or queue.bytes + size > limits.max_offline_bytes:
                return None
            queue.bytes += size
            return queue
        if not limits.max_offline_messages or size > limits.max_offline_bytes:
            return None
        queue = self.queue = HeldQueue()
        queue.bytes = size
        return queue

    def _remember_offset(self, message: Message) -> None:
        """Offline, logged topic: remember where to resume instead of holding the message."""
        cursors = self.cursors
        if cursors is None:
            cursors = self.cursors = {}
        if message.topic not in cursors and message.offset is not None:
            cursors[message.topic] = message.offset

    def drain(self) -> None:
        """Move queued messages into the in-flight window while it has room (after an ack or a resume)."""
        conn = self.connection
        if conn is None:
            return
        if (rare := self._rare) is not None and (rare.resends or rare.retained_due):
            if rare.resends and not self._resend(conn):
                return
            if rare.retained_due and not self._send_retained_due(conn):
                return
        queue = self.queue
        if queue:
            inflight = self.inflight
            if inflight is not None and inflight.resend_as is None and not conn.terms.paused:
                self._send_queued(conn, queue, inflight)
            else:
                quota = conn.terms.send_quota
                router = self.router
                while queue and not conn.terms.paused and (not self.inflight or len(self.inflight) < quota):
                    message, qos, retain, subscription_ids = queue.popleft()
                    queue.bytes -= len(message.payload)
                    if message.expires_at is not None and message.expired():
                        router.count_drop("expired")
                        continue
                    self._send(conn, message, qos, retain, subscription_ids)
            if not queue:
                self.queue = None
        if (rare := self._rare) is not None and rare.cursors and not self.queue:
            self.router.pump_replays(self)

    def _send_queued(self, conn: Outlet, queue: HeldQueue, inflight: Inflight) -> None:
        """``drain``'s loop for a window with no ids to resend as before (``Inflight.resend_as``): queued
        deliveries sent while the window has room, each the same packet id and bytes ``_send`` would give
        it, its queue entry kept as its in-flight entry. (Writing leaves the connection's ``paused`` as it
        is: the transport takes the output at the end of the turn.)"""
        room = conn.terms.send_quota - len(inflight)
        send = conn.send_message
        packet_id = inflight.next_id
        while room > 0 and queue:
            delivery = queue.popleft()
            message = delivery[0]
            queue.bytes -= len(message.payload)
            if message.expires_at is not None and message.expired():
                self.router.count_drop("expired")
                continue
            while packet_id in inflight:
                packet_id = packet_id % 0xFFFF + 1
            if send(message, delivery[1], delivery[2], delivery[3], packet_id):
                inflight[packet_id] = delivery
                room -= 1
            packet_id = packet_id % 0xFFFF + 1
        inflight.next_id = packet_id

    def deliver_retained(
        self, messages: list[Message], max_qos: int, subscription_ids: tuple[int, ...], room: int
    ) -> None:
        """Send the retained messages a new subscription of ``max_qos`` matched (RETAIN set): at QoS 0 at
        once; else in order as the in-flight window has room, ahead of the queue and of what is delivered
        meanwhile. At most ``room`` of them wait at a time over all subscriptions (the rest are dropped,
        counted ``queue_full``): a client subscribing again and again cannot pile them up."""
        conn = self.connection
        if not messages:
            return
        if conn is None:  # gone before they were looked up (a cluster's retained gate): held as any delivery
            for message in messages:
                self.deliver(message, min(max_qos, message.qos), True, subscription_ids)
            return
        if max_qos == 0:
            for message in messages:
                conn.send_message(message, 0, True, subscription_ids, None)
            return
        if not self.queue and not self.resends and not self.retained_due:  # most: sent at once, nothing kept
            quota = conn.terms.send_quota
            for index, message in enumerate(messages):
                inflight = self.inflight
                if conn.terms.paused or (inflight and len(inflight) >= quota):
                    messages = messages[index:]
                    break
                qos = max_qos if max_qos < message.qos else message.qos
                if qos:
                    self._send(conn, message, qos, True, subscription_ids)
                else:
                    conn.send_message(message, 0, True, subscription_ids, None)
            else:
                return
        due = self.retained_due
        if due is None:
            due = self.retained_due = deque()
        room -= sum(len(batch) for batch in due)
        if len(messages) > room:
            for message in messages[max(room, 0) :]:
                self.router.drop_for(self, "queue_full", message)
            messages = messages[: max(room, 0)]
        if messages:
            due.append(RetainedDue(messages, max_qos, subscription_ids))
            self.drain()

    def _send_retained_due(self, conn: Outlet) -> bool:
        """Send what waits in ``retained_due`` while the window has room: True once none is left."""
        due = self.retained_due
        while due:
            batch = due[0]
            messages = batch.messages
            while batch.position < len(messages):
                inflight = self.inflight
                if conn.terms.paused or (inflight and len(inflight) >= conn.terms.send_quota):
                    return False
                message = messages[batch.position]
                batch.position += 1
                if message.expires_at is not None and message.expired():
                    self.router.count_drop("expired")
                    continue
                qos = batch.max_qos if batch.max_qos < message.qos else message.qos
                if qos:
                    self._send(conn, message, qos, True, batch.subscription_ids)
                else:
                    conn.send_message(message, 0, True, batch.subscription_ids, None)
            due.popleft()
        self.retained_due = None
        return True

    def window_open(self) -> bool:
        """True when one more QoS 1/2 message may be sent right now (replays read only while it is)."""
        conn = self.connection
        if conn is None or conn.terms.paused or self.queue:
            return False
        return not self.inflight or len(self.inflight) < conn.terms.send_quota

    # -- acknowledgements from the client -----------------------------------------------------------------

    def on_puback(self, packet_id: int) -> bool:
        """QoS 1 delivery complete; False if the id was not a QoS 1 message in flight."""
        inflight = self.inflight
        if not inflight or not _ended_by_puback(inflight.get(packet_id)):
            return False
        del inflight[packet_id]
        self.drain()
        return True

    def on_pubacks(self, packet_ids: Iterable[int]) -> None:
        """``on_puback`` for each of ``packet_ids`` (a read's PUBACKs), the window refilled once after them
        all: the same messages sent in the same order, one ``drain`` instead of one per acknowledgement."""
        inflight = self.inflight
        if not inflight:
            return
        freed = False
        get = inflight.get
        for packet_id in packet_ids:
            entry = get(packet_id)
            if type(entry) is tuple and entry[1] == 1:  # ``_ended_by_puback`` without the call
                del inflight[packet_id]
                freed = True
        if freed:
            self.drain()

    def on_pubrec(self, packet_id: int, failed: bool) -> bool:
        """QoS 2 step 1: True if PUBREL must be sent (False: unknown id, or an error code ended the flow)."""
        inflight = self.inflight
        if not inflight:
            return False
        entry = inflight.get(packet_id)
        if entry is None or entry is RELEASED:
            return entry is RELEASED  # a repeated PUBREC is answered with PUBREL again
        if failed:
            del inflight[packet_id]
            self.drain()
            return False
        inflight[packet_id] = RELEASED
        return True

    def on_pubcomp(self, packet_id: int) -> bool:
        inflight = self.inflight
        if not inflight or inflight.get(packet_id) is not RELEASED:
            return False
        del inflight[packet_id]
        self.drain()
        return True

    # -- connection changes -------------------------------------------------------------------------------

    def attach(self, conn: Outlet) -> None:
        """The client (re)connected: resend what was in flight, with DUP and the same packet ids, then the
        queue (MQTT 4.4); never more unacknowledged at once than its new Receive Maximum [MQTT-3.3.4-9]."""
        self.connection = conn
        self.expires_at = None
        self.resends = None
        inflight = self.inflight
        if inflight:
            self.resends = deque(inflight)
        self.drain()

    def _resend(self, conn: Outlet) -> bool:
        """Send again, in order, what was in flight when the client came back (``resends``) while its window
        has room: True once none is left to send."""
        resends = self.resends
        inflight = self.inflight
        if resends is None or inflight is None:
            self.resends = None
            return True
        waiting = [packet_id for packet_id in resends if packet_id in inflight]  # gone: acknowledged since
        resends.clear()
        resends.extend(waiting)
        quota = conn.terms.send_quota
        while resends and not conn.terms.paused and len(inflight) - len(resends) < quota:
            packet_id = resends.popleft()
            entry = inflight.get(packet_id)
            if entry is None:
                continue
            if isinstance(entry, Released):
                conn.send_pubrel(packet_id)
                continue
            message, qos, retain, subscription_ids = entry
            if not conn.send_message(message, qos, retain, subscription_ids, packet_id, dup=True):
                del inflight[packet_id]
        if resends:
            return False
        self.resends = None
        return True

    def detach(self) -> None:
        self.connection = None

    def clear_outgoing(self) -> None:
        self.inflight = None
        self.queue = None
        if self._rare is not None:
            self.incoming_qos2 = None
            self.answered_qos2 = None
            self.cursors = None
            self.resends = None
            self.retained_due = None
