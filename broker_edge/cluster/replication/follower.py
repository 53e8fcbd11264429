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
2. truncates or appends (`ReplicatedLog.append_at`, through the group commit), copies the epoch
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
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp

from broker_edge.cluster.links.member_clients import MemberClients
from broker_edge.log_info import LogInfo
from broker_edge.observe import path_trace
from broker_edge.protocol.topics import topic_matches

from .delivery import LocalDelivery
from .epochs import LeaderEpochs
from .fetcher import Fetcher, FetchFailed, FollowerConfig
from .replica_fetch import (
    CONTENT_TYPE,
    LISTS_TOPICS_HEADER,
    OK,
    PATH,
    PUSH_HEADER,
    FetchRequest,
    FetchResponse,
    WireError,
    decode_response,
    encode_request,
)
from .replica_push import decode_push

if TYPE_CHECKING:
    from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
    from broker_edge.cluster.reads.interest import LocalInterest, RetainedRefresh
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.message import Message
    from broker_edge.storage.store import LogStore

__all__ = ["Followers"]

log = logging.getLogger(__name__)

FetcherKey = tuple[str, bool]
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
        store.replicated_log.enable()
        if path_trace.ON:
            path_trace.set_node(view.node_id)
        self._headers = {"Content-Type": CONTENT_TYPE}
        self._fetchers: dict[FetcherKey, Fetcher] = {}
        self.retiring: set[Fetcher] = set()
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
        self.observed_positions: dict[str, int] = {}
        """Observers' positions in the partitions observed now, kept when their fetcher is replaced."""
        self.catching_up: dict[int, dict[str, int] | None] = {}
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
        self.listed: set[int] = set()
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
        fetchers, self._fetchers = [*self._fetchers.values(), *self.retiring], {}
        self.retiring = set()
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
    def fetchers(self) -> dict[FetcherKey, dict[int, int]]:
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
        return number not in self.catching_up

    def _track_new_copies(self, copies: set[int], previous_copies: set[int]) -> None:
        """Copies this node was given since its last look at the view catch up (see `_catching_up`)."""
        catching_up = self.catching_up
        if self._looked:
            for number in copies - previous_copies:
                if number not in catching_up:
                    catching_up[number] = None
                    if number not in self.listed:
                        self._unlisted_copies.add(number)
        me = self.view.node_id
        for number in [number for number in catching_up if number not in copies]:
            del catching_up[number]
        for number in [n for n in catching_up if self.view.states[n].leader == me]:
            del catching_up[number]  # led here (an unclean election): its own log is what it serves
        self._unlisted_copies.intersection_update(catching_up)
        self._looked = self._looked or bool(self.view.states)

    def copy_answered(self, response: FetchResponse) -> None:
        """A replica's answer: where a new copy's routing of each topic starts (see `_catching_up`)."""
        catching_up = self.catching_up
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
            self.caught_up(list(starts))

    def caught_up(self, topics: list[str]) -> None:
        """Drop the topics (and copies) that hold every record below where their routing starts now."""
        catching_up = self.catching_up
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
        wanted: dict[FetcherKey, tuple[str, dict[int, int]]] = {}
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
        replaced: dict[FetcherKey, Fetcher] = {}
        for key, fetcher in list(self._fetchers.items()):
            if wanted.get(key) != (fetcher.url, fetcher.partitions):
                del self._fetchers[key]
                if fetcher.observer:
                    self.observed_positions.update(fetcher.positions)
                if key[1] and key in wanted and wanted[key][0] == fetcher.url:
                    fetcher.retire()  # hands over to the next observer of this leader (no gap)
                    self.retiring.add(fetcher)
                    replaced[key] = fetcher
                else:
                    fetcher.cancel()
        previous, self._routing = self._routing, routing
        previous_copies, self._copies = self._copies, copies
        self._track_new_copies(copies, previous_copies)
        routed = self.delivery.routed
        for topic, end in self.observed_positions.items():
            number = view.partition_of(topic)
            if number in copies and number not in previous_copies and routed.get(topic, 0) < end:
                # observed until now, a copy from now on: the replica copies the log from its start, and
                # routes none of what this observation had routed or started after
                routed[topic] = end
        for topic in [topic for topic in self.observed_positions if view.partition_of(topic) not in routing]:
            del self.observed_positions[
                topic
            ]  # its observation ended: a new one starts from the committed end
        self.listed = {number for number in self.listed if number in routing and number not in copies}
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
                fetcher = Fetcher(self, key[0], url, partitions, key[1], previous_copies, replaced.get(key))
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

    def opened(self, fetcher: Fetcher) -> None:
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
        if number in self.catching_up:  # a new copy: its routing starts where its first answer put it
            return self.delivery.routed.get(topic) if self.catching_up[number] is not None else None
        for (_, observer), fetcher in self._fetchers.items():
            if observer and number in fetcher.partitions:
                return fetcher.positions.get(topic)
        return self.observed_positions.get(topic) if number in self._routing else None

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
        positions = dict(self.observed_positions)
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
