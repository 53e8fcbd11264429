"""The leader's replication stage and fetch sessions, driven by fetch requests on a real store (no HTTP)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from broker_edge.cluster.replication.leader import LeaderReplication
from broker_edge.cluster.replication.replica_fetch import (
    DIVERGING,
    FRAMES,
    NEWER_EPOCH,
    NOT_LEADER,
    OK,
    STALE_EPOCH,
    UNKNOWN_SESSION,
    FetchRequest,
    FetchResponse,
    PartitionFetch,
    TopicPosition,
)
from broker_edge.cluster.replication.stage import LeaderConfig, NotEnoughReplicas, NotLeader
from broker_edge.cluster.view import ClusterView
from broker_edge.engine.message import Message
from broker_edge.engine.ports import AppendedRun
from broker_edge.engine.records import record_fields
from broker_edge.placement import PartitionState
from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage.replicated_log import ReplicatedLog
from tests.static_isr import StaticIsr

NODES = ("b1", "b2", "b3")


class CountingLog(ReplicatedLog):
    """A replicated log noting which topics the leader reads frames of."""

    def __init__(self, store: LogStore) -> None:
        super().__init__(store)
        self.reads: list[str] = []

    def read_frames(
        self, topic: str, offset: int, max_bytes: int, stop: int | None = None
    ) -> tuple[list[bytes], int]:
        self.reads.append(topic)
        return super().read_frames(topic, offset, max_bytes, stop)


class CountingStore(LogStore):
    """A store whose replicated log notes which topics the leader reads frames of."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replicated_log = self.counting = CountingLog(self)

    @property
    def reads(self) -> list[str]:
        return self.counting.reads


class Outcome:
    def __init__(self) -> None:
        self.done = 0
        self.errors: list[BaseException] = []

    def when_replicated(self, leader: LeaderReplication, runs: list[AppendedRun]) -> None:
        leader.when_replicated(runs, self._done, self.errors.append)

    def _done(self) -> None:
        self.done += 1


def _scenario(
    tmp_path: Path, body: Callable[[LeaderReplication, LogStore, StaticIsr], Awaitable[None]]
) -> None:
    async def main() -> None:
        store = CountingStore(tmp_path / "store", StorageConfig(durability="none"))
        store.open()
        view = ClusterView("b1", 1, fenced=False)
        isr = StaticIsr()
        isr.views.append(view)
        view.states[0] = PartitionState(0, "b1", 1, NODES, NODES)
        leader = LeaderReplication(
            view, store, isr, LeaderConfig(min_insync_replicas=2, replica_lag_max_ms=60_000)
        )
        leader.start()
        try:
            await body(leader, store, isr)
        finally:
            await leader.stop()
            store.close()

    asyncio.run(main())


async def _append(store: LogStore, topic: str, count: int) -> AppendedRun:
    messages = [Message(topic, f"{topic} {n}".encode(), 1) for n in range(count)]
    first = store.append_batch(topic, [record_fields(message) for message in messages])
    await store.wait_durable()
    return AppendedRun(topic, first, messages)


def _fetch(replica: str, session: int, epoch: int, positions: list[tuple[str, int, int]]) -> FetchRequest:
    topics = [TopicPosition(topic, offset, last_epoch) for topic, offset, last_epoch in positions]
    return FetchRequest(replica, session, False, 0, 1 << 20, 1 << 20, [PartitionFetch(0, epoch, topics)])


def _topics(response: FetchResponse) -> dict[str, tuple[int, int, int]]:
    """topic -> (kind, first, count) of every topic in the answer."""
    return {t.topic: (t.kind, t.first, t.count) for p in response.partitions for t in p.topics}


def test_a_batch_completes_once_every_in_sync_follower_fetched_past_it(tmp_path: Path) -> None:
    async def body(leader: LeaderReplication, store: LogStore, _isr: StaticIsr) -> None:
        outcome = Outcome()
        outcome.when_replicated(leader, [await _append(store, "t", 3)])
        first = await leader.fetch(_fetch("b2", 0, 1, []))
        assert _topics(first) == {"t": (FRAMES, 0, 3)}
        third = await leader.fetch(_fetch("b3", 0, 1, []))
        await leader.fetch(_fetch("b2", first.session, 1, [("t", 3, 1)]))
        assert outcome.done == 0 and store.committed_end("t") == 0  # b3 has not confirmed
        answer = await leader.fetch(_fetch("b3", third.session, 1, [("t", 3, 1)]))
        assert outcome.done == 1 and store.committed_end("t") == 3
        assert [t.high_watermark for p in answer.partitions for t in p.topics] == [3]

    _scenario(tmp_path, body)


