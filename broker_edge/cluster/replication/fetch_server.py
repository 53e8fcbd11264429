"""The leader's server of replica fetches (``replica_fetch``): sessions, positions, answers, long-polls.

Fetches are served through sessions (``sessions.FetchSession``): per follower, its position per topic and the
topics with something new for it (``dirty``), updated when the leader appends or a watermark moves. A fetch
reads only the dirty topics, so its cost follows the topics that changed, not all the device topics of the
partitions. A fetch with nothing to send waits (long-poll) and is answered as soon as the leader appends or
a watermark moves. A follower's fetch from offset N of a topic says it holds the records below N durably:
its partition's high watermark follows (``Partition.advance``). The same answers are pushed over the peer
link once a session moves there (``push_server``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from itertools import count
from typing import TYPE_CHECKING

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
)
from .sessions import FetchSession

if TYPE_CHECKING:
    from broker_edge.cluster.partition import Partitions
    from broker_edge.storage.store import LogStore

__all__ = ["FetchServer", "ReadsOfTurn", "positions_of"]

log = logging.getLogger("broker_edge.cluster.replication.leader")

POSITIONS_PER_SLICE = 1024
"""Topic positions a fetch takes in before letting the event loop run other work."""
MAX_WAIT_MS = 30_000
"""The longest a fetch with nothing new is held, whatever it asks."""


class FetchServer:
    """Serves the replica fetches of this leader's followers and observers (see the module docstring)."""

    def __init__(
        self,
        partitions: Partitions,
        epochs: LeaderEpochs,
        settle: Callable[[], None],
        step_down: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``settle`` completes what a new position may have replicated (the stage); ``step_down`` takes a
        newer epoch a follower reports into account (the view's listener)."""
        self.partitions = partitions
        self.store: LogStore = partitions.store
        self.view = partitions.view
        self.epochs = epochs
        self._settle = settle
        self._step_down = step_down
        self._clock = clock
        self.sessions: dict[tuple[str, bool], FetchSession] = {}
        """(replica, observer) -> its fetch session (a node may both follow and observe this leader)."""
        self._session_ids = count(int(time.time() * 1000) << 8)
        self.serving = False
        """Whether fetches are answered (between the leader's start and stop)."""
        self.fetches_served = 0
        """HTTP fetches answered (a steady state over the peer link answers none)."""
        self.diverged: dict[tuple[str, str], float] = {}
        """(replica, topic) -> when the replica's position first diverged from this log, until it reports
        one that does not: it is behind the topic all that time, across its sessions (a replica that will
        not truncate, reopening session after session, is taken out of the in-sync set)."""
        self._reads = ReadsOfTurn(self.store)

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        """Serve one replica fetch (see `replica_fetch`): update the session, answer, or wait for news."""
        self.fetches_served += 1
        now = self._clock()
        session = self.sessions.get((request.replica, request.observer))
        partitions, errors = self.check_partitions(request)
        if request.session == 0:
            session = self._open_session(request, partitions, now)
        elif session is None or session.id != request.session or session.partitions != partitions:
            return FetchResponse(request.session, UNKNOWN_SESSION)
        if session.push is not None:  # the follower is back on HTTP: what was pushed may be lost
            return FetchResponse(request.session, UNKNOWN_SESSION)
        session.last_seen = now
        session.max_bytes, session.max_topic_bytes = request.max_bytes, request.max_topic_bytes
        session.wait_s = min(request.wait_ms, MAX_WAIT_MS) / 1000
        answers = self.answers(session, errors)
        positions = positions_of(request)
        for start in range(0, len(positions), POSITIONS_PER_SLICE):
            if start:
                await asyncio.sleep(0)  # a session's first fetch lists every topic
            self.take_positions(session, positions[start : start + POSITIONS_PER_SLICE], answers, now)
        self._settle()
        deadline = now + session.wait_s
        while True:
            if self.answer(session, answers, request.max_bytes) or not self.serving:
                break
            remaining = deadline - self._clock()
            if (
                remaining <= 0
                or self.sessions.get((request.replica, request.observer)) is not session  # replaced
                or any(self.session_broken(session, number) for number in partitions)
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
            if self.session_broken(session, number):
                answers[number] = PartitionData(number, NOT_LEADER, self.epoch_of(number))
        return FetchResponse(session.id, OK, list(answers.values()))

    def answers(self, session: FetchSession, errors: dict[int, int]) -> dict[int, PartitionData]:
        """The answer's partitions: the errors, then every partition the session serves."""
        answers: dict[int, PartitionData] = {
            number: PartitionData(number, error, self.epoch_of(number)) for number, error in errors.items()
        }
        for number, epoch in session.partitions.items():
            answers[number] = PartitionData(number, OK, epoch)
        return answers

    def forget_departed(self) -> None:
        """Drop the sessions whose member left the cluster (its lease ended) or registered again since they
        were opened. A session outlives its member's process, and the member may come back within
        `replica_lag_max_ms`: the session of its former process, caught up when it died, would take it back
        into an in-sync set before it has shown its log (it may have come back without its records, or with
        a log it cannot prove) in a session of its own. A registration is compared, not only a presence: the
        end of a lease and the next registration can reach this leader in one batch of changes."""
        for session in list(self.sessions.values()):
            if not self.speaks_for_member(session):
                self._end(session)

    def speaks_for_member(self, session: FetchSession) -> bool:
        """Whether ``session`` was opened under its replica's current registration, the replica a member."""
        view = self.view
        replica = session.replica
        return replica in view.members and view.registrations.get(replica) == session.registration

    def _end(self, session: FetchSession) -> None:
        """Serve ``session`` no more (replaced by a new one, or its member gone or registered again): taken
        off its partitions, a fetch parked on it answered (the next one reopens a session)."""
        key = session.key
        if self.sessions.get(key) is session:
            del self.sessions[key]
        for number in session.partitions:
            self.partitions.number(number).serve(key, None)
        session.wake()

    def wake_broken(self) -> None:
        """Wake the sessions a view change broke (a partition's epoch or leader changed): their next fetch
        learns why."""
        for session in list(self.sessions.values()):
            for number in session.partitions:
                if self.session_broken(session, number):
                    session.wake()
                    break

    def wake_all(self) -> None:
        for session in self.sessions.values():
            session.wake()

    def epoch_of(self, number: int) -> int:
        state = self.view.states.get(number)
        return state.epoch if state is not None else NO_EPOCH

    def session_broken(self, session: FetchSession, number: int) -> bool:
        partition = self.partitions.number(number)
        state = partition.state
        return state is None or state.epoch != session.partitions[number] or not partition.leads()

    def check_partitions(self, request: FetchRequest) -> tuple[dict[int, int], dict[int, int]]:
        """The partitions this node serves the request for (-> epoch), and the others' errors."""
        served: dict[int, int] = {}
        errors: dict[int, int] = {}
        view = self.view
        for fetch in request.partitions:
            number = fetch.partition
            partition = self.partitions.number(number)
            state = partition.state
            if state is None or state.leader != view.node_id or view.fenced:
                errors[number] = NOT_LEADER
            elif fetch.epoch > state.epoch:
                newer = partition.newer_epoch
                if newer is None or newer < fetch.epoch:
                    log.warning(
                        "%s fetches partition %d under epoch %d, newer than this leader's %d: stepping down",
                        request.replica,
                        number,
                        fetch.epoch,
                        state.epoch,
                    )
                    partition.newer_epoch = fetch.epoch
                    self._step_down()
                errors[number] = NEWER_EPOCH
            elif not partition.leads() or partition.led_since is None:
                # not yet taken over (the view changed, its listener has not run): the tail it holds is not
                # committed yet, so an observer would start at an old committed end and route the past
                errors[number] = NOT_LEADER
            elif fetch.epoch < state.epoch:
                errors[number] = STALE_EPOCH
            elif not request.observer and request.replica not in state.replicas:
                errors[number] = NOT_REPLICA
            else:
                served[number] = state.epoch
        return served, errors

    def _open_session(self, request: FetchRequest, partitions: dict[int, int], now: float) -> FetchSession:
        """A new session: every topic of its partitions the replica lacks or is behind on is dirty."""
        key = (request.replica, request.observer)
        old = self.sessions.get(key)
        if old is not None:
            self._end(old)
        session = FetchSession(
            next(self._session_ids),
            request.replica,
            request.observer,
            dict(partitions),
            self.view.registrations.get(request.replica),
        )
        self.sessions[key] = session
        store = self.store
        listed = {position.topic for fetch in request.partitions for position in fetch.topics}
        for number in partitions:
            partition = self.partitions.number(number)
            partition.serve(key, session)
            for topic in partition.topics:
                if topic in listed:
                    continue
                if request.observer:  # starts at the committed end, which the first answer tells it
                    session.positions[topic] = store.committed_end(topic)
                    session.dirty[topic] = None
                else:
                    session.dirty[topic] = None
                    session.behind[topic] = now
        return session

    def take_positions(
        self,
        session: FetchSession,
        positions: Sequence[tuple[int, TopicPosition]],
        answers: dict[int, PartitionData],
        now: float,
    ) -> None:
        """Take the `(partition, position)`s a fetch or an acknowledgement reports: divergence checks,
        lag, watermarks."""
        store = self.store
        epochs = self.epochs
        partition_of = self.partitions.of
        diverged = self.diverged
        for number, position in positions:
            answer = answers[number]
            if answer.error != OK:
                continue
            topic = position.topic
            partition = partition_of(topic)
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
                if not session.observer:
                    diverged.setdefault((session.replica, topic), now)
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
            if diverged:
                diverged.pop((session.replica, topic), None)
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
            partition.advance(topic)

    def answer(self, session: FetchSession, answers: dict[int, PartitionData], budget: int) -> bool:
        """Add what the session's dirty topics have new, with at most `budget` bytes of frames; whether the
        answer has anything."""
        store = self.store
        epochs = self.epochs
        known = self.partitions.known
        now = self._clock()
        has_news = any(answer.topics or answer.error != OK for answer in answers.values())
        for topic in list(session.dirty):
            partition = known(topic)
            answer = answers.get(partition.number) if partition is not None else None
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
                    offset = self._reads.read_into(data, offset, min(budget, session.max_topic_bytes), limit)
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


class ReadsOfTurn:
    """The frames read for answers in this loop turn, kept for the turn: the followers of a partition are
    usually sent the same records at once (the leader's new durable ones), read once."""

    def __init__(self, store: LogStore) -> None:
        self._store = store
        self._reads: dict[tuple[str, int, int], tuple[int, int, list[bytes], int, int, int]] = {}
        """(topic, offset, limit) -> (kind, first, frames, count, their bytes, the bytes they could take)."""

    def read_into(self, data: TopicData, offset: int, max_bytes: int, limit: int) -> int:
        """`_read_into`, of frames already read this turn where they are what it would read."""
        key = (data.topic, offset, limit)
        kept = self._reads.get(key)
        if kept is not None:
            kind, first, frames, count, size, asked = kept
            if asked == max_bytes or (first + count == limit and size <= max_bytes):
                data.kind, data.first, data.frames, data.count = kind, first, frames, count
                return first
        first = _read_into(self._store, data, offset, max_bytes, limit)
        reads = self._reads
        if not reads:
            try:
                asyncio.get_running_loop().call_soon(reads.clear)
            except RuntimeError:  # no loop turn to keep them for
                return first
        reads[key] = (data.kind, first, data.frames, data.count, sum(map(len, data.frames)), max_bytes)
        return first


def _read_into(store: LogStore, data: TopicData, offset: int, max_bytes: int, limit: int) -> int:
    """Frames of ``data.topic`` from ``offset`` into ``data``; where they start. When the log holds no
    record at ``offset`` (a mirror's gap, ``ReplicatedLog.append_at``' ``at``) they start after it, and
    ``data`` says ``GAP``: the replica's log goes on at the same offset."""
    topic = data.topic
    log_ = store.replicated_log
    data.frames, data.count = log_.read_frames(topic, offset, max_bytes, limit)
    if data.count:
        return offset
    held = log_.next_held(topic, offset, limit)
    if held != offset:
        frames, count_ = log_.read_frames(topic, held, max_bytes, limit)
        if count_:
            data.kind, data.first, data.frames, data.count = GAP, held, frames, count_
            return held
    return offset


def positions_of(request: FetchRequest) -> list[tuple[int, TopicPosition]]:
    """`(partition, position)` of every topic a request reports."""
    return [(fetch.partition, position) for fetch in request.partitions for position in fetch.topics]
