"""The data directory's layout: topic logs under ``topics/``, the store's files under ``meta/``, and the move
of an older directory (both side by side) into it, which a crash at any step leaves resumable."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from broker_edge.storage import LogStore
from broker_edge.storage.layout import open_layout
from tests.unit.broker_edge.storage.log_helpers import assert_matches, make_record

TOPICS = ["a/b", "topics", "meta", "sessions.json.tmp"]


def older_directory(root: Path) -> None:
    """A data directory as brokers before ``meta/`` left it after a clean stop (logs and files together)."""
    store = LogStore(root)
    store.open()
    for number, topic in enumerate(TOPICS):
        store.append(topic, make_record(number))
    store.close()
    (root / "meta" / "sessions.json").write_text('{"kept": true}')
    as_older_layout(root)


def as_older_layout(root: Path) -> None:
    """Rearrange a data directory the way brokers before ``meta/`` kept it: every topic log directory and
    the store's files (``CLEAN_SHUTDOWN``, ``sessions.json``) side by side at the top."""
    (root / "topics").rename(root / "new-topics")  # old logs may be called "topics" or "meta" themselves
    (root / "meta").rename(root / "new-meta")
    for log_directory in (root / "new-topics").iterdir():
        log_directory.rename(root / log_directory.name)
    for name in ("CLEAN_SHUTDOWN", "sessions.json"):
        if (root / "new-meta" / name).exists():
            (root / "new-meta" / name).rename(root / name)
    (root / "new-meta" / "LAYOUT").unlink()
    (root / "new-meta").rmdir()
    (root / "new-topics").rmdir()


def assert_moved_whole(root: Path) -> None:
    open_layout(root)
    assert sorted(path.name for path in root.iterdir()) == ["meta", "topics"]
    assert sorted(path.name for path in (root / "meta").iterdir()) == [
        "CLEAN_SHUTDOWN",
        "LAYOUT",
        "sessions.json",
    ]
    assert (root / "meta" / "sessions.json").read_text() == '{"kept": true}'
    store = LogStore(root)
    report = store.open()
    assert report.clean_shutdown
    assert sorted(info.topic for info in store.logs()) == sorted(TOPICS)
    for number, topic in enumerate(TOPICS):
        assert_matches(store.read(topic, 0)[0], number, offset=0)
    store.close()


def test_a_new_directory_gets_the_layout(tmp_path: Path):
    layout = open_layout(tmp_path / "data")
    assert sorted(os.listdir(layout.root)) == ["meta", "topics"]
    assert os.listdir(layout.topics) == []
    assert Path(layout.meta_file("LAYOUT")).read_text() == "2\n"


def test_an_older_directory_is_moved_with_every_log_and_file(tmp_path: Path):
    older_directory(tmp_path)
    assert_moved_whole(tmp_path)


@pytest.mark.parametrize("renames_before_the_crash", range(12))
def test_a_move_interrupted_at_any_rename_is_finished_by_the_next_start(
    tmp_path: Path, monkeypatch, renames_before_the_crash: int
):
    older_directory(tmp_path)
    real_rename = os.rename
    done: list[str] = []

    def crashing_rename(source, target):
        if len(done) == renames_before_the_crash:
            raise OSError("power cut")
        done.append(source)
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", crashing_rename)
    with contextlib.suppress(OSError):
        open_layout(tmp_path)
    monkeypatch.setattr(os, "rename", real_rename)
    assert_moved_whole(tmp_path)
