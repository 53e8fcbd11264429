"""The follower's side of the epoch rule (where a diverged tail is cut), and the replication settings."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from broker_edge.cluster.replication.delivery import LocalDelivery
from broker_edge.cluster.replication.fetcher import (
    STORAGE_FAILURE_LOG_S,
    Fetcher,
    FollowerConfig,
    TruncationRefused,
)
from broker_edge.cluster.replication.follower import Followers
from broker_edge.cluster.replication.replica_fetch import (
    DIVERGING,
    FRAMES,
    GAP,
    OK,
    RESTART,
    FetchResponse,
    PartitionData,
    TopicData,
)
from broker_edge.cluster.replication.stage import LeaderConfig
from broker_edge.cluster.view import ClusterView
from broker_edge.storage import CorruptRecord, LogStore, StorageConfig
from broker_edge.storage.errors import DISK_FULL, StorageError, StorageShortage


def _fetcher_of_b1(store: LogStore) -> Fetcher:
    """b2's fetcher from b1, leader of partition 0 in epoch 1, appending into ``store``."""
    followers = Followers(ClusterView("b2", 1), store, LocalDelivery(store, lambda _m: None, None), None)
    return Fetcher(followers, "b1", "http://127.0.0.1:1", {0: 1}, observer=False)


def _answer(data: TopicData) -> FetchResponse:
    """b1's answer for partition 0: ``data`` alone."""
    return FetchResponse(1, OK, [PartitionData(0, OK, 1, [data])])


