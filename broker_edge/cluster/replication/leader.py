"""The leader's side of the replicated log: the PUBLISH path's `Replication` stage, fetch sessions, the ISR.

`LeaderReplication.when_replicated` holds each durable batch until every in-sync replica (ISR member) of
its topics' partitions holds it, then lets the PUBLISH path acknowledge and route it. A follower's fetch
from offset N of a topic says it holds the records below N durably, so a topic's high watermark (its
committed end, what readers see) is the smallest such position over the ISR, the leader's durable end
included. A batch completes, in arrival order, once the high watermark of each of its topics passes it
and the partition's ISR has at least `min_insync_replicas` members; otherwise it fails with
`NotEnoughReplicas` (the PUBLISH path refuses the publishes: v5 reason 0x83, v3.1.1 closes). It fails
with `NotLeader` when this node is fenced or stops leading a partition of the batch.

Fetches are served through sessions (see `replica_fetch`): per follower, its position per topic and the
topics with something new for it (`dirty`), updated when the leader appends or a watermark moves. A fetch
reads only the dirty topics, so its cost follows the topics that changed, not all the device topics of
the partitions. A fetch with nothing to send waits (long-poll) and is answered as soon as the leader
appends or a watermark moves. A session can also be served over the peer link (`replica_push`): the
follower's acknowledgements take the place of its fetches, and what a parked fetch would have been answered
with is pushed instead, once per loop iteration; both transports share the session and its answers.

The ISR: a follower is out of sync when a record of one of the partition's topics has waited for it more
than `replica_lag_max_ms` (it is "behind" a topic from the time the leader had records it had not fetched,
or since the previous answer it caught up to), or when it has not fetched for that long. The leader then
asks the ISR changer to shrink the ISR, and to expand it again once the follower is behind nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import TYPE_CHECKING, Protocol

from broker_edge.observe import path_trace
from broker_edge.storage.errors import OffsetOutOfRange

from .epochs import NO_EPOCH, LeaderEpochs
from .replica_fetch import (
    DIVERGING,
    FRAMES,
    GAP,
    NEWER_EPOCH,
    NOT_LEADER,
    NOT_REPLICA,
    OK,
    RESTART,
    STALE_EPOCH,
    UNKNOWN_SESSION,
    FetchRequest,
    FetchResponse,
    PartitionData,
    TopicData,
    TopicPosition,
    WireError,
)
from .replica_push import ACK, PUSH, Push, decode_ack, encode_push

if TYPE_CHECKING:
    from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.ports import AppendedRun
    from broker_edge.placement import PartitionState
    from broker_edge.storage.store import LogStore

__all__ = [
    "IsrChanger",
    "LeaderConfig",
    "LeaderReplication",
    "NotEnoughReplicas",
    "NotLeader",
    "ReplicationRefused",
]

log = logging.getLogger(__name__)

POSITIONS_PER_SLICE = 1024
"""Topic positions a fetch takes in before letting the event loop run other work."""
MAX_WAIT_MS = 30_000
"""The longest a fetch with nothing new is held, whatever it asks."""


class IsrChanger(Protocol):
    """Changes a partition's in-sync set by compare-and-swap on its epoch (the coordination side)."""

    async def shrink_isr(self, partition: int, expected_epoch: int, node: str) -> bool: ...

    async def expand_isr(self, partition: int, expected_epoch: int, node: str) -> bool: ...


class ReplicationRefused(Exception):
    """A batch the leader will not acknowledge; `str()` is the reason string for a v5 refusal."""


class NotEnoughReplicas(ReplicationRefused):
    """Fewer in-sync replicas than `min_insync_replicas`: the publish is refused, never acknowledged."""


class NotLeader(ReplicationRefused):
    """This node is fenced or no longer leads the partition: the publish is refused."""


@dataclass(frozen=True, slots=True)
class LeaderConfig:
    min_insync_replicas: int = 2
    replica_lag_max_ms: int = 5000

    def __post_init__(self) -> None:
        if self.min_insync_replicas < 1:
            raise ValueError(
                f"cluster.min_insync_replicas must be at least 1, got {self.min_insync_replicas}"
            )
        if self.replica_lag_max_ms < 10:
            raise ValueError(f"cluster.replica_lag_max_ms must be at least 10, got {self.replica_lag_max_ms}")


