"""LogStore.open: a clean shutdown is told apart from a crash, and a crash's torn tails are repaired."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage.store import CLEAN_SHUTDOWN_MARKER
from tests.unit.broker_edge.storage.log_helpers import (
    assert_matches,
    frame_positions,
    make_record,
    segment_files,
)


def _filled(directory: Path) -> LogStore:
    store = LogStore(directory, StorageConfig())
    store.open()
    for number in range(20):
        store.append("a/b", make_record(number))
        store.append("c", make_record(number))
    store.flush()
    return store


def test_a_clean_shutdown_is_recognised_once(tmp_path: Path):
    _filled(tmp_path).close()

    first = LogStore(tmp_path)
    report = first.open()

    assert report.clean_shutdown
    assert not (tmp_path / "meta" / CLEAN_SHUTDOWN_MARKER).exists()
    assert (report.logs, report.records, report.repaired) == (2, 40, [])
    assert LogStore(tmp_path).open().clean_shutdown is False  # `first` never closed: a crash


def test_after_a_crash_torn_tails_are_repaired_and_reported(tmp_path: Path):
    _filled(tmp_path)  # never closed
    tail = segment_files(tmp_path / "topics" / "a%2Fb")[-1]
    os.truncate(tail, frame_positions(tail)[-1] + 5)

    store = LogStore(tmp_path)
    report = store.open()

    assert not report.clean_shutdown
    assert [(log.topic, log.bytes_dropped) for log in report.repaired] == [("a/b", 5)]
    assert report.records == 39
    assert store.log_info("a/b").end_offset == 19
    assert store.append("a/b", make_record(19)) == 19
    store.flush()
    assert_matches(store.read("a/b", 19)[0], 19)
    store.close()


def test_foreign_directories_are_skipped(tmp_path: Path):
    _filled(tmp_path).close()
    (tmp_path / "topics" / "lost+found").mkdir()
    (tmp_path / "topics" / "abc~deadbeef").mkdir()  # a hashed name without its TOPIC file

    store = LogStore(tmp_path)
    report = store.open()

    assert sorted(Path(path).name for path in report.skipped_directories) == ["abc~deadbeef", "lost+found"]
    assert [info.topic for info in store.logs()] == ["a/b", "c"]
    store.close()


def test_a_new_directory_is_a_fresh_start_not_a_repair(tmp_path: Path, caplog):
    caplog.set_level(logging.INFO, logger="broker_edge.storage")

    store = LogStore(tmp_path / "new")
    report = store.open()
    store.close()

    assert report.fresh and not report.clean_shutdown
    assert (report.logs, report.repaired, report.bytes_dropped) == (0, [], 0)
    messages = [record.getMessage() for record in caplog.records]
    assert any("new store" in message for message in messages)
    assert not any("unclean" in message for message in messages)
    assert LogStore(tmp_path / "new").open().fresh is False  # the clean close left its marker


def test_a_repair_is_logged_with_its_counts(tmp_path: Path, caplog):
    _filled(tmp_path)  # never closed
    tail = segment_files(tmp_path / "topics" / "c")[-1]
    os.truncate(tail, frame_positions(tail)[-1] + 3)
    caplog.set_level(logging.INFO, logger="broker_edge.storage")

    store = LogStore(tmp_path)
    report = store.open()

    assert not report.fresh
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("kept 19 records, dropped 3 bytes" in message for message in warnings)
    assert any(
        "opened 2 logs (39 records)" in message and "1 repaired, 3 bytes dropped" in message
        for message in warnings
    )
    assert any("unclean" in message for message in warnings)
    store.close()
