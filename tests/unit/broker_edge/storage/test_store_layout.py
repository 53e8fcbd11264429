"""The data directory's layout: partition logs under ``log/``, the store's files under ``meta/``; the move of
a layout-1 directory (logs and files side by side) forward, which a crash at any step leaves resumable."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from broker_edge.storage import LogStore
from broker_edge.storage.clock import CLOCK_REFERENCE_FILE
from broker_edge.storage.layout import open_layout
from tests.unit.broker_edge.storage.layout2 import SESSIONS, as_layout_1, write_layout_2
from tests.unit.broker_edge.storage.log_helpers import assert_matches, make_record

TOPICS = ["a/b", "topics", "meta", "sessions.json.tmp", "log"]


def older_directory(root: Path) -> None:
    """A data directory as brokers before ``meta/`` left it after a clean stop (logs and files together)."""
    write_layout_2(root, {topic: [make_record(number)] for number, topic in enumerate(TOPICS)})
    as_layout_1(root)


def assert_moved_whole(root: Path) -> None:
    store = LogStore(root)
    report = store.open()
    assert sorted(path.name for path in root.iterdir()) == ["log", "meta"]
    moved = sorted(path.name for path in (root / "meta").iterdir() if path.name != CLOCK_REFERENCE_FILE)
    assert moved == ["LAYOUT", "STORE_ID", "sessions.json"]  # (the clock's reference: a close's own)
    assert (root / "meta" / "LAYOUT").read_text() == "3\n"
    assert (root / "meta" / "sessions.json").read_text() == SESSIONS
    assert report.clean_shutdown  # the marker was carried over (and read: an open removes it)
    assert sorted(info.topic for info in store.logs()) == sorted(TOPICS)
    for number, topic in enumerate(TOPICS):
        assert_matches(store.read(topic, 0)[0], number, offset=0)
    store.close()


def test_a_new_directory_gets_the_layout(tmp_path: Path):
    layout = open_layout(tmp_path / "data")
    assert sorted(os.listdir(layout.root)) == ["log", "meta"]
    assert os.listdir(layout.log) == []
    assert Path(layout.meta_file("LAYOUT")).read_text() == "3\n"


def test_an_older_directory_is_moved_with_every_log_and_file(tmp_path: Path):
    older_directory(tmp_path)
    assert_moved_whole(tmp_path)


@pytest.mark.parametrize("renames_before_the_crash", range(14))
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
    store = LogStore(tmp_path)
    with contextlib.suppress(OSError):
        store.open()  # the move into layout 2, then the upgrade: a crash at any of their renames
        store.close()  # (past the last rename: the move was whole)
    monkeypatch.setattr(os, "rename", real_rename)
    assert_moved_whole(tmp_path)


@pytest.mark.parametrize("lost", ["meta/LAYOUT", "meta/"])
def test_a_directory_of_partition_logs_whose_layout_file_is_gone_keeps_every_record(
    tmp_path: Path, lost: str, caplog
):
    store = LogStore(tmp_path)
    store.open()
    for number in range(30):
        store.append("a/b", make_record(number))
        store.append("log", make_record(number))
    store.close()
    if lost == "meta/":
        for path in (tmp_path / "meta").iterdir():
            path.unlink()
        (tmp_path / "meta").rmdir()
    else:
        (tmp_path / "meta" / "LAYOUT").unlink()

    reopened = LogStore(tmp_path)
    reopened.open()

    assert "holds partition logs" in caplog.text and "written again" in caplog.text
    assert (tmp_path / "meta" / "LAYOUT").read_text() == "3\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["log", "meta"]
    for topic in ("a/b", "log"):
        records = reopened.read(topic, 0, max_records=100)
        assert [record.offset for record in records] == list(range(30))
        for number, record in enumerate(records):
            assert_matches(record, number)
    assert reopened.append("a/b", make_record(30)) == 30
    reopened.close()


def others_files(root: Path) -> dict[str, bytes]:
    """What someone else keeps in the directory given as the data directory: a key among certificates, a
    backup, a mount point's ``lost+found``, an empty directory and a file of notes."""
    (root / "certs").mkdir(parents=True)
    (root / "certs" / "server.key").write_bytes(b"-----BEGIN PRIVATE KEY-----\n")
    (root / "backups" / "2026").mkdir(parents=True)
    (root / "backups" / "2026" / "store.tar").write_bytes(b"tar")
    (root / "lost+found").mkdir()
    (root / "empty").mkdir()
    (root / "NOTES").write_text("ours")
    return {
        str(path.relative_to(root)): path.read_bytes() if path.is_file() else b"<dir>"
        for path in sorted(root.rglob("*"))
    }


