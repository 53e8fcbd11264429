"""One partition's truth on this node, in one object: who leads it and under which epoch, its in-sync set, the
high watermark of its topics, the ranges not yet committed or inherited from an earlier leader, and the fetch
sessions its followers and observers hold with this node.

As Kafka's ``Partition`` does, a ``Partition`` decides; the store only keeps what it is told
(``storage.replicated_log``: committed ends, frames). The cluster's state of the partition (leader, epoch,
replicas, ISR) is the record the coordination side keeps in the view (``PartitionState``, from etcd); the
partition reads it from there and adds what only this node knows: since when it leads (``led_since``), a
newer epoch a follower has seen (``newer_epoch``: this node steps down until the view catches up), and, as
leader, how far each topic is committed. ``advance`` moves a topic's high watermark to what every in-sync
replica holds (the followers' sessions say how far they are), routes the records inherited from an earlier
leader as it passes them, and tells the sessions that something is new.

``Partitions`` is every partition of this node by number, and each topic's partition (the one hash,
``placement.partition_of``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from broker_edge.observe import path_trace

if TYPE_CHECKING:
    from broker_edge.cluster.view import ClusterView
    from broker_edge.placement import PartitionState
    from broker_edge.storage.store import LogStore

__all__ = ["Partition", "Partitions", "Session"]


class Session(Protocol):
    """A fetch session as a partition sees it (``replication.sessions.FetchSession``)."""

    observer: bool
    partitions: dict[int, int]
    positions: dict[str, int]
    known_hw: dict[str, int]
    dirty: dict[str, None]
    behind: dict[str, float]

    def wake(self) -> None: ...


RouteCommitted = Callable[[str, int, int], None]
"""Delivers the committed records ``[start, end)`` of a topic to this node's subscribers."""


class Partition:
    """One partition on this node (see the module docstring)."""

    __slots__ = (
        "_route",
        "_store",
        "_view",
        "inherited",
        "led_since",
        "newer_epoch",
        "number",
        "sessions",
        "topics",
        "uncommitted",
    )

    def __init__(self, number: int, view: ClusterView, store: LogStore, route: RouteCommitted | None) -> None:
        self.number = number
        self._view = view
        self._store = store
        self._route = route
        self.topics: set[str] = set()
        """Its topics known here (those of the store, and those a replica reported)."""
        self.led_since: float | None = None
        """Since when this node leads it (None: it does not, or has not taken over yet)."""
        self.newer_epoch: int | None = None
        """An epoch newer than the view's that a follower fetched under: this node does not lead the partition
        until the view shows that epoch (it has stepped down)."""
        self.inherited: dict[str, int] = {}
        """topic -> records below this end were not routed here: appended as a follower before this node took
        the lead, or refused; they are routed as the high watermark passes them."""
        self.uncommitted: dict[str, None] = {}
        """Topics whose durable end is past their high watermark here."""
        self.sessions: dict[tuple[str, bool], Session] = {}
        """(replica, observer) -> the fetch session serving this partition to that member."""

    @property
    def state(self) -> PartitionState | None:
        """The cluster's record of the partition: leader, epoch, replicas, in-sync replicas."""
        return self._view.states.get(self.number)

    @property
    def epoch(self) -> int:
        state = self._view.states.get(self.number)
        return state.epoch if state is not None else -1

    def leads(self) -> bool:
        """Whether this node leads it now (not fenced, and no follower has seen a newer epoch)."""
        view = self._view
        if not view.leads(self.number):
            return False
        newer = self.newer_epoch
        return newer is None or view.states[self.number].epoch >= newer

    def take_lead(self, now: float) -> None:
        """This node leads the partition from now on: what it appended as a follower and is not committed yet
        is inherited (routed as the high watermark passes it)."""
        self.led_since = now
        store = self._store
        for topic in self.topics:
            durable = store.durable_end(topic)
            if store.committed_end(topic) < durable:
                self.uncommitted[topic] = None
                self.inherited[topic] = durable

    def inherit(self, topic: str, first: int, end: int) -> None:
        """Records ``[first, end)`` were refused here (never acknowledged) but stay in the log: route what is
        committed of them now, and the rest as the high watermark passes it."""
        committed = self._store.committed_end(topic)
        if committed > first and self._route is not None:
            self._route(topic, first, min(end, committed))
        if end > committed:
            self.inherited[topic] = max(self.inherited.get(topic, 0), end)

    def followers(self) -> Iterator[Session]:
        """The sessions of its replicas (observers left out)."""
        return (session for session in self.sessions.values() if not session.observer)

    def advance(self, topic: str) -> None:
        """Move ``topic``'s high watermark to what every in-sync replica holds durably (the leader's durable
        end included); route inherited records it passes; tell the sessions of a new watermark."""
        store = self._store
        durable = store.durable_end(topic)
        hw = durable
        view = self._view
        state = view.states.get(self.number)
        if state is None or not self.leads():
            return
        me = view.node_id
        sessions = self.sessions
        for member in state.isr:
            if member == me:
                continue
            session = sessions.get((member, False))
            position = session.positions.get(topic, 0) if session is not None else 0
            if position < hw:
                hw = position
        before = store.committed_end(topic)
        if hw <= before:
            return
        after = store.replicated_log.commit_to(topic, hw)
        if path_trace.ON:
            path_trace.mark("hw", topic, before, after)
        if after >= durable:
            self.uncommitted.pop(topic, None)
        inherited = self.inherited.get(topic)
        if inherited is not None:
            if after >= inherited:
                del self.inherited[topic]
            if self._route is not None:
                self._route(topic, before, min(after, inherited))
        for session in sessions.values():
            if session.known_hw.get(topic, -1) < after:
                session.dirty[topic] = None
                session.wake()

    def serve(self, key: tuple[str, bool], session: Session | None) -> None:
        """``session`` serves this partition to ``key``'s member from now on (None: none does)."""
        if session is None:
            self.sessions.pop(key, None)
        else:
            self.sessions[key] = session


class Partitions:
    """Every partition of this node by number, and each topic's (see the module docstring)."""

    def __init__(self, view: ClusterView, store: LogStore, route: RouteCommitted | None = None) -> None:
        self.view = view
        self.store = store
        self._route = route
        self._by_number: dict[int, Partition] = {}
        self._by_topic: dict[str, Partition] = {}

    def number(self, number: int) -> Partition:
        """Partition ``number`` (made on first use)."""
        partition = self._by_number.get(number)
        if partition is None:
            partition = self._by_number[number] = Partition(number, self.view, self.store, self._route)
        return partition

    def of(self, topic: str) -> Partition:
        """``topic``'s partition, which knows the topic from now on."""
        partition = self._by_topic.get(topic)
        if partition is None:
            partition = self._by_topic[topic] = self.number(self.view.partition_of(topic))
            partition.topics.add(topic)
        return partition

    def known(self, topic: str) -> Partition | None:
        """``topic``'s partition if the topic is known here (None: never seen)."""
        return self._by_topic.get(topic)

    def learn_topics(self) -> None:
        """Know every topic the store holds (a follower may have created some since the last look)."""
        for topic in self.store.topics():
            self.of(topic)

    def __iter__(self) -> Iterator[Partition]:
        return iter(list(self._by_number.values()))
