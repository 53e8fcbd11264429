"""The follower's side of the replicated log: fetchers pulling the partitions other members lead.

`Followers` keeps one fetcher per (leader member, role) for the partitions that member leads: as a
replica (the node is in the partition's `replicas`) it persists what it fetches, as an observer (it is
not) it only routes committed records to its local subscribers. The set of fetchers follows the
`ClusterView`: a fetcher whose partitions, epochs or leader address changed is replaced.

A replica's fetcher:

1. once everything appended here is durable, opens a fetch session listing every local topic of its
   partitions with `(offset, last_fetched_epoch)`; the leader answers, per topic, frames to append, where
   to truncate (the epoch rule: the local tail diverged from the leader's log) or where to restart (the
   leader's log starts later), and the topic's high watermark;
2. truncates or appends (`LogStore.append_frames`, through the group commit), copies the epoch
   boundaries into its epoch caches, and commits up to the leader's high watermark (readers see records
   once every in-sync replica holds them; never past what is durable here) and routes the newly committed
   records to local subscribers, one `Message` per record shared by all of them, as the leader's PUBLISH
   path does; then waits until the appended frames are durable and commits again (a watermark past what
   is durable here is kept until then, even when it came in a later answer without frames);
3. sends its next fetch, listing only the topics whose position moved: that fetch tells the leader the
   appended records are durable here.

Once a replica's session is open and the peer link to the leader is up, steps 2 and 3 move onto the link
(`replica_push`): the leader pushes what a fetch would have been answered with, the replica handles it as
in step 2 as soon as it arrives, and acknowledges on the link what became durable, as step 3's fetch
would. Anything out of the ordinary there (a lost message, an error, a divergence, the link down) makes it
open a new session over HTTP. Observers always fetch over HTTP.

Errors (the leader unreachable, an unknown session, a partition error) reopen the session after a short
pause; a stale view is fixed by the coordination side, which restarts the fetchers on the next change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp

from broker_edge.cluster.links.member_clients import FailureStreak, MemberClients
from broker_edge.engine.records import message_of_record
from broker_edge.http.client_errors import failure_text
from broker_edge.log_info import LogInfo
from broker_edge.observe import path_trace
from broker_edge.protocol.topics import topic_matches
from broker_edge.storage.errors import CorruptRecord, StorageError
from broker_edge.storage.record import decode_frames

from .epochs import NO_EPOCH, LeaderEpochs
from .replica_fetch import (
    CONTENT_TYPE,
    DIVERGING,
    ERROR_NAMES,
    FRAMES,
    GAP,
    LISTS_TOPICS_HEADER,
    OK,
    PATH,
    PUSH_HEADER,
    RESTART,
    UNKNOWN_SESSION,
    FetchRequest,
    FetchResponse,
    PartitionFetch,
    TopicData,
    TopicPosition,
    WireError,
    decode_response,
    encode_request,
)
from .replica_push import ACK, Ack, Push, decode_push, encode_ack

if TYPE_CHECKING:
    from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
    from broker_edge.cluster.reads.interest import LocalInterest, RetainedRefresh
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.cursors import ReplayManager
    from broker_edge.engine.message import Message
    from broker_edge.storage.record import Record
    from broker_edge.storage.store import LogStore

__all__ = ["FetchFailed", "FollowerConfig", "Followers", "LocalDelivery"]

log = logging.getLogger(__name__)

_MAX_FRAME_BODY = 1 << 28
_ROUTE_READ_BYTES = 4 << 20


class FetchFailed(Exception):
    """The leader answered a fetch with an HTTP error (``status``)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200].decode(errors='replace')}")
        self.status = status


