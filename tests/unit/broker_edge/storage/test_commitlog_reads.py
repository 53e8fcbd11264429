"""CommitLog: dense offsets, reads bounded by records and bytes, segments, timestamps, restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.storage import CommitLog, LogConfig, OffsetOutOfRange
from tests.unit.broker_edge.storage.log_helpers import (
    BASE_TIME_MS,
    assert_matches,
    make_record,
    segment_files,
)


def test_offsets_are_dense_from_zero(tmp_path: Path):
    log = CommitLog("a", tmp_path / "a")

    offsets = [log.append(make_record(n)) for n in range(5)]

    assert offsets == [0, 1, 2, 3, 4]
    assert log.next_offset == 5
    log.close()


def test_records_are_readable_only_after_they_are_written(tmp_path: Path):
    log = CommitLog("a", tmp_path / "a")
    log.append(make_record(0))

    assert log.end_offset == 0
    assert log.read(0) == []

    log.flush()

    assert log.end_offset == 1
    assert_matches(log.read(0)[0], 0)
    log.close()


def test_every_record_reads_back_across_segments(filled_log: CommitLog):
    records = filled_log.read(0, max_records=1000, max_bytes=10**9)

    assert filled_log.segment_count >= 4
    assert len(records) == 200
    for number, record in enumerate(records):
        assert_matches(record, number)


def test_segments_are_named_by_base_offset(filled_log: CommitLog):
    logs = segment_files(Path(filled_log.directory))
    indexes = segment_files(Path(filled_log.directory), ".index")

    bases = [int(path.stem) for path in logs]
    assert bases[0] == 0 and bases == sorted(bases)
    assert all(len(path.stem) == 20 for path in logs)
    assert [path.stem for path in indexes] == [path.stem for path in logs[:-1]]  # active index: at close


def test_a_read_stops_at_max_records(filled_log: CommitLog):
    records = filled_log.read(10, max_records=7)

    assert [record.offset for record in records] == list(range(10, 17))


def test_a_read_stops_at_max_bytes_but_returns_at_least_one_record(filled_log: CommitLog):
    sizes = [record.size for record in filled_log.read(5, max_records=4)]

    one = filled_log.read(5, max_records=100, max_bytes=1)
    three = filled_log.read(5, max_records=100, max_bytes=sum(sizes[:3]) + sizes[3] - 1)

    assert [record.offset for record in one] == [5]
    assert [record.offset for record in three] == [5, 6, 7]


def test_a_read_from_the_tail_cache_shares_record_objects(filled_log: CommitLog):
    first = filled_log.read(198)
    second = filled_log.read(198)

    assert [record.offset for record in first] == [198, 199]
    assert all(a is b for a, b in zip(first, second, strict=True))


def test_reading_at_the_end_returns_nothing_and_past_it_raises(filled_log: CommitLog):
    assert filled_log.read(200) == []

    with pytest.raises(OffsetOutOfRange) as caught:
        filled_log.read(201)

    assert (caught.value.start, caught.value.end, caught.value.offset) == (0, 200, 201)


def test_offset_for_timestamp_finds_the_first_record_at_or_after(filled_log: CommitLog):
    assert filled_log.offset_for_timestamp(BASE_TIME_MS + 123) == 123
    assert filled_log.offset_for_timestamp(0) == 0
    assert filled_log.offset_for_timestamp(BASE_TIME_MS + 10_000) == 200


def test_offset_for_timestamp_survives_a_clock_stepping_back(tmp_path: Path):
    log = CommitLog("a", tmp_path / "a")
    for timestamp in (100, 200, 150, 300):
        log.append(make_record(0, timestamp_ms=timestamp))
    log.flush()

    assert log.offset_for_timestamp(150) == 1
    assert log.offset_for_timestamp(250) == 3
    assert [record.timestamp_ms for record in log.read(0)] == [100, 200, 150, 300]
    log.close()


def test_restart_keeps_every_record_and_continues_offsets(tmp_path: Path, small_segments: LogConfig):
    log = CommitLog("a", tmp_path / "a", small_segments)
    for number in range(150):
        log.append(make_record(number))
    log.close()

    reopened = CommitLog("a", tmp_path / "a", small_segments)
    offset = reopened.append(make_record(150))
    reopened.flush()

    assert reopened.recovery.records == 150
    assert reopened.recovery.indexes_rebuilt == 0
    assert offset == 150
    records = reopened.read(0, max_records=1000, max_bytes=10**9)
    assert len(records) == 151
    for number, record in enumerate(records):
        assert_matches(record, number)
    assert reopened.offset_for_timestamp(BASE_TIME_MS + 77) == 77
    reopened.close()


def test_a_segment_rolls_when_it_gets_too_old(tmp_path: Path):
    log = CommitLog("a", tmp_path / "a", LogConfig(segment_ms=1000))
    for timestamp in (0, 500, 999, 1000, 1500, 2100):
        log.append(make_record(0, timestamp_ms=timestamp))
    log.flush()

    assert [int(path.stem) for path in segment_files(tmp_path / "a")] == [0, 3, 5]
    log.close()


def test_an_oversized_record_is_refused(tmp_path: Path):
    from broker_edge.storage import RecordTooLarge

    log = CommitLog("a", tmp_path / "a", LogConfig(max_record_bytes=100))

    with pytest.raises(RecordTooLarge):
        log.append(make_record(0, payload_size=200))
    assert log.next_offset == 0
    log.close()
