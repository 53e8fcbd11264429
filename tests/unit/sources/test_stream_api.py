"""Which Spark gives Python streaming sources admission control, and the notice where it does not."""

from __future__ import annotations

import logging

import pytest

from sources.stream_api import BatchStarts, admission_control, note_spark_version


@pytest.mark.parametrize(
    ("version", "has_it"),
    [
        ("4.0.0", False),
        ("4.0.5", False),
        ("4.1.4", False),
        ("4.2.0", True),
        ("4.3.0", True),
        ("5.0.0-preview1", True),
    ],
)
def test_admission_control_came_with_spark_4_2(version: str, has_it: bool) -> None:
    assert admission_control(version) is has_it


def test_an_older_spark_is_noted_once_with_what_degrades(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="sources.stream_api"):
        assert note_spark_version("4.0.9") is False
        assert note_spark_version("4.0.9") is False
        assert note_spark_version("4.3.0") is True
    (notice,) = [record.getMessage() for record in caplog.records]
    assert notice.startswith(
        "Spark 4.0.9 gives Python streaming sources neither their batch start nor a read"
    )
    assert "maxRecordsPerTrigger" in notice and "availableNow run reads at most one such batch" in notice


def test_batch_starts_begin_at_the_initial_offset_then_follow_the_ends() -> None:
    starts = BatchStarts()
    assert starts.start(lambda: {"version": 0}) == {"version": 0}
    starts.ended({"version": 4})
    assert starts.start(lambda: {"version": 0}) == {"version": 4}
