"""Retention of one topic by size and by age: its start moves by whole groups (its records in one segment),
never into the active segment, and survives a restart; segments go once nothing in them is kept."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from pathlib import Path

import pytest

from broker_edge.storage import CorruptRecord, LogStore, OffsetOutOfRange, PersistRule, StorageConfig
from broker_edge.storage.retention import SLICE_GROUPS
from broker_edge.storage.sealed_index import GROUP, HEADER
from tests.unit.broker_edge.storage.log_helpers import (
    BASE_TIME_MS,
    assert_matches,
    make_record,
    partition_segments,
)


def _store(directory: Path, **limits) -> LogStore:
    limits.setdefault("retention_ms", None)
    store = LogStore(directory, StorageConfig(segment_bytes=4096, **limits))
    store.open()
    for number in range(200):
        store.append("t", make_record(number))
    store.flush()
    return store


def test_retention_by_bytes_moves_the_start_and_deletes_the_oldest_segments(tmp_path: Path):
    store = _store(tmp_path, retention_bytes=10_000)
    segments_before = partition_segments(tmp_path)

    report = store.apply_retention(now_ms=BASE_TIME_MS)

    info = store.log_info("t")
    assert report.segments_deleted == len(segments_before) - len(partition_segments(tmp_path)) > 0
    assert info.bytes <= 10_000
    assert (
        len(store.read("t", info.start_offset, max_records=1000, max_bytes=10**9)) == 200 - info.start_offset
    )
    store.close()


def test_reading_below_the_start_raises_with_the_current_bounds(tmp_path: Path):
    store = _store(tmp_path, retention_bytes=10_000)
    store.apply_retention(now_ms=BASE_TIME_MS)
    start = store.start_offset("t")

    with pytest.raises(OffsetOutOfRange) as caught:
        store.read("t", 0)

    assert caught.value.start == start > 0
    assert caught.value.end == 200
    assert_matches(store.read("t", start, max_records=1)[0], start)
    store.close()


def test_retention_by_age_drops_the_groups_whose_newest_record_is_too_old(tmp_path: Path):
    store = _store(tmp_path, retention_ms=1000)
    first_segment_records = (
        len(store.read("t", 0, 1000, 10**9)) - store.partition_logs[0].segments[0].row_count
    )
    second = store.partition_logs[0].segments[1]
    newest_of_first = BASE_TIME_MS + (200 - first_segment_records) - 1

    report = store.apply_retention(now_ms=newest_of_first + 1000 + 1)

    assert report.segments_deleted == 1
    assert store.start_offset("t") == 200 - first_segment_records
    assert store.start_offset("t") == second.base  # one topic: positions and offsets agree
    store.close()


def test_the_active_segment_is_never_deleted(tmp_path: Path):
    store = _store(tmp_path, retention_bytes=1, retention_ms=1, segment_ms=None)  # never rolled by age

    store.apply_retention(now_ms=BASE_TIME_MS + 10**9)

    assert len(partition_segments(tmp_path)) == 1
    assert store.start_offset("t") == store.partition_logs[0].segments[0].base
    assert store.read("t", 199, max_records=1)[0].offset == 199
    store.close()


@pytest.mark.parametrize("restart", ["close", "crash"])
def test_the_start_offset_survives_a_restart(tmp_path: Path, restart: str):
    store = _store(tmp_path, retention_bytes=10_000)
    store.apply_retention(now_ms=BASE_TIME_MS)
    start = store.start_offset("t")
    if restart == "close":
        store.close()

    reopened = LogStore(tmp_path, StorageConfig(segment_bytes=4096))
    reopened.open()

    assert (reopened.start_offset("t"), reopened.log_info("t").end_offset) == (start, 200)
    reopened.close()


def _fill(store: LogStore, topic: str, until_segments: int) -> None:
    """Append to `topic` until the partition has `until_segments` segments."""
    number = 0
    while len(store.partition_logs[0].segments) < until_segments:
        store.append(topic, make_record(number))
        store.flush()
        number += 1


@pytest.mark.parametrize("restart", ["close", "crash"])
def test_a_segment_holding_only_a_truncation_marker_goes_with_the_records_before_its_cut(
    tmp_path: Path, restart: str, caplog: pytest.LogCaptureFixture
):
    """A truncation's marker caps the sealed group it cut, whose records past the cut stay on disk: its
    segment stays while the topic's records before the cut live, though nothing else in it does, so that a
    log moved on past a gap serves none of the cut records, before and after a restart. It goes with them."""
    store = LogStore(tmp_path, StorageConfig(segment_bytes=4096, retention_ms=None))
    store.open()
    for number in range(4):
        store.append("kept", make_record(number))
    store.flush()
    _fill(store, "filler", until_segments=2)
    store.replicated_log.truncate_to("kept", 1)  # its marker goes into segment 1
    _fill(store, "gone", until_segments=3)
    store.replicated_log.truncate_to("gone", 0)
    store.replicated_log.truncate_to("filler", 0)
    store.wait_sealed()

    report = store.apply_retention(now_ms=BASE_TIME_MS)

    assert report.segments_deleted == 0
    assert [s.number for s in store.partition_logs[0].segments] == [0, 1, 2]
    assert store.replicated_log.continue_at({"kept": 10}) == {"kept": 1}
    if restart == "close":
        store.close()
    else:
        store.file_pool.close()
    reopened = LogStore(tmp_path, StorageConfig(segment_bytes=4096, retention_ms=1000))
    reopened.open()
    assert_matches(reopened.read("kept", 0)[0], 0)
    assert [record.offset for record in reopened.read("kept", 0)] == [0]
    with pytest.raises(CorruptRecord) as missing:
        reopened.read("kept", 1)
    assert missing.value.next_offset == 10

    report = reopened.apply_retention(now_ms=BASE_TIME_MS + 10_000)  # record 0 is past retention

    numbers = [s.number for s in reopened.partition_logs[0].segments]
    assert report.segments_deleted >= 2 and not {0, 1} & set(numbers)  # (and 2, if the close sealed it)
    assert reopened.start_offset("kept") == 1
    _reads_the_gap_quietly(reopened, caplog)  # its walk passes segments retention deleted
    assert reopened.append("kept", make_record(10)) == 10
    reopened.flush()
    assert [record.offset for record in reopened.read("kept", 10)] == [10]
    reopened.close()
    again = LogStore(tmp_path, StorageConfig(segment_bytes=4096, retention_ms=1000))
    again.open()
    _reads_the_gap_quietly(again, caplog)  # retention's account says which segments it deleted
    assert [record.offset for record in again.read("kept", 10)] == [10]
    again.close()


def _reads_the_gap_quietly(store: LogStore, caplog: pytest.LogCaptureFixture) -> None:
    """A read of "kept" in its gap (offsets 1 to 9) is told the log goes on at 10, and nothing is logged at
    ERROR (no record is lost)."""
    caplog.clear()
    with pytest.raises(CorruptRecord) as missing:
        store.read("kept", 1)
    assert missing.value.next_offset == 10
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_start_moved_inside_a_segment_that_stays_survives_a_crash(tmp_path: Path):
    """Retention can move a topic's start without deleting a segment (another topic's records in it are
    kept): the pass saves the moved start at once, so a crash does not bring the expired records back."""
    store = LogStore(tmp_path, StorageConfig(segment_bytes=4096, retention_ms=1000))
    store.open()
    for number in range(3):
        store.append("expired", make_record(number, timestamp_ms=BASE_TIME_MS))
        store.append("kept", make_record(number, timestamp_ms=BASE_TIME_MS + 10_000))
    store.flush()
    _fill(store, "filler", until_segments=2)  # the first segment is sealed, its groups can be judged
    store.wait_sealed()

    report = store.apply_retention(now_ms=BASE_TIME_MS + 5_000)
    store.wait_sealed()
    store.file_pool.close()  # a crash: the store is dropped without closing

    assert report.segments_deleted == 0 and store.start_offset("expired") == 3
    reopened = LogStore(tmp_path, StorageConfig(segment_bytes=4096, retention_ms=1000))
    assert not reopened.open().clean_shutdown
    assert reopened.start_offset("expired") == 3
    assert reopened.start_offset("kept") == 0
    reopened.close()


def test_a_quiet_partition_is_rolled_by_age_so_its_records_expire(tmp_path: Path):
    """A partition nothing is appended to any more still rolls once its active segment is `segment_ms` old:
    the retention pass rolls it, and its records go once past `retention_ms` (they outlive it by about
    `segment_ms`, not forever)."""
    store = LogStore(tmp_path, StorageConfig(segment_ms=1000, retention_ms=2000))
    store.open()
    for number in range(3):
        store.append("quiet", make_record(number, timestamp_ms=BASE_TIME_MS))
    store.flush()

    store.apply_retention(now_ms=BASE_TIME_MS + 1000)  # the active segment is segment_ms old: rolled
    store.flush()  # (the broker's loop writes the roll at once; a script's next flush does)
    store.wait_sealed()
    report = store.apply_retention(now_ms=BASE_TIME_MS + 2001)

    assert store.start_offset("quiet") == store.log_info("quiet").end_offset == 3
    assert report.segments_deleted == 1
    assert store.append("quiet", make_record(3)) == 3  # offsets go on where they were
    store.close()
    reopened = LogStore(tmp_path, StorageConfig(segment_ms=1000, retention_ms=2000))
    reopened.open()
    assert (reopened.start_offset("quiet"), reopened.log_info("quiet").end_offset) == (3, 4)
    reopened.close()


def test_a_quiet_partition_younger_than_segment_ms_is_not_rolled(tmp_path: Path):
    store = LogStore(tmp_path, StorageConfig(segment_ms=1000, retention_ms=2000))
    store.open()
    store.append("quiet", make_record(0, timestamp_ms=BASE_TIME_MS))
    store.flush()

    store.apply_retention(now_ms=BASE_TIME_MS + 999)

    assert len(store.partition_logs[0].segments) == 1
    store.close()


def test_a_pass_deleting_segments_of_many_topics_yields_to_the_loop_throughout():
    """`apply_retention_async` yields between slices of groups also while it reads a segment's groups and
    checks which segments can go: reading a whole segment's groups, and checking every deleted segment, in
    one turn held the event loop for seconds with 200,000 topics (2.2 s of a 4.6 s pass)."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        store = LogStore(directory, StorageConfig(segment_ms=1000, retention_ms=1000))
        store.open()
        for number in range(6 * SLICE_GROUPS):
            store.append(f"fleet/device-{number}", make_record(0, timestamp_ms=BASE_TIME_MS))
        store.flush()
        store.apply_retention(now_ms=BASE_TIME_MS + 1000)  # rolled: one sealed segment of 24,576 groups
        store.flush()
        store.wait_sealed()
        turns = asyncio.run(_cpu_per_loop_turn(store.apply_retention_async(now_ms=BASE_TIME_MS + 5000)))
        store.close()

    assert store.start_offset("fleet/device-0") == 1
    assert max(turns) < sum(turns) / 4, turns  # no turn takes more than a few slices' share of the pass


