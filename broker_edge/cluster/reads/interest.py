"""Which partitions this broker's subscribers need, so that it observes only those (``follower``).

A broker routes the committed records of every partition it leads or replicates. A partition it holds no
copy of (only with more brokers than ``replication_factor``) it fetches as an **observer**, and only while
something here can want its records: a subscription whose filter can match a topic of the partition. An
exact filter (no ``+`` or ``#``; a ``$share`` group's filter alike) names one topic, hence one partition; a
filter with a wildcard can match topics of any partition, so it wants them all. Subscriptions count whether
their session is online or not (a persistent session's messages are routed to it while it is away), and
whichever way they arrived (SUBSCRIBE, a session restored at start or moved from another broker).

``LocalInterest`` counts the filters of the router's subscriptions (it is the ``interest`` port) and tells
its listeners when the set of wanted partitions changes.

``RetainedRefresh`` keeps the retained messages of partitions that were not observed right: retained
messages of logged topics reach a broker by routing, so while a broker does not observe a partition its
retained messages for that partition's topics may age. When observation of a partition starts, the broker
asks the partition's leader (which routes everything of it) for the retained messages of the partition
(peer service ``RETAINED_OF_PARTITIONS``) and replaces its own with them, but for topics whose retained
message changed here since the observation started (those changes are the same or newer: from then on the
broker routes every record of the partition, in the log's order).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from broker_edge.cluster.features.retained_sync import (
    LOCAL_ONLY_PREFIX,
    PAGE_BYTES,
    decode_snapshot,
    encode_snapshot,
    snapshot_page,
)
from broker_edge.cluster.links.peer_link import PeerLinkDown, PeerRequestFailed

if TYPE_CHECKING:
    from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.message import Message
    from broker_edge.engine.routing.router import Router

__all__ = ["RETAINED_OF_PARTITIONS", "LocalInterest", "RetainedRefresh", "is_wildcard"]

log = logging.getLogger("broker_edge.cluster.interest")

RETAINED_OF_PARTITIONS = 30
"""Peer service: one page of the answering broker's retained messages of some partitions, by topic order.
Request: ``u32 count | count x u32 partition | UTF-8 topic the previous page ended with`` (empty: from the
start). Reply: ``u8 more pages | snapshot`` (``retained_sync.encode_snapshot``)."""

_U32 = struct.Struct("<I")
_MORE = struct.Struct("<B")


def is_wildcard(topic_filter: str) -> bool:
    """Whether ``topic_filter`` can match more than one topic (it has a ``+`` or ``#`` level)."""
    return "+" in topic_filter or "#" in topic_filter


class LocalInterest:
    """The partitions this broker's subscriptions can want records of (``wants``), kept from the router's
    ``interest_changed(filter, added)``; listeners hear when that set changes."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self._exact: dict[str, int] = {}
        """Exact filter → subscriptions with it."""
        self._wildcards = 0
        self._by_partition: dict[int, int] = {}
        self._partitions = view.partitions
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def count_existing(self, subscriptions: Iterable[tuple[str, Any, Any, str | None]]) -> None:
        """Count subscriptions made before this was attached (sessions restored at start)."""
        for topic_filter, _session, _options, _group in subscriptions:
            self._count(topic_filter, 1)

    @property
    def everything(self) -> bool:
        """Whether a wildcard filter makes every partition wanted."""
        return self._wildcards > 0

    def wants(self, partition: int) -> bool:
        self._check_partition_count()
        return self._wildcards > 0 or partition in self._by_partition

    def interest_changed(self, topic_filter: str, added: bool) -> None:
        """A subscription with ``topic_filter`` was added or removed (the router tells the port)."""
        if self._count(topic_filter, 1 if added else -1):
            for listener in list(self._listeners):
                listener()

    def _count(self, topic_filter: str, delta: int) -> bool:
        """Count one subscription more or fewer; whether the wanted partitions changed."""
        self._check_partition_count()
        if is_wildcard(topic_filter):
            self._wildcards += delta
            return self._wildcards == (1 if delta > 0 else 0)
        count = self._exact.get(topic_filter, 0)
        if delta < 0 and count == 0:
            return False  # not counted (cannot happen: the router reports what it removed)
        count += delta
        if count > 0:
            self._exact[topic_filter] = count
        else:
            del self._exact[topic_filter]
        if count not in (0, 1) or (count == 0) != (delta < 0):
            return False  # the filter was and stays wanted
        partition = self.view.partition_of(topic_filter)
        filters = self._by_partition.get(partition, 0) + (1 if delta > 0 else -1)
        if filters > 0:
            self._by_partition[partition] = filters
        else:
            self._by_partition.pop(partition, None)
        return self._wildcards == 0 and filters == (1 if delta > 0 else 0)

    def _check_partition_count(self) -> None:
        """The partition count is learnt from etcd at start: place the exact filters again if it moved."""
        if self.view.partitions == self._partitions:
            return
        self._partitions = self.view.partitions
        self._by_partition = {}
        for topic_filter in self._exact:
            partition = self.view.partition_of(topic_filter)
            self._by_partition[partition] = self._by_partition.get(partition, 0) + 1


class RetainedRefresh:
    """Serves this broker's retained messages of given partitions to peers, and brings this broker's up to
    date from a partition's leader when it starts observing the partition (see the module docstring)."""

    def __init__(
        self, router: Router, view: ClusterView, links: PeerLinks, request_timeout_s: float = 2.0
    ) -> None:
        self.router = router
        self.view = view
        self.links = links
        self.request_timeout_s = request_timeout_s
        self.refreshed = 0
        """Partitions whose retained messages were brought up to date from a peer."""
        links.serve_requests(RETAINED_OF_PARTITIONS, self._serve)

    def local(self, partitions: set[int]) -> dict[str, Message]:
        """This broker's retained messages of ``partitions`` now (taken when their observation starts)."""
        view = self.view
        return {
            topic: message
            for topic, message in self.router.retained.items()
            if not topic.startswith(LOCAL_ONLY_PREFIX) and view.partition_of(topic) in partitions
        }

    async def _serve(self, link: PeerLink, body: memoryview) -> bytes:
        (count,) = _U32.unpack_from(body, 0)
        end = _U32.size * (count + 1)
        partitions = {_U32.unpack_from(body, _U32.size * (index + 1))[0] for index in range(count)}
        after = str(body[end:], "utf-8")
        view = self.view
        entries = sorted(
            (
                entry
                for entry in self.router.retained.items()
                if not entry[0].startswith(LOCAL_ONLY_PREFIX) and view.partition_of(entry[0]) in partitions
            ),
            key=lambda entry: entry[0],
        )
        page, more = snapshot_page(entries, after, PAGE_BYTES)
        return _MORE.pack(more) + encode_snapshot(page)

    async def refresh(self, partitions: set[int], before: dict[str, Message]) -> bool:
        """Replace this broker's retained messages of ``partitions`` (``before``: as they were when their
        observation started) by those of their leaders; False if a leader could not be asked."""
        view = self.view
        by_leader: dict[str, set[int]] = {}
        for partition in partitions:
            state = view.states.get(partition)
            if state is not None and state.leader is not None and state.leader != view.node_id:
                by_leader.setdefault(state.leader, set()).add(partition)
        done = True
        for leader, led in sorted(by_leader.items()):
            messages = await self._ask(leader, led)
            if messages is None:
                done = False
                continue
            self._apply(led, messages, before)
            self.refreshed += len(led)
        return done

    async def _ask(self, peer: str, partitions: set[int]) -> list[Message] | None:
        head = _U32.pack(len(partitions)) + b"".join(_U32.pack(number) for number in sorted(partitions))
        loop = asyncio.get_running_loop()
        found: list[Message] = []
        after = ""
        try:
            more = True
            while more:
                if not self.links.up(peer):
                    raise PeerLinkDown(f"no peer link to {peer}")
                reply = await self.links.link(peer).request(
                    RETAINED_OF_PARTITIONS, head + after.encode(), self.request_timeout_s
                )
                more = bool(_MORE.unpack_from(reply, 0)[0])
                messages = decode_snapshot(memoryview(reply)[_MORE.size :], loop.time())
                found += messages
                if messages:
                    after = messages[-1].topic
        except (PeerLinkDown, PeerRequestFailed, TimeoutError, ValueError, struct.error) as exc:
            log.warning("retained messages of partitions %s from %s: %s", sorted(partitions), peer, exc)
            return None
        return found

    def _apply(self, partitions: set[int], messages: list[Message], before: dict[str, Message]) -> None:
        store = self.router.retained
        view = self.view
        fresh = {message.topic: message for message in messages}
        for topic, message in fresh.items():
            unchanged = store.get(topic) is before.get(topic)
            if unchanged and not message.expired() and not store.set(topic, message):
                self.router.count_drop("retained_full")
        for topic, message in before.items():
            if topic not in fresh and view.partition_of(topic) in partitions and store.get(topic) is message:
                store.clear(topic)  # cleared on the leader while this broker did not observe it
