"""A replica's side of a log: verbatim frame appends, truncation, and the committed end readers see."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from broker_edge.storage import CommitLog, InvalidRecord, LogConfig, LogStore, StorageConfig, StorageError
from tests.unit.broker_edge.storage.log_helpers import make_record


def _frames(log: CommitLog, offset: int = 0) -> bytes:
    chunks, _count = log.read_frames(offset, 1 << 30)
    return b"".join(chunks)


def _segment_files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.glob("*.log"))}


def test_appended_frames_give_identical_offsets_and_segment_files(tmp_path: Path, small_segments: LogConfig):
    leader = CommitLog("t", tmp_path / "leader", small_segments)
    follower = CommitLog("t", tmp_path / "follower", small_segments)
    for number in range(120):
        leader.append(make_record(number))
    leader.flush()
    offset = 0
    while offset < leader.durable_end:  # in uneven pieces, as fetches would bring them
        chunks, count = leader.read_frames(offset, 700 + offset * 13)
        assert follower.append_frames(b"".join(chunks)) == offset
        offset += count
    follower.flush()
    assert follower.end_offset == leader.end_offset == 120
    assert leader.segment_count >= 3
    assert _segment_files(tmp_path / "follower") == _segment_files(tmp_path / "leader")
    assert [r.payload for r in follower.read(0, 500, 1 << 30)] == [
        r.payload for r in leader.read(0, 500, 1 << 30)
    ]
    leader.close()
    follower.close()


def test_frames_that_do_not_continue_the_log_or_fail_their_crc_are_refused(tmp_path: Path):
    leader = CommitLog("t", tmp_path / "leader")
    follower = CommitLog("t", tmp_path / "follower")
    for number in range(5):
        leader.append(make_record(number))
    leader.flush()
    frames = _frames(leader)
    with pytest.raises(InvalidRecord, match="offset"):
        follower.append_frames(_frames(leader, 2))  # a gap: the follower is at 0
    damaged = bytearray(frames)
    damaged[-1] ^= 0xFF
    with pytest.raises(InvalidRecord, match="checksum"):
        follower.append_frames(bytes(damaged))
    assert follower.next_offset == 0  # all or nothing
    follower.append_frames(frames)
    with pytest.raises(InvalidRecord, match="offset"):
        follower.append_frames(frames)  # the same again: offsets must continue
    assert follower.next_offset == 5
    leader.close()
    follower.close()


def test_truncate_drops_the_tail_across_segments_and_survives_a_reopen(
    tmp_path: Path, small_segments: LogConfig
):
    log = CommitLog("t", tmp_path / "log", small_segments)
    for number in range(150):
        log.append(make_record(number))
    log.flush()
    segments_before = log.segment_count
    with pytest.raises(StorageError):
        log.append(make_record(150))
        log.truncate(40)  # refused while an append is buffered
    log.flush()
    log.truncate(37)
    assert log.next_offset == log.durable_end == log.end_offset == 37
    assert log.segment_count < segments_before
    assert [r.offset for r in log.read(30, 100, 1 << 30)] == list(range(30, 37))
    log.append(make_record(1000))  # the log goes on at the cut
    log.flush()
    assert log.read(37, 1, 1 << 20)[0].payload == make_record(1000).payload
    log.close()
    reopened = CommitLog("t", tmp_path / "log", small_segments)
    assert reopened.end_offset == 38
    assert reopened.read(36, 10, 1 << 20)[-1].payload == make_record(1000).payload
    assert not reopened.recovery.repaired
    reopened.close()


def test_truncate_cut_but_unsynced_index_is_rebuilt_at_open(tmp_path: Path, small_segments: LogConfig):
    log = CommitLog("t", tmp_path / "log", small_segments)
    for number in range(60):
        log.append(make_record(number))
    log.flush()
    log.truncate(10)
    # crash right here: no close, no index for the cut segment
    names = sorted(os.listdir(tmp_path / "log"))
    assert names == ["00000000000000000000.log"]
    reopened = CommitLog("t", tmp_path / "log", small_segments)
    assert reopened.end_offset == 10
    assert [r.offset for r in reopened.read(0, 100, 1 << 30)] == list(range(10))
    reopened.close()
    log.close()


def test_restart_at_empties_the_log_and_continues_at_the_offset(tmp_path: Path):
    log = CommitLog("t", tmp_path / "log")
    for number in range(5):
        log.append(make_record(number))
    log.flush()
    log.restart_at(100)
    assert log.start_offset == log.end_offset == log.next_offset == 100
    log.close()


def test_committed_end_gates_readers_of_a_replicated_store(tmp_path: Path):
    async def scenario() -> None:
        store = LogStore(tmp_path / "store", StorageConfig(durability="none"))
        store.open()
        store.enable_replication()
        first = store.append_batch("a/b", [make_record(n).batch_fields() for n in range(4)])
        await store.wait_durable()
        assert first == 0
        assert store.durable_end("a/b") == 4
        assert store.log_info("a/b").end_offset == 0
        assert store.read("a/b", 0) == []
        _chunks, count = store.read_frames("a/b", 0, 1 << 20)
        assert count == 4  # a follower may fetch what is durable here
        waiting = asyncio.create_task(store.wait_for_data({"a/b": 0}, 5))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        assert store.commit("a/b", 3) == 3
        assert await waiting == ["a/b"]
        assert [r.offset for r in store.read("a/b", 0)] == [0, 1, 2]
        assert store.commit("a/b", 99) == 4  # never past the durable end
        store.close()

    asyncio.run(scenario())


def test_a_single_store_commits_what_is_durable(tmp_path: Path):
    async def scenario() -> None:
        store = LogStore(tmp_path / "store", StorageConfig(durability="none"))
        store.open()
        store.append_batch("a", [make_record(n).batch_fields() for n in range(3)])
        await store.wait_durable()
        assert store.log_info("a").end_offset == store.durable_end("a") == 3
        store.close()

    asyncio.run(scenario())


def test_store_append_frames_goes_through_the_group_commit(tmp_path: Path):
    async def scenario() -> None:
        leader = LogStore(tmp_path / "leader", StorageConfig(durability="group"))
        follower = LogStore(tmp_path / "follower", StorageConfig(durability="group"))
        for store in (leader, follower):
            store.open()
            store.enable_replication()
        leader.append_batch("x", [make_record(n).batch_fields() for n in range(10)])
        await leader.wait_durable()
        chunks, _ = leader.read_frames("x", 0, 1 << 20)
        follower.append_frames("x", b"".join(chunks))
        assert follower.durable_end("x") == 0
        done = asyncio.get_running_loop().create_future()
        follower.when_durable(lambda: done.set_result(True))
        await done
        assert follower.durable_end("x") == 10
        follower.truncate("x", 4)
        assert follower.durable_end("x") == 4
        leader.close()
        follower.close()

    asyncio.run(scenario())
