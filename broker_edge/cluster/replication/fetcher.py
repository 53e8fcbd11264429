"""One fetcher per leader this node follows or observes: a fetch session in a loop, its answers applied.

A replica's fetcher opens a session listing its durable positions, appends, truncates or restarts as the
leader's answers say, commits up to the leader's watermark what is durable here, and fetches again (or, once
the peer link is up, takes the leader's pushes and acknowledges them there: ``PushedSession``). An observer's
fetcher only routes the committed records it is sent. See ``follower`` for the whole of a node's fetchers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import aiohttp

from broker_edge.cluster.links.member_clients import FailureStreak
from broker_edge.http.client_errors import failure_text
from broker_edge.observe import path_trace
from broker_edge.observe.refusal_log import LogSummary
from broker_edge.storage.errors import StorageError, StorageShortage

from .epochs import NO_EPOCH, LeaderEpochs
from .replica_fetch import (
    DIVERGING,
    ERROR_NAMES,
    FRAMES,
    GAP,
    OK,
    RESTART,
    UNKNOWN_SESSION,
    FetchRequest,
    FetchResponse,
    PartitionFetch,
    TopicData,
    TopicPosition,
    WireError,
)
from .replica_push import ACK, Ack, Push, encode_ack

if TYPE_CHECKING:
    from broker_edge.cluster.links.peer_link import PeerLink
    from broker_edge.cluster.view import ClusterView
    from broker_edge.storage.store import LogStore

    from .delivery import LocalDelivery

__all__ = ["FetchFailed", "Fetcher", "FetcherOwner", "FollowerConfig", "PushedSession", "TruncationRefused"]

log = logging.getLogger("broker_edge.cluster.replication.follower")

STORAGE_FAILURE_LOG_S = 30.0
"""The least time between two lines of a follower's store errors of one kind (a full disk lasts)."""


