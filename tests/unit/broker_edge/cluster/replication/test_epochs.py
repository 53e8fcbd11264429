"""Leader epoch caches: where each epoch ends, truncation, the partition's journal, crash leftovers."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.cluster.replication.epochs import NO_EPOCH, EpochCache, LeaderEpochs
from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage.epoch_journal import EPOCHS_FILE, EpochJournal


def _cache(directory: Path, topic_id: int = 0) -> EpochCache:
    return EpochCache(EpochJournal(str(directory / EPOCHS_FILE)), topic_id)


def _load(directory: Path, log_end: int, topic_id: int = 0) -> EpochCache:
    return EpochCache.load(EpochJournal(str(directory / EPOCHS_FILE)), topic_id, log_end)


def test_end_offset_for_an_epoch_is_where_the_next_one_starts(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    assert cache.end_offset_for(3, 50) == (NO_EPOCH, 50)
    assert cache.assign(1, 0)
    assert cache.assign(3, 10)
    assert cache.assign(4, 25)
    assert not cache.assign(4, 30)  # the same epoch again: nothing to record
    assert not cache.assign(2, 30)  # an older one: never recorded
    assert cache.end_offset_for(1, 40) == (1, 10)
    assert cache.end_offset_for(2, 40) == (1, 10)  # unknown here: the largest older epoch ends at 10
    assert cache.end_offset_for(3, 40) == (3, 25)
    assert cache.end_offset_for(4, 40) == (4, 40)  # the latest ends at the log's end
    assert cache.end_offset_for(9, 40) == (4, 40)
    assert cache.end_offset_for(0, 40) == (NO_EPOCH, 0)
    assert cache.epoch_at(9) == 1 and cache.epoch_at(10) == 3 and cache.epoch_at(39) == 4
    assert cache.boundaries(12, 30) == [(3, 10), (4, 25)]
    assert cache.boundaries(26, 27) == [(4, 25)]


def test_assigning_at_the_start_of_the_previous_epoch_replaces_it(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    cache.assign(1, 0)
    cache.assign(2, 5)
    cache.assign(3, 5)  # epoch 2 appended nothing that is still here
    assert cache.entries == [(1, 0), (3, 5)]


def test_the_file_survives_a_reload_and_truncation_rewrites_it(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    cache.assign(1, 0)
    cache.assign(2, 10)
    cache.assign(5, 20)
    assert _load(tmp_path, 30).entries == [(1, 0), (2, 10), (5, 20)]
    cache.truncate_from(15)
    assert cache.entries == [(1, 0), (2, 10)]
    assert _load(tmp_path, 15).entries == [(1, 0), (2, 10)]
    assert not (tmp_path / (EPOCHS_FILE + ".tmp")).exists()


def test_loading_drops_epochs_starting_past_the_log_end(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    cache.assign(1, 0)
    cache.assign(2, 10)  # a crash after the log was cut to 8 and before its epochs were
    assert _load(tmp_path, 8).entries == [(1, 0)]
    assert _load(tmp_path, 8).entries == [(1, 0)]  # and the file says so now
    assert _load(tmp_path, 0).entries == []


def test_a_damaged_journal_is_logged_and_read_as_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / EPOCHS_FILE).write_text("1\n0 3 0 2 5\n")
    assert _load(tmp_path, 10).entries == []
    assert "do not increase" in caplog.text
    (tmp_path / EPOCHS_FILE).write_text("")  # renamed before its data reached the disk
    assert _load(tmp_path, 10).entries == []
    assert "not a leader epoch journal" in caplog.text


def test_the_topics_of_a_partition_share_its_journal_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    first, second = _cache(tmp_path, 0), _cache(tmp_path, 7)
    first.assign(1, 0)
    second.assign(2, 3)
    first.assign(4, 9)
    with open(tmp_path / EPOCHS_FILE, "a", encoding="ascii") as journal:
        journal.write("7 5 1")  # the crash came in the middle of a line
    assert _load(tmp_path, 20, 0).entries == [(1, 0), (4, 9)]
    assert _load(tmp_path, 20, 7).entries == [(2, 3)]
    assert _load(tmp_path, 20, 3).entries == []


def test_a_journal_of_many_changes_is_folded_when_read(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    for epoch in range(1, 1500):
        cache.assign(epoch, epoch)
    cache.truncate_from(3)
    assert _load(tmp_path, 100).entries == [(1, 1), (2, 2)]
    assert len((tmp_path / EPOCHS_FILE).read_text().splitlines()) == 2  # the version and one line


def test_leader_epochs_truncate_the_log_and_its_epochs_together(tmp_path: Path) -> None:
    store = LogStore(tmp_path / "store", StorageConfig(durability="none"))
    store.open()
    store.append_batch("t", [(b"x", 1, False, "c", (), None, None, None, None, None)] * 12)
    store.flush()
    epochs = LeaderEpochs(store)
    assert epochs.latest_epoch("t") == NO_EPOCH
    assert epochs.latest_epoch("absent") == NO_EPOCH
    epochs.for_topic("t").assign(1, 0)
    epochs.for_topic("t").assign(2, 8)
    epochs.truncate("t", 6)
    assert store.durable_end("t") == 6
    assert epochs.for_topic("t").entries == [(1, 0)]
    epochs.restart_at("t", 40)
    assert epochs.latest_epoch("t") == NO_EPOCH
    assert store.log_info("t").start_offset == 40
    store.close()
