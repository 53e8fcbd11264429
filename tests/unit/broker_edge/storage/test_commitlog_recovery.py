"""Recovery: torn and corrupt tails are truncated, unclean indexes rebuilt, damaged records never served.

"Crash" here means the log object is dropped without `close()`: the files are exactly what the writes
left, as after a process kill (the page cache still holds them; power loss is the fsync tests' business).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker_edge.storage import CommitLog, CorruptRecord, LogConfig
from tests.unit.broker_edge.storage.log_helpers import (
    assert_matches,
    flip_byte,
    frame_positions,
    make_record,
    segment_files,
)


def _crashed_log(directory: Path, config: LogConfig, count: int = 200) -> None:
    log = CommitLog("t", directory, config)
    for number in range(count):
        log.append(make_record(number))
    log.flush()


def _reopen(directory: Path, config: LogConfig) -> CommitLog:
    return CommitLog("t", directory, config)


def _read_all(log: CommitLog) -> list:
    return log.read(log.start_offset, max_records=10_000, max_bytes=10**9)


def test_a_torn_last_record_is_truncated(tmp_path: Path, small_segments: LogConfig):
    _crashed_log(tmp_path, small_segments)
    tail = segment_files(tmp_path)[-1]
    last_frame = frame_positions(tail)[-1]
    os.truncate(tail, last_frame + 10)

    log = _reopen(tmp_path, small_segments)

    assert log.recovery.bytes_dropped == 10
    assert log.end_offset == 199
    assert tail.stat().st_size == last_frame
    assert log.append(make_record(199)) == 199
    log.flush()
    records = _read_all(log)
    assert len(records) == 200
    assert_matches(records[-1], 199)
    log.close()


def test_a_corrupt_last_record_is_truncated(tmp_path: Path, small_segments: LogConfig):
    _crashed_log(tmp_path, small_segments)
    tail = segment_files(tmp_path)[-1]
    base = int(tail.stem)
    positions = frame_positions(tail)
    size_before = tail.stat().st_size
    flip_byte(tail, positions[-1] + 20)

    log = _reopen(tmp_path, small_segments)

    assert log.end_offset == 199
    assert log.recovery.bytes_dropped == size_before - positions[-1]
    assert log.recovery.records == 199
    assert tail.stat().st_size == positions[-1]
    assert [record.offset for record in _read_all(log)] == list(range(199))
    assert base <= 199
    log.close()


@pytest.mark.parametrize("closed", [False, True], ids=["after a crash", "after a clean close"])
def test_a_record_damaged_between_valid_ones_is_kept_as_a_hole_never_served(
    tmp_path: Path, small_segments: LogConfig, closed: bool
):
    log = CommitLog("t", tmp_path, small_segments)
    for number in range(200):
        log.append(make_record(number))
    log.flush()
    if closed:
        log.close(write_index=False)  # as the store closes small active segments: the next open scans
    tail = segment_files(tmp_path)[-1]
    base = int(tail.stem)
    positions = frame_positions(tail)
    damaged = base + len(positions) // 2
    size_before = tail.stat().st_size
    flip_byte(tail, positions[damaged - base] + 20)

    log = _reopen(tmp_path, small_segments)

    assert (log.recovery.damaged_records, log.recovery.bytes_dropped) == ([damaged], 0)
    assert tail.stat().st_size == size_before  # the valid records after it are not truncated away
    assert log.end_offset == 200
    with pytest.raises(CorruptRecord) as caught:
        log.read(damaged)
    assert (caught.value.offset, caught.value.next_offset) == (damaged, damaged + 1)
    assert [record.offset for record in log.read(base, max_records=1000)] == list(range(base, damaged))
    after = log.read(damaged + 1, max_records=1000)
    assert [record.offset for record in after] == list(range(damaged + 1, 200))
    assert_matches(after[-1], 199)
    assert log.append(make_record(200)) == 200
    log.close()


def test_after_a_clean_close_a_flipped_byte_is_caught_at_read_and_never_served(
    filled_log: CommitLog, small_segments: LogConfig
):
    directory = Path(filled_log.directory)
    filled_log.close()
    tail = segment_files(directory)[-1]
    base = int(tail.stem)
    positions = frame_positions(tail)
    damaged = base + len(positions) // 2
    flip_byte(tail, positions[damaged - base] + 20)

    log = _reopen(directory, small_segments)
    with pytest.raises(CorruptRecord) as caught:
        log.read(damaged)
    before = log.read(base, max_records=1000)
    after = log.read(damaged + 1, max_records=1000)

    assert log.recovery.indexes_rebuilt == 0
    assert (caught.value.offset, caught.value.next_offset) == (damaged, damaged + 1)
    assert [record.offset for record in before] == list(range(base, damaged))
    assert [record.offset for record in after] == list(range(damaged + 1, 200))
    log.close()


def test_a_damaged_sealed_segment_with_a_clean_index_fails_reads_of_the_bad_record_only(
    filled_log: CommitLog, small_segments: LogConfig
):
    directory = Path(filled_log.directory)
    filled_log.close()
    first = segment_files(directory)[0]
    flip_byte(first, frame_positions(first)[3] + 12)

    log = _reopen(directory, small_segments)

    assert [record.offset for record in log.read(0)] == [0, 1, 2]
    with pytest.raises(CorruptRecord):
        log.read(3)
    assert_matches(log.read(4, max_records=1)[0], 4)
    log.close()


def test_a_damaged_sealed_segment_without_a_valid_index_is_cut_at_the_damage(
    filled_log: CommitLog, small_segments: LogConfig
):
    directory = Path(filled_log.directory)
    filled_log.close()
    first, second = segment_files(directory)[:2]
    next_base = int(second.stem)
    size = first.stat().st_size
    flip_byte(first, frame_positions(first)[5] + 3)  # the length prefix: the frames after it are lost
    (directory / f"{0:020d}.index").unlink()

    log = _reopen(directory, small_segments)

    assert log.recovery.damaged_segments == [0]
    assert first.stat().st_size == size  # a sealed segment is kept whole for inspection
    assert [record.offset for record in log.read(0)] == [0, 1, 2, 3, 4]
    for offset in (5, next_base - 1):
        with pytest.raises(CorruptRecord) as caught:
            log.read(offset)
        assert caught.value.next_offset == next_base
    assert_matches(log.read(next_base, max_records=1)[0], next_base)
    log.close()
    assert _reopen(directory, small_segments).recovery.damaged_segments == [0]


def test_an_unclosed_log_gets_its_active_index_rebuilt(tmp_path: Path, small_segments: LogConfig):
    _crashed_log(tmp_path, small_segments)

    log = _reopen(tmp_path, small_segments)

    assert log.recovery.indexes_rebuilt == 1
    assert log.recovery.bytes_dropped == 0
    records = _read_all(log)
    assert len(records) == 200
    for number, record in enumerate(records):
        assert_matches(record, number)
    log.close()


def test_appends_after_a_clean_close_are_recovered_after_a_crash(tmp_path: Path, small_segments: LogConfig):
    log = CommitLog("t", tmp_path, LogConfig(segment_bytes=1 << 20))
    for number in range(10):
        log.append(make_record(number))
    log.close()
    log = CommitLog("t", tmp_path, LogConfig(segment_bytes=1 << 20))
    for number in range(10, 15):
        log.append(make_record(number))
    log.flush()  # crash: the index on disk is the clean one of 10 records

    reopened = CommitLog("t", tmp_path, LogConfig(segment_bytes=1 << 20))

    assert reopened.recovery.indexes_rebuilt == 1
    assert [record.offset for record in _read_all(reopened)] == list(range(15))
    reopened.close()


@pytest.mark.parametrize("damage", ["zeroed entries", "open state", "truncated"])
def test_an_index_that_disagrees_with_its_segment_is_rebuilt(
    filled_log: CommitLog, small_segments: LogConfig, damage: str
):
    directory = Path(filled_log.directory)
    filled_log.close()
    index = segment_files(directory, ".index")[1]
    data = bytearray(index.read_bytes())
    if damage == "zeroed entries":
        data[32:] = bytes(len(data) - 32)
    elif damage == "open state":
        data[6] = 0
    else:
        data = data[:-16]
    index.write_bytes(bytes(data))

    log = _reopen(directory, small_segments)

    assert log.recovery.indexes_rebuilt == 1
    records = _read_all(log)
    assert len(records) == 200
    for number, record in enumerate(records):
        assert_matches(record, number)
    log.close()
    assert _reopen(directory, small_segments).recovery.indexes_rebuilt == 0


def test_leftover_files_of_an_interrupted_rebuild_are_removed(
    filled_log: CommitLog, small_segments: LogConfig
):
    directory = Path(filled_log.directory)
    filled_log.close()
    (directory / f"{0:020d}.index.tmp").write_bytes(b"partial")
    (directory / f"{999_999:020d}.index").write_bytes(b"orphan")

    log = _reopen(directory, small_segments)

    assert not (directory / f"{0:020d}.index.tmp").exists()
    assert not (directory / f"{999_999:020d}.index").exists()
    assert log.end_offset == 200
    log.close()