async def _cpu_per_loop_turn(work) -> list[float]:
    """The CPU time of the loop's thread in each turn while `work` runs (the garbage collector held off: a
    collection of what earlier tests left is no turn's own work)."""
    turns: list[float] = []
    task = asyncio.ensure_future(work)
    gc.disable()
    try:
        last = time.thread_time()
        while not task.done():
            await asyncio.sleep(0)
            now = time.thread_time()
            turns.append(now - last)
            last = now
    finally:
        gc.enable()
    await task
    return turns


@pytest.mark.parametrize("cut", [0, GROUP.size // 2])
def test_a_segment_whose_sealed_index_reads_short_is_not_deleted(tmp_path: Path, cut: int):
    """A sealed index cut while the broker runs (groups missing at the end of the file) is never taken for a
    segment of fewer groups: retention deleted the segment once the groups it could read were past
    retention, with the records of the topics whose groups it could not read (not expired)."""
    store = LogStore(tmp_path, StorageConfig(segment_bytes=4096, retention_ms=1000))
    store.open()
    store.append("expired", make_record(0, timestamp_ms=BASE_TIME_MS))
    store.append("kept", make_record(1, timestamp_ms=BASE_TIME_MS + 10_000))
    store.flush()
    _fill(store, "filler", until_segments=2)
    store.wait_sealed()
    first = store.partition_logs[0].segments[0]
    index = tmp_path / "log" / "00" / f"{first.number:020d}.index"
    groups_at = HEADER.size + 4 * len(first.sealed.summary)
    os.truncate(index, groups_at + GROUP.size + cut)  # only the group of "expired" (topic id 0) is whole

    store.apply_retention(now_ms=BASE_TIME_MS + 5000)

    assert first in store.partition_logs[0].segments
    assert store.start_offset("kept") == 0
    store.close()


def test_a_pass_reads_no_groups_of_segments_too_young_to_hold_expired_records(tmp_path: Path):
    """A pass reads again the groups of a segment only when one of them may be past the shortest retention
    (their oldest newest time is kept from the pass that read them): every pass read every group of every
    sealed segment, so a fleet's week of records (a group per topic and segment) cost each pass minutes of
    the loop's CPU with nothing to delete. A rule of a short retention (of no log here) makes every segment
    worth reading again, for comparison."""
    costs = {}
    short = PersistRule("short/#", retention_ms=1000)
    for name, rules in (("young", [PersistRule("#")]), ("judged", [short, PersistRule("#")])):
        store = LogStore(tmp_path / name, StorageConfig(segment_bytes=200_000, persist=rules))
        store.open()
        for round_number in range(8):
            for number in range(SLICE_GROUPS):
                store.append(f"fleet/device-{number}", make_record(round_number, timestamp_ms=BASE_TIME_MS))
            store.flush()
        store.wait_sealed()
        assert len(store.partition_logs[0].segments) > 4
        store.apply_retention(now_ms=BASE_TIME_MS + 60_000)  # reads every group once
        gc.disable()
        try:
            began = time.thread_time()
            report = store.apply_retention(now_ms=BASE_TIME_MS + 60_000)
            costs[name] = time.thread_time() - began
        finally:
            gc.enable()
        assert report.topics_moved == 0 and store.start_offset("fleet/device-0") == 0
        store.close()

    assert costs["young"] < costs["judged"] / 3, costs


@pytest.mark.parametrize("damage", ["zeroed", "flipped"])
def test_a_segment_whose_sealed_index_is_damaged_is_neither_deleted_nor_moved_past(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
):
    """A sealed index whose groups a bad disk damaged after a clean close (no checksum covers them, and a
    clean open does not read them): until 2026-12-01 retention took its zeroed groups (each "topic id 0, no
    record") for the truth, moved topic 0's start past all its records and deleted the segment with the
    records of the other topics, kept without limit. Groups that are impossible now keep the segment and
    every start where it was, the pass says which index is damaged, and the next start makes it again."""
    rules = [PersistRule("sized", retention_bytes=2000), PersistRule("#")]
    store = LogStore(tmp_path, StorageConfig(segment_bytes=4096, retention_ms=None))
    store.open()
    for number in range(60):
        store.append("sized", make_record(number))
        store.append("kept", make_record(number + 100))
    store.close()
    index = partition_segments(tmp_path, suffix=".index")[0]
    data = bytearray(index.read_bytes())
    header = HEADER.unpack_from(data)
    groups_at = HEADER.size + 4 * -(-header[7] // 64)  # the summary: a topic id per 64 groups
    if damage == "zeroed":
        data[groups_at:] = bytes(len(data) - groups_at)
    else:  # topic id of the second group ("kept", id 1) made 0
        data[groups_at + GROUP.size] = 0
    index.write_bytes(bytes(data))
    store = LogStore(tmp_path, StorageConfig(segment_bytes=4096, retention_ms=None, persist=rules))
    store.open()

    store.apply_retention()

    assert index.with_suffix(".log").exists()
    assert store.start_offset("sized") == 0
    assert f"its sealed index {index} is damaged" in caplog.text
    store.close()
    store = LogStore(tmp_path, StorageConfig(segment_bytes=4096, retention_ms=None))  # makes the index again
    store.open()
    kept = store.read("kept", 0, max_records=1000, max_bytes=10**9)
    assert [record.offset for record in kept] == list(range(60))
    assert store.start_offset("sized") == 0
    store.close()


@pytest.mark.parametrize("when", ["by age", "by size"])
def test_a_sealed_index_that_cannot_be_read_keeps_its_segment_and_retention_goes_on_with_the_others(
    tmp_path: Path, when: str, caplog: pytest.LogCaptureFixture
):
    """A sealed index deleted, or unreadable on a bad disk, while the broker runs: until 2026-12-01 the pass
    raised the ``OSError`` at that segment, every pass after it too, so no segment of any topic was deleted
    any more and the disk filled. Its segment is now kept and named at ERROR; the others go."""
    limits = {"retention_ms": 1000} if when == "by age" else {"retention_ms": None, "retention_bytes": 2000}
    config = StorageConfig(segment_bytes=4096, max_open_files=2, sealed_cache_bytes=0, **limits)
    store = LogStore(tmp_path, config)
    store.open()
    _fill(store, "t", until_segments=3)  # "t" fills segments 0 and 1, "u" the segments after them
    for number in range(200):
        store.append("u", make_record(number, timestamp_ms=BASE_TIME_MS))
    store.flush()
    store.wait_sealed()
    indexes = partition_segments(tmp_path, suffix=".index")
    assert len(indexes) >= 5
    indexes[1].unlink()
    store.file_pool.close()  # its descriptor given back, as the pool does with many files

    report = store.apply_retention(now_ms=BASE_TIME_MS + 60_000)

    assert report.segments_deleted >= 2
    assert indexes[1].with_suffix(".log").exists()
    assert not indexes[3].with_suffix(".log").exists()  # the oldest segment of "u" alone
    assert f"{indexes[1]} cannot be read" in caplog.text
    store.close()