@dataclass(slots=True, eq=False)
class _Session:
    """One follower's (or observer's) fetch session with this leader."""

    id: int
    replica: str
    observer: bool
    partitions: dict[int, int]
    """partition -> the epoch the session was opened under."""
    positions: dict[str, int] = field(default_factory=dict)
    known_hw: dict[str, int] = field(default_factory=dict)
    dirty: dict[str, None] = field(default_factory=dict)
    """Topics with something new for it (records, a higher watermark), oldest first."""
    behind: dict[str, float] = field(default_factory=dict)
    """topic -> since when it lacks records the leader has."""
    shown: dict[str, tuple[int, float]] = field(default_factory=dict)
    """topic -> (the leader's end the last answer reached, when)."""
    sent: dict[str, int] = field(default_factory=dict)
    """topic -> the end of the frames sent to it (the next ones start there)."""
    last_seen: float = 0.0
    waiter: asyncio.Future[None] | None = None
    max_bytes: int = 1 << 20
    max_topic_bytes: int = 1 << 20
    wait_s: float = 0.5
    push: _PushStream | None = None
    """Set while the session is served over the peer link."""

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self.push is not None:
            self.push.schedule()


@dataclass(slots=True, eq=False)
class _PushStream:
    """A session's push side: its link, the numbers of both directions, the frames in flight."""

    link: PeerLink
    send: Callable[[], None]
    """Builds and sends the session's next push (called once per loop iteration at most, by the link just
    before its next message leaves, so that the push takes in everything new until then)."""
    sequence: int = 0
    acks: int = 0
    pushed_bytes: int = 0
    durable_bytes: int = 0
    last_push: float = 0.0
    scheduled: bool = False

    def schedule(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            self.link.soon(self._run)

    def _run(self) -> None:
        self.scheduled = False
        self.send()


@dataclass(slots=True, eq=False)
class _Batch:
    ends: list[tuple[str, int, int, int]]
    """(topic, partition, first offset, end offset) of each run: the batch needs them committed."""
    done: Callable[[], None]
    failed: Callable[[BaseException], None]
    doomed: BaseException | None = None


class LeaderReplication:
    """The `Replication` stage of a cluster node, and the server of its followers' fetches.

    Wiring (a cluster node): once the store is open and before MQTT listeners accept publishes, construct
    it (the store's readers then see committed records only), set it as the PUBLISH path's `replication`,
    add `replica_fetch_route(leader.fetch)` to the offsets API, and call `start()` on the loop; `await
    stop()` before the store closes. While the view is fenced, every logged publish is refused.
    """

    def __init__(
        self,
        view: ClusterView,
        store: LogStore,
        isr_changer: IsrChanger,
        config: LeaderConfig | None = None,
        epochs: LeaderEpochs | None = None,
        clock: Callable[[], float] = time.monotonic,
        route_committed: Callable[[str, int, int], None] | None = None,
    ) -> None:
        """`route_committed(topic, start, end)` delivers records a follower appended before this node took
        the lead, once committed (the PUBLISH path routes only its own); see `Followers.route_committed`."""
        self.view = view
        self.store = store
        self.isr_changer = isr_changer
        self.config = config or LeaderConfig()
        self.epochs = epochs if epochs is not None else LeaderEpochs(store)
        self._clock = clock
        self._route_committed = route_committed
        store.enable_replication()  # from construction on: nothing appended is visible before it is committed
        if path_trace.ON:
            path_trace.set_node(view.node_id)
        self._inherited: dict[str, int] = {}
        """topic -> records below this end were not routed here: appended as a follower before this node
        took the lead, or refused; they are routed as the watermark passes them."""
        self._partition_of: dict[str, int] = {}
        self._topics: dict[int, set[str]] = {}
        self._sessions: dict[tuple[str, bool], _Session] = {}
        """(replica, observer) -> its fetch session (a node may both follow and observe this leader)."""
        self._led_since: dict[int, float] = {}
        self._session_ids = count(int(time.time() * 1000) << 8)
        self._pending: deque[_Batch] = deque()
        self._uncommitted: dict[str, None] = {}
        self._stepped_down: dict[int, int] = {}
        self._isr_calls: set[tuple[int, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._checker: asyncio.Task[None] | None = None
        self._started = False
        self.fetches_served = 0
        """HTTP fetches answered (a steady state over the peer link answers none)."""
        self.pushes_sent = 0
        """Pushes sent over peer links, keepalives excluded."""
        self.acks_received = 0

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Index the store's topics by partition, follow the view, check the followers' lag periodically."""
        if self._started:
            return
        self._started = True
        for topic in self.store.topics():
            self._partition(topic)
        self.view.on_change(self._view_changed)
        self._view_changed()
        self._checker = asyncio.get_running_loop().create_task(self._check_lag_forever())

    async def stop(self) -> None:
        """Fail what is pending, answer parked fetches, stop the lag checks."""
        self._started = False
        self._fail_all(NotLeader("the broker is stopping"))
        for session in self._sessions.values():
            session.wake()
        tasks = [task for task in (self._checker, *self._tasks) if task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the Replication stage ------------------------------------------------------------------------

    def leads(self, partition: int) -> bool:
        """Whether this node leads `partition` now (not fenced, no follower has seen a newer epoch)."""
        if not self.view.leads(partition):
            return False
        newer = self._stepped_down.get(partition)
        return newer is None or self.view.states[partition].epoch >= newer

    def refusal(self, topic: str) -> str | None:
        """Why a logged publish on `topic` would be refused now (None: it may be appended)."""
        partition = self._partition(topic)
        if not self.leads(partition):
            return f"this broker does not lead partition {partition}"
        state = self.view.states[partition]
        if len(state.isr) < self.config.min_insync_replicas:
            return self._too_few(state)
        return None

    def when_replicated(
        self, runs: Sequence[AppendedRun], done: Callable[[], None], failed: Callable[[BaseException], None]
    ) -> None:
        """Call `done` once every ISR member holds `runs` (in batch order), or `failed` (see the module)."""
        now = self._clock()
        ends: list[tuple[str, int, int, int]] = []
        doomed: BaseException | None = None
        for run in runs:
            topic = run.topic
            partition = self._partition(topic)
            end = run.end_offset
            ends.append((topic, partition, run.first_offset, end))
            if path_trace.ON:
                path_trace.mark("replicating", topic, run.first_offset, end)
            if not self.leads(partition):
                doomed = doomed or NotLeader(f"this broker does not lead partition {partition}")
                continue
            state = self.view.states[partition]
            if len(state.isr) < self.config.min_insync_replicas:
                doomed = doomed or NotEnoughReplicas(self._too_few(state))
            cache = self.epochs.for_topic(topic)
            if cache.latest_epoch < state.epoch:
                cache.assign(state.epoch, run.first_offset)
            self._uncommitted[topic] = None
            self._appended(topic, partition, now)
        self._pending.append(_Batch(ends, done, failed, doomed))
        for topic, _partition, _first, _end in ends:
            self._advance_hw(topic)
        self._complete_ready()

    def _too_few(self, state: PartitionState) -> str:
        return (
            f"partition {state.partition} has {len(state.isr)} in-sync replicas, "
            f"fewer than min_insync_replicas={self.config.min_insync_replicas}"
        )

    def _appended(self, topic: str, partition: int, now: float) -> None:
        """The leader's durable end of `topic` moved: every follower session has something new."""
        for session in self._sessions.values():
            if session.observer or partition not in session.partitions:
                continue
            session.dirty[topic] = None
            if topic not in session.behind:
                session.behind[topic] = now
            session.wake()

    def _advance_hw(self, topic: str) -> None:
        """Move `topic`'s committed end to what every ISR member holds; tell sessions the new watermark."""
        store = self.store
        partition = self._partition(topic)
        durable = store.durable_end(topic)
        hw = durable
        state = self.view.states.get(partition)
        if state is None or not self.leads(partition):
            return
        me = self.view.node_id
        for member in state.isr:
            if member == me:
                continue
            session = self._sessions.get((member, False))
            position = session.positions.get(topic, 0) if session is not None else 0
            if position < hw:
                hw = position
        before = store.committed_end(topic)
        if hw <= before:
            return
        after = store.commit(topic, hw)
        if path_trace.ON:
            path_trace.mark("hw", topic, before, after)
        if after >= durable:
            self._uncommitted.pop(topic, None)
        inherited = self._inherited.get(topic)
        if inherited is not None:
            if after >= inherited:
                del self._inherited[topic]
            if self._route_committed is not None:
                self._route_committed(topic, before, min(after, inherited))
        for session in self._sessions.values():
            if partition in session.partitions and session.known_hw.get(topic, -1) < after:
                session.dirty[topic] = None
                session.wake()

    def _complete_ready(self) -> None:
        """Complete (or fail) the batches at the head of the queue that can be, in order."""
        pending = self._pending
        store = self.store
        states = self.view.states
        minimum = self.config.min_insync_replicas
        while pending:
            batch = pending[0]
            error = batch.doomed
            if error is None:
                for topic, partition, _first, end in batch.ends:
                    if store.committed_end(topic) < end:
                        return
                    state = states.get(partition)
                    if state is None or not self.leads(partition):
                        error = NotLeader(f"this broker no longer leads partition {partition}")
                    elif len(state.isr) < minimum:
                        error = NotEnoughReplicas(self._too_few(state))
            pending.popleft()
            if error is None:
                batch.done()
            else:
                self._fail(batch, error)

    def _fail_all(self, error: BaseException) -> None:
        pending, self._pending = self._pending, deque()
        for batch in pending:
            self._fail(batch, error)

    def _fail(self, batch: _Batch, error: BaseException) -> None:
        """Refuse a batch. Its records stay in the log and may be committed (the in-sync replicas hold
        them, or will): every replica's subscribers then get them, so this node's do too, now for the
        committed part and as the watermark passes the rest (the PUBLISH path routes only what it
        acknowledges)."""
        batch.failed(error)
        store = self.store
        for topic, _partition, first, end in batch.ends:
            committed = store.committed_end(topic)
            if committed > first and self._route_committed is not None:
                self._route_committed(topic, first, min(end, committed))
            if end > committed:
                self._inherited[topic] = max(self._inherited.get(topic, 0), end)

    # -- the view -------------------------------------------------------------------------------------

    def _view_changed(self) -> None:
        view = self.view
        for partition, newer in list(self._stepped_down.items()):
            state = view.states.get(partition)
            if state is not None and state.epoch >= newer:
                del self._stepped_down[partition]
        if view.fenced:
            self._fail_all(NotLeader("this broker is fenced (its etcd lease is not confirmed)"))
        elif any(not self.leads(run[1]) for batch in self._pending for run in batch.ends):
            self._fail_all(NotLeader("partition leadership moved"))
        for session in list(self._sessions.values()):
            for partition, epoch in session.partitions.items():
                state = view.states.get(partition)
                if state is None or state.epoch != epoch or not self.leads(partition):
                    session.wake()  # its next fetch learns why
                    break
        store = self.store
        taken = [number for number in view.states if number not in self._led_since and self.leads(number)]
        if taken:
            for topic in store.topics():  # topics a follower created since the last look
                self._partition(topic)
        for number in taken:
            self._led_since[number] = self._clock()
            for topic in self._topics.get(number, ()):  # a tail appended as a follower: committed now
                durable = store.durable_end(topic)
                if store.committed_end(topic) < durable:
                    self._uncommitted[topic] = None
                    self._inherited[topic] = durable
        for number in list(self._led_since):
            if not self.leads(number):
                del self._led_since[number]
        for topic in list(self._uncommitted):
            self._advance_hw(topic)
        self._complete_ready()

    # -- fetches --------------------------------------------------------------------------------------

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        """Serve one replica fetch (see `replica_fetch`): update the session, answer, or wait for news."""
        self.fetches_served += 1
        now = self._clock()
        session = self._sessions.get((request.replica, request.observer))
        partitions, errors = self._check_partitions(request)
        if request.session == 0:
            session = self._open_session(request, partitions, now)
        elif session is None or session.id != request.session or session.partitions != partitions:
            return FetchResponse(request.session, UNKNOWN_SESSION)
        if session.push is not None:  # the follower is back on HTTP: what was pushed may be lost
            return FetchResponse(request.session, UNKNOWN_SESSION)
        session.last_seen = now
        session.max_bytes, session.max_topic_bytes = request.max_bytes, request.max_topic_bytes
        session.wait_s = min(request.wait_ms, MAX_WAIT_MS) / 1000
        answers = self._answers(session, errors)
        positions = _positions(request)
        for start in range(0, len(positions), POSITIONS_PER_SLICE):
            if start:
                await asyncio.sleep(0)  # a session's first fetch lists every topic
            self._take_positions(session, positions[start : start + POSITIONS_PER_SLICE], answers, now)
        self._complete_ready()
        deadline = now + session.wait_s
        while True:
            if self._answer(session, answers, request.max_bytes) or not self._started:
                break
            remaining = deadline - self._clock()
            if (
                remaining <= 0
                or self._sessions.get((request.replica, request.observer)) is not session  # replaced
                or any(self._session_broken(session, number) for number in partitions)
            ):
                break
            session.waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(session.waiter, remaining)
            except TimeoutError:
                pass
            finally:
                session.waiter = None
                session.last_seen = self._clock()
        for number in partitions:
            if self._session_broken(session, number):
                answers[number] = PartitionData(number, NOT_LEADER, self._epoch_of(number))
        return FetchResponse(session.id, OK, list(answers.values()))

    def _answers(self, session: _Session, errors: dict[int, int]) -> dict[int, PartitionData]:
        """The answer's partitions: the errors, then every partition the session serves."""
        answers: dict[int, PartitionData] = {
            number: PartitionData(number, error, self._epoch_of(number)) for number, error in errors.items()
        }
        for number, epoch in session.partitions.items():
            answers[number] = PartitionData(number, OK, epoch)
        return answers

    # -- pushes over the peer link (see `replica_push`) ------------------------------------------------------

    def serve_pushes(self, links: PeerLinks) -> None:
        """Take followers' acknowledgements on the peer links, and serve their sessions by pushing."""
        links.on(ACK, self._acknowledged)

    def _acknowledged(self, link: PeerLink, body: memoryview) -> None:
        """A follower's acknowledgement: its first one moves its session onto the link."""
        try:
            ack = decode_ack(body)
        except WireError as error:
            log.error("replica acknowledgement from %s refused: %s", link.peer, error)
            return
        self.acks_received += 1
        request = ack.request
        session = self._sessions.get((link.peer, False))
        partitions, errors = self._check_partitions(request)
        stream = session.push if session is not None else None
        if (
            not self._started
            or request.observer
            or request.replica != link.peer
            or session is None
            or session.id != request.session
            or session.partitions != partitions
            or (stream is None and ack.sequence != 1)
            or (stream is not None and (stream.link is not link or ack.sequence != stream.acks + 1))
        ):
            link.send(PUSH, encode_push(Push(0, FetchResponse(request.session, UNKNOWN_SESSION))))
            if session is not None and session.id == request.session:
                session.push = None  # an acknowledgement was lost: the follower starts over over HTTP
            return
        if stream is None:
            pushed = session
            stream = session.push = _PushStream(link, lambda: self._push(pushed))
        stream.acks = ack.sequence
        stream.durable_bytes = max(stream.durable_bytes, ack.durable_bytes)
        now = self._clock()
        session.last_seen = now
        answers = self._answers(session, errors)
        self._take_positions(session, _positions(request), answers, now)
        self._complete_ready()
        if any(answer.error != OK or answer.topics for answer in answers.values()):
            self._push(session, answers)  # errors and divergences go out now (the follower then reopens)
        else:
            stream.schedule()  # the window may have opened

    def _push(self, session: _Session, answers: dict[int, PartitionData] | None = None) -> None:
        """Push what the session has new (records within the window, watermarks), if anything."""
        stream = session.push
        if stream is None or self._sessions.get((session.replica, session.observer)) is not session:
            return
        if not stream.link.up or not self._started:
            session.push = None  # pushes would be lost: the follower notices and reopens over HTTP
            return
        if answers is None:
            answers = self._answers(session, {})
        broken = False
        for number in session.partitions:
            if self._session_broken(session, number):
                answers[number] = PartitionData(number, NOT_LEADER, self._epoch_of(number))
                broken = True
        window = session.max_bytes - (stream.pushed_bytes - stream.durable_bytes)
        if not self._answer(session, answers, window) and not broken:
            return
        stream.pushed_bytes += sum(
            len(frames) for answer in answers.values() for data in answer.topics for frames in data.frames
        )
        stream.sequence += 1
        stream.last_push = self._clock()
        self.pushes_sent += 1
        news = [answer for answer in answers.values() if answer.topics or answer.error != OK]
        stream.link.send(PUSH, encode_push(Push(stream.sequence, FetchResponse(session.id, OK, news))))
        if broken:
            session.push = None

    def _keep_pushes_alive(self) -> None:
        """Tell idle push sessions' followers the number of the last push (a lost one shows)."""
        now = self._clock()
        for session in list(self._sessions.values()):
            stream = session.push
            if stream is not None and now - stream.last_push >= session.wait_s:
                if not stream.link.up:
                    session.push = None
                    continue
                stream.last_push = now
                keepalive = Push(stream.sequence, FetchResponse(session.id, OK))
                stream.link.send(PUSH, encode_push(keepalive))

    def _epoch_of(self, partition: int) -> int:
        state = self.view.states.get(partition)
        return state.epoch if state is not None else NO_EPOCH

    def _session_broken(self, session: _Session, partition: int) -> bool:
        state = self.view.states.get(partition)
        return state is None or state.epoch != session.partitions[partition] or not self.leads(partition)

    def _check_partitions(self, request: FetchRequest) -> tuple[dict[int, int], dict[int, int]]:
        """The partitions this node serves the request for (-> epoch), and the others' errors."""
        served: dict[int, int] = {}
        errors: dict[int, int] = {}
        states = self.view.states
        for fetch in request.partitions:
            number = fetch.partition
            state = states.get(number)
            if state is None or state.leader != self.view.node_id or self.view.fenced:
                errors[number] = NOT_LEADER
            elif fetch.epoch > state.epoch:
                if self._stepped_down.get(number, -1) < fetch.epoch:
                    log.warning(
                        "%s fetches partition %d under epoch %d, newer than this leader's %d: stepping down",
                        request.replica,
                        number,
                        fetch.epoch,
                        state.epoch,
                    )
                    self._stepped_down[number] = fetch.epoch
                    self._view_changed()
                errors[number] = NEWER_EPOCH
            elif not self.leads(number) or number not in self._led_since:
                # not yet taken over (the view changed, `_view_changed` has not run): the tail it holds is
                # not committed yet, so an observer would start at an old committed end and route the past
                errors[number] = NOT_LEADER
            elif fetch.epoch < state.epoch:
                errors[number] = STALE_EPOCH
            elif not request.observer and request.replica not in state.replicas:
                errors[number] = NOT_REPLICA
            else:
                served[number] = state.epoch
        return served, errors

    def _open_session(self, request: FetchRequest, partitions: dict[int, int], now: float) -> _Session:
        """A new session: every topic of its partitions the replica lacks or is behind on is dirty."""
        key = (request.replica, request.observer)
        old = self._sessions.get(key)
        if old is not None:
            old.wake()
        session = _Session(next(self._session_ids), request.replica, request.observer, dict(partitions))
        self._sessions[key] = session
        store = self.store
        listed = {position.topic for fetch in request.partitions for position in fetch.topics}
        for number in partitions:
            for topic in self._topics.get(number, ()):
                if topic in listed:
                    continue
                if request.observer:  # starts at the committed end, which the first answer tells it
                    session.positions[topic] = store.committed_end(topic)
                    session.dirty[topic] = None
                else:
                    session.dirty[topic] = None
                    session.behind[topic] = now
        return session

    def _take_positions(
        self,
        session: _Session,
        positions: Sequence[tuple[int, TopicPosition]],
        answers: dict[int, PartitionData],
        now: float,
    ) -> None:
        """Take the `(partition, position)`s a fetch or an acknowledgement reports: divergence checks,
        lag, watermarks."""
        store = self.store
        epochs = self.epochs
        for number, position in positions:
            answer = answers[number]
            if answer.error != OK:
                continue
            topic = position.topic
            self._partition(topic)
            offset = position.offset
            end = store.durable_end(topic)
            if topic not in store:
                if offset > 0:
                    answer.topics.append(TopicData(topic, DIVERGING, 0, 0, diverging_end=0))
                continue
            diverging = False
            end_epoch = NO_EPOCH
            last = position.last_fetched_epoch
            if offset > store.start_offset(topic) and not session.observer:  # observers: committed only
                # a replica without epochs (lost in a crash) is compared from the first one's start
                cache = epochs.for_topic(topic)
                if last != cache.latest_epoch and cache.latest_epoch != NO_EPOCH:
                    end_epoch, epoch_end = cache.end_offset_for(last, end)
                    if epoch_end < offset or end_epoch < last:
                        diverging, end = True, epoch_end
            if not diverging and offset > end:
                diverging, end_epoch = True, NO_EPOCH  # ahead of this leader: cut to its end
            if diverging:
                answer.topics.append(
                    TopicData(
                        topic,
                        DIVERGING,
                        store.committed_end(topic),
                        store.start_offset(topic),
                        diverging_epoch=end_epoch,
                        diverging_end=min(end, offset),
                    )
                )
                session.positions.pop(topic, None)
                session.sent.pop(topic, None)
                continue
            if path_trace.ON and not session.observer:
                path_trace.mark(f"ack<{session.replica}", topic, session.positions.get(topic, offset), offset)
            session.positions[topic] = offset
            if session.push is None:
                session.sent[topic] = offset  # a fetch asks from its position; pushes go on from theirs
            session.dirty[topic] = None  # the answer says at least the watermark
            if session.observer:
                continue
            if offset >= end:
                session.behind.pop(topic, None)
            else:
                shown = session.shown.get(topic)
                if shown is not None and offset >= shown[0]:
                    session.behind[topic] = shown[1]
                elif topic not in session.behind:
                    session.behind[topic] = now
            self._advance_hw(topic)

    def _answer(self, session: _Session, answers: dict[int, PartitionData], budget: int) -> bool:
        """Add what the session's dirty topics have new, with at most `budget` bytes of frames; whether the
        answer has anything."""
        store = self.store
        epochs = self.epochs
        now = self._clock()
        has_news = any(answer.topics or answer.error != OK for answer in answers.values())
        for topic in list(session.dirty):
            partition = self._partition_of.get(topic)
            answer = answers.get(partition) if partition is not None else None
            if answer is None or answer.error != OK:
                continue
            if topic not in store:
                del session.dirty[topic]
                continue
            hw = store.committed_end(topic)
            durable = store.durable_end(topic)
            limit = hw if session.observer else durable
            start = store.start_offset(topic)
            offset = session.sent.get(topic, session.positions.get(topic, start))
            data = TopicData(topic, FRAMES, hw, start, first=offset)
            if offset < start or (start > 0 and topic not in session.positions and not session.observer):
                data.kind = RESTART  # the replica cannot continue from what it holds: it starts over here
                data.boundaries = epochs.for_topic(topic).boundaries(start, start + 1)
                session.positions[topic] = session.sent[topic] = start
            elif offset < limit:
                if budget <= 0:  # the records stay dirty for the next answer; a new watermark goes now
                    if hw != session.known_hw.get(topic):
                        session.known_hw[topic] = hw
                        answer.topics.append(data)
                        has_news = True
                    continue
                try:
                    offset = _read_into(store, data, offset, min(budget, session.max_topic_bytes), limit)
                except OffsetOutOfRange:
                    continue
                sent_end = offset + data.count
                session.sent[topic] = sent_end
                if path_trace.ON:
                    path_trace.mark(f"send>{session.replica}", topic, offset, sent_end)
                budget -= sum(map(len, data.frames))
                data.boundaries = epochs.for_topic(topic).boundaries(offset, sent_end)
                if sent_end >= durable:
                    session.shown[topic] = (sent_end, now)
            elif hw == session.known_hw.get(topic):
                del session.dirty[topic]
                continue
            del session.dirty[topic]
            if path_trace.ON:
                path_trace.mark(f"hw>{session.replica}", topic, session.known_hw.get(topic, hw), hw)
            session.known_hw[topic] = hw
            answer.topics.append(data)
            has_news = True
        return has_news

    # -- the ISR --------------------------------------------------------------------------------------

    async def _check_lag_forever(self) -> None:
        interval = min(0.25, self.config.replica_lag_max_ms / 4000)
        while True:
            await asyncio.sleep(interval)
            try:
                self.check_isr()
                self._keep_pushes_alive()
            except Exception:
                log.exception("in-sync replica check failed")

    def check_isr(self) -> None:
        """Shrink the ISR of the partitions led here by followers lagging too long; expand it by those
        caught up (run periodically; the changes go through the ISR changer). A partition just taken over
        gives its followers `replica_lag_max_ms` to show up."""
        if self.view.fenced:  # no change could be written: none is tried (and logged)
            return
        now = self._clock()
        lag_max = self.config.replica_lag_max_ms / 1000
        me = self.view.node_id
        members = self.view.members
        lagging_since = self._lagging_since()
        for number, state in self.view.states.items():
            led_since = self._led_since.get(number)
            if led_since is None or not self.leads(number):
                continue
            for replica in state.replicas:
                if replica == me:
                    continue
                session = self._sessions.get((replica, False))
                serving = session is not None and number in session.partitions
                contact = float("-inf")
                if session is not None and serving:
                    contact = now if session.waiter is not None else session.last_seen
                alive = now - max(contact, led_since) <= lag_max
                since = lagging_since.get((replica, number))
                too_far = since is not None and now - max(since, led_since) > lag_max
                if replica in state.isr and (not alive or too_far):
                    self._change_isr(number, state.epoch, replica, shrink=True)
                elif (
                    replica not in state.isr
                    and replica in members  # one whose lease ended is never added back (the controller's)
                    and serving
                    and now - contact <= lag_max
                    and since is None
                ):
                    self._change_isr(number, state.epoch, replica, shrink=False)

    def _lagging_since(self) -> dict[tuple[str, int], float]:
        """(replica, partition) -> the oldest time it has been behind a topic of the partition."""
        result: dict[tuple[str, int], float] = {}
        partition_of = self._partition_of
        for session in self._sessions.values():
            if session.observer:
                continue
            for topic, since in session.behind.items():
                key = (session.replica, partition_of.get(topic, -1))
                if since < result.get(key, float("inf")):
                    result[key] = since
        return result

    def _change_isr(self, partition: int, epoch: int, replica: str, shrink: bool) -> None:
        key = (partition, replica)
        if key in self._isr_calls:
            return
        self._isr_calls.add(key)

        async def change() -> None:
            change = "removed from" if shrink else "added to"
            try:
                if shrink:
                    changed = await self.isr_changer.shrink_isr(partition, epoch, replica)
                else:
                    changed = await self.isr_changer.expand_isr(partition, epoch, replica)
                if changed:
                    (log.warning if shrink else log.info)(
                        "%s %s the in-sync replicas of partition %d", replica, change, partition
                    )
                else:
                    log.debug(
                        "%s not %s the in-sync replicas of partition %d: %s",
                        replica,
                        change,
                        partition,
                        self._why_not_changed(partition, epoch, replica),
                    )
            finally:
                self._isr_calls.discard(key)

        task = asyncio.get_running_loop().create_task(change())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _why_not_changed(self, partition: int, epoch: int, replica: str) -> str:
        view = self.view
        if view.fenced:
            return "this broker is fenced"
        if replica not in view.members:
            return f"{replica} is not a live member"
        state = view.states.get(partition)
        if state is None or state.leader != view.node_id or state.epoch != epoch:
            return "the partition's leader or epoch changed"
        return "its state changed meanwhile"

    # -- topics ---------------------------------------------------------------------------------------

    def _partition(self, topic: str) -> int:
        partition = self._partition_of.get(topic)
        if partition is None:
            partition = self._partition_of[topic] = self.view.partition_of(topic)
            self._topics.setdefault(partition, set()).add(topic)
        return partition


def _read_into(store: LogStore, data: TopicData, offset: int, max_bytes: int, limit: int) -> int:
    """Frames of ``data.topic`` from ``offset`` into ``data``; where they start. When the log holds no
    record at ``offset`` (a mirror's gap, ``LogStore.append_frames``' ``at``) they start after it, and
    ``data`` says ``GAP``: the replica's log goes on at the same offset."""
    topic = data.topic
    data.frames, data.count = store.read_frames(topic, offset, max_bytes, limit)
    if data.count:
        return offset
    held = store.next_held(topic, offset, limit)
    if held != offset:
        frames, count = store.read_frames(topic, held, max_bytes, limit)
        if count:
            data.kind, data.first, data.frames, data.count = GAP, held, frames, count
            return held
    return offset


def _positions(request: FetchRequest) -> list[tuple[int, TopicPosition]]:
    """`(partition, position)` of every topic a request reports."""
    return [(fetch.partition, position) for fetch in request.partitions for position in fetch.topics]
