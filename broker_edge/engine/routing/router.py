"""The router: sessions, subscriptions, retained messages and wills, called synchronously by the handlers.

There is one router per broker and no queue in front of it: a PUBLISH handler calls ``publish`` which
matches the topic once (cached by the trie) and calls ``Session.deliver`` for every matching session, in the
same loop iteration. The router never touches sockets; times come in as numbers (``now``) or from the clock
it is given (message expiry of wills), and the broker's periodic sweep calls ``tick``.

Logged topics (see ``broker_edge.engine.cursors``) are the exception to "deliver at once": a session that is
behind on a topic's log (a replay, or messages missed while offline) reads that topic from the log until it
has caught up, and the router does not hand it the live copy meanwhile, so the switch has no gap and no
duplicate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker_edge.engine.message import Message, forwarded_properties
from broker_edge.engine.routing.retained import RetainedBounds, RetainedStore
from broker_edge.engine.routing.subscriptions import (
    OwnTerms,
    SharedGroup,
    SubscriptionOptions,
    SubscriptionTrie,
)
from broker_edge.engine.sessions.session import NEVER_EXPIRES, Released, Session, SessionSubscription
from broker_edge.protocol.topics import topic_matches

if TYPE_CHECKING:
    from broker_edge.engine.cursors import ReplayManager
    from broker_edge.engine.ports import (
        ClusterPorts,
        Interest,
        RetainedSync,
        SharedDispatch,
        SharedMembers,
        Wills,
    )
    from broker_edge.engine.publish_run import LoggedRun, PublishRun
    from broker_edge.protocol.packets import Will
    from broker_edge.security.limits import LimitsConfig

__all__ = ["Router"]

log = logging.getLogger(__name__)


RECOUNT_S = 10.0
"""Seconds between two counts of the subscription trie's walks that a refused SUBSCRIBE may ask for."""


def _walk_allowed(trie: SubscriptionTrie[Session], topic_filter: str, limit: int) -> bool:
    walk = trie.walk_with(topic_filter)
    return walk <= limit or walk <= trie.walk


def _is_online(session: Session) -> bool:
    return session.connection is not None


def _has_room(session: Session) -> bool:
    """Whether an online ``session`` can be sent a QoS 1/2 message now, not held behind what it has not
    acknowledged (``Session.window_open``)."""
    return session.window_open()


def _delivery_terms(message: Message, options: SubscriptionOptions) -> tuple[int, bool, tuple[int, ...]]:
    """The QoS, RETAIN flag and subscription identifiers of ``message`` delivered to a shared subscription."""
    sub_id = options.subscription_id
    return (
        options.qos if options.qos < message.qos else message.qos,
        message.retain and options.retain_as_published,
        (sub_id,) if sub_id is not None else (),
    )


def _takes(member: Session, options: SubscriptionOptions, message: Message) -> bool:
    """Whether a shared ``message`` would not be dropped for ``member`` as too large: it is offline (its
    next connection's Maximum Packet Size is not known), or the message fits its connection's."""
    conn = member.connection
    return conn is None or conn.fits(message, *_delivery_terms(message, options))


