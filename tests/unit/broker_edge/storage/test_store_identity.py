"""The store's identity (``meta/STORE_ID``): made once with a data directory, kept across restarts, made at
the first open of a directory from an earlier version, and never left half written by a crash."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from broker_edge.storage import LogStore
from broker_edge.storage.store_identity import STORE_ID_FILE, ensure_store_id, read_store_id
from tests.unit.broker_edge.storage.log_helpers import make_record


def opened(root: Path) -> LogStore:
    store = LogStore(root)
    store.open()
    return store


def test_a_new_directory_gets_an_id_that_restarts_keep(tmp_path: Path) -> None:
    store = opened(tmp_path)
    store_id = store.store_id
    assert store_id is not None and len(store_id) == 32 and int(store_id, 16) >= 0
    assert (tmp_path / "meta" / STORE_ID_FILE).read_text() == store_id + "\n"
    store.append("a/b", make_record(1))
    store.close()
    for _ in range(2):
        again = opened(tmp_path)
        assert again.store_id == store_id
        again.close()
    assert not (tmp_path / "meta" / (STORE_ID_FILE + ".tmp")).exists()


def test_a_wiped_directory_is_a_new_store(tmp_path: Path) -> None:
    first = opened(tmp_path / "a")
    second = opened(tmp_path / "b")
    assert first.store_id != second.store_id
    first.close()
    second.close()


def test_a_store_from_an_earlier_version_gets_an_id_once(tmp_path: Path) -> None:
    store = opened(tmp_path)
    store.append("a/b", make_record(1))
    store.close()
    (tmp_path / "meta" / STORE_ID_FILE).unlink()  # as a broker before identities left its directory

    made = opened(tmp_path)
    assert made.store_id is not None
    assert [record.offset for record in made.read("a/b", 0)] == [0]
    made.close()
    kept = opened(tmp_path)
    assert kept.store_id == made.store_id
    kept.close()


def test_a_crash_before_the_rename_leaves_no_id_and_the_next_open_makes_one(tmp_path: Path) -> None:
    meta = tmp_path / "meta"
    meta.mkdir()
    (meta / (STORE_ID_FILE + ".tmp")).write_text("0123")  # torn: the crash came while it was written
    assert read_store_id(str(meta)) is None
    store_id = ensure_store_id(str(meta))
    assert read_store_id(str(meta)) == store_id
    assert sorted(os.listdir(meta)) == [STORE_ID_FILE]  # the rename replaced the torn file
    assert ensure_store_id(str(meta)) == store_id


def test_the_id_is_written_durably_before_it_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        synced.append("fsync")
        real_fsync(fd)

    def rename(source: str, target: str) -> None:
        synced.append("rename")
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", rename)
    ensure_store_id(str(tmp_path))
    assert synced == ["fsync", "rename", "fsync"]  # the file, then the directory


def test_a_damaged_id_is_replaced_and_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / STORE_ID_FILE).write_text("not an id\n")
    with caplog.at_level(logging.ERROR):
        store_id = ensure_store_id(str(tmp_path))
    assert "is damaged" in caplog.text
    assert read_store_id(str(tmp_path)) == store_id


def test_an_opened_store_without_records_keeps_its_id(tmp_path: Path) -> None:
    store = opened(tmp_path)
    store_id = store.store_id
    store.close()
    assert os.listdir(tmp_path / "log")  # what the next open tells from a wiped log
    again = opened(tmp_path)
    assert again.store_id == store_id
    again.close()


@pytest.mark.parametrize("wipe", ["deleted", "emptied"])
def test_a_store_whose_log_was_wiped_gets_a_new_id_and_says_so(
    tmp_path: Path, wipe: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = opened(tmp_path)
    store.append("a/b", make_record(1))
    old_id = store.store_id
    store.close()
    log_directory = tmp_path / "log"
    if wipe == "deleted":
        shutil.rmtree(log_directory)
    else:
        for entry in log_directory.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    with caplog.at_level(logging.WARNING, logger="broker_edge.storage.store_identity"):
        again = opened(tmp_path)
    assert again.store_id is not None and again.store_id != old_id
    assert again.append("a/b", make_record(2)) == 0  # offsets start again: readers must see a new store
    assert f"names store {old_id}" in caplog.text and "new store id" in caplog.text
    again.close()
    kept = opened(tmp_path)
    assert kept.store_id == again.store_id
    kept.close()


def test_a_wiped_log_without_its_layout_file_is_a_new_store_keeping_the_brokers_files(tmp_path: Path) -> None:
    """``log/`` emptied and ``meta/LAYOUT`` deleted: ``meta/`` is still the broker's (its ``STORE_ID``), so
    the start goes on with a new store, where it was refused as someone else's directory."""
    store = opened(tmp_path)
    store.append("a/b", make_record(1))
    old_id = store.store_id
    store.close()
    shutil.rmtree(tmp_path / "log")
    (tmp_path / "log").mkdir()
    (tmp_path / "meta" / "LAYOUT").unlink()
    (tmp_path / "meta" / "sessions.json").write_text("{}")

    again = opened(tmp_path)
    assert again.store_id != old_id
    assert (tmp_path / "meta" / "LAYOUT").read_text() == "3\n"
    assert (tmp_path / "meta" / "sessions.json").read_text() == "{}"
    again.close()
