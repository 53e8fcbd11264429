"""The store's identity (``meta/STORE_ID``): made once with a data directory, kept across restarts, made at
the first open of a directory from an earlier version, and never left half written by a crash."""

from __future__ import annotations

import logging
import os
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