class Router:
    """Sessions by client id, the subscription trie, retained messages, delayed wills, expiring sessions.

    ``count_drop(reason)`` is called for every message not delivered (the broker binds it to its metrics);
    ``replays`` is the ``ReplayManager`` when a commitlog is attached, else None.
    """

    def __init__(
        self,
        limits: LimitsConfig,
        *,
        retained: RetainedBounds | None = None,
        retain_enabled: bool = True,
        count_drop: Callable[..., None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.sessions: dict[str, Session] = {}
        self.session_type = Session.bound_to(self)
        """The class of this broker's sessions (they reach the router through it)."""
        self.persistent_count = 0
        """Sessions with a Session Expiry Interval > 0 (kept by ``Session.expiry_interval``)."""
        self.trie: SubscriptionTrie[Session] = SubscriptionTrie()
        self._walks_counted_at = -RECOUNT_S
        """When the trie's walks were last counted again (``match_cost_allows``)."""
        self.retained = RetainedStore(retained, is_expired=Message.expired)
        self.retained_refused: Callable[[Message, str, int], None] | None = None
        """Told of a retained message the bounds refused (message, reason, bytes): the broker logs it."""
        self.retained_refusal: str | None = None
        """Why the last message ``retain`` was given was not kept (None: it was); its publisher is told."""
        self.retain_enabled = retain_enabled
        self.count_drop: Callable[..., None] = count_drop or (lambda reason, count=1: None)
        self.drop_for: Callable[[Session, str, Message], None] = lambda session, reason, message: (
            self.count_drop(reason)
        )
        """A message not delivered to ``session`` by the broker's policy (a full queue): the broker counts it
        and says so naming the subscriber (``BrokerCore`` sets it)."""
        self.clock = clock
        """Monotonic seconds, for the expiry deadline of wills (the broker's clock)."""
        self.replays: ReplayManager | None = None
        """``broker_edge.engine.cursors.ReplayManager`` when the broker has a commitlog."""
        self.qos2_journal: Callable[[str, int, bool], None] | None = None
        """Told of incoming QoS 2 ids persistent sessions hold or release (``runtime.qos2_journal``)."""
        self._delayed_wills: set[Session] = set()
        self._expiring: set[Session] = set()
        self.publish_through: Callable[[Message], None] | None = None
        """The PUBLISH path's entry (``BrokerCore`` sets it once), so wills take the path client PUBLISHes
        take, log append included; None: routed here only."""
        # The ports of the cluster this broker is a member of (``join_cluster``); all None alone.
        self._wills: Wills | None = None
        self._shared_dispatch: SharedDispatch | None = None
        self._shared_members: SharedMembers | None = None
        self._retained_sync: RetainedSync | None = None
        self._interest: Interest | None = None

    def join_cluster(self, ports: ClusterPorts) -> None:
        """Route as a cluster member from now on (``BrokerCore.join_cluster``): shared groups, retained
        messages, interest and wills go through ``ports``."""
        self._wills = ports.wills
        self._shared_dispatch = ports.shared_dispatch
        self._shared_members = ports.shared_members
        self._retained_sync = ports.retained_sync
        self._interest = ports.interest

    # -- publishing ---------------------------------------------------------------------------------------

    def retain(self, message: Message) -> bool:
        """Keep ``message`` as its topic's retained message within the bounds, counted (topic and payload
        bytes) to its publisher; False when refused (counted by reason, and told to ``retained_refused``)."""
        size = len(message.topic) + len(message.payload)
        refusal = self.retained_refusal = self.retained.set(message.topic, message, size, message.origin)
        if refusal is None:
            return True
        self.count_drop(refusal)
        if self.retained_refused is not None:
            self.retained_refused(message, refusal, size)
        return False

    def publish(self, message: Message, groups_served: bool = False) -> int:
        """Deliver ``message`` to every matching session (and update retained); returns how many matched.

        ``message.retain`` is the RETAIN flag of the incoming PUBLISH: the message becomes the topic's
        retained message (an empty payload clears it). Live deliveries carry RETAIN only to subscriptions
        with Retain As Published (MQTT 3.3.1.3). ``groups_served``: its shared groups were served where it
        was published (a cluster peer's unlogged publish), only ordinary subscriptions get it here.
        """
        if message.retain and self.retain_enabled:
            if message.payload:
                self.retain(message)  # refused or not, it is delivered live all the same
            else:
                self.retained.clear(message.topic)
            if self._retained_sync is not None:
                self._retained_sync.retained_changed(message.topic)
        match = self.trie.match(message.topic)
        shared = self._shared_dispatch
        served = 0
        if shared is not None and not groups_served:
            served = shared.dispatch(message)
        if not match.subscribers and (not match.groups or shared is not None or groups_served):
            return served
        origin = message.origin
        message_qos = message.qos
        retain = message.retain
        replays = self.replays
        for session, qos, no_local, retain_as_published, subscription_ids in match.subscribers:
            if no_local and session.client_id == origin:
                if not isinstance(no_local, OwnTerms):
                    continue
                qos, retain_as_published, subscription_ids = no_local  # its other subscriptions' terms
            if qos > message_qos:
                qos = message_qos
            if (
                (rare := session._rare) is not None  # a session with none of its rare fields set: one read
                and rare.cursors is not None
                and replays is not None
                and replays.holds(session, message, qos)
            ):
                continue
            if not qos:  # ``Session.deliver``'s first case without the call: nothing held, online or not
                conn = session.connection
                if conn is not None:
                    conn.send_message(message, 0, retain and retain_as_published, subscription_ids, None)
                continue
            session.deliver(message, qos, retain and retain_as_published, subscription_ids)
        if shared is not None or groups_served:
            return len(match.subscribers) + served
        for group in match.groups:
            self.deliver_to_group(group, message)
        return len(match.subscribers) + len(match.groups)

    def publish_run(self, run: PublishRun | LoggedRun) -> int | None:
        """Deliver a run of plain messages of one publisher and topic (``engine.publish_run``) to every
        matching session, as ``publish`` would each of them; how many sessions matched each, or None when
        shared groups match its topic (nothing delivered then: each goes through ``publish``).

        A run of unlogged QoS 0 messages goes to every session at once (``send_run``: no cursor holds them,
        none waits offline); a run of logged QoS 1 messages goes so to a QoS 0 subscriber with none of a
        session's rare fields set (no log cursors, no ``offset`` property), to every other one each message
        as ``publish`` sends it."""
        shared = self._shared_dispatch
        if shared is not None and shared.serves(run.topic):
            return None
        match = self.trie.match(run.topic)
        if match.groups:
            return None
        origin = run.origin
        logged = run.qos
        for session, qos, no_local, _retain_as_published, subscription_ids in match.subscribers:
            if no_local and session.client_id == origin:
                if not isinstance(no_local, OwnTerms):
                    continue
                qos, _, subscription_ids = no_local
            if not logged or (not qos and session._rare is None):
                conn = session.connection
                if conn is not None:
                    conn.send_run(run, subscription_ids)
                continue
            if qos and (session._rare is None or session._rare.cursors is None or self.replays is None):
                session.deliver_logged(run.messages(), qos if qos < 2 else 1, subscription_ids)
                continue
            for message in run.messages():
                self._deliver_logged(session, message, qos, subscription_ids)
        return len(match.subscribers)

    def _deliver_logged(
        self, session: Session, message: Message, qos: int, subscription_ids: tuple[int, ...]
    ) -> None:
        """Deliver a plain logged QoS 1 message to one matching session, as ``publish`` does."""
        if qos > 1:
            qos = 1
        replays = self.replays
        if (
            (rare := session._rare) is not None
            and rare.cursors is not None
            and replays is not None
            and replays.holds(session, message, qos)
        ):
            return
        if not qos:
            conn = session.connection
            if conn is not None:
                conn.send_message(message, 0, False, subscription_ids, None)
            return
        session.deliver(message, qos, False, subscription_ids)

    def deliver_to_group(self, group: SharedGroup[Session], message: Message) -> Session | None:
        """Deliver ``message`` to one member of a shared group (round robin, online members first, those
        with room in their window before the others, and an online member it is too large for only when
        no other can take it); the member it went to, None if the group is empty."""
        picked = group.pick(_is_online, _has_room, lambda member, options: _takes(member, options, message))
        if picked is None:
            return None
        member, options = picked
        member.deliver(message, *_delivery_terms(message, options), True)
        return member

    def group_takes(self, group: SharedGroup[Session], message: Message) -> bool:
        """Whether a member of ``group`` can take ``message``: an offline one, or an online one it is not
        larger than the Maximum Packet Size of (a cluster gives it to another broker's member else)."""
        return any(_takes(member, options, message) for member, options in group.members.items())

    def send_retained(self, session: Session, topic_filter: str, options: SubscriptionOptions) -> int:
        """Deliver the retained messages matching a new subscription (RETAIN set, MQTT 3.3.1.3)."""
        if not self.retain_enabled:
            return 0
        sync = self._retained_sync
        if sync is not None and sync.retained_gate(
            lambda: self.send_retained(session, topic_filter, options)
        ):
            return 0  # sent once the cluster's retained messages are known here
        sub_ids = (options.subscription_id,) if options.subscription_id is not None else ()
        found = self.retained.match(topic_filter)
        room = self.retained.count + self.limits.max_offline_messages  # one whole retained set and more
        session.deliver_retained([message for _topic, message in found], options.qos, sub_ids, room)
        return len(found)

    # -- subscriptions ------------------------------------------------------------------------------------

    def match_cost_allows(self, topic_filter: str) -> bool:
        """Whether one more subscription to ``topic_filter`` keeps every match within
        ``limits.max_match_nodes`` nodes visited (0: no limit), or at least adds nothing to the most one can
        visit (a trie already past the limit, restored or made under a higher one, still takes filters that
        cost nothing more). Upper bounds left by unsubscribes are counted again first, at most once per
        ``RECOUNT_S`` (a count visits every node of the trie)."""
        limit = self.limits.max_match_nodes
        trie = self.trie
        if not limit or _walk_allowed(trie, topic_filter, limit):
            return True
        if trie.walks_exact or self.clock() - self._walks_counted_at < RECOUNT_S:
            return False
        trie.recount_walks()
        self._walks_counted_at = self.clock()
        return _walk_allowed(trie, topic_filter, limit)

    def subscribe(
        self, session: Session, key: str, topic_filter: str, group: str | None, options: SubscriptionOptions
    ) -> bool:
        """Add or replace the subscription ``key`` (the filter as subscribed); True if it is new."""
        subscriptions = session.subscriptions
        if subscriptions is None:
            subscriptions = session.subscriptions = {}
        existing = subscriptions.get(key)
        joined = self.trie.add(topic_filter, session, options, group)
        subscriptions[key] = SessionSubscription(topic_filter, group, options)
        if joined and self._interest is not None:
            self._interest.interest_changed(topic_filter, True)
        if joined and group is not None and self._shared_members is not None:
            self._shared_members.member_changed(group, topic_filter, True)
        return existing is None

    def unsubscribe(self, session: Session, key: str) -> bool:
        subscriptions = session.subscriptions
        entry = subscriptions.pop(key, None) if subscriptions else None
        if entry is None:
            return False
        left = self.trie.remove(entry.topic_filter, session, entry.group)
        if left and self._interest is not None:
            self._interest.interest_changed(entry.topic_filter, False)
        if left and entry.group is not None and self._shared_members is not None:
            self._shared_members.member_changed(entry.group, entry.topic_filter, False)
        if not subscriptions:
            session.subscriptions = None
        if self.replays is not None:
            self.replays.forget_filter(session, entry.topic_filter)
        return True

    def subscription_count(self, session: Session) -> int:
        return len(session.subscriptions) if session.subscriptions else 0

    # -- session lifecycle --------------------------------------------------------------------------------

    def open_session(
        self, client_id: str, clean_start: bool, expiry_interval: int, now: float
    ) -> tuple[Session, bool]:
        """The session for a CONNECT: the existing one (session present) unless ``clean_start``.

        The caller has already taken over any connection still attached to the old session.
        """
        old = self.sessions.get(client_id)
        if old is not None and not clean_start:
            self._delayed_wills.discard(old)
            old.will = old.will_at = None  # a new connection before the delay cancels the will (3.1.2.5)
            self._expiring.discard(old)
            old.expires_at = None
            old.expiry_interval = expiry_interval
            return old, True
        if old is not None:
            self._end_session(old, now)
        session = self.session_type(client_id, expiry_interval)
        self.sessions[client_id] = session
        return session, False

    def restore_session(
        self, client_id: str, expiry_interval: int, expires_at: float | None, username: str | None
    ) -> Session:
        """Add an offline session read back at start (``broker_edge.engine.sessions.snapshot``); it ends at
        ``expires_at`` unless its client reconnects first (None: never)."""
        session = self.session_type(client_id, expiry_interval)
        session.username = username
        session.expires_at = expires_at
        self.sessions[client_id] = session
        if expires_at is not None:
            self._expiring.add(session)
        return session

    def connection_closed(self, session: Session, will: Will | None, will_delay: int, now: float) -> None:
        """The session's connection ended; ``will`` is None after a normal DISCONNECT."""
        session.detach()
        if self.sessions.get(session.client_id) is not session:
            if will is not None:
                self.publish_will(will, session.client_id)
            return
        if will is not None:
            if will_delay <= 0 or session.expiry_interval == 0:
                self.publish_will(will, session.client_id)
            else:
                session.will = will
                session.will_at = now + will_delay
                self._delayed_wills.add(session)
        if session.expiry_interval == 0:
            self._end_session(session, now)
        elif session.expiry_interval != NEVER_EXPIRES:
            session.expires_at = now + session.expiry_interval
            self._expiring.add(session)

    def _end_session(self, session: Session, now: float) -> None:
        """Discard a session: its subscriptions, queues and a will still waiting (sent now, 3.1.2.5)."""
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
            session.expiry_interval = 0  # no longer counted as persistent
        self._expiring.discard(session)
        if session.will is not None:
            self._delayed_wills.discard(session)
            will, session.will, session.will_at = session.will, None, None
            self.publish_will(will, session.client_id)
        orphans = _shared_orphans(session) if session.subscriptions else None
        if session.subscriptions:
            for key in list(session.subscriptions):
                self.unsubscribe(session, key)
        if self.replays is not None:
            self.replays.forget_session(session)
        session.clear_outgoing()
        if orphans:
            self._deliver_orphans(orphans)

    def _deliver_orphans(self, orphans: list[tuple[Message, SessionSubscription]]) -> None:
        """Give the shared deliveries an ended session held unacknowledged to other members of their groups,
        in the order it held them (MQTT 5.0 4.8.2: "SHOULD send the Application Message to another Client";
        the ended session is no member any more). Expired ones are dropped; with no member left here, a
        cluster gives them to another broker's member, a broker alone loses them."""
        for message, entry in orphans:
            if message.expires_at is not None and message.expired():
                self.count_drop("expired")
                continue
            group = self.trie.shared_group(entry.topic_filter, entry.group or "")
            member = self.deliver_to_group(group, message) if group is not None else None
            if member is None and self._shared_dispatch is not None:
                self._shared_dispatch.undelivered(message)  # a cluster: a member on another broker

    def publish_will(self, will: Will, client_id: str) -> None:
        forwarded, expiry = forwarded_properties(will.properties)
        expires_at = self.clock() + expiry if expiry is not None else None
        message = Message(
            will.topic, will.payload, will.qos, will.retain, forwarded, client_id, None, expires_at
        )
        if self._wills is not None:
            self._wills.publish_will(message)
        elif self.publish_through is not None:
            self.publish_through(message)
        else:
            self.publish(message)

    def tick(self, now: float) -> None:
        """Fire delayed wills and expire offline sessions whose time has come (called about once a second)."""
        if self._delayed_wills:
            for session in [s for s in self._delayed_wills if s.will_at is not None and s.will_at <= now]:
                self._delayed_wills.discard(session)
                will, session.will, session.will_at = session.will, None, None
                if will is not None:
                    self.publish_will(will, session.client_id)
        if self._expiring:
            for session in [s for s in self._expiring if s.expires_at is not None and s.expires_at <= now]:
                log.info("session expired", extra={"client_id": session.client_id})
                self._end_session(session, now)

    def online_count(self) -> int:
        return sum(1 for s in self.sessions.values() if s.connection is not None)

    def inflight_count(self) -> int:
        return sum(s.inflight_count() for s in self.sessions.values())

    def pump_replays(self, session: Session) -> None:
        if self.replays is not None:
            self.replays.pump_soon(session)


def _shared_orphans(session: Session) -> list[tuple[Message, SessionSubscription]]:
    """The deliveries of ``session``'s shared subscriptions that another member may still get when the
    session ends: QoS 1 ones sent and not acknowledged, and every one waiting in its queue (never sent). A
    QoS 2 delivery already sent stays with it [MQTT-4.8.2-5]. A delivery counts as its group's when its
    topic matches that one shared subscription of the session and no other: with an ordinary subscription
    or another group matching too, which copy it was is not known, and it is not moved."""
    entries = list((session.subscriptions or {}).values())
    if all(entry.group is None for entry in entries):
        return []
    held = [
        entry[0]
        for entry in (session.inflight or {}).values()
        if not isinstance(entry, Released) and entry[1] == 1
    ]
    held.extend(delivery[0] for delivery in session.queue or ())
    orphans = []
    for message in held:
        matching = [entry for entry in entries if topic_matches(entry.topic_filter, message.topic)]
        if len(matching) == 1 and matching[0].group is not None:
            orphans.append((message, matching[0]))
    return orphans