def test_a_diverged_tail_is_cut_where_the_common_epoch_ends_on_either_side(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = LogStore(tmp_path / "store", StorageConfig(durability="none"))
        store.open()
        store.replicated_log.enable()  # a cluster node: appended records are committed by the leader's word
        store.append_batch("t", [(b"x", 1, False, "c", (), None, None, None, None, None)] * 12)
        await store.wait_durable()
        followers = Followers(ClusterView("b2", 1), store, LocalDelivery(store, lambda _m: None, None), None)
        cache = followers.epochs.for_topic("t")
        cache.assign(1, 0)
        cache.assign(2, 6)  # here epoch 1 ends at 6; the leader says its epoch 1 ends at 9
        fetcher = Fetcher(followers, "b1", "http://127.0.0.1:1", {0: 3}, observer=False)
        fetcher._truncate(TopicData("t", DIVERGING, 0, 0, diverging_epoch=1, diverging_end=9))
        assert store.durable_end("t") == 6  # the earlier of the two ends
        assert cache.entries == [(1, 0)]
        fetcher._truncate(TopicData("t", DIVERGING, 0, 0, diverging_epoch=1, diverging_end=2))
        assert store.durable_end("t") == 2  # the leader's end when it is earlier
        store.close()

    asyncio.run(scenario())


def test_a_leader_that_would_cut_committed_records_is_refused_unless_elections_are_unclean(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        store = LogStore(tmp_path / "store", StorageConfig(durability="none"))
        store.open()
        store.replicated_log.enable()
        store.append_batch("t", [(b"x", 1, False, "c", (), None, None, None, None, None)] * 10)
        await store.wait_durable()
        store.replicated_log.commit_to("t", 8)  # 8 records acknowledged; 2 more appended, not yet committed
        delivery = LocalDelivery(store, lambda _m: None, None)
        followers = Followers(ClusterView("b2", 1), store, delivery, None)
        fetcher = Fetcher(followers, "b3", "http://127.0.0.1:1", {0: 4}, observer=False)
        with pytest.raises(TruncationRefused, match="below its committed end 8"):
            fetcher._truncate(TopicData("t", DIVERGING, 0, 0, diverging_end=5))
        with pytest.raises(TruncationRefused):  # nor emptied by a restart before what it holds
            fetcher.apply(FetchResponse(1, OK, [PartitionData(0, OK, 4, [TopicData("t", RESTART, 0, 3)])]))
        assert store.durable_end("t") == 10 and store.committed_end("t") == 8  # nothing was cut
        fetcher._truncate(TopicData("t", DIVERGING, 0, 0, diverging_end=8))
        assert store.durable_end("t") == 8  # the uncommitted tail may go: the epoch rule as ever
        unclean = Followers(
            ClusterView("b2", 1), store, delivery, None, FollowerConfig(unclean_election=True)
        )
        Fetcher(unclean, "b3", "http://127.0.0.1:1", {0: 4}, observer=False)._truncate(
            TopicData("t", DIVERGING, 0, 0, diverging_end=5)
        )
        assert store.durable_end("t") == 5  # the operator chose availability over those records
        store.close()

    asyncio.run(scenario())


def test_settings_out_of_range_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        FollowerConfig(max_bytes=0)
    with pytest.raises(ValueError, match="retry_s"):
        FollowerConfig(retry_s=-1)
    assert FollowerConfig(wait_ms=0).wait_ms == 0  # no long-poll is allowed
    with pytest.raises(ValueError, match=r"cluster\.min_insync_replicas"):
        LeaderConfig(min_insync_replicas=0)
    with pytest.raises(ValueError, match=r"cluster\.replica_lag_max_ms"):
        LeaderConfig(replica_lag_max_ms=1)


def test_records_already_routed_are_not_routed_again_and_an_observer_starts_after_them(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        store = LogStore(tmp_path / "store", StorageConfig(durability="none"))
        store.open()
        store.append_batch("t", [(b"x", 1, False, "c", (), None, None, None, None, None)] * 6)
        await store.wait_durable()
        store.replicated_log.commit_to("t", 6)
        routed: list[bytes] = []
        delivery = LocalDelivery(store, lambda message: routed.append(message.payload), None)
        records = store.read("t", 0, 6, 1 << 20)
        delivery.route("t", 2, records[2:4])  # what this node routed as an observer
        delivery.route_committed("t", 0, 6)  # then its own copy, from the start
        assert len(routed) == 4  # offsets 2, 3, then 4, 5: none twice, none of the earlier
        assert delivery.routed == {"t": 6}
        followers = Followers(ClusterView("b2", 1), store, delivery, None)
        observer = Fetcher(followers, "b1", "http://127.0.0.1:1", {0: 3}, observer=True, copies={0})
        assert (
            observer._position("t").offset == 6
        )  # its copy moved away: it observes from where routing stopped
        other = Fetcher(followers, "b1", "http://127.0.0.1:1", {1: 3}, observer=True, copies={0})
        assert other.positions == {}  # topics of other partitions are not its business
        fresh = Fetcher(followers, "b1", "http://127.0.0.1:1", {0: 3}, observer=True)
        assert fresh.positions == {}  # an observation that starts lists nothing: the leader's committed end
        store.close()

    asyncio.run(scenario())


def test_a_watermark_that_comes_before_its_records_are_durable_is_committed_once_they_are(
    tmp_path: Path,
) -> None:
    """A push may bring the leader's newer watermark, alone, while the frames of the push before it are
    still being synced here: once they are durable, the newer watermark is committed, not the older one."""

    async def scenario() -> None:
        leader = LogStore(tmp_path / "leader", StorageConfig(durability="none"))
        leader.open()
        leader.append_batch("t", [(b"x", 1, False, "c", (), None, None, None, None, None)] * 3)
        await leader.wait_durable()
        frames, count = leader.replicated_log.read_frames("t", 0, 1 << 20)
        store = LogStore(tmp_path / "store", StorageConfig(durability="none"))
        store.open()
        fetcher = _fetcher_of_b1(store)
        records = TopicData("t", FRAMES, 1, 0, [(1, 0)], first=0, count=count, frames=frames)
        first_watermarks, _touched, appended = fetcher.apply(_answer(records))
        assert appended and store.durable_end("t") < 3  # appended, not yet durable
        fetcher.apply(_answer(TopicData("t", FRAMES, 3, 0, first=3)))  # the watermark alone
        assert store.committed_end("t") == 0
        await store.wait_durable()
        fetcher.commit(first_watermarks)  # what the first push's durability commits
        assert store.committed_end("t") == 3
        assert fetcher._waiting_watermarks == {}
        leader.close()
        store.close()

    asyncio.run(scenario())


def test_a_gap_in_the_leaders_log_is_a_gap_in_the_copy_at_the_same_offsets(tmp_path: Path) -> None:
    """A mirror's gap (``append_frames``' ``at``, docs/uplink.md) travels as ``GAP``: the copy goes on at
    the leader's offset, the records on both sides byte for byte, the gap missing here too."""

    async def scenario() -> None:
        source = LogStore(tmp_path / "source", StorageConfig(durability="none"))
        source.open()
        source.append_batch("t", [(b"x", 1, False, "c", (), None, None, None, None, None)] * 8)
        await source.wait_durable()
        leader = LogStore(tmp_path / "leader", StorageConfig(durability="none"))
        leader.open()
        before, _ = source.replicated_log.read_frames("t", 0, 1 << 20, 3)
        after, _ = source.replicated_log.read_frames("t", 6, 1 << 20)
        leader.replicated_log.append_at("t", b"".join(before))
        leader.replicated_log.append_at("t", b"".join(after), at=6)
        await leader.wait_durable()
        assert leader.replicated_log.next_held("t", 3) == 6 and leader.replicated_log.next_held("t", 2) == 2
        store = LogStore(tmp_path / "store", StorageConfig(durability="none"))
        store.open()
        fetcher = _fetcher_of_b1(store)
        fetcher.apply(_answer(TopicData("t", FRAMES, 3, 0, first=0, count=3, frames=before)))
        fetcher.apply(_answer(TopicData("t", GAP, 8, 0, first=6, count=2, frames=after)))
        await store.wait_durable()
        fetcher.commit([("t", 8)])
        assert store.durable_end("t") == store.committed_end("t") == 8
        assert store.replicated_log.read_frames("t", 0, 1 << 20) == leader.replicated_log.read_frames(
            "t", 0, 1 << 20
        )
        assert store.replicated_log.read_frames("t", 6, 1 << 20) == leader.replicated_log.read_frames(
            "t", 6, 1 << 20
        )
        with pytest.raises(CorruptRecord) as missing:
            store.read("t", 4)
        assert missing.value.next_offset == 6
        for opened in (source, leader, store):
            opened.close()

    asyncio.run(scenario())


def test_a_store_error_lasting_through_many_retries_is_said_once_per_interval_per_kind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A follower whose disk is full meets the same refusal at every retry: one ERROR line per
    ``STORAGE_FAILURE_LOG_S`` for it (the next one counting those left out), another kind said at once."""
    store = LogStore(tmp_path / "store", StorageConfig(durability="none"))
    store.open()
    fetcher = _fetcher_of_b1(store)
    now = [100.0]
    fetcher.storage_failures.clock = lambda: now[0]
    full = StorageShortage(DISK_FULL, "No space left on device")
    with caplog.at_level(logging.ERROR, logger="broker_edge.cluster.replication.follower"):
        for _ in range(200):  # a retry every 0.1 s for 20 s
            fetcher.storage_failed(full)
            now[0] += 0.1
        fetcher.storage_failed(StorageError("write failed"))
        now[0] += STORAGE_FAILURE_LOG_S
        fetcher.storage_failed(full)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith("replicating from b1 failed: ") and "disk space" in lines[0].lower()
    assert lines[1] == "replicating from b1 failed: write failed"
    assert lines[2].endswith("(and 199 more like it since the last such line)")
    store.close()
