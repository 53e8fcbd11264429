"""Shared subscriptions cluster-wide: each message of a ``$share/<group>/<filter>`` goes to one member of
the group, whichever broker its members are connected to.

Which brokers have members of which group is in etcd (``SharedRegistry``, a key per broker under its lease,
followed into a ``SharedDirectory``); everything per message moves over the peer links:

- **Logged publishes** (QoS 1/2 by default). Every broker routes the committed records its subscribers
  want, so a broker's ordinary routing never serves shared groups (this object is the ``shared_dispatch``
  port; ``may_assign`` tells a follower which topics' records it must route for it):
  only the partition's leader, the first to know the record and the one place its order is defined, picks
  a broker for each matching group (round robin over the brokers with members whose link is up) and sends
  it the message (``ASSIGN``); that broker picks one of its own members as a broker alone does. The leader
  tells every other broker who got it (``NOTE``). When the member has acknowledged it (or the broker drops
  it as a broker alone would: its queue was full, it expired) the broker tells everyone (``DONE``); a broker
  with no member left declines it (``DONE``, declined) and the leader picks another, and so does one whose
  member's session ended holding a QoS 1 delivery no other member there took (``undelivered``).
- **A broker dies** (its member lease expires). Every broker knows the deliveries in flight to it: the
  leader of each record's partition gives them to members on other brokers, reading the record from its
  own log. A new leader first asks its peers for the deliveries they know of in the partitions it took
  over (``ASSIGNED``), so the deliveries of a leader that died with its partitions are not forgotten.
  So under failure a message can reach two members (the dead broker's member may have had it without its
  acknowledgement reaching anyone): at least once, never lost while a broker that knew of its delivery
  survives.
- **Unlogged publishes** (QoS 0 by default) are picked for by the broker they were published on, which
  sends the message to the chosen broker (``DIRECT``); the copies it broadcasts to every broker for their
  ordinary subscribers do not serve shared groups there (``Router.publish(groups_served=True)``). A broker
  none of whose members of the group can take it (larger than their Maximum Packet Size, or none left) hands
  it to another broker of the group none of the brokers before it had (request ``ONWARD``, naming them);
  the last one drops it (counted ``too_large``). At most once, as every unlogged publish.

A delivery is known to be finished when the copy handed to the member's session is released: the session
holds it until the member acknowledges it (QoS 1 PUBACK; QoS 2 PUBREC, from which on the member holds
it), or drops it, and a QoS 0 delivery is written at once. The copy is a ``Message`` with a weak
reference (``weakref.finalize``), so sessions need no hook of their own.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import struct
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker_edge.cluster.features.shared_directory import (
    Deliveries,
    DeliveryKey,
    GroupKey,
    SharedDirectory,
    choose,
)
from broker_edge.cluster.features.shared_groups_wire import (
    ASSIGN,
    ASSIGNED,
    DECLINED_TOO_LARGE,
    DIRECT,
    DONE,
    NOTE,
    ONWARD,
    decode_assign,
    decode_assigned,
    decode_direct,
    decode_done,
    decode_moved,
    decode_note,
    decode_onward,
    decode_partitions,
    encode_assign,
    encode_assigned,
    encode_direct,
    encode_done,
    encode_moved,
    encode_note,
    encode_onward,
    encode_partitions,
)
from broker_edge.cluster.links.peer_link import PeerLinkDown, PeerRequestFailed
from broker_edge.cluster.tasks import stop_task
from broker_edge.engine.message import Message
from broker_edge.engine.records import message_of_record
from broker_edge.engine.sessions.session import Inflight, Released
from broker_edge.storage.errors import StorageError

if TYPE_CHECKING:
    from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.routing.router import Router
    from broker_edge.engine.routing.subscriptions import SharedGroup
    from broker_edge.engine.sessions.session import Session
    from broker_edge.storage.store import LogStore

__all__ = ["ReadRecord", "SharedGroups", "log_reader"]

log = logging.getLogger("broker_edge.cluster.shared_groups")

ReadRecord = Callable[[str, int], "Message | None"]
"""The committed record of ``(topic, offset)`` in this broker's log as a message; None while it is not
committed here yet; ``LookupError`` when the log no longer has it."""
RETRY_S = 0.2
"""How often deliveries that could not be given to another broker yet are tried again."""
ASK_TIMEOUT_S = 1.0
"""How long a new leader waits for each peer's list of deliveries in flight."""
LOCAL_ONLY_PREFIX = "$SYS/"
"""Each broker's own statistics: their shared groups are served by the broker alone."""


