"""The PUBLISH path's ``Replication`` stage on a leader: a durable batch is held until every in-sync replica
holds it, then acknowledged, in arrival order.

A batch completes once the high watermark of each of its topics (``cluster.partition.Partition.advance``)
passes it and the partition's ISR has at least ``min_insync_replicas`` members; otherwise it fails with
``NotEnoughReplicas`` (the PUBLISH path refuses the publishes: v5 reason 0x83, v3.1.1 closes). It fails with
``NotLeader`` when this node is fenced or stops leading a partition of the batch. A refused batch's records
stay in the log: the partition routes them as it commits them (``Partition.inherit``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker_edge.observe import path_trace

from .epochs import LeaderEpochs

if TYPE_CHECKING:
    from broker_edge.cluster.partition import Partition, Partitions
    from broker_edge.engine.ports import AppendedRun
    from broker_edge.placement import PartitionState

__all__ = ["LeaderConfig", "NotEnoughReplicas", "NotLeader", "ReplicationRefused", "ReplicationStage"]


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
class _Batch:
    ends: list[tuple[str, Partition, int, int]]
    """(topic, partition, first offset, end offset) of each run: the batch needs them committed."""
    done: Callable[[], None]
    failed: Callable[[BaseException], None]
    doomed: BaseException | None = None


class ReplicationStage:
    """The ``Replication`` port of a leader (see the module docstring)."""

    def __init__(
        self,
        partitions: Partitions,
        epochs: LeaderEpochs,
        config: LeaderConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.partitions = partitions
        self.epochs = epochs
        self.config = config
        self._clock = clock
        self._pending: deque[_Batch] = deque()

    def leads(self, number: int) -> bool:
        """Whether this node leads partition ``number`` now (not fenced, no follower has seen a newer
        epoch)."""
        return self.partitions.number(number).leads()

    def refusal(self, topic: str) -> str | None:
        """Why a logged publish on `topic` would be refused now (None: it may be appended)."""
        partition = self.partitions.of(topic)
        if not partition.leads():
            return f"this broker does not lead partition {partition.number}"
        state = partition.state
        assert state is not None, "a led partition has a state"
        if len(state.isr) < self.config.min_insync_replicas:
            return self.too_few(state)
        return None

    def when_replicated(
        self, runs: Sequence[AppendedRun], done: Callable[[], None], failed: Callable[[BaseException], None]
    ) -> None:
        """Call `done` once every ISR member holds `runs` (in batch order), or `failed` (see the module)."""
        now = self._clock()
        ends: list[tuple[str, Partition, int, int]] = []
        doomed: BaseException | None = None
        partition_of = self.partitions.of
        for run in runs:
            topic = run.topic
            partition = partition_of(topic)
            end = run.end_offset
            ends.append((topic, partition, run.first_offset, end))
            if path_trace.ON:
                path_trace.mark("replicating", topic, run.first_offset, end)
            if not partition.leads():
                doomed = doomed or NotLeader(f"this broker does not lead partition {partition.number}")
                continue
            state = partition.state
            assert state is not None, "a led partition has a state"
            if len(state.isr) < self.config.min_insync_replicas:
                doomed = doomed or NotEnoughReplicas(self.too_few(state))
            cache = self.epochs.for_topic(topic)
            if cache.latest_epoch < state.epoch:
                cache.assign(state.epoch, run.first_offset)
            partition.uncommitted[topic] = None
            _appended(partition, topic, now)
        self._pending.append(_Batch(ends, done, failed, doomed))
        for topic, partition, _first, _end in ends:
            partition.advance(topic)
        self.complete_ready()

    def too_few(self, state: PartitionState) -> str:
        return (
            f"partition {state.partition} has {len(state.isr)} in-sync replicas, "
            f"fewer than min_insync_replicas={self.config.min_insync_replicas}"
        )

    def complete_ready(self) -> None:
        """Complete (or fail) the batches at the head of the queue that can be, in order."""
        pending = self._pending
        store = self.partitions.store
        minimum = self.config.min_insync_replicas
        while pending:
            batch = pending[0]
            error = batch.doomed
            if error is None:
                for topic, partition, _first, end in batch.ends:
                    if store.committed_end(topic) < end:
                        return
                    state = partition.state
                    if state is None or not partition.leads():
                        error = NotLeader(f"this broker no longer leads partition {partition.number}")
                    elif len(state.isr) < minimum:
                        error = NotEnoughReplicas(self.too_few(state))
            pending.popleft()
            if error is None:
                batch.done()
            else:
                self._fail(batch, error)

    def fail_all(self, error: BaseException) -> None:
        pending, self._pending = self._pending, deque()
        for batch in pending:
            self._fail(batch, error)

    def leadership_lost(self) -> bool:
        """Whether a pending batch has a partition this node no longer leads."""
        return any(not partition.leads() for batch in self._pending for _, partition, _, _ in batch.ends)

    def _fail(self, batch: _Batch, error: BaseException) -> None:
        """Refuse a batch. Its records stay in the log and may be committed (the in-sync replicas hold
        them, or will): every replica's subscribers then get them, so this node's do too
        (``Partition.inherit``: the PUBLISH path routes only what it acknowledges)."""
        batch.failed(error)
        for topic, partition, first, end in batch.ends:
            partition.inherit(topic, first, end)


def _appended(partition: Partition, topic: str, now: float) -> None:
    """The leader's durable end of `topic` moved: every follower session has something new."""
    for session in partition.followers():
        session.dirty[topic] = None
        behind = session.behind
        if topic not in behind:
            behind[topic] = now
        session.wake()
