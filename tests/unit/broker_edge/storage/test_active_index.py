"""The index of an active segment: a bounded part in memory, the rest in its open index file.

Reads by offset and by time, truncation, a clean close and a crash all see the whole index, whichever
part of it is in memory; memory per appended record stays bounded however long the segment grows.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest

from broker_edge.storage import CommitLog, LogConfig
from broker_edge.storage.index import STATE_OPEN, parse_header
from broker_edge.storage.segment import INDEX_MEMORY_ENTRIES
from tests.unit.broker_edge.storage.log_helpers import BASE_TIME_MS, assert_matches, make_record

RECORDS = 3 * INDEX_MEMORY_ENTRIES + 41
"""Enough records that most of the active segment's index has left memory, and some has not."""


@pytest.fixture
def one_segment() -> LogConfig:
    """One segment for everything, and a tail cache too small to serve the reads below."""
    return LogConfig(tail_cache_records=4, tail_cache_bytes=1024, retention_ms=None, segment_ms=None)


def _fill(directory: Path, config: LogConfig, count: int = RECORDS, flush_every: int = 50) -> CommitLog:
    log = CommitLog("t", directory, config)
    for number in range(count):
        log.append(make_record(number))
        if number % flush_every == flush_every - 1:
            log.flush()
    log.flush()
    return log


def _index_file(directory: Path) -> Path:
    return directory / f"{0:020d}.index"


def test_an_active_segment_keeps_a_bounded_part_of_its_index_in_memory(tmp_path: Path, one_segment):
    log = _fill(tmp_path, one_segment)
    segment = log._segments[-1]

    assert log.segment_count == 1
    assert segment.entries is not None and len(segment.entries) // 2 < 2 * INDEX_MEMORY_ENTRIES
    assert segment.spilled + len(segment.entries) // 2 == RECORDS
    header = parse_header(_index_file(tmp_path).read_bytes())
    assert header == (STATE_OPEN, 0)  # never trusted by recovery
    log.close()


def test_every_offset_reads_back_across_the_moved_and_the_held_index(tmp_path: Path, one_segment):
    log = _fill(tmp_path, one_segment)
    moved = log._segments[-1].spilled

    for start, count in [(0, RECORDS), (moved - 3, 7), (moved, 1), (moved - 1, 2), (RECORDS - 5, 10)]:
        records = log.read(start, max_records=count, max_bytes=10**9)
        assert [record.offset for record in records] == list(range(start, min(start + count, RECORDS)))
        for record in records:
            assert_matches(record, record.offset)
    runs = log.read_runs(moved - 10, max_records=20, max_bytes=10**9)
    assert sum(len(run) for run in runs) == 20
    log.close()


def test_time_lookups_see_the_moved_and_the_held_index(tmp_path: Path, one_segment):
    log = _fill(tmp_path, one_segment)
    moved = log._segments[-1].spilled

    for offset in (0, 1, moved - 1, moved, moved + 1, RECORDS - 1):
        assert log.offset_for_timestamp(BASE_TIME_MS + offset) == offset
    assert log.offset_for_timestamp(BASE_TIME_MS + RECORDS) == RECORDS
    log.close()


@pytest.mark.parametrize("cut", [10, INDEX_MEMORY_ENTRIES, RECORDS - 3])
def test_truncation_inside_or_after_the_moved_index(tmp_path: Path, one_segment, cut: int):
    log = _fill(tmp_path, one_segment)
    log.truncate(cut)
    for number in range(cut, cut + 2 * INDEX_MEMORY_ENTRIES):
        log.append(make_record(number))
    log.flush()

    records = log.read(0, max_records=10**6, max_bytes=10**9)
    assert [record.offset for record in records] == list(range(cut + 2 * INDEX_MEMORY_ENTRIES))
    for record in records:
        assert_matches(record, record.offset)
    log.close()


def test_a_clean_close_writes_the_whole_index_and_the_next_open_trusts_it(tmp_path: Path, one_segment):
    _fill(tmp_path, one_segment).close()

    log = CommitLog("t", tmp_path, one_segment)
    assert log.recovery.indexes_rebuilt == 0 and log.recovery.records == RECORDS
    for number in range(RECORDS, RECORDS + 2 * INDEX_MEMORY_ENTRIES):  # appended again: moved again
        log.append(make_record(number))
    log.flush()
    records = log.read(0, max_records=10**6, max_bytes=10**9)
    assert len(records) == RECORDS + 2 * INDEX_MEMORY_ENTRIES
    for record in records:
        assert_matches(record, record.offset)
    log.close()


def test_after_a_crash_the_open_index_is_rebuilt_from_the_segment(tmp_path: Path, one_segment):
    crashed = _fill(tmp_path, one_segment)
    del crashed  # no close: the open index file is what the appends left

    log = CommitLog("t", tmp_path, one_segment)
    assert log.recovery.indexes_rebuilt == 1 and not log.recovery.repaired
    records = log.read(0, max_records=10**6, max_bytes=10**9)
    assert [record.offset for record in records] == list(range(RECORDS))
    log.close()


def test_a_rolled_segment_gets_its_whole_index(tmp_path: Path):
    config = LogConfig(segment_bytes=64 * 1024, tail_cache_records=4, retention_ms=None, segment_ms=None)
    log = _fill(tmp_path, config, count=2000)

    assert log.segment_count > 1
    records = log.read(0, max_records=10**6, max_bytes=10**9)
    assert [record.offset for record in records] == list(range(2000))
    log.close()
    reopened = CommitLog("t", tmp_path, config)
    assert reopened.recovery.indexes_rebuilt == 0
    reopened.close()


def test_memory_per_appended_record_of_an_active_segment_is_bounded(tmp_path: Path):
    config = LogConfig(tail_cache_records=16, tail_cache_bytes=64 * 1024, retention_ms=None, segment_ms=None)
    log = CommitLog("t", tmp_path, config)
    payload = b"x" * 100
    for _ in range(2000):  # warm: caches full, arrays at their working size
        log.append_message(payload, timestamp_ms=BASE_TIME_MS)
    log.flush()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    appended = 100_000
    for number in range(appended):
        log.append_message(payload, timestamp_ms=BASE_TIME_MS + number)
        if number % 500 == 499:
            log.flush(sync=False)
    log.flush(sync=False)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()

    assert log.segment_count == 1
    assert grown / appended < 1.0, f"{grown / appended:.2f} bytes per appended record"
    log.close()