def test_an_incremental_fetch_reads_only_the_topics_that_changed(tmp_path: Path) -> None:
    async def body(leader: LeaderReplication, store: LogStore, isr: StaticIsr) -> None:
        isr.set(PartitionState(0, "b1", 1, NODES, ("b1", "b2")))
        topics = [f"devices/d{n}/telemetry" for n in range(2000)]
        for topic in topics:
            store.append_batch(topic, [record_fields(Message(topic, b"x", 1))])
        await store.wait_durable()
        full = await leader.fetch(_fetch("b2", 0, 1, [(topic, 1, -1) for topic in topics]))
        assert full.error == OK
        assert isinstance(store, CountingStore)
        store.reads.clear()
        outcome = Outcome()
        outcome.when_replicated(leader, [await _append(store, topics[7], 2)])
        answer = await leader.fetch(_fetch("b2", full.session, 1, []))
        assert _topics(answer) == {topics[7]: (FRAMES, 1, 2)}
        assert store.reads == [topics[7]]
        await leader.fetch(_fetch("b2", full.session, 1, [(topics[7], 3, 1)]))
        assert outcome.done == 1

    _scenario(tmp_path, body)


def test_followers_sent_the_same_records_in_one_loop_turn_read_them_once(tmp_path: Path) -> None:
    async def body(leader: LeaderReplication, store: LogStore, _isr: StaticIsr) -> None:
        assert isinstance(store, CountingStore)
        Outcome().when_replicated(leader, [await _append(store, "t", 3)])
        frames = [t.frames for p in (await leader.fetch(_fetch("b2", 0, 1, []))).partitions for t in p.topics]
        again = await leader.fetch(_fetch("b3", 0, 1, []))  # the same turn: nothing awaited in between
        assert _topics(again) == {"t": (FRAMES, 0, 3)}
        assert [t.frames for p in again.partitions for t in p.topics] == frames
        assert store.reads == ["t"]
        small = _fetch("b3", 0, 1, [])
        small.max_topic_bytes = len(frames[0][0])  # room for one frame: not what was read for b2
        assert _topics(await leader.fetch(small)) == {"t": (FRAMES, 0, 1)}
        assert store.reads == ["t", "t"]
        await asyncio.sleep(0)  # a later turn reads anew
        assert _topics(await leader.fetch(_fetch("b2", 0, 1, []))) == {"t": (FRAMES, 0, 3)}
        assert store.reads == ["t", "t", "t"]

    _scenario(tmp_path, body)


def test_fewer_in_sync_replicas_than_the_minimum_fails_the_batch(tmp_path: Path) -> None:
    async def body(leader: LeaderReplication, store: LogStore, isr: StaticIsr) -> None:
        isr.set(PartitionState(0, "b1", 1, NODES, ("b1",)))
        assert leader.refusal("t") is not None
        outcome = Outcome()
        outcome.when_replicated(leader, [await _append(store, "t", 1)])
        assert outcome.done == 0
        assert isinstance(outcome.errors[0], NotEnoughReplicas)
        assert "min_insync_replicas=2" in str(outcome.errors[0])

    _scenario(tmp_path, body)


def test_a_shrunk_isr_below_the_minimum_fails_a_waiting_batch_in_order(tmp_path: Path) -> None:
    async def body(leader: LeaderReplication, store: LogStore, isr: StaticIsr) -> None:
        first, second = Outcome(), Outcome()
        first.when_replicated(leader, [await _append(store, "t", 1)])
        second.when_replicated(leader, [await _append(store, "u", 1)])
        assert await isr.shrink_isr(0, 1, "b2")
        assert await isr.shrink_isr(0, 1, "b3")
        assert not await isr.shrink_isr(0, 0, "b1")  # a stale epoch: the compare-and-swap fails
        assert [type(e) for e in first.errors + second.errors] == [NotEnoughReplicas, NotEnoughReplicas]
        assert store.committed_end("t") == 1  # the leader alone holds it: committed, but refused

    _scenario(tmp_path, body)


def test_stale_and_newer_epochs_and_unknown_sessions(tmp_path: Path) -> None:
    async def body(leader: LeaderReplication, store: LogStore, isr: StaticIsr) -> None:
        isr.set(PartitionState(0, "b1", 5, NODES, NODES))
        stale = await leader.fetch(_fetch("b2", 0, 4, []))
        assert [p.error for p in stale.partitions] == [STALE_EPOCH]
        unknown = await leader.fetch(_fetch("b2", 12345, 5, []))
        assert unknown.error == UNKNOWN_SESSION
        outcome = Outcome()
        outcome.when_replicated(leader, [await _append(store, "t", 1)])
        newer = await leader.fetch(_fetch("b3", 0, 6, []))
        assert [p.error for p in newer.partitions] == [NEWER_EPOCH]
        assert not leader.leads(0)  # stepped down until its view shows epoch 6
        assert isinstance(outcome.errors[0], NotLeader)
        isr.set(PartitionState(0, "b1", 6, NODES, NODES))
        assert leader.leads(0)

    _scenario(tmp_path, body)


