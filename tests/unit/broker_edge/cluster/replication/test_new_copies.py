"""A copy given to a running broker: what was committed before it came is the past, not news.

Its subscribers are not sent the records its leader had committed when the copy's first answer came (they
subscribed after them), and reads of its topics go to the leader until the copy holds them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from broker_edge.cluster.replication.delivery import LocalDelivery
from broker_edge.cluster.replication.fetcher import Fetcher
from broker_edge.cluster.replication.follower import Followers
from broker_edge.cluster.replication.replica_fetch import FRAMES, OK, FetchResponse, PartitionData, TopicData
from broker_edge.cluster.view import ClusterView
from broker_edge.placement import PartitionState
from broker_edge.storage import LogStore, StorageConfig

RECORD = (b"x", 1, False, "c", (), None, None, None, None, None)


@contextlib.asynccontextmanager
async def _stores(
    tmp_path: Path, topic: str, appended: int, committed: int
) -> AsyncIterator[tuple[LogStore, LogStore]]:
    """The leader's store holding `appended` records of `topic`, `committed` of them committed, and the
    empty store of the broker given a copy."""
    leader = LogStore(tmp_path / "leader", StorageConfig(durability="none"))
    here = LogStore(tmp_path / "here", StorageConfig(durability="none"))
    leader.open()
    here.open()
    try:
        leader.append_batch(topic, [RECORD] * appended)
        await leader.wait_durable()
        leader.replicated_log.commit_to(topic, committed)
        yield leader, here
    finally:
        leader.close()
        here.close()


def _answer(leader: LogStore, topic: str, first: int, stop: int) -> FetchResponse:
    frames, count = leader.replicated_log.read_frames(topic, first, 1 << 20, stop)
    data = TopicData(topic, FRAMES, stop, 0, first=first, count=count, frames=frames)
    return FetchResponse(1, OK, [PartitionData(0, OK, 4, [data])])


def test_a_copy_given_while_running_routes_only_what_its_leader_commits_after_its_first_answer(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with _stores(tmp_path, "t", 11, 10) as (leader, here):  # 0-9 committed before the copy comes
            routed: list[int | None] = []
            delivery = LocalDelivery(here, lambda message: routed.append(message.offset), None)
            view = ClusterView("b3", 1)
            view.states[0] = PartitionState(0, "b1", 4, ("b1", "b2"), ("b1", "b2"))
            followers = Followers(view, here, delivery, None)
            followers._track_new_copies(set(), set())  # the first look: b3 observes partition 0
            assert followers.copy_complete(0)  # nothing to catch up on: no copy here

            view.states[0] = PartitionState(0, "b1", 4, ("b1", "b3"), ("b1",))
            followers._track_new_copies({0}, set())  # given a copy while running
            assert not followers.copy_complete(0)
            assert followers.routing_position("t") is None  # not known before the leader's first answer

            fetcher = Fetcher(followers, "b1", "http://127.0.0.1:1", {0: 4}, observer=False)
            first = _answer(leader, "t", 0, 10)
            followers.copy_answered(first)
            await fetcher._replicate(first)
            assert routed == []  # the past: committed before the copy came
            assert here.committed_end("t") == 10
            assert followers.copy_complete(0)  # it holds everything below where its routing starts
            assert delivery.routed == {"t": 10}

            leader.replicated_log.commit_to("t", 11)
            await fetcher._replicate(_answer(leader, "t", 10, 11))
            assert routed == [10]  # news: committed after the copy came

    asyncio.run(scenario())


def test_a_new_copy_reads_from_the_leader_until_it_holds_where_its_routing_starts(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _stores(tmp_path, "t", 8, 8) as (leader, here):
            delivery = LocalDelivery(here, lambda message: None, None)
            view = ClusterView("b3", 1)
            view.states[0] = PartitionState(0, "b1", 4, ("b1", "b3"), ("b1",))
            followers = Followers(view, here, delivery, None)
            followers._looked = True
            delivery.routed["t"] = 6  # its observation had routed up to 6 before the copy came
            followers._track_new_copies({0}, set())

            fetcher = Fetcher(followers, "b1", "http://127.0.0.1:1", {0: 4}, observer=False)
            first = _answer(leader, "t", 0, 3)  # an answer that brings only part of the log
            first.partitions[0].topics[0].high_watermark = 8
            followers.copy_answered(first)
            assert followers.routing_position("t") == 6  # where the observation had got to, not the end
            await fetcher._replicate(first)
            assert not followers.copy_complete(0)  # 3 of the 6 records below its routing's start
            await fetcher._replicate(_answer(leader, "t", 3, 8))
            assert followers.copy_complete(0)

    asyncio.run(scenario())


def test_a_copy_of_a_partition_whose_topics_a_leader_listed_routes_a_topic_new_since_from_its_start(
    tmp_path: Path,
) -> None:
    """The observation had a listing of the partition's topics (then its leader died); a topic it does not
    know was created since: once the broker holds a copy, that topic is routed from its start."""

    async def scenario() -> None:
        async with _stores(tmp_path, "fresh", 2, 2) as (leader, here):
            routed: list[int | None] = []
            delivery = LocalDelivery(here, lambda message: routed.append(message.offset), None)
            view = ClusterView("b3", 1)
            view.states[0] = PartitionState(0, "b2", 5, ("b2", "b3"), ("b2",))
            followers = Followers(view, here, delivery, None)
            followers._looked = True
            followers.listed = {0}  # a leader of the observation had listed every topic of partition 0
            followers._track_new_copies({0}, set())

            fetcher = Fetcher(followers, "b2", "http://127.0.0.1:1", {0: 5}, observer=False)
            first = _answer(leader, "fresh", 0, 2)
            followers.copy_answered(first)
            await fetcher._replicate(first)
            assert routed == [0, 1]  # new since the listing: news to the subscribers
            assert followers.copy_complete(0)

    asyncio.run(scenario())
