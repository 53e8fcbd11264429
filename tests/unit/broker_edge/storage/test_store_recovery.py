"""LogStore.open: a clean shutdown is told apart from a crash, a crash's torn tails are repaired, and only
what was not checkpointed is scanned."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage.store import CLEAN_SHUTDOWN_MARKER
from tests.unit.broker_edge.storage.log_helpers import (
    assert_matches,
    entry_positions,
    make_record,
    partition_segments,
)


def _filled(directory: Path, count: int = 20, **settings) -> LogStore:
    store = LogStore(directory, StorageConfig(**settings))
    store.open()
    for number in range(count):
        store.append("a/b", make_record(number))
        store.append("c", make_record(number))
        store.flush()
    return store


def test_a_clean_shutdown_is_recognised_once_and_nothing_is_scanned_after_it(tmp_path: Path):
    _filled(tmp_path).close()

    first = LogStore(tmp_path)
    report = first.open()

    assert report.clean_shutdown
    assert not (tmp_path / "meta" / CLEAN_SHUTDOWN_MARKER).exists()
    assert (report.logs, report.records, report.repaired) == (2, 40, [])
    assert (report.records_scanned, report.indexes_rebuilt) == (
        0,
        0,
    )  # the indexes written at close are trusted
    assert LogStore(tmp_path).open().clean_shutdown is False  # `first` never closed: a crash


def test_after_a_crash_a_torn_tail_is_cut_and_appends_continue(tmp_path: Path):
    _filled(tmp_path)  # never closed
    tail = partition_segments(tmp_path)[-1]
    os.truncate(tail, entry_positions(tail)[-1] + 5)  # the last entry ("c", record 19) torn

    store = LogStore(tmp_path)
    report = store.open()

    assert not report.clean_shutdown
    assert [(repair.partition, repair.bytes_dropped) for repair in report.repaired] == [(0, 5)]
    assert report.records == 39
    assert store.log_info("c").end_offset == 19
    assert store.log_info("a/b").end_offset == 20
    assert store.append("c", make_record(19)) == 19
    store.flush()
    assert_matches(store.read("c", 19)[0], 19)
    assert_matches(store.read("a/b", 19)[0], 19)
    store.close()


def test_after_a_crash_only_what_follows_the_last_checkpoint_is_scanned(tmp_path: Path):
    store = _filled(tmp_path, count=400, index_checkpoint_bytes=4096)  # never closed
    records_per_checkpoint = 4096 * 800 // store.partition_logs[0].segments[-1].durable_size + 1

    report = LogStore(tmp_path).open()

    assert report.records == 800
    assert report.records_scanned <= records_per_checkpoint + 2  # not 800: what the open index had is trusted


def test_leftovers_of_interrupted_writes_are_removed_and_other_files_left_alone(tmp_path: Path):
    _filled(tmp_path).close()
    partition = tmp_path / "log" / "00"
    (partition / "00000000000000000007.index.tmp").write_bytes(b"half an index")
    (partition / "00000000000000000009.index").write_bytes(b"an index without its segment")
    (partition / "README").write_text("notes of an operator")

    store = LogStore(tmp_path)
    store.open()

    assert not (partition / "00000000000000000007.index.tmp").exists()
    assert not (partition / "00000000000000000009.index").exists()
    assert (partition / "README").read_text() == "notes of an operator"
    assert [info.topic for info in store.logs()] == ["a/b", "c"]
    store.close()


def test_a_torn_catalog_entry_drops_the_topic_that_was_never_acknowledged(tmp_path: Path):
    store = _filled(tmp_path, count=3)
    store.append("new/topic", make_record(0))
    store.flush()
    catalog = tmp_path / "log" / "catalog"
    os.truncate(catalog, catalog.stat().st_size - 2)  # its entry torn (its record went with the same job)

    reopened = LogStore(tmp_path)
    report = reopened.open()

    assert "new/topic" not in reopened
    assert [info.topic for info in reopened.logs()] == ["a/b", "c"]
    assert report.bytes_dropped > 0
    assert reopened.append("new/topic", make_record(5)) == 0  # created again, from offset 0
    reopened.close()


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
    tail = partition_segments(tmp_path)[-1]
    os.truncate(tail, entry_positions(tail)[-1] + 3)
    caplog.set_level(logging.INFO, logger="broker_edge.storage")

    store = LogStore(tmp_path)
    report = store.open()

    assert not report.fresh
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("(torn): dropped 3 bytes" in message for message in warnings)
    assert any(
        "opened 2 logs (39 records)" in message and "1 repaired, 3 bytes dropped" in message
        for message in warnings
    )
    assert any("unclean" in message for message in warnings)
    store.close()


def test_a_truncation_of_records_whose_seal_a_crash_undid_counts_their_bytes_once(tmp_path: Path):
    """The marker says it cut bytes from a sealed segment; after the crash that segment is sealed again
    without the cut records, so replaying the marker must not take their bytes off a second time."""
    config = StorageConfig(segment_bytes=4096, retention_ms=None)
    store = LogStore(tmp_path, config)
    store.open()
    for number in range(5):
        store.append("cut", make_record(number))
    number = 0
    while len(store.partition_logs[0].segments) < 2:
        store.append("other", make_record(number))
        store.flush()
        number += 1
    store.wait_sealed()
    store.replicated_log.truncate_to("cut", 0)
    store.file_pool.close()  # a crash, before any snapshot counted the first seal
    os.unlink(partition_segments(tmp_path, suffix=".index")[0])

    for _restart in range(2):
        reopened = LogStore(tmp_path, config)
        reopened.open()
        assert reopened.log_info("cut").bytes == 0
        assert reopened.log_info("other").bytes == sum(
            len(record.frame) for record in reopened.read("other", 0, 10_000, 1 << 30)
        )
        reopened.close()