def test_a_follower_past_the_end_of_its_epoch_is_told_where_it_diverged(tmp_path: Path) -> None:
    async def body(leader: LeaderReplication, store: LogStore, isr: StaticIsr) -> None:
        isr.set(PartitionState(0, "b1", 3, NODES, NODES))
        await _append(store, "t", 5)
        cache = leader.epochs.for_topic("t")
        cache.assign(1, 0)
        cache.assign(3, 3)
        # b2 appended records 3..7 under epoch 2, which this leader never had
        answer = await leader.fetch(_fetch("b2", 0, 3, [("t", 8, 2)]))
        diverged = answer.partitions[0].topics[0]
        assert (diverged.kind, diverged.diverging_epoch, diverged.diverging_end) == (DIVERGING, 1, 3)
        # a follower ahead of the leader within the leader's own epoch is cut to the leader's end
        answer = await leader.fetch(_fetch("b3", 0, 3, [("t", 9, 3)]))
        assert [(t.kind, t.diverging_end) for t in answer.partitions[0].topics] == [(DIVERGING, 5)]
        # a replica that lost its epochs in a crash is compared from the first epoch's start
        answer = await leader.fetch(_fetch("b3", 0, 3, [("t", 4, -1)]))
        assert [(t.kind, t.diverging_end) for t in answer.partitions[0].topics] == [(DIVERGING, 0)]

    _scenario(tmp_path, body)


def test_a_parked_fetch_is_answered_when_the_leader_appends(tmp_path: Path) -> None:
    async def body(leader: LeaderReplication, store: LogStore, _isr: StaticIsr) -> None:
        opened = await leader.fetch(_fetch("b2", 0, 1, []))
        request = _fetch("b2", opened.session, 1, [])
        request.wait_ms = 5000
        parked = asyncio.create_task(leader.fetch(request))
        await asyncio.sleep(0.05)
        assert not parked.done()
        Outcome().when_replicated(leader, [await _append(store, "t", 1)])
        answer = await asyncio.wait_for(parked, 1)
        assert _topics(answer) == {"t": (FRAMES, 0, 1)}

    _scenario(tmp_path, body)


def test_a_parked_fetch_is_answered_when_the_watermark_moves(tmp_path: Path) -> None:
    async def body(leader: LeaderReplication, store: LogStore, _isr: StaticIsr) -> None:
        Outcome().when_replicated(leader, [await _append(store, "t", 1)])
        b2 = await leader.fetch(_fetch("b2", 0, 1, []))
        b3 = await leader.fetch(_fetch("b3", 0, 1, []))
        request = _fetch("b2", b2.session, 1, [("t", 1, 1)])
        request.wait_ms = 5000
        parked = asyncio.create_task(leader.fetch(request))  # b2 holds it; the watermark waits for b3
        await asyncio.sleep(0.05)
        assert not parked.done()
        await leader.fetch(_fetch("b3", b3.session, 1, [("t", 1, 1)]))
        answer = await asyncio.wait_for(parked, 1)
        assert [(t.topic, t.high_watermark, t.count) for p in answer.partitions for t in p.topics] == [
            ("t", 1, 0)
        ]

    _scenario(tmp_path, body)


def test_a_partition_is_served_only_once_the_leader_has_taken_it_over(tmp_path: Path) -> None:
    """The view says this node leads a partition before it has told the leader (its listeners run later in
    the loop): until then fetches are told NOT_LEADER, so no observer starts at the committed end the log
    had before the leader committed the tail it holds; afterwards the tail is committed and served."""

    async def body(leader: LeaderReplication, store: LogStore, isr: StaticIsr) -> None:
        isr.set(PartitionState(0, "b2", 2, NODES, NODES))  # b2 leads; b1 holds 3 records, uncommitted
        await _append(store, "t", 3)
        assert store.committed_end("t") == 0
        leader.view.states[0] = PartitionState(0, "b1", 3, ("b1",), ("b1",))  # not yet told
        observer = FetchRequest("b3", 0, True, 0, 1 << 20, 1 << 20, [PartitionFetch(0, 3, [])])
        early = await leader.fetch(observer)
        assert [p.error for p in early.partitions] == [NOT_LEADER]
        leader.view.changed()
        assert store.committed_end("t") == 3  # the leader alone in sync: its tail is committed
        answer = await leader.fetch(observer)
        assert [(t.topic, t.first, t.high_watermark) for p in answer.partitions for t in p.topics] == [
            ("t", 3, 3)
        ]  # the observer starts after the records committed before it came

    _scenario(tmp_path, body)
