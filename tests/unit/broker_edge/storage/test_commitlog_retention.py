"""Retention deletes whole old segments by size and by age, never the active one, and moves the start."""

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


def _log(directory: Path, **limits) -> CommitLog:
    limits.setdefault("retention_ms", None)
    log = CommitLog("t", directory, LogConfig(segment_bytes=4096, **limits))
    for number in range(200):
        log.append(make_record(number))
    log.flush()
    return log


def test_retention_by_bytes_deletes_the_oldest_segments(tmp_path: Path):
    log = _log(tmp_path, retention_bytes=10_000)
    segments_before = segment_files(tmp_path)

    result = log.apply_retention(now_ms=BASE_TIME_MS)

    remaining = segment_files(tmp_path)
    assert result.segments_deleted == len(segments_before) - len(remaining) > 0
    assert log.size_bytes <= 10_000
    assert log.start_offset == int(remaining[0].stem) == result.start_offset
    assert len(log.read(log.start_offset, max_records=1000, max_bytes=10**9)) == 200 - log.start_offset
    log.close()


def test_reading_below_the_start_raises_with_the_current_bounds(tmp_path: Path):
    log = _log(tmp_path, retention_bytes=10_000)
    log.apply_retention(now_ms=BASE_TIME_MS)

    with pytest.raises(OffsetOutOfRange) as caught:
        log.read(0)

    assert caught.value.start == log.start_offset > 0
    assert caught.value.end == 200
    assert_matches(log.read(log.start_offset, max_records=1)[0], log.start_offset)
    log.close()


def test_retention_by_age_deletes_segments_whose_newest_record_is_too_old(tmp_path: Path):
    log = _log(tmp_path, retention_ms=1000)
    second_base = int(segment_files(tmp_path)[1].stem)
    third_base = int(segment_files(tmp_path)[2].stem)

    result = log.apply_retention(now_ms=BASE_TIME_MS + third_base - 1 + 1000)

    assert result.segments_deleted == 1
    assert log.start_offset == second_base
    log.close()


def test_the_active_segment_is_never_deleted(tmp_path: Path):
    log = _log(tmp_path, retention_bytes=1, retention_ms=1)

    log.apply_retention(now_ms=BASE_TIME_MS + 10**9)

    remaining = segment_files(tmp_path)
    assert len(remaining) == 1
    assert log.start_offset == int(remaining[0].stem)
    assert log.read(199, max_records=1)[0].offset == 199
    log.close()


def test_the_start_offset_survives_a_restart(tmp_path: Path):
    log = _log(tmp_path, retention_bytes=10_000)
    log.apply_retention(now_ms=BASE_TIME_MS)
    start = log.start_offset
    log.close()

    reopened = CommitLog("t", tmp_path, LogConfig(segment_bytes=4096))

    assert (reopened.start_offset, reopened.end_offset) == (start, 200)
    reopened.close()