class TruncationRefused(StorageError):
    """A leader told this replica to cut records it knows were committed (acknowledged): a leader elected
    without them (an unclean election, or a partition record nobody's controller wrote). Refused unless
    ``FollowerConfig.unclean_election``: the records stay, and the replica does not follow that leader."""

    def __init__(self, topic: str, leader: str, target: int, committed: int) -> None:
        super().__init__(
            f"{topic!r}: leader {leader} would cut this replica's log to {target}, below its committed end "
            f"{committed}: refused (acknowledged records are never truncated without unclean_election)"
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


Publish = Callable[["Message"], object]
"""Routes a message to local subscribers (`Router.publish`)."""

_FetcherKey = tuple[str, bool]
"""(leader node id, observer)."""


class Followers:
    """All fetchers of one node; `start()` after the store is open, `await stop()` before it closes."""

    def __init__(
        self,
        view: ClusterView,
        store: LogStore,
        delivery: LocalDelivery,
        clients: MemberClients | None,
        config: FollowerConfig | None = None,
        epochs: LeaderEpochs | None = None,
        links: PeerLinks | None = None,
        interest: LocalInterest | None = None,
        retained: RetainedRefresh | None = None,
    ) -> None:
        """`clients` are this node's sessions to the other members (fetches go to a leader's members'
        endpoint, to that member only; None: plain ones, development on loopback); with `links`, replicas
        take pushes over the peer links once their sessions are open (hand the links' `PUSH` parts to
        `pushed`). With `interest`, partitions held here in no copy are observed
        only while local subscriptions want them (else all of them), and `subscribe_gate` holds a SUBACK
        until the partitions it made wanted are observed; `retained` then brings their retained messages
        up to date."""
        self.view = view
        self.links = links
        self._own_clients = clients is None
        self.clients = clients if clients is not None else MemberClients(view.node_id, None)
        self.store = store
        self.delivery = delivery
        self.config = config or FollowerConfig()
        self.epochs = epochs if epochs is not None else LeaderEpochs(store)
        store.enable_replication()
        if path_trace.ON:
            path_trace.set_node(view.node_id)
        self._headers = {"Content-Type": CONTENT_TYPE}
        self._fetchers: dict[_FetcherKey, _Fetcher] = {}
        self._retiring: set[_Fetcher] = set()
        """Observer fetchers replaced by one of the same leader, finishing their last fetch."""
        self._started = False
        self.fetches_sent = 0
        """HTTP fetches sent (a steady state over the peer link sends none)."""
        self.interest = interest
        self.retained = retained
        self.observer_fetches: dict[int, int] = {}
        """partition → fetches sent for it as an observer."""
        self._routing: set[int] = set()
        """Partitions routed here (led, replicated, or observed once they have a leader) as of the last
        look at the view."""
        self._copies: set[int] = set()
        """Partitions led or replicated here as of the last look at the view."""
        self._positions: dict[str, int] = {}
        """Observers' positions in the partitions observed now, kept when their fetcher is replaced."""
        self._catching_up: dict[int, dict[str, int] | None] = {}
        """Copies given to this node while it runs (a restart's copies are not): partition → None until its
        leader's first answer, then topic → where this node's routing of it starts: where its observation
        had got to; for a topic the observation did not know, its log's start if a leader had listed the
        partition's topics to the observation (the topic is new since), else the leader's committed end at
        that first answer (the observation knew nothing: what was committed before the copy came is the
        past). The records below are not routed to subscribers, and reads of them go to the leader, as an
        observer's do, until the copy here holds them (`copy_complete`)."""
        self._unlisted_copies: set[int] = set()
        """The partitions of `_catching_up` whose observation no leader had listed when they became copies."""
        self._looked = False
        """Whether this node has seen the partitions' states since it started."""
        self._listed: set[int] = set()
        """Observed partitions whose every topic a leader has given this node a position in (the first answer
        of an observer's session lists them): a topic of theirs not known here since is new, read from its
        start. Kept across leaders while the observation goes on (a failover, a replaced fetcher)."""
        self._starting: dict[int, dict[str, Message]] = {}
        """Partitions whose observation is starting (their session not open yet) → this broker's retained
        messages of them when it started."""
        self._gated: list[tuple[set[int], Callable[[], object]]] = []
        """SUBACKs waiting, in order, each for the partitions that were starting when it was ready."""
        self._tasks: set[asyncio.Task[None]] = set()
        if interest is not None:
            interest.on_change(self._view_changed)

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self.view.on_change(self._view_changed)
        self._view_changed()

    async def stop(self) -> None:
        self._started = False
        fetchers, self._fetchers = [*self._fetchers.values(), *self._retiring], {}
        self._retiring = set()
        for fetcher in fetchers:
            fetcher.cancel()
        for fetcher in fetchers:
            await fetcher.wait()
        if self._own_clients:
            await self.clients.close()
        for task in list(self._tasks):
            task.cancel()
        self._starting = {}
        self._release_gated(everything=True)

    @property
    def fetchers(self) -> dict[_FetcherKey, dict[int, int]]:
        """(leader, observer) -> the partitions (-> epoch) each running fetcher covers."""
        return {key: dict(fetcher.partitions) for key, fetcher in self._fetchers.items()}

    @property
    def observed(self) -> list[int]:
        """The partitions observed here now."""
        return sorted(
            number for (_, observer), f in self._fetchers.items() if observer for number in f.partitions
        )

    def copy_complete(self, number: int) -> bool:
        """Whether this node's copy of partition `number` holds every record it routes (a copy given to it
        while it ran holds the past only once it has caught up: until then its topics are read from the
        leader)."""
        return number not in self._catching_up

    def _track_new_copies(self, copies: set[int], previous_copies: set[int]) -> None:
        """Copies this node was given since its last look at the view catch up (see `_catching_up`)."""
        catching_up = self._catching_up
        if self._looked:
            for number in copies - previous_copies:
                if number not in catching_up:
                    catching_up[number] = None
                    if number not in self._listed:
                        self._unlisted_copies.add(number)
        me = self.view.node_id
        for number in [number for number in catching_up if number not in copies]:
            del catching_up[number]
        for number in [n for n in catching_up if self.view.states[n].leader == me]:
            del catching_up[number]  # led here (an unclean election): its own log is what it serves
        self._unlisted_copies.intersection_update(catching_up)
        self._looked = self._looked or bool(self.view.states)

    def _copy_answered(self, response: FetchResponse) -> None:
        """A replica's answer: where a new copy's routing of each topic starts (see `_catching_up`)."""
        catching_up = self._catching_up
        routed = self.delivery.routed
        for data in response.partitions:
            number = data.partition
            if data.error != OK or number not in catching_up or catching_up[number] is not None:
                continue
            unlisted = number in self._unlisted_copies
            self._unlisted_copies.discard(number)
            starts = {
                t.topic: routed.setdefault(t.topic, t.high_watermark if unlisted else 0) for t in data.topics
            }
            catching_up[number] = starts
            self._caught_up(list(starts))

    def _caught_up(self, topics: list[str]) -> None:
        """Drop the topics (and copies) that hold every record below where their routing starts now."""
        catching_up = self._catching_up
        store = self.store
        partition_of = self.view.partition_of
        for topic in topics:
            number = partition_of(topic)
            starts = catching_up.get(number)
            if not starts or topic not in starts:
                continue
            if starts[topic] == 0 or (topic in store and store.committed_end(topic) >= starts[topic]):
                del starts[topic]
                if not starts:
                    del catching_up[number]
                    log.info("partition %d: the new copy here holds what it routes", number)

    def _view_changed(self) -> None:
        if not self._started:
            return
        view = self.view
        me = view.node_id
        interest = self.interest
        wanted: dict[_FetcherKey, tuple[str, dict[int, int]]] = {}
        routing: set[int] = set()
        copies: set[int] = set()
        for number, state in view.states.items():
            observer = me not in state.replicas and state.leader != me
            if observer and interest is not None and not interest.wants(number):
                continue
            routing.add(number)  # routed here (once it has a leader)
            if not observer:
                copies.add(number)
            if state.leader is None or state.leader == me:
                continue
            member = view.members.get(state.leader)
            if member is None or member.peer is None:
                continue
            key = (state.leader, observer)
            wanted.setdefault(key, (member.peer, {}))[1][number] = state.epoch
        replaced: dict[_FetcherKey, _Fetcher] = {}
        for key, fetcher in list(self._fetchers.items()):
            if wanted.get(key) != (fetcher.url, fetcher.partitions):
                del self._fetchers[key]
                if fetcher.observer:
                    self._positions.update(fetcher.positions)
                if key[1] and key in wanted and wanted[key][0] == fetcher.url:
                    fetcher.retire()  # hands over to the next observer of this leader (no gap)
                    self._retiring.add(fetcher)
                    replaced[key] = fetcher
                else:
                    fetcher.cancel()
        previous, self._routing = self._routing, routing
        previous_copies, self._copies = self._copies, copies
        self._track_new_copies(copies, previous_copies)
        routed = self.delivery.routed
        for topic, end in self._positions.items():
            number = view.partition_of(topic)
            if number in copies and number not in previous_copies and routed.get(topic, 0) < end:
                # observed until now, a copy from now on: the replica copies the log from its start, and
                # routes none of what this observation had routed or started after
                routed[topic] = end
        for topic in [topic for topic in self._positions if view.partition_of(topic) not in routing]:
            del self._positions[topic]  # its observation ended: a new one starts from the committed end
        self._listed = {number for number in self._listed if number in routing and number not in copies}
        fresh = {
            number
            for (_, observer), (_, partitions) in wanted.items()
            if observer
            for number in partitions
            if number not in previous
        }
        if fresh:  # observation starts: SUBACKs wait for it, retained messages are brought up to date
            retained = self.retained.local(fresh) if self.retained is not None else {}
            for number in fresh:
                self._starting[number] = {}
            for topic, message in retained.items():
                self._starting[view.partition_of(topic)][topic] = message
        observed = {number for (_, observer), (_, p) in wanted.items() if observer for number in p}
        for number in [number for number in self._starting if number not in observed]:
            del self._starting[number]  # no longer observed (replicated, or no longer wanted)
        for key, (url, partitions) in wanted.items():
            if key not in self._fetchers:
                fetcher = _Fetcher(self, key[0], url, partitions, key[1], previous_copies, replaced.get(key))
                self._fetchers[key] = fetcher
                fetcher.start()
        self._release_gated()

    # -- SUBACKs waiting for observation (the `subscribe_gate` port) -----------------------------------------

    def subscribe_gate(self, send: Callable[[], object]) -> bool:
        """Whether a SUBACK must wait for partitions whose observation is starting; runs `send` once they
        are observed (their leader has fixed where this broker's routing of them starts: at their committed
        end then, before the SUBACK), or after `subscribe_wait_s`."""
        if not self._starting:
            return False
        entry = (set(self._starting), send)
        self._gated.append(entry)
        loop = asyncio.get_running_loop()
        loop.call_later(self.config.subscribe_wait_s, self._gate_expired, entry)
        return True

    def _gate_expired(self, entry: tuple[set[int], Callable[[], object]]) -> None:
        if entry[0] and any(waiting[1] is entry[1] for waiting in self._gated):
            log.warning(
                "observation of partitions %s not started within %.1f s: acknowledging a SUBSCRIBE anyway",
                sorted(entry[0]),
                self.config.subscribe_wait_s,
            )
            entry[0].clear()
            self._release_gated()

    def _release_gated(self, everything: bool = False) -> None:
        """Send the SUBACKs whose partitions are observed now. One client's SUBACKs keep their order: a
        later one waits for every partition an earlier one still waits for (and longer)."""
        starting = self._starting
        ready: list[Callable[[], object]] = []
        waiting: list[tuple[set[int], Callable[[], object]]] = []
        for partitions, send in self._gated:
            partitions.intersection_update(starting)
            if partitions and not everything:
                waiting.append((partitions, send))
            else:
                ready.append(send)
        if not ready:
            return
        self._gated = waiting
        for send in ready:
            send()

    def opened(self, fetcher: _Fetcher) -> None:
        """An observer's session is open: its partitions that were starting are routed here from now on;
        their retained messages are brought up to date before the SUBACKs waiting for them go."""
        started = {
            number: self._starting[number] for number in fetcher.partitions if number in self._starting
        }
        if not started:
            return
        if self.retained is None:
            for number in started:
                self._starting.pop(number, None)
            self._release_gated()
            return
        retained = self.retained
        before = {topic: message for messages in started.values() for topic, message in messages.items()}

        async def refresh() -> None:
            try:
                await retained.refresh(set(started), before)
            finally:
                for number, messages in started.items():
                    if self._starting.get(number) is messages:
                        del self._starting[number]
                self._release_gated()

        task = asyncio.get_running_loop().create_task(refresh())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- what fetchers share ------------------------------------------------------------------------------

    def link_to(self, leader: str) -> PeerLink | None:
        """The peer link to `leader` if it is up (pushes then replace fetches)."""
        link = self.links.links.get(leader) if self.links is not None else None
        return link if link is not None and link.up else None

    def pushed(self, link: PeerLink, body: memoryview) -> None:
        """A `PUSH` part from a leader: to the replica fetcher of that leader taking pushes."""
        fetcher = self._fetchers.get((link.peer, False))
        if fetcher is None or fetcher.pushes is None:
            return  # a push to a session that ended: nothing waits for it
        try:
            push = decode_push(body)
        except WireError as error:
            fetcher.pushes.end(f"a malformed push: {error}")
            return
        fetcher.pushes.received(link, push)

    def routing_position(self, topic: str) -> int | None:
        """Where this node's routing of `topic`, observed here, stands: every record below it has been
        routed here (or preceded the observation), every one from it on will be. None while it is not
        known (the observation has not started, or the topic is unknown to it)."""
        number = self.view.partition_of(topic)
        if number in self._catching_up:  # a new copy: its routing starts where its first answer put it
            return self.delivery.routed.get(topic) if self._catching_up[number] is not None else None
        for (_, observer), fetcher in self._fetchers.items():
            if observer and number in fetcher.partitions:
                return fetcher.positions.get(topic)
        return self._positions.get(topic) if number in self._routing else None

    def observed_logs(self, topic_filter: str) -> list[LogInfo]:
        """The topics observed here that `topic_filter` matches, each ending where this node's routing of
        it stands (what a session caught up on it has had): a session saved on this node is restored
        elsewhere from there, not from the topic's start."""
        copies = self._copies
        if "+" not in topic_filter and "#" not in topic_filter:
            if self.view.partition_of(topic_filter) in copies:
                return []
            end = self.routing_position(topic_filter)
            return [] if end is None else [LogInfo(topic_filter, 0, end, 0, None)]
        positions = dict(self._positions)
        for (_, observer), fetcher in self._fetchers.items():
            if observer:
                positions.update(fetcher.positions)
        partition_of = self.view.partition_of
        return [
            LogInfo(topic, 0, end, 0, None)
            for topic, end in positions.items()
            if partition_of(topic) not in copies and topic_matches(topic_filter, topic)
        ]

    async def post(self, leader: str, url: str, request: FetchRequest) -> tuple[FetchResponse, bool, bool]:
        """The answer of ``leader`` (at ``url``, its members' endpoint), whether it pushes sessions over the
        peer link, and whether it lists every topic to a new observer session (`LISTS_TOPICS_HEADER`)."""
        if not self._started:
            raise asyncio.CancelledError
        self.fetches_sent += 1
        timeout = aiohttp.ClientTimeout(total=request.wait_ms / 1000 + self.config.timeout_s)
        async with self.clients.session(leader).post(
            url.rstrip("/") + PATH, data=encode_request(request), headers=self._headers, timeout=timeout
        ) as answer:
            body = await answer.read()
            if answer.status != 200:
                raise FetchFailed(answer.status, body)
            pushes = answer.headers.get(PUSH_HEADER) == "1"
            lists = answer.headers.get(LISTS_TOPICS_HEADER) == "1"
        return decode_response(body), pushes, lists


class LocalDelivery:
    """Routes committed records of the log to this node's subscribers: one `Message` per record, shared
    by all of them, and handed to the log readers' shared cache (as the PUBLISH path does).

    It remembers, per topic, the end of what it routed, and never routes a record below it again: a node
    that observed a partition and then becomes its replica copies the log from its start, and one whose
    replica is moved away observes from where its copy had been routed (see `_Fetcher`).

    Records appended (by their leader's clock) before ``live_from_ms`` are history, not news: a broker that
    starts, restarts or joins catches up on what was published while it was away without sending it to the
    subscribers that connect meanwhile (they subscribed after those publishes). Log readers (replays,
    persistent sessions' cursors) still get every record."""

    def __init__(
        self,
        store: LogStore,
        publish: Publish,
        replays: ReplayManager | None,
        live_from_ms: int | None = None,
    ) -> None:
        self.store = store
        self.publish = publish
        self.replays = replays
        self.live_from_ms = live_from_ms
        """Records appended before this wall-clock time (ms) are not routed live (None: route all)."""
        self.routed: dict[str, int] = {}
        """topic → offset after the last record routed here (by this process)."""

    def route(self, topic: str, first: int, records: list[Record]) -> None:
        """Deliver committed records of `topic` (from offset `first`) to local subscribers, but for those
        already routed."""
        done = self.routed.get(topic, 0)
        if records and records[0].offset < done:
            records = [record for record in records if record.offset >= done]
            if not records:
                return
            first = records[0].offset
        if records:
            self.routed[topic] = records[-1].offset + 1
            if path_trace.ON:
                path_trace.mark("routed", topic, records[0].offset, records[-1].offset + 1)
        messages = [message_of_record(topic, record) for record in records]
        publish = self.publish
        live_from = self.live_from_ms
        if live_from is None or not records or records[0].timestamp_ms >= live_from:
            for message in messages:
                publish(message)
        else:
            for record, message in zip(records, messages, strict=True):
                if record.timestamp_ms >= live_from:
                    publish(message)
        if self.replays is not None and messages:
            self.replays.appended(topic, first, messages)

    def commit_and_route(self, topic: str, high_watermark: int) -> int:
        """Commit `topic` up to the leader's watermark (capped at what is durable here), route what that
        made visible. Returns the committed end (the watermark itself for a topic without a log here)."""
        store = self.store
        if topic not in store:
            return high_watermark
        offset = store.committed_end(topic)
        committed = store.commit(topic, high_watermark)
        self.route_committed(topic, offset, committed)
        return committed

    def route_committed(self, topic: str, offset: int, end: int) -> None:
        """Route the committed records of `topic` from `offset` to `end` to local subscribers."""
        store = self.store
        while offset < end:
            try:
                records = store.read(topic, offset, end - offset, _ROUTE_READ_BYTES)
            except CorruptRecord as missing:  # no record there (a mirror's gap): nothing to route
                offset = max(offset + 1, missing.next_offset)
                continue
            if not records:
                break
            self.route(topic, offset, records)
            offset = records[-1].offset + 1


class _Fetcher:
    """Fetches the partitions one leader leads for this node, in a loop (see the module docstring)."""

    def __init__(
        self,
        owner: Followers,
        leader: str,
        url: str,
        partitions: dict[int, int],
        observer: bool,
        copies: set[int] | None = None,
        predecessor: _Fetcher | None = None,
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
        self.positions: dict[str, int] = {}
        """An observer's next offset per topic (it keeps no log)."""
        if observer:
            view = owner.view
            copies = copies or set()
            for topic, end in owner._positions.items():
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
        self.pushes: _PushedSession | None = None
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
            self.owner._retiring.discard(self)

    async def wait(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        try:
            await self._fetch_forever()
        finally:
            self.owner._retiring.discard(self)

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
                    await _durable(owner.store)  # a session opens on durable ends: see `request`
                except StorageError as error:
                    log.error("replicating from %s failed: %s", self.leader, error)
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
                    if owner._catching_up:
                        owner._copy_answered(response)
                    await self._replicate(response)
            except TruncationRefused as error:
                refusals += 1
                if refusals == 1 or refusals % 60 == 0:
                    log.error("replicating from %s: %s", self.leader, error)
                session = 0
                await asyncio.sleep(max(owner.config.retry_s, 1.0))
                continue
            except StorageError as error:
                log.error("replicating from %s failed: %s", self.leader, error)
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
        pushes = self.pushes = _PushedSession(self, session, link)
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
                await _durable(owner.store)

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
            await _durable(self.owner.store)
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
                store.append_frames(topic, frames, at)
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
        if owner._catching_up:
            owner._caught_up([topic for topic, _ in watermarks])

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
            raise TruncationRefused(topic, self.leader, target, committed)
        log.warning(
            "%r diverged from the leader %s: truncating from %d to %d",
            topic,
            self.leader,
            store.durable_end(topic),
            target,
        )
        owner.epochs.truncate(topic, target)

    def _observe(self, response: FetchResponse, lists: bool) -> None:
        """Route the committed records an observer was sent; nothing is persisted. `lists`: the leader
        lists every topic in the first answer of a session (`LISTS_TOPICS_HEADER`).

        A topic this node does not know yet, of a partition a leader has listed to this observation (the
        observation goes on: across a failover, or from a fetcher replaced), is new since that listing:
        it is routed from where this node's routing of it got to (a predecessor's answer), else from its
        log's start, never from where a new session of the leader put it (its committed end then: the
        records committed between the two would never be routed here). The next request tells the leader."""
        owner = self.owner
        listed = owner._listed
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
                first = data.first
                frames = data.frames[0] if len(data.frames) == 1 else b"".join(data.frames)
                records, error = decode_frames(frames, first, _MAX_FRAME_BODY)
                if error is not None:
                    log.error(
                        "%r from %s: frame %d refused (%s)", topic, self.leader, first + len(records), error
                    )
                owner.delivery.route(topic, first, records)
                self.positions[topic] = first + len(records)
            else:
                self.positions.setdefault(topic, data.first)  # where the leader starts this node's routing
                continue
            self._moved[topic] = None
        if lists:
            listed.update(data.partition for data in response.partitions if data.error == OK)


class _PushedSession:
    """A replica's session while its leader pushes it (see `replica_push`): checks the pushes' numbers,
    applies them, acknowledges what became durable."""

    def __init__(self, fetcher: _Fetcher, session: int, link: PeerLink) -> None:
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
            log.error("replicating from %s failed: %s", self.fetcher.leader, error)
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


async def _durable(store: LogStore) -> None:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def succeed() -> None:
        if not done.done():
            done.set_result(None)

    def fail(error: BaseException) -> None:
        if not done.done():
            done.set_exception(error)

    store.when_durable(succeed, fail)
    store.end_window()
    await done
