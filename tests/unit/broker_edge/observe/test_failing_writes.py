"""``FailingWrites``: a file's failing writes said once, then at most once per reminder interval, and once
more when a write works again."""

from __future__ import annotations

import logging

import pytest

from broker_edge.observe.refusal_log import FailingWrites


def test_failing_writes_are_said_once_reminded_once_a_minute_and_their_end_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    said = FailingWrites(
        logging.getLogger("test.writes"),
        "writing x",
        "/data/meta/x",
        "the last file stays",
        clock=lambda: now[0],
    )
    gone = FileNotFoundError(2, "No such file or directory")
    with caplog.at_level(logging.INFO, logger="test.writes"):
        said.succeeded()  # working all along: nothing to say
        for _ in range(60):  # a write a second for a minute
            said.failed(gone)
            now[0] += 1.0
        said.failed(gone)  # 60 s after the first line
        said.failed(gone)
        now[0] += 5.0
        said.succeeded()
        said.succeeded()
        said.failed(gone)  # failing again: said at once, however soon
    assert [(record.levelno, record.getMessage()) for record in caplog.records] == [
        (
            logging.ERROR,
            "writing x to /data/meta/x failed: [Errno 2] No such file or directory (the last file stays);"
            " said again at most every 60 s until it works again",
        ),
        (
            logging.ERROR,
            "writing x to /data/meta/x still fails, for 60 s now (60 failed writes since the last line):"
            " [Errno 2] No such file or directory",
        ),
        (logging.WARNING, "writing x to /data/meta/x works again, after failing for 65 s"),
        (
            logging.ERROR,
            "writing x to /data/meta/x failed: [Errno 2] No such file or directory (the last file stays);"
            " said again at most every 60 s until it works again",
        ),
    ]
