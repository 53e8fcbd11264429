"""``LogSummary``: one line per interval per kind, the repeats left out counted in the next line."""

from __future__ import annotations

import logging

import pytest

from broker_edge.observe.refusal_log import LogSummary


def test_repeats_within_the_interval_are_left_out_and_counted_in_the_next_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    summary = LogSummary(logging.getLogger("test.summary"), interval_s=5.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="test.summary"):
        for _ in range(44):  # a fenced broker refusing every batch in one millisecond
            summary.log(logging.WARNING, "replication_failed", "%d publishes refused", 3)
        summary.log(logging.WARNING, "log_failed", "other kind")
        now[0] += 5.0
        summary.log(logging.WARNING, "replication_failed", "%d publishes refused", 2)
    assert [record.getMessage() for record in caplog.records] == [
        "3 publishes refused",
        "other kind",
        "2 publishes refused (and 43 more like it since the last such line)",
    ]
    assert {record.levelno for record in caplog.records} == {logging.WARNING}
