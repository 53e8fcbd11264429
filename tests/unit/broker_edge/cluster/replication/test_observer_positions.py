"""Where an observer's routing of each topic stands, across the sessions of different leaders."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker_edge.cluster.replication.delivery import LocalDelivery
from broker_edge.cluster.replication.fetcher import Fetcher
from broker_edge.cluster.replication.follower import Followers
from broker_edge.cluster.replication.replica_fetch import FRAMES, OK, FetchResponse, PartitionData, TopicData
from broker_edge.cluster.view import ClusterView
from broker_edge.storage import LogStore, StorageConfig


def test_a_topic_unknown_to_a_going_observation_is_routed_from_its_start_not_from_the_new_leaders_end(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        leader = LogStore(tmp_path / "leader", StorageConfig(durability="none"))
        leader.open()
        leader.append_batch("new", [(b"x", 1, False, "c", (), None, None, None, None, None)] * 3)
        await leader.wait_durable()
        leader.replicated_log.commit_to("new", 3)
        frames, count = leader.replicated_log.read_frames("new", 0, 1 << 20)
        here = LogStore(tmp_path / "here", StorageConfig(durability="none"))
        here.open()
        routed: list[str] = []
        delivery = LocalDelivery(here, lambda message: routed.append(message.topic), None)
        followers = Followers(ClusterView("b2", 1), here, delivery, None)
        followers._routing = {0}

        first = Fetcher(followers, "b1", "http://127.0.0.1:1", {0: 3}, observer=True)
        followers._fetchers[("b1", True)] = first
        assert followers.routing_position("quiet") is None  # nothing known before the first answer
        # the first answer of a session lists every topic with the position this node starts at
        first._observe(
            FetchResponse(1, OK, [PartitionData(0, OK, 3, [TopicData("quiet", FRAMES, 4, 0, first=4)])]), True
        )
        assert followers.routing_position("quiet") == 4
        assert followers.listed == {0}

        # its leader dies; the new leader's session starts a topic created meanwhile at its committed end
        del followers._fetchers[("b1", True)]
        followers.observed_positions.update(first.positions)
        assert followers.routing_position("quiet") == 4  # known while no leader answers
        second = Fetcher(followers, "b3", "http://127.0.0.1:2", {0: 4}, observer=True)
        followers._fetchers[("b3", True)] = second
        assert second.request(0).partitions[0].topics[0].topic == "quiet"  # asked for from its position
        announced = TopicData("new", FRAMES, 3, 0, first=3)
        second._observe(FetchResponse(2, OK, [PartitionData(0, OK, 4, [announced])]), True)
        assert routed == []
        assert followers.routing_position("new") == 0  # new since the listing: from its start
        assert [(t.topic, t.offset) for t in second.request(2).partitions[0].topics] == [("new", 0)]
        data = TopicData("new", FRAMES, 3, 0, first=0, count=count, frames=frames)
        second._observe(FetchResponse(2, OK, [PartitionData(0, OK, 4, [data])]), True)
        assert routed == ["new"] * 3
        assert followers.routing_position("new") == 3
        assert [info.end_offset for info in followers.observed_logs("#")] == [4, 3]
        leader.close()
        here.close()

    asyncio.run(scenario())
