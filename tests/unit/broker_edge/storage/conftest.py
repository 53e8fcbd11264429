"""Fixtures of the storage tests: small segments, and a flushed log spanning several of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_edge.storage import CommitLog, LogConfig
from tests.unit.broker_edge.storage.log_helpers import make_record


@pytest.fixture
def small_segments() -> LogConfig:
    """Segments of ~4 KiB so a few dozen records span several segments."""
    return LogConfig(segment_bytes=4096, tail_cache_records=8, tail_cache_bytes=2048, retention_ms=None)


@pytest.fixture
def filled_log(tmp_path: Path, small_segments: LogConfig) -> Iterator[CommitLog]:
    """A flushed log of 200 records over several segments."""
    log = CommitLog("plant/line-1/temp", tmp_path / "log", small_segments)
    for number in range(200):
        log.append(make_record(number))
    log.flush()
    yield log
    log.close()
