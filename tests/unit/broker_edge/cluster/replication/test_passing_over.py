"""A follower passes over the committed records of topics no subscription here matches, retained ones aside.

Real stores on disk: a leader's log whose frames a replica's fetcher appends and commits, and an observer's
fetcher routing frames it is sent; what reaches the router is what a subscriber here would get.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker_edge.cluster.replication.delivery import LocalDelivery, retained_frames
from broker_edge.cluster.replication.fetcher import Fetcher
from broker_edge.cluster.replication.follower import Followers
from broker_edge.cluster.replication.replica_fetch import FRAMES, OK, FetchResponse, PartitionData, TopicData
from broker_edge.cluster.view import ClusterView
from broker_edge.engine.message import Message
from broker_edge.storage import LogStore, StorageConfig


def _record(payload: bytes, retain: bool = False) -> tuple:
    return (payload, 1, retain, "device", (), None, None, None, None, None)


async def _leader_frames(directory: Path) -> tuple[LogStore, list[bytes], int]:
    """A leader's log of ``t``: offsets 0-5, offset 2 and 4 retained (4 clearing it), and its frames."""
    leader = LogStore(directory, StorageConfig(durability="none"))
    leader.open()
    records = [_record(b"a"), _record(b"b"), _record(b"on", True), _record(b"c"), _record(b"", True)]
    leader.append_batch("t", [*records, _record(b"d")])
    await leader.wait_durable()
    frames, count = leader.replicated_log.read_frames("t", 0, 1 << 20)
    return leader, frames, count


def test_the_retain_flag_is_read_from_each_frame_and_a_cut_frame_ends_the_count(tmp_path: Path) -> None:
    async def scenario() -> None:
        leader, frames, _count = await _leader_frames(tmp_path / "leader")
        blob = b"".join(frames)
        total, found = retained_frames(blob, 10)
        assert (total, [offset for offset, _, _ in found]) == (6, [12, 14])
        _offset, start, end = found[0]
        assert blob[start:end] == frames[2]
        assert retained_frames(blob[:-1], 10)[0] == 5  # the last frame cut short: not counted
        leader.close()

    asyncio.run(scenario())


def test_a_replica_routes_only_the_retained_records_of_a_topic_nobody_here_wants(tmp_path: Path) -> None:
    async def scenario() -> None:
        leader, frames, count = await _leader_frames(tmp_path / "leader")
        store = LogStore(tmp_path / "store", StorageConfig(durability="none"))
        store.open()
        routed: list[Message] = []
        wanted: set[str] = set()
        delivery = LocalDelivery(store, routed.append, None, wants=wanted.__contains__)
        followers = Followers(ClusterView("b2", 1), store, delivery, None)
        fetcher = Fetcher(followers, "b1", "http://127.0.0.1:1", {0: 1}, observer=False)
        data = TopicData("t", FRAMES, 4, 0, [(1, 0)], first=0, count=count, frames=frames)
        fetcher.apply(FetchResponse(1, OK, [PartitionData(0, OK, 1, [data])]))
        await store.wait_durable()
        fetcher.commit([("t", 4)])  # committed up to 4: the retained record at 2 is routed alone
        assert [(m.offset, m.payload, m.retain) for m in routed] == [(2, b"on", True)]
        assert (delivery.records_routed, delivery.records_passed_over) == (1, 3)
        assert delivery.routed == {"t": 4}
        wanted.add("t")  # a subscription here from now on: every record committed since is routed
        fetcher.commit([("t", 6)])
        assert [(m.offset, m.payload) for m in routed[1:]] == [(4, b""), (5, b"d")]
        assert (delivery.records_routed, delivery.records_passed_over) == (3, 3)
        assert store.read("t", 0, 10)[0].payload == b"a"  # the log holds what was passed over
        leader.close()
        store.close()

    asyncio.run(scenario())


def test_an_observer_decodes_only_the_retained_frames_of_a_topic_nobody_here_wants(tmp_path: Path) -> None:
    async def scenario() -> None:
        leader, frames, count = await _leader_frames(tmp_path / "leader")
        routed: list[Message] = []
        delivery = LocalDelivery(leader, routed.append, None, wants=lambda topic: False)
        assert delivery.route_frames("t", 0, b"".join(frames), "b1") == count
        assert [(m.offset, m.payload) for m in routed] == [(2, b"on"), (4, b"")]
        assert (delivery.records_routed, delivery.records_passed_over, delivery.routed) == (2, 4, {"t": 6})
        assert delivery.route_frames("t", 0, b"".join(frames), "b1") == count  # sent again: routed once
        assert len(routed) == 2
        leader.close()

    asyncio.run(scenario())