class FetchFailed(Exception):
    """The leader answered a fetch with an HTTP error (``status``)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200].decode(errors='replace')}")
        self.status = status


class TruncationRefused(StorageError):
    """A leader told this replica to cut records it knows were committed (acknowledged): a leader elected
    without them (an unclean election, or a partition record nobody's controller wrote). Refused unless
    ``FollowerConfig.unclean_election``: the records stay, and the replica does not follow that leader."""

    def __init__(self, topic: str, leader: str, target: int, committed: int, cause: str = "") -> None:
        """``cause``: why this replica is likely told so, with what to do, when it knows (a sentence)."""
        super().__init__(
            f"{topic!r}: leader {leader} would cut this replica's log to {target}, below its committed end "
            f"{committed}: refused (acknowledged records are never truncated without unclean_election)"
            + (f"; {cause}" if cause else "")
        )
        self.topic = topic


@dataclass(frozen=True, slots=True)
class FollowerConfig:
    wait_ms: int = 500
    """How long a leader may hold a fetch with nothing new (below `replica_lag_max_ms`)."""
    max_bytes: int = 4 << 20
    max_topic_bytes: int = 1 << 20
    retry_s: float = 0.2
    """Pause before reopening a session after an error."""
    timeout_s: float = 10.0
    """Time for a fetch to be answered, beyond `wait_ms`."""
    unclean_election: bool = False
    """Whether the cluster elects out-of-sync replicas (``cluster.unclean_election``): only then does a
    replica follow a leader that lacks records it committed, truncating them."""
    subscribe_wait_s: float = 5.0
    """Longest a SUBACK waits for the observation of a partition its subscription needs to start."""

    def __post_init__(self) -> None:
        for name in ("wait_ms", "max_bytes", "max_topic_bytes", "retry_s", "timeout_s", "subscribe_wait_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or value < 0
                or (value == 0 and name != "wait_ms")
            ):
                raise ValueError(f"{name} must be a positive number, got {value!r}")


class FetcherOwner(Protocol):
    """What a fetcher uses of the node's followers (``follower.Followers``)."""

    view: ClusterView
    store: LogStore
    config: FollowerConfig
    delivery: LocalDelivery
    epochs: LeaderEpochs
    observer_fetches: dict[int, int]
    catching_up: dict[int, dict[str, int] | None]
    listed: set[int]
    observed_positions: dict[str, int]
    retiring: set[Fetcher]

    def link_to(self, leader: str) -> PeerLink | None: ...

    async def post(
        self, leader: str, url: str, request: FetchRequest
    ) -> tuple[FetchResponse, bool, bool]: ...

    def opened(self, fetcher: Fetcher) -> None: ...

    def copy_answered(self, response: FetchResponse) -> None: ...

    def caught_up(self, topics: list[str]) -> None: ...


class Fetcher:
    """Fetches the partitions one leader leads for this node, in a loop (see the module docstring)."""

    def __init__(
        self,
        owner: FetcherOwner,
        leader: str,
        url: str,
        partitions: dict[int, int],
        observer: bool,
        copies: set[int] | None = None,
        predecessor: Fetcher | None = None,
    ) -> None:
        """An observer goes on from where this node's routing of its partitions ended: as a replica or
        leader of those in `copies` (before the copy moved away), as an observer of the others if their
        observation goes on (`predecessor`: the observer of the same leader this one replaces, which
        handles the answer to its last fetch before this one handles any). A partition whose observation
        starts now starts at the leader's committed end (routing it from earlier would deliver the past)."""
        self.owner = owner
        self.leader = leader
        self.url = url
        self.partitions = partitions
        self.observer = observer
        self.predecessor = predecessor
        self.retiring = False
        self.storage_failures = LogSummary(log, STORAGE_FAILURE_LOG_S)
        """Its store's errors, said once per ``STORAGE_FAILURE_LOG_S`` per kind (``storage_failed``)."""
        self.positions: dict[str, int] = {}
        """An observer's next offset per topic (it keeps no log)."""
        if observer:
            view = owner.view
            copies = copies or set()
            for topic, end in owner.observed_positions.items():
                if view.partition_of(topic) in partitions:
                    self.positions[topic] = end
            if predecessor is not None:
                for topic, end in predecessor.positions.items():
                    if view.partition_of(topic) in partitions:
                        self.positions[topic] = end
            for topic, end in owner.delivery.routed.items():
                if view.partition_of(topic) in copies and view.partition_of(topic) in partitions:
                    self.positions[topic] = end
        self._moved: dict[str, None] = {}
        self._waiting_watermarks: dict[str, int] = {}
        """A leader's watermark per topic past what is durable here when it came: committed once the
        records below it are (a later answer, or one whose frames are not durable yet, may not repeat it)."""
        self._task: asyncio.Task[None] | None = None
        self.pushes: PushedSession | None = None
        """Set while the leader pushes this replica's session over the peer link."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.predecessor is not None:
            self.predecessor.cancel()

    def retire(self) -> None:
        """Stop after handling the answer of the fetch under way (an observer replaced by another)."""
        self.retiring = True
        if self._task is not None and self._task.done():
            self.owner.retiring.discard(self)

    async def wait(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        try:
            await self._fetch_forever()
        finally:
            self.owner.retiring.discard(self)

    async def _handed_over(self) -> None:
        """Wait for the observer this one replaces to handle its last answer (the leader ended its
        session when this one's opened), so that the two route every record in order."""
        predecessor, self.predecessor = self.predecessor, None
        task = predecessor._task if predecessor is not None else None
        if predecessor is None or task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=self.owner.config.timeout_s)
        if not done:
            predecessor.cancel()

    def storage_failed(self, error: StorageError) -> None:
        """Say that this node's store refused what was replicated (a full disk, no descriptors, a failed
        write): it is retried every ``retry_s`` while it lasts, so said at most once per
        ``STORAGE_FAILURE_LOG_S`` per kind, the next line counting those left out."""
        kind = error.cause.reason if isinstance(error, StorageShortage) else type(error).__name__
        self.storage_failures.log(logging.ERROR, kind, "replicating from %s failed: %s", self.leader, error)

    async def _fetch_forever(self) -> None:
        owner = self.owner
        role = "observer" if self.observer else "replica"
        session = 0
        failures = FailureStreak(every=50)
        refusals = 0
        opened = False
        last_said, repeats = "", 0
        while not self.retiring:
            if session == 0 and not self.observer:
                try:
                    await owner.store.wait_durable()  # a session opens on durable ends: see `request`
                except StorageError as error:
                    self.storage_failed(error)
                    await asyncio.sleep(owner.config.retry_s)
                    continue
            request = self.request(session)
            if self.observer:
                counts = owner.observer_fetches
                for number in self.partitions:
                    counts[number] = counts.get(number, 0) + 1
            try:
                response, pushes, lists = await owner.post(self.leader, self.url, request)
            except (aiohttp.ClientError, OSError, TimeoutError, FetchFailed, WireError) as error:
                refused = isinstance(error, FetchFailed) and error.status == 403
                if failures.failed(asyncio.get_running_loop().time(), refused):
                    log.warning("fetch from %s as %s failed: %s", self.leader, role, failure_text(error))
                else:
                    log.debug("fetch from %s as %s failed: %s", self.leader, role, failure_text(error))
                session = 0
                await self._handed_over()
                await asyncio.sleep(owner.config.retry_s)
                continue
            await self._handed_over()
            if self.retiring:
                if response.error == OK:
                    self._observe(response, lists)  # its last answer, routed before its successor's
                return
            failures.succeeded()
            if response.error == UNKNOWN_SESSION:
                session = 0
                continue
            broken = [data for data in response.partitions if data.error != OK]
            if broken:
                said = ", ".join(
                    f"partition {d.partition} {ERROR_NAMES.get(d.error, d.error)}" for d in broken
                )
                repeats = repeats + 1 if said == last_said else 0
                if not repeats:  # said once, then summarised: a fenced leader answers so every retry
                    log.info("fetch from %s: %s", self.leader, said)
                elif repeats % 100 == 0:
                    log.info("fetch from %s: %s (still, %d times since)", self.leader, said, repeats)
                last_said = said
            else:
                last_said, repeats = "", 0
            session = response.session
            try:
                if self.observer:
                    self._observe(response, lists)
                    if not opened:  # this node's routing of the partitions starts where the leader put it
                        opened = True
                        owner.opened(self)
                else:
                    if owner.catching_up:
                        owner.copy_answered(response)
                    await self._replicate(response)
            except TruncationRefused as error:
                refusals += 1
                if refusals == 1 or refusals % 60 == 0:
                    log.error("replicating from %s: %s", self.leader, error)
                session = 0
                await asyncio.sleep(max(owner.config.retry_s, 1.0))
                continue
            except StorageError as error:
                self.storage_failed(error)
                session = 0
                await asyncio.sleep(owner.config.retry_s)
                continue
            if broken:
                session = 0
                await asyncio.sleep(owner.config.retry_s)
                continue
            link = owner.link_to(self.leader) if pushes and not self.observer else None
            if link is not None:
                why, handled = await self._follow_pushes(session, link)
                log.info("pushes from %s ended (%s): reopening the session over HTTP", self.leader, why)
                session = 0
                if not handled:  # not one push: no reopening in a tight loop
                    await asyncio.sleep(owner.config.retry_s)

    async def _follow_pushes(self, session: int, link: PeerLink) -> tuple[str, bool]:
        """Take the leader's pushes of `session` until something ends them; returns why, and whether any
        push was handled. Everything appended is durable when it returns (the next session lists durable
        positions)."""
        owner = self.owner
        pushes = self.pushes = PushedSession(self, session, link)
        wait_s = owner.config.wait_ms / 1000
        interval = max(wait_s / 2, 0.05)  # keepalives: the leader's in-sync check wants to hear from it
        try:
            pushes.acknowledge()  # the first acknowledgement moves the session onto the link
            while not pushes.ended.done():
                await asyncio.wait({pushes.ended}, timeout=interval)
                if pushes.ended.done():
                    break
                if owner.link_to(self.leader) is not link:
                    pushes.end("the peer link dropped")
                elif asyncio.get_running_loop().time() - pushes.last_heard > 3 * wait_s + 1:
                    pushes.end("the leader went quiet")
                else:
                    pushes.acknowledge()  # a keepalive: the leader sees this replica alive
            return pushes.ended.result(), pushes.sequence > 0
        finally:
            self.pushes = None
            with contextlib.suppress(StorageError):
                await owner.store.wait_durable()

    def request(self, session: int) -> FetchRequest:
        """The next request of `session` (0: open one): every position when opening, else those moved.

        A replica opens a session only once everything appended here is durable (`_run` waits): the
        positions it lists are then the ends of its logs, and the leader's epoch checks cover every record
        it holds. Otherwise a tail still being synced (appended by the fetcher this one replaced when the
        view changed, from this or another leader) lay beyond the listed end: the leader's answer, sent
        from that end, would be refused as not continuing the log, and whether that tail matches the
        leader's records would never have been checked."""
        owner = self.owner
        config = owner.config
        request = FetchRequest(
            owner.view.node_id,
            session,
            self.observer,
            0 if self.observer and session == 0 else config.wait_ms,  # an observer's SUBACKs wait for it
            config.max_bytes,
            config.max_topic_bytes,
            [PartitionFetch(number, epoch) for number, epoch in self.partitions.items()],
        )
        by_number = {fetch.partition: fetch for fetch in request.partitions}
        topics: list[str]
        if session == 0:
            topics = list(self.positions) if self.observer else owner.store.topics()
        else:
            topics = list(self._moved)
        view = owner.view
        for topic in topics:
            fetch = by_number.get(view.partition_of(topic))
            if fetch is not None:
                fetch.topics.append(self._position(topic))
        self._moved = {}
        return request

    def _position(self, topic: str) -> TopicPosition:
        if self.observer:
            return TopicPosition(topic, self.positions.get(topic, 0), NO_EPOCH)
        store = self.owner.store
        end = store.durable_end(topic)
        return TopicPosition(topic, end, self.owner.epochs.latest_epoch(topic) if end else NO_EPOCH)

    async def _replicate(self, response: FetchResponse) -> None:
        """Handle a fetch answer: apply it, then commit again once what it brought is durable."""
        watermarks, touched, appended = self.apply(response)
        self._moved.update(touched)
        if appended:
            await self.owner.store.wait_durable()
            self.commit(watermarks)

    def apply(self, response: FetchResponse) -> tuple[list[tuple[str, int]], dict[str, None], bool]:
        """Truncate, restart or append what an answer (or a push) brings, commit and route up to its
        watermarks what is already durable here. Returns the watermarks, the topics whose position moves
        (once durable), and whether anything was appended."""
        owner = self.owner
        store = owner.store
        epochs = owner.epochs
        watermarks: list[tuple[str, int]] = []
        touched: dict[str, None] = {}
        appended = False
        for data in _topics(response):
            topic = data.topic
            if data.kind == DIVERGING:
                self._truncate(data)
            elif data.kind == RESTART:
                if topic in store and data.start_offset < store.durable_end(topic):
                    # a leader restarts a replica only past everything it holds (its retention removed it)
                    raise TruncationRefused(topic, self.leader, data.start_offset, store.committed_end(topic))
                log.warning(
                    "%r: the leader's log starts at %d: restarting it there", topic, data.start_offset
                )
                epochs.restart_at(topic, data.start_offset)
                for epoch, start in data.boundaries:
                    epochs.for_topic(topic).assign(epoch, max(start, data.start_offset))
            elif data.frames:
                frames = data.frames[0] if len(data.frames) == 1 else b"".join(data.frames)
                at = None
                if data.kind == GAP:  # the leader's log holds no records below `first`: nor will this one
                    at = data.first
                    log.warning(
                        "%r: the leader's log holds no records from this copy's end up to %d (a gap): this "
                        "copy goes on at %d, the gap missing here too",
                        topic,
                        at,
                        at,
                    )
                owner.delivery.appended(topic, store.replicated_log.append_at(topic, frames, at), frames)
                if path_trace.ON:
                    path_trace.mark("appended", topic, data.first, data.first + data.count)
                cache = epochs.for_topic(topic)
                for epoch, start in data.boundaries:
                    cache.assign(epoch, start)
                appended = True
            else:
                watermarks.append((topic, data.high_watermark))
                continue
            watermarks.append((topic, data.high_watermark))
            touched[topic] = None
        self.commit(watermarks)  # capped at what is durable here: at once what already is
        return watermarks, touched, appended

    def commit(self, watermarks: list[tuple[str, int]]) -> None:
        """Commit up to the leader's watermarks what is durable here; a watermark past that waits."""
        owner = self.owner
        delivery = owner.delivery
        waiting = self._waiting_watermarks
        for topic, high_watermark in watermarks:
            if waiting:
                high_watermark = max(high_watermark, waiting.pop(topic, 0))
            if delivery.commit_and_route(topic, high_watermark) < high_watermark:
                waiting[topic] = high_watermark
        if owner.catching_up:
            owner.caught_up([topic for topic, _ in watermarks])

    def moved(self, topics: dict[str, None]) -> None:
        """`topics`' positions moved (what was appended is durable): the next request lists them."""
        self._moved.update(topics)

    def _truncate(self, data: TopicData) -> None:
        """Cut the local tail the leader does not have (the epoch rule)."""
        owner = self.owner
        topic = data.topic
        target = data.diverging_end
        store = owner.store
        if topic in store and data.diverging_epoch != NO_EPOCH:
            cache = owner.epochs.for_topic(topic)
            _epoch, local_end = cache.end_offset_for(data.diverging_epoch, store.durable_end(topic))
            target = min(target, local_end)
        committed = store.committed_end(topic) if topic in store else 0
        if target < committed and not owner.config.unclean_election:
            raise TruncationRefused(topic, self.leader, target, committed, self._epochs_lost(topic))
        log.warning(
            "%r diverged from the leader %s: truncating from %d to %d",
            topic,
            self.leader,
            store.durable_end(topic),
            target,
        )
        owner.epochs.truncate(topic, target)

    def _epochs_lost(self, topic: str) -> str:
        """What to do when this replica holds committed records of ``topic`` without any leader epoch:
        its partition's journal was lost or damaged, and the leader cannot tell that those records are its
        own ("": it holds some, the leader's log differs)."""
        store = self.owner.store
        if self.owner.epochs.latest_epoch(topic) != NO_EPOCH:
            return ""
        journal = store.replicated_log.epochs_path(store.partition_of(topic))
        return (
            f"this replica holds no leader epoch of it ({journal} lost or damaged): stop this broker and "
            "move its data directory aside, and it copies every partition again from the leaders"
        )

    def _observe(self, response: FetchResponse, lists: bool) -> None:
        """Route the committed records an observer was sent; nothing is persisted. `lists`: the leader
        lists every topic in the first answer of a session (`LISTS_TOPICS_HEADER`).

        A topic this node does not know yet, of a partition a leader has listed to this observation (the
        observation goes on: across a failover, or from a fetcher replaced), is new since that listing:
        it is routed from where this node's routing of it got to (a predecessor's answer), else from its
        log's start, never from where a new session of the leader put it (its committed end then: the
        records committed between the two would never be routed here). The next request tells the leader."""
        owner = self.owner
        listed = owner.listed
        view = owner.view
        for data in _topics(response):
            topic = data.topic
            if topic not in self.positions and data.kind != DIVERGING and view.partition_of(topic) in listed:
                start = owner.delivery.routed.get(topic, data.start_offset)
                if data.kind not in (FRAMES, GAP) or not data.frames or data.first != start:
                    self.positions[topic] = start
                    self._moved[topic] = None
                    continue
            if data.kind == DIVERGING:
                self.positions[topic] = data.diverging_end
            elif data.kind == RESTART:
                self.positions[topic] = data.start_offset
            elif data.frames:
                frames = data.frames[0] if len(data.frames) == 1 else b"".join(data.frames)
                count = owner.delivery.route_frames(topic, data.first, frames, self.leader)
                self.positions[topic] = data.first + count
            else:
                self.positions.setdefault(topic, data.first)  # where the leader starts this node's routing
                continue
            self._moved[topic] = None
        if lists:
            listed.update(data.partition for data in response.partitions if data.error == OK)


class PushedSession:
    """A replica's session while its leader pushes it (see `replica_push`): checks the pushes' numbers,
    applies them, acknowledges what became durable."""

    def __init__(self, fetcher: Fetcher, session: int, link: PeerLink) -> None:
        self.fetcher = fetcher
        self.session = session
        self.link = link
        self.sequence = 0
        """The last push handled."""
        self.acks = 0
        self.durable_bytes = 0
        loop = asyncio.get_running_loop()
        self.last_heard = loop.time()
        self.ended: asyncio.Future[str] = loop.create_future()
        self._ack_scheduled = False

    def end(self, why: str) -> None:
        if not self.ended.done():
            self.ended.set_result(why)

    def received(self, link: PeerLink, push: Push) -> None:
        if self.ended.done():
            return
        response = push.response
        if link is not self.link:
            return self.end("the peer link was replaced")
        if response.session != self.session:
            return None  # of an earlier session of this replica's: overtaken by the fetch opening this one
        if response.error != OK:
            return self.end(f"the leader answered {ERROR_NAMES.get(response.error, response.error)}")
        self.last_heard = asyncio.get_running_loop().time()
        if not response.partitions and push.sequence == self.sequence:
            return None  # a keepalive naming the last push handled: nothing was lost
        if push.sequence != self.sequence + 1 or not response.partitions:
            return self.end(f"push {self.sequence + 1} was lost")
        self.sequence = push.sequence
        for data in response.partitions:
            if data.error != OK:
                return self.end(f"partition {data.partition} {ERROR_NAMES.get(data.error, data.error)}")
        if any(data.kind not in (FRAMES, GAP) for data in _topics(response)):
            return self.end("the leader's log and this one differ")
        try:
            watermarks, touched, appended = self.fetcher.apply(response)
        except StorageError as error:
            self.fetcher.storage_failed(error)
            return self.end("appending failed")
        if appended:
            size = sum(len(frames) for data in _topics(response) for frames in data.frames)
            store = self.fetcher.owner.store
            store.when_durable(
                lambda: self._durable(watermarks, touched, size), lambda error: self.end(f"{error}")
            )
            store.end_window()  # a push is a whole batch: sync it now, acknowledge as soon as it is durable
        return None

    def _durable(self, watermarks: list[tuple[str, int]], touched: dict[str, None], size: int) -> None:
        """A push's frames are durable here: commit up to its watermarks, acknowledge (once per message on
        the link, for every push that became durable before it leaves)."""
        self.fetcher.commit(watermarks)
        if self.ended.done():
            return
        self.fetcher.moved(touched)
        self.durable_bytes += size
        if not self._ack_scheduled:
            self._ack_scheduled = True
            self.link.soon(self.acknowledge)  # built as the link's next message leaves

    def acknowledge(self) -> None:
        """Tell the leader what is durable here (the topics whose position moved; none for a keepalive)."""
        self._ack_scheduled = False
        if self.ended.done():
            return
        self.acks += 1
        ack = Ack(self.acks, self.durable_bytes, self.fetcher.request(self.session))
        self.link.send(ACK, encode_ack(ack))


def _topics(response: FetchResponse) -> list[TopicData]:
    return [topic for data in response.partitions if data.error == OK for topic in data.topics]