def left_alone(root: Path, before: dict[str, bytes]) -> None:
    for name, content in before.items():
        path = root / name
        assert path.exists(), f"{name} was moved or deleted"
        assert (path.read_bytes() if path.is_file() else b"<dir>") == content


def test_a_first_start_in_a_directory_of_other_files_leaves_them_where_they_are(tmp_path: Path, caplog):
    """A data directory given where other things are kept: a directory of those is no topic log of an
    older layout (it has no segment file), so nothing is moved into ``topics/`` and deleted with it, where
    ``certs/`` and ``backups/`` were deleted and ``lost+found`` moved."""
    before = others_files(tmp_path)
    store = LogStore(tmp_path)
    store.open()
    store.append("a/b", make_record(0))
    store.close()
    store = LogStore(tmp_path)
    store.open()
    assert_matches(store.read("a/b", 0)[0], 0, offset=0)
    store.close()
    left_alone(tmp_path, before)
    assert not (tmp_path / "topics").exists()
    assert "layout" not in caplog.text, "nothing was moved: no upgrade to speak of"


def test_an_older_directory_beside_other_files_moves_its_logs_and_leaves_the_rest(tmp_path: Path):
    older_directory(tmp_path)
    before = others_files(tmp_path / "others")
    for path in (tmp_path / "others").iterdir():
        path.rename(tmp_path / path.name)
    (tmp_path / "others").rmdir()
    before = {name.removeprefix("others/"): content for name, content in before.items()}
    store = LogStore(tmp_path)
    store.open()
    assert sorted(info.topic for info in store.logs()) == sorted(TOPICS)
    for number, topic in enumerate(TOPICS):
        assert_matches(store.read(topic, 0)[0], number, offset=0)
    store.close()
    left_alone(tmp_path, before)


@pytest.mark.parametrize("name", ["log", "meta"])
def test_a_log_or_meta_directory_of_someone_elses_is_not_taken_over(tmp_path: Path, name: str):
    """A first start where ``log/`` or ``meta/`` holds others' files: refused, naming it, where the
    partition logs or the broker's files were put among them."""
    (tmp_path / name).mkdir()
    (tmp_path / name / "app.log").write_text("theirs")
    with pytest.raises(OSError, match=rf"{name} is not the broker's \(it holds app\.log\)"):
        LogStore(tmp_path).open()
    assert sorted(path.name for path in tmp_path.rglob("*")) == sorted([name, "app.log"])


@pytest.mark.parametrize(
    "damaged", [b"", b"\x00\x00\x00\x00", b"\xff\xfe3\n", b"3\x00\n"], ids=["empty", "zeroed", "bytes", "nul"]
)
def test_a_damaged_layout_file_beside_partition_logs_is_written_again_and_every_record_kept(
    tmp_path: Path, damaged: bytes, caplog
):
    """``meta/LAYOUT`` emptied or overwritten by a bad disk: until 2026-12-01 the start stopped (`unknown
    data directory layout ''`, naming no file) or failed with a ``UnicodeDecodeError`` traceback, where a
    missing one is written again. A file that names no version is now damaged and written again as a
    missing one is (with partition logs beside it), said at WARNING."""
    store = LogStore(tmp_path)
    store.open()
    for number in range(10):
        store.append("a/b", make_record(number))
    store.close()
    (tmp_path / "meta" / "LAYOUT").write_bytes(damaged)

    reopened = LogStore(tmp_path)
    reopened.open()

    assert f"{tmp_path / 'meta' / 'LAYOUT'} is damaged" in caplog.text and "written again" in caplog.text
    assert (tmp_path / "meta" / "LAYOUT").read_text() == "3\n"
    assert [record.offset for record in reopened.read("a/b", 0, max_records=100)] == list(range(10))
    reopened.close()


@pytest.mark.parametrize("content", [b"9\n", b"\xff\xfe"], ids=["a later version", "damaged"])
def test_a_layout_file_this_version_cannot_read_stops_the_start_naming_it(tmp_path: Path, content: bytes):
    """A later version's layout is not this version's to touch; nor is a damaged file beside no partition
    log (what else the directory holds is not known): the start stops with an `OSError` naming the file."""
    store = LogStore(tmp_path)
    store.open()
    store.append("a/b", make_record(0))
    store.close()
    layout = tmp_path / "meta" / "LAYOUT"
    layout.write_bytes(content)
    if content != b"9\n":
        for path in (tmp_path / "log").rglob("*"):
            if path.is_file():
                path.unlink()
        for path in sorted((tmp_path / "log").rglob("*"), reverse=True):
            path.rmdir()
        (tmp_path / "log").rmdir()

    with pytest.raises(OSError, match=f"^{layout}: "):
        LogStore(tmp_path).open()
    assert layout.read_bytes() == content