MAX_RECORD_BYTES = 64 * 1024 * 1024


def log_reader(store: LogStore) -> ReadRecord:
    """``ReadRecord`` over this broker's commitlog."""

    def read(topic: str, offset: int) -> Message | None:
        if topic not in store or offset >= store.committed_end(topic):
            return None
        try:
            records = store.read(topic, offset, 1, MAX_RECORD_BYTES)
        except StorageError as exc:
            raise LookupError(str(exc)) from exc
        if not records or records[0].offset != offset:
            raise LookupError(f"offset {offset} of {topic!r} is not in the log")
        return message_of_record(topic, records[0])

    return read


class _TrackedMessage(Message):
    """The copy of a message handed to a member: its release tells that the delivery is finished; ``key``
    is its delivery (None: an unlogged one, not tracked)."""

    __slots__ = ("__weakref__", "key")

    key: DeliveryKey | None


def _copy(message: Message, key: DeliveryKey | None) -> _TrackedMessage:
    copy = _TrackedMessage(
        message.topic,
        message.payload,
        message.qos,
        message.retain,
        message.properties,
        message.origin,
        message.offset,
        message.expires_at,
    )
    copy.key = key
    return copy


class SharedGroups:
    """This broker's part in cluster-wide shared subscriptions (see the module docstring)."""

    def __init__(
        self,
        router: Router,
        view: ClusterView,
        links: PeerLinks,
        directory: SharedDirectory,
        loop: asyncio.AbstractEventLoop,
        read_record: ReadRecord | None,
        remembered: int,
        resend_s: float,
    ) -> None:
        self.router = router
        self.view = view
        self.links = links
        self.directory = directory
        self.loop = loop
        self.read_record = read_record
        self.deliveries = Deliveries(remembered)
        self._here: set[DeliveryKey] = set()
        """Deliveries handed to a member of this broker and not finished."""
        self._too_large: set[DeliveryKey] = set()
        """Deliveries of partitions this node leads that a broker declined as too large for its members: one
        no other broker takes is dropped, counted ``too_large``."""
        self._moved: dict[DeliveryKey, str] = {}
        """Deliveries a member's session took to another broker (``hand_over``), until they finish: an
        assignment sent here before the leader knew it is not delivered again while that broker lives."""
        self._retry_timer: asyncio.TimerHandle | None = None
        self.resend_s = resend_s
        self._sent_at: dict[DeliveryKey, float] = {}
        """Deliveries this node assigned to another broker, and when (sent again while unfinished)."""
        self._resend_timer: asyncio.TimerHandle | None = None
        self._led: set[int] = set()
        self.led_epochs: dict[int, set[int]] = {}
        """Partition → the epochs in which this node led it (since it started)."""
        self.epoch_of: Callable[[str, int], int] | None = None
        """The epoch that appended a topic's record at an offset (set when the node keeps epoch caches)."""
        self._asking: set[asyncio.Task[None]] = set()
        """Requests under way: a new leader's ``ASSIGNED``, unlogged messages passed ``ONWARD``."""
        self._started = False
        links.on(ASSIGN, self._on_assign)
        links.on(NOTE, self._on_note)
        links.on(DONE, self._on_done)
        links.on(DIRECT, self._on_direct)
        links.serve_requests(ASSIGNED, self._serve_assigned)
        links.serve_requests(ONWARD, self._serve_onward)

    def start(self) -> None:
        self._started = True
        self.view.on_change(self._view_changed)
        self._view_changed()
        self._resend_timer = self.loop.call_later(self.resend_s / 2, self._resend_unfinished)

    async def stop(self) -> None:
        self._started = False
        for timer in (self._retry_timer, self._resend_timer):
            if timer is not None:
                timer.cancel()
        for task in list(self._asking):
            await stop_task(task)

    # -- routing (the ``shared_dispatch`` port) --------------------------------------------------------------

    def dispatch(self, message: Message) -> int:
        """Serve the shared groups of a message routed here: how many groups it went to (or will)."""
        groups = self.directory.match(message.topic)
        if not groups:
            return 0
        if message.offset is None:
            return self._dispatch_unlogged(message, groups)
        if not self._assigns(message.topic, message.offset):
            return 0  # the leader that appended it assigns it
        served = 0
        for group in groups:
            key = DeliveryKey(message.topic, message.offset, group.name, group.filter)
            if not self.deliveries.known(key):
                self._assign(key, message, group, set())
                served += 1
        return served

    def serves(self, topic: str) -> bool:
        return bool(self.directory.match(topic))

    def _dispatch_unlogged(self, message: Message, groups: list[SharedGroup[str]]) -> int:
        me = self.view.node_id
        local_only = message.topic.startswith(LOCAL_ONLY_PREFIX)
        served = 0
        for group in groups:
            node = choose(group, (lambda n: n == me) if local_only else self._usable)
            if node is None:
                continue
            served += 1
            if node == me:
                self._deliver_unlogged((group.name, group.filter), message, set())
            else:
                self.links.link(node).send(DIRECT, encode_direct(group.name, group.filter, message))
        return served

    def _usable(self, node: str, excluded: set[str] | None = None) -> bool:
        if excluded and node in excluded:
            return False
        return node == self.view.node_id or (node in self.view.members and self.links.up(node))

    def _assign(
        self, key: DeliveryKey, message: Message, group: SharedGroup[str] | None, excluded: set[str]
    ) -> None:
        """Give ``key`` to a broker of ``group`` (this one included) and tell the others."""
        if group is None or not group.members:
            self._finished(key)  # no member left anywhere: dropped, as a broker alone drops it
            return
        node = choose(group, lambda n: self._usable(n, excluded))
        if node is None and key in self._too_large and all(n in excluded for n in group.members):
            log.info(
                "%s %s@%d dropped: larger than the Maximum Packet Size of every member of the group",
                key.group,
                key.topic,
                key.offset,
            )
            self.router.count_drop("too_large")
            self._finished(key)
            return
        if node is None:  # no link up to a broker with members: tried again shortly
            self.deliveries.hold(key)
            self._retry_later()
            return
        if not self.deliveries.assign(key, node):
            return
        note = encode_note(key, node)
        for peer, link in self.links.links.items():
            if peer != node and peer in self.view.members:
                link.send(NOTE, note)
        if node == self.view.node_id:
            self._deliver_here((key.group, key.topic_filter), message, key)
        else:
            self.links.link(node).send(ASSIGN, encode_assign(key, message))
            self._sent_at[key] = self.loop.time()

    # -- delivering here ----------------------------------------------------------------------------------

    def _deliver_here(self, group_key: GroupKey, message: Message, key: DeliveryKey) -> None:
        """Deliver a logged message to one member of the group here, tracked until it is finished."""
        group = self.router.trie.shared_group(group_key[1], group_key[0])
        copy = _copy(message, key)
        if group is not None and not self.router.group_takes(group, copy):
            self._decline(key, too_large=True)  # another broker's member may take it
            return
        member = self.router.deliver_to_group(group, copy) if group is not None else None
        if member is None:
            self._decline(key)
            return
        self._here.add(key)
        weakref.finalize(copy, self._released, key)

    def _deliver_unlogged(self, group_key: GroupKey, message: Message, tried: set[str]) -> None:
        """Deliver an unlogged message to one member of the group here that can take it; with none here
        (none left, or each one's Maximum Packet Size too small), to another broker of the group none of
        ``tried`` (the brokers that could not) is; with none of those either, it is dropped: counted
        ``too_large`` for a member here, or for the brokers before when none is left here."""
        group = self.router.trie.shared_group(group_key[1], group_key[0])
        copy = _copy(message, None)
        if group is not None and self.router.group_takes(group, copy):
            self.router.deliver_to_group(group, copy)
            return
        if self._pass_on(group_key, message, tried):
            return
        if group is not None and self.router.deliver_to_group(group, copy) is not None:
            return  # dropped for the member it went to, counted there
        if tried:
            log.info(
                "%s %s dropped: larger than the Maximum Packet Size of every member of the group",
                group_key[0],
                message.topic,
            )
            self.router.count_drop("too_large")

    def _pass_on(self, group_key: GroupKey, message: Message, tried: set[str]) -> bool:
        """Hand an unlogged message no member here can take to another broker of the group, not one of
        ``tried``, whose link is up (``ONWARD``); False when there is none."""
        if message.topic.startswith(LOCAL_ONLY_PREFIX):
            return False
        tried = tried | {self.view.node_id}
        node = choose(self.directory.group(group_key), lambda n: self._usable(n, tried))
        if node is None:
            return False
        body = encode_onward(tried, group_key[0], group_key[1], message)
        sending = self._send_onward(node, body, message.topic)
        task = self.loop.create_task(sending, name="cluster-shared-onward")
        self._asking.add(task)
        task.add_done_callback(self._asking.discard)
        return True

    async def _send_onward(self, node: str, body: bytes, topic: str) -> None:
        try:
            await self.links.link(node).request(ONWARD, body, ASK_TIMEOUT_S)
        except PeerRequestFailed as exc:  # a member of an earlier version: no such service
            log.info("%s: %s did not take a message too large for the members here: %s", topic, node, exc)
            self.router.count_drop("too_large")
        except (PeerLinkDown, TimeoutError) as exc:  # at most once: it may have been delivered
            log.info("%s: a message too large for the members here, handed to %s: %s", topic, node, exc)

    async def _serve_onward(self, link: PeerLink, body: memoryview) -> bytes:
        tried, group, topic_filter, message = decode_onward(body, self.loop.time())
        self._deliver_unlogged((group, topic_filter), message, tried)
        return b""

    def _released(self, key: DeliveryKey) -> None:
        """The member's session let go of its copy (it may be in the middle of handling an ack)."""
        if not self.loop.is_closed():
            self.loop.call_soon(self._delivered, key)

    def _delivered(self, key: DeliveryKey) -> None:
        if key not in self._here:
            return  # given up here before its copy was let go (``undelivered``)
        self._here.discard(key)
        self._finished(key)

    def undelivered(self, message: Message) -> None:
        """A member's session ended holding this delivery unacknowledged and no member here took it: declined,
        so the leader gives it to another broker (the ``shared_dispatch`` port)."""
        key = message.key if isinstance(message, _TrackedMessage) else None
        if key is None or key not in self._here:
            return
        self._here.discard(key)
        self._decline(key)

    def _finished(self, key: DeliveryKey) -> None:
        self.deliveries.finish(key)
        self._too_large.discard(key)
        self._moved.pop(key, None)
        self._sent_at.pop(key, None)
        self._tell_others(DONE, encode_done(key, False))

    def _decline(self, key: DeliveryKey, too_large: bool = False) -> None:
        """No member of the group here (any more), or none that can take the message (``too_large``): the
        leader gives it to another broker."""
        if self._leads(key.topic):
            if too_large:
                self._too_large.add(key)
            self._reassign(key, self.deliveries.decline(key, self.view.node_id))
        else:
            self.deliveries.decline(key, self.view.node_id)
            self._tell_others(DONE, encode_done(key, DECLINED_TOO_LARGE if too_large else 1))

    def _tell_others(self, kind: int, body: bytes) -> None:
        for peer, link in self.links.links.items():
            if peer in self.view.members:
                link.send(kind, body)

    # -- a member's session moving to another broker ------------------------------------------------------

    def hand_over(self, session: Session, node: str) -> list[dict[str, Any]]:
        """The shared QoS 2 deliveries ``session`` has in flight and not past PUBREC, for ``node``, the broker
        its client resumes it on (``adopt``): tracked here no more (their copies' release here finishes
        nothing, the other brokers are told where they went), its member completes them there
        [MQTT-4.8.2-4] and no other member gets them [MQTT-4.8.2-5]."""
        moved = []
        for packet_id, entry in (session.inflight or {}).items():
            if isinstance(entry, Released):
                continue
            message, qos, retain, subscription_ids = entry
            if qos != 2 or not isinstance(message, _TrackedMessage):
                continue
            key = message.key
            if key is not None:
                if key not in self._here:
                    continue
                self._here.discard(key)
                self._moved[key] = node
                self.deliveries.assign(key, node)
                self._tell_others(NOTE, encode_note(key, node))
            moved.append(
                {
                    "packet_id": packet_id,
                    "key": None if key is None else [key.topic, key.offset, key.group, key.topic_filter],
                    "retain": retain,
                    "subscription_ids": list(subscription_ids),
                    "message": base64.b64encode(encode_moved(message)).decode(),
                }
            )
        return moved

    def adopt(self, session: Session, moved: list[Any]) -> None:
        """Put the shared deliveries the session's former broker had in flight (``hand_over``) into its
        window here: sent again with their packet ids and DUP when its client connects [MQTT-4.4.0-1], and
        tracked here from now on (the other brokers told: ``NOTE``)."""
        me = self.view.node_id
        for entry in moved:
            try:
                message = decode_moved(base64.b64decode(entry["message"]), self.loop.time())
                key = DeliveryKey(*entry["key"]) if entry["key"] is not None else None
                packet_id = int(entry["packet_id"])
                delivery = (bool(entry["retain"]), tuple(int(n) for n in entry["subscription_ids"]))
            except (KeyError, TypeError, ValueError, struct.error, binascii.Error) as exc:
                log.error(
                    "a shared delivery of session %r handed over is not readable: %s", session.client_id, exc
                )
                continue
            inflight = session.inflight
            if inflight is None:
                inflight = session.inflight = Inflight()
                inflight.next_id = 1
                inflight.resend_as = None
            if packet_id in inflight:
                continue
            if key is not None:
                message.offset = key.offset
            copy = _copy(message, key)
            inflight[packet_id] = (copy, 2, *delivery)
            if key is None:
                continue
            self._here.add(key)
            self.deliveries.assign(key, me)
            self._tell_others(NOTE, encode_note(key, me))
            weakref.finalize(copy, self._released, key)

    # -- what peers send ----------------------------------------------------------------------------------

    def _on_assign(self, link: PeerLink, body: memoryview) -> None:
        key, message = decode_assign(body, self.loop.time())
        if key in self._here or self._moved.get(key) in self.view.members:
            return  # sent again while its delivery here, or where its member's session went, goes on
        if not self.deliveries.assign(key, self.view.node_id):
            link.send(DONE, encode_done(key, False))  # finished: the first notice did not get through
            return
        self._deliver_here((key.group, key.topic_filter), message, key)

    def _on_note(self, link: PeerLink, body: memoryview) -> None:
        key, node = decode_note(body)
        self.deliveries.assign(key, node)

    def _on_done(self, link: PeerLink, body: memoryview) -> None:
        key, declined = decode_done(body)
        if not declined:
            self.deliveries.finish(key)
            self._sent_at.pop(key, None)
            self._too_large.discard(key)
            self._moved.pop(key, None)
            return
        excluded = self.deliveries.decline(key, link.peer)
        if excluded and self._leads(key.topic):
            if declined == DECLINED_TOO_LARGE:
                self._too_large.add(key)
            self._reassign(key, excluded)

    def _on_direct(self, link: PeerLink, body: memoryview) -> None:
        group, topic_filter, message = decode_direct(body, self.loop.time())
        self._deliver_unlogged((group, topic_filter), message, set())

    async def _serve_assigned(self, link: PeerLink, body: memoryview) -> bytes:
        partitions = decode_partitions(body)
        return encode_assigned(self.deliveries.in_partitions(self.view.partition_of, partitions))

    # -- brokers leaving, leaders changing ----------------------------------------------------------------

    def _leads(self, topic: str) -> bool:
        return self.view.leads(self.view.partition_of(topic))

    def _assigns(self, topic: str, offset: int) -> bool:
        """Whether this node assigns the logged record at ``offset``: the node that led its partition in the
        epoch that appended it, whatever leads now. Deciding by the current leader instead loses the records
        routed while leadership moves (the old leader routes them after its view moved on, the new one had
        routed them as a follower before its view showed it leading)."""
        partition = self.view.partition_of(topic)
        epoch_of = self.epoch_of
        if epoch_of is not None:
            epoch = epoch_of(topic, offset)
            if epoch >= 0:
                return epoch in self.led_epochs.get(partition, ()) and not self.view.fenced
        return self.view.leads(partition)

    def may_assign(self, topic: str) -> bool:
        """Whether this node may assign any logged record of ``topic`` (``_assigns``): it leads the topic's
        partition, or led it in an epoch since it started. A node that never did only routes the records of
        the partition's shared groups to nobody (another node assigns them)."""
        partition = self.view.partition_of(topic)
        return partition in self.led_epochs or self.view.leads(partition)

    def _view_changed(self) -> None:
        view = self.view
        for partition, state in view.states.items():
            if state.leader == view.node_id:
                self.led_epochs.setdefault(partition, set()).add(state.epoch)
        if not self._started:
            return
        led = {partition for partition in view.states if view.leads(partition)}
        gained, self._led = led - self._led, led
        if gained:
            task = self.loop.create_task(self._ask_then_reassign(gained), name="cluster-shared-takeover")
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)
        else:
            self._reassign_orphans()

    async def _ask_then_reassign(self, partitions: set[int]) -> None:
        """Learn the deliveries in flight in partitions this node now leads, then move the orphaned ones."""
        me = self.view.node_id
        peers = [peer for peer in self.view.members if peer != me and self.links.up(peer)]
        request = encode_partitions(partitions)
        replies = await asyncio.gather(
            *(self.links.link(peer).request(ASSIGNED, request, ASK_TIMEOUT_S) for peer in peers),
            return_exceptions=True,
        )
        for peer, reply in zip(peers, replies, strict=True):
            if isinstance(reply, PeerLinkDown | PeerRequestFailed | TimeoutError):
                log.info("deliveries in flight from %s not known: %s", peer, reply)
                continue
            if isinstance(reply, BaseException):
                raise reply
            try:
                entries = decode_assigned(reply)
            except (ValueError, struct.error) as exc:
                log.error("deliveries in flight from %s are not readable: %s", peer, exc)
                continue
            for key, node in entries:
                if not self.deliveries.known(key):
                    self.deliveries.assign(key, node)
        self._reassign_orphans()

    def _reassign_orphans(self) -> None:
        members = self.view.members
        me = self.view.node_id
        for key in self.deliveries.orphans(lambda node: node == me or node in members, self._leads):
            node = self.deliveries.assigned.get(key)
            excluded = set(self.deliveries.declined.get(key, ()))
            if node is not None:
                excluded.add(node)
                log.info(
                    "%s %s@%d: its broker %s is gone, giving it to another",
                    key.group,
                    key.topic,
                    key.offset,
                    node,
                )
            self._reassign(key, excluded)

    def _reassign(self, key: DeliveryKey, excluded: set[str]) -> None:
        read = self.read_record
        try:
            message = read(key.topic, key.offset) if read is not None else None
        except LookupError as exc:
            log.warning(
                "%s@%d for group %s cannot be delivered again: %s", key.topic, key.offset, key.group, exc
            )
            self._finished(key)
            return
        if message is None:  # not committed here yet (a new leader's watermark is still behind)
            self.deliveries.hold(key)
            self._retry_later()
            return
        self._assign(key, message, self.directory.group((key.group, key.topic_filter)), excluded)

    def _resend_unfinished(self) -> None:
        """Send again the assignments to live brokers unfinished for ``resend_s`` (one, or its completion
        notice, may have been lost on a peer link that dropped): the broker delivers it if it never got
        it, ignores it while delivering it, and repeats its notice if it has finished it."""
        now = self.loop.time()
        self._resend_timer = self.loop.call_later(self.resend_s / 2, self._resend_unfinished)
        assigned = self.deliveries.assigned
        for key, sent in list(self._sent_at.items()):
            node = assigned.get(key)
            if node is None or node == self.view.node_id or not self._leads(key.topic):
                del self._sent_at[key]  # finished, moved, or no longer this node's to watch
                continue
            if now - sent < self.resend_s or not self._usable(node):
                continue
            try:
                message = self.read_record(key.topic, key.offset) if self.read_record is not None else None
            except LookupError:
                message = None
            if message is not None:
                self._sent_at[key] = now
                self.links.link(node).send(ASSIGN, encode_assign(key, message))

    def _retry_later(self) -> None:
        if self._retry_timer is None and self._started:
            self._retry_timer = self.loop.call_later(RETRY_S, self._retry_now)

    def _retry_now(self) -> None:
        self._retry_timer = None
        self._reassign_orphans()
