"""A replica's side of a topic's log in a shared partition log: verbatim frame appends (byte for byte the
leader's, whatever else the partitions hold), truncation that survives restarts and crashes, restarts at a
later offset, and the committed end readers see."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker_edge.storage import CorruptRecord, InvalidRecord, LogStore, StorageConfig, StorageError
from tests.unit.broker_edge.storage.log_helpers import make_record


def _store(directory: Path, config: StorageConfig | None = None) -> LogStore:
    store = LogStore(directory, config or StorageConfig())
    store.open()
    return store


def _frames(store: LogStore, topic: str, offset: int = 0) -> list[bytes]:
    frames: list[bytes] = []
    end = store.durable_end(topic)
    while offset < end:
        batch, count = store.replicated_log.read_frames(topic, offset, 1 << 30)
        frames += [bytes(frame) for frame in batch]
        offset += count
    return frames


def test_appended_frames_give_identical_offsets_and_bytes_whatever_else_the_partition_holds(
    tmp_path: Path, small_segments: StorageConfig
):
    leader = _store(tmp_path / "leader", small_segments)
    follower = _store(tmp_path / "follower", small_segments)
    for number in range(120):
        leader.append("t", make_record(number))
        leader.append(f"leader-only/{number % 7}", make_record(number))
        if number % 3 == 0:
            follower.append(f"follower-only/{number % 5}", make_record(number))  # interleaved differently
    leader.flush()
    offset = 0
    while offset < leader.durable_end("t"):  # in uneven pieces, as fetches would bring them
        chunks, count = leader.replicated_log.read_frames("t", offset, 700 + offset * 13)
        assert follower.replicated_log.append_at("t", b"".join(chunks)) == offset
        offset += count
    follower.flush()

    assert follower.log_info("t").end_offset == leader.log_info("t").end_offset == 120
    assert _frames(follower, "t") == _frames(leader, "t")  # the record format's bytes, same offsets
    assert [r.payload for r in follower.read("t", 0, 500, 1 << 30)] == [
        r.payload for r in leader.read("t", 0, 500, 1 << 30)
    ]
    leader.close()
    follower.close()


def test_frames_that_do_not_continue_the_log_or_fail_their_crc_are_refused(tmp_path: Path):
    leader = _store(tmp_path / "leader")
    follower = _store(tmp_path / "follower")
    for number in range(5):
        leader.append("t", make_record(number))
    leader.flush()
    frames = b"".join(_frames(leader, "t"))
    with pytest.raises(InvalidRecord, match="offset"):
        follower.replicated_log.append_at(
            "t", b"".join(_frames(leader, "t", 2))
        )  # a gap: the follower is at 0
    damaged = bytearray(frames)
    damaged[-1] ^= 0xFF
    with pytest.raises(InvalidRecord, match="checksum"):
        follower.replicated_log.append_at("t", bytes(damaged))
    assert follower.durable_end("t") == 0  # all or nothing
    follower.replicated_log.append_at("t", frames)
    with pytest.raises(InvalidRecord, match="offset"):
        follower.replicated_log.append_at("t", frames)  # the same again: offsets must continue
    follower.flush()
    assert follower.durable_end("t") == 5
    leader.close()
    follower.close()


@pytest.mark.parametrize("restart", ["close", "crash"])
def test_truncate_drops_the_tail_across_shared_segments_and_survives_a_restart(
    tmp_path: Path, small_segments: StorageConfig, restart: str
):
    store = _store(tmp_path, small_segments)
    for number in range(150):
        store.append("t", make_record(number))
        store.append("other", make_record(number))
    store.flush()
    store.append("t", make_record(150))
    with pytest.raises(StorageError):
        store.replicated_log.truncate_to("t", 40)  # refused while an append is buffered
    store.flush()
    store.replicated_log.truncate_to("t", 37)

    assert store.durable_end("t") == store.log_info("t").end_offset == 37
    assert [r.offset for r in store.read("t", 30, 100, 1 << 30)] == list(range(30, 37))
    store.append("t", make_record(1000))  # the log goes on at the cut
    store.flush()
    assert store.read("t", 37, 1, 1 << 20)[0].payload == make_record(1000).payload
    if restart == "close":
        store.close()
    reopened = LogStore(tmp_path, small_segments)
    report = reopened.open()
    assert reopened.log_info("t").end_offset == 38
    assert [r.offset for r in reopened.read("t", 0, 100, 1 << 30)] == list(range(38))
    assert reopened.read("t", 36, 10, 1 << 20)[-1].payload == make_record(1000).payload
    assert reopened.log_info("other").end_offset == 150  # the other topic of the segments: untouched
    assert not report.repaired
    reopened.close()


def test_a_truncation_is_durable_before_it_returns(tmp_path: Path, small_segments: StorageConfig):
    store = _store(tmp_path, small_segments)
    for number in range(60):
        store.append("t", make_record(number))
    store.flush()
    store.replicated_log.truncate_to("t", 10)
    # crash right here: the marker was fsynced, nothing else happened

    reopened = LogStore(tmp_path, small_segments)
    reopened.open()
    assert reopened.log_info("t").end_offset == 10
    assert [r.offset for r in reopened.read("t", 0, 100, 1 << 30)] == list(range(10))
    reopened.close()


def test_restart_at_empties_the_log_and_continues_at_the_offset(tmp_path: Path):
    store = _store(tmp_path)
    for number in range(5):
        store.append("t", make_record(number))
    store.flush()
    store.replicated_log.restart_at("t", 100)
    info = store.log_info("t")
    assert (info.start_offset, info.end_offset, info.bytes) == (100, 100, 0)
    assert store.append("t", make_record(100)) == 100
    store.close()
    reopened = _store(tmp_path)
    assert (reopened.log_info("t").start_offset, reopened.log_info("t").end_offset) == (100, 101)
    reopened.close()


def test_committed_end_gates_readers_of_a_replicated_store(tmp_path: Path):
    async def scenario() -> None:
        store = LogStore(tmp_path / "store", StorageConfig(durability="none"))
        store.open()
        store.replicated_log.enable()
        first = store.append_batch("a/b", [make_record(n).batch_fields() for n in range(4)])
        await store.wait_durable()
        assert first == 0
        assert store.durable_end("a/b") == 4
        assert store.log_info("a/b").end_offset == 0
        assert store.read("a/b", 0) == []
        _chunks, count = store.replicated_log.read_frames("a/b", 0, 1 << 20)
        assert count == 4  # a follower may fetch what is durable here
        waiting = asyncio.create_task(store.wait_for_data({"a/b": 0}, 5))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        assert store.replicated_log.commit_to("a/b", 3) == 3
        assert await waiting == ["a/b"]
        assert [r.offset for r in store.read("a/b", 0)] == [0, 1, 2]
        assert store.replicated_log.commit_to("a/b", 99) == 4  # never past the durable end
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
            store.replicated_log.enable()
        leader.append_batch("x", [make_record(n).batch_fields() for n in range(10)])
        await leader.wait_durable()
        chunks, _ = leader.replicated_log.read_frames("x", 0, 1 << 20)
        follower.replicated_log.append_at("x", b"".join(chunks))
        assert follower.durable_end("x") == 0
        done = asyncio.get_running_loop().create_future()
        follower.when_durable(lambda: done.set_result(True))
        await done
        assert follower.durable_end("x") == 10
        follower.replicated_log.truncate_to("x", 4)
        assert follower.durable_end("x") == 4
        leader.close()
        follower.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("restart", ["close", "crash", "rolled"])
def test_frames_appended_past_the_logs_end_keep_what_it_holds_and_leave_a_gap(
    tmp_path: Path, small_segments: StorageConfig, restart: str
):
    source = _store(tmp_path / "source", small_segments)
    for number in range(40):
        source.append("t", make_record(number))
    source.flush()
    mirror = _store(tmp_path / "mirror", small_segments)
    mirror.replicated_log.append_at("t", b"".join(source.replicated_log.read_frames("t", 0, 1 << 30, 12)[0]))
    mirror.append("other", make_record(1))  # the partition goes on with another topic
    after_gap = b"".join(source.replicated_log.read_frames("t", 30, 1 << 30)[0])
    with pytest.raises(InvalidRecord):  # frames not at `at` are refused, and leave no gap
        mirror.replicated_log.append_at("t", after_gap, at=29)
    assert mirror.replicated_log.append_at("t", after_gap, at=30) == 30
    mirror.flush()
    if restart == "rolled":  # the gap's segment rolls and is sealed, then a crash
        for number in range(80):
            mirror.append("other", make_record(number))
        mirror.flush()
        mirror.wait_sealed()
    if restart == "close":
        mirror.close()
    mirror = _store(tmp_path / "mirror", small_segments)

    info = mirror.log_info("t")
    assert (info.start_offset, info.end_offset) == (0, 40)
    assert [r.offset for r in mirror.read("t", 0, 100, 1 << 30)] == list(range(12))
    with pytest.raises(CorruptRecord) as missing:
        mirror.read("t", 12, 100, 1 << 30)
    assert missing.value.next_offset == 30
    assert mirror.replicated_log.read_frames("t", 0, 1 << 30) == source.replicated_log.read_frames(
        "t", 0, 1 << 30, 12
    )
    assert mirror.replicated_log.read_frames("t", 12, 1 << 30) == (
        [],
        0,
    )  # frames are never served from the gap
    assert _frames(mirror, "t", 30) == _frames(source, "t", 30)
    mirror.close()
    source.close()


def test_a_gap_costs_its_sealed_index_nothing_however_long(tmp_path: Path, small_segments: StorageConfig):
    source = _store(tmp_path / "source", small_segments)
    source.replicated_log.restart_at("t", 10_000_000)
    for number in range(5):
        source.append("t", make_record(number))
    source.flush()
    mirror = _store(tmp_path / "mirror", small_segments)
    mirror.append("t", make_record(0))
    mirror.replicated_log.append_at(
        "t", b"".join(source.replicated_log.read_frames("t", 10_000_000, 1 << 30)[0]), at=10_000_000
    )
    mirror.close()  # sealed: each segment's index holds only the records it has
    indexes = sum(path.stat().st_size for path in (tmp_path / "mirror").rglob("*.index"))
    assert indexes < 4096
    reopened = _store(tmp_path / "mirror", small_segments)
    assert reopened.log_info("t").end_offset == 10_000_005
    assert [r.offset for r in reopened.read("t", 10_000_000, 10, 1 << 30)] == list(
        range(10_000_000, 10_000_005)
    )
    reopened.close()
    source.close()


def test_continue_at_moves_logs_below_their_offset_on_in_one_flush_durably(
    tmp_path: Path, small_segments: StorageConfig
):
    """A log holding records goes on past a gap (they stay readable), one holding nothing restarts at the
    offset, one at or past it is left alone; appends then take offsets from there, after a crash too."""
    store = _store(tmp_path, small_segments)
    for number in range(3):
        store.append("held", make_record(number))
        store.append("ahead", make_record(number))
    moved = store.replicated_log.continue_at({"held": 10, "ahead": 2, "absent": 7})
    assert moved == {"held": 3, "absent": 0}
    assert (store.start_offset("absent"), store.durable_end("absent")) == (7, 7)
    assert store.durable_end("held") == 10
    # crash right here: nothing written since

    reopened = _store(tmp_path, small_segments)
    assert reopened.append("held", make_record(10)) == 10
    assert reopened.append("absent", make_record(7)) == 7
    assert reopened.append("ahead", make_record(3)) == 3
    reopened.flush()
    assert [r.payload for r in reopened.read("held", 0)] == [make_record(n).payload for n in range(3)]
    assert [r.offset for r in reopened.read("held", 10)] == [10]
    with pytest.raises(CorruptRecord):
        reopened.read("held", 5)
    assert reopened.start_offset("absent") == 7
    reopened.close()


@pytest.mark.parametrize("gap", ["append_at", "continue_at"])
@pytest.mark.parametrize("restart", ["none", "close", "crash", "sealed"])
def test_a_log_cut_inside_a_sealed_group_and_moved_past_a_gap_never_serves_the_cut_records(
    tmp_path: Path, small_segments: StorageConfig, gap: str, restart: str
):
    """A follower's truncation inside a segment sealed already keeps its cut when the log then goes on past
    a gap before any record (a leader's gap, or `continue_at`): the cut records stay unread, in memory, once
    the truncation's segment is sealed, and after a close or a crash."""
    source = _store(tmp_path / "source", small_segments)
    for number in range(6):
        source.append("t", make_record(number))
    source.replicated_log.restart_at("gap", 20)  # the leader's log with a gap: records 20 on
    for number in range(3):
        source.append("gap", make_record(number))
    source.flush()
    store = _store(tmp_path / "follower", small_segments)
    store.replicated_log.append_at("t", b"".join(source.replicated_log.read_frames("t", 0, 1 << 30)[0]))
    for number in range(60):  # the segment holding "t" rolls and is sealed
        store.append("other", make_record(number))
    store.flush()
    store.wait_sealed()
    store.replicated_log.truncate_to("t", 2)
    if gap == "append_at":
        frames = b"".join(source.replicated_log.read_frames("gap", 20, 1 << 30)[0])
        assert store.replicated_log.append_at("t", frames, at=20) == 20
    else:
        assert store.replicated_log.continue_at({"t": 20}) == {"t": 2}
    store.flush()
    if restart == "sealed":  # the segments of the cut and the gap are sealed too
        for number in range(60):
            store.append("other", make_record(number))
        store.flush()
        store.wait_sealed()
    if restart in ("close", "crash", "sealed"):
        if restart == "close":
            store.close()
        store = _store(tmp_path / "follower", small_segments)

    end = 23 if gap == "append_at" else 20
    assert store.durable_end("t") == end
    assert [r.offset for r in store.read("t", 0, 100, 1 << 30)] == [0, 1]
    with pytest.raises(CorruptRecord) as missing:
        store.read("t", 2, 100, 1 << 30)
    assert missing.value.next_offset == 20  # the gap's end (the log's, when nothing follows it)
    assert store.replicated_log.read_frames("t", 0, 1 << 30)[1] == 2
    assert store.replicated_log.next_held("t", 2) == 20
    if gap == "append_at":
        assert [r.offset for r in store.read("t", 20, 100, 1 << 30)] == [20, 21, 22]
    store.close()
    source.close()
