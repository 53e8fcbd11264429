"""A disk the log filled is freed by retention itself: the snapshot that must be durable before segments go is
written into the space of the disk reserve, released for it (``storage.disk_reserve``).

The "disk" here is full for the snapshot's writes and for making the reserve, as the kernel answers ENOSPC,
until a file is deleted: the reserve, or a segment retention gave up. The real calls run otherwise.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from pathlib import Path

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.settings.broker import BrokerConfig
from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage import sealer as sealer_module
from broker_edge.storage.disk_reserve import RESERVE_FILE
from broker_edge.storage.topic_table import SNAPSHOT_FILE
from tests.unit.broker_edge.storage.log_helpers import BASE_TIME_MS, make_record, partition_segments

TOPIC = "site/gateway-3/temp"
RECORDS = 200


class FullDisk:
    """While ``full``: the snapshot's temporary file takes no byte and no block is preallocated; deleting any
    file of the store gives space back."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, log_directory: Path) -> None:
        self.full = False
        self.refused = 0
        temporary = str(log_directory / SNAPSHOT_FILE) + ".tmp"
        real_write, real_fallocate, real_unlink = os.write, os.posix_fallocate, os.unlink

        def write(fd: int, data) -> int:
            if self.full and os.readlink(f"/proc/self/fd/{fd}") == temporary:
                self.refused += 1
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, data)

        def fallocate(fd: int, offset: int, length: int) -> None:
            if self.full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_fallocate(fd, offset, length)

        def unlink(path, *args, **kwargs) -> None:
            real_unlink(path, *args, **kwargs)
            if str(path).startswith(str(log_directory)) and not str(path).endswith(".tmp"):
                self.full = False

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(os, "posix_fallocate", fallocate)
        monkeypatch.setattr(os, "unlink", unlink)


def _filled(directory: Path, **config) -> LogStore:
    store = LogStore(
        directory, StorageConfig(segment_bytes=4096, retention_ms=None, retention_bytes=10_000, **config)
    )
    store.open()
    for number in range(RECORDS):
        store.append(TOPIC, make_record(number))
    store.flush()
    return store


def _retention(store: LogStore) -> int:
    """One retention pass as the broker runs it (the sealer in its thread); the segments it gave up."""

    async def scenario() -> int:
        report = store.apply_retention(now_ms=BASE_TIME_MS)
        assert store._sealer is not None
        store._sealer.wait_idle()
        return report.segments_deleted

    return asyncio.run(scenario())


def test_a_full_disk_releases_the_reserve_for_the_snapshot_and_retention_frees_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    reserve = tmp_path / "log" / RESERVE_FILE
    store = _filled(tmp_path, disk_reserve_bytes=64 * 1024)
    assert reserve.stat().st_blocks * 512 >= 64 * 1024, "made at the first seal"
    segments = len(partition_segments(tmp_path))
    disk = FullDisk(monkeypatch, tmp_path / "log")
    disk.full = True

    with caplog.at_level(logging.WARNING, logger=sealer_module.__name__):
        deleted = _retention(store)

    assert deleted > 0 and disk.refused == 1
    assert len(partition_segments(tmp_path)) == segments - deleted, "the files are gone, not only counted"
    assert store._sealer is not None and store._sealer.failure is None and not store._sealer.deletions_waiting
    assert "disk reserve" in caplog.text and f"retention deletes {deleted} segments" in caplog.text
    assert reserve.exists(), "made again once the segments gave their space back"
    start = store.start_offset(TOPIC)
    assert start > 0
    store.close()

    reopened = LogStore(tmp_path, StorageConfig(segment_bytes=4096, retention_ms=None))
    reopened.open()
    assert reopened.start_offset(TOPIC) == start
    records = reopened.read(TOPIC, start, max_records=RECORDS, max_bytes=1 << 20)
    assert [r.offset for r in records] == list(range(start, RECORDS))
    assert reopened.append(TOPIC, make_record(RECORDS)) == RECORDS, "offsets go on where they were"
    reopened.close()


def test_without_a_reserve_the_segments_wait_and_go_at_a_pass_after_space_came_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(sealer_module, "SHORTAGE_PATIENCE_S", 0.05)
    store = _filled(tmp_path, disk_reserve_bytes=0)
    assert not (tmp_path / "log" / RESERVE_FILE).exists()
    segments = len(partition_segments(tmp_path))
    disk = FullDisk(monkeypatch, tmp_path / "log")
    disk.full = True

    deleted = _retention(store)

    assert deleted > 0 and disk.refused > 1, "tried again until its patience ran out"
    assert store._sealer is not None and store._sealer.deletions_waiting
    assert len(partition_segments(tmp_path)) == segments, "no segment goes before the snapshot"

    disk.full = False  # space freed by hand
    assert _retention(store) == 0  # nothing more to give up: the waiting ones go
    assert not store._sealer.deletions_waiting
    assert len(partition_segments(tmp_path)) == segments - deleted
    store.close()


def test_a_store_that_holds_no_log_keeps_no_reserve(tmp_path: Path):
    empty = LogStore(tmp_path, StorageConfig())
    empty.open()
    empty.close()  # its snapshot written: nothing for retention to delete, nothing held back
    assert not (tmp_path / "log" / RESERVE_FILE).exists()
    store = LogStore(tmp_path, StorageConfig())
    store.open()
    store.append(TOPIC, make_record(0))
    store.close()  # the active segment sealed
    assert (tmp_path / "log" / RESERVE_FILE).stat().st_blocks * 512 >= StorageConfig().disk_reserve_bytes


def test_a_reserve_left_by_a_run_that_kept_one_goes_when_none_is_kept(tmp_path: Path):
    _filled(tmp_path, disk_reserve_bytes=64 * 1024).close()
    assert (tmp_path / "log" / RESERVE_FILE).exists()

    store = LogStore(tmp_path, StorageConfig(segment_bytes=4096, disk_reserve_bytes=0))
    store.open()

    assert not (tmp_path / "log" / RESERVE_FILE).exists()
    store.close()


@pytest.mark.parametrize("reserve_bytes", [64 * 1024, 0], ids=["kept", "none-kept"])
def test_a_directory_where_the_reserve_goes_is_set_aside_said_in_one_line_and_the_reserve_made_anew(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, reserve_bytes: int
):
    """A ``log/disk-reserve`` made by hand as a directory left the broker without its reserve, said nowhere
    (the file could not be made, logged at DEBUG), and with none kept it stopped the store's open. It is set
    aside under a name of its own, all it holds kept, said in one WARNING line; the reserve is then made."""
    _filled(tmp_path, disk_reserve_bytes=64 * 1024).close()
    reserve = tmp_path / "log" / RESERVE_FILE
    reserve.unlink()
    reserve.mkdir()
    (reserve / "notes.txt").write_text("made by hand")

    store = LogStore(tmp_path, StorageConfig(segment_bytes=4096, disk_reserve_bytes=reserve_bytes))
    with caplog.at_level(logging.WARNING):
        store.open()
    store.close()

    aside = tmp_path / "log" / f"{RESERVE_FILE}.set-aside-1"
    assert (aside / "notes.txt").read_text() == "made by hand"
    said = [record.getMessage() for record in caplog.records if RESERVE_FILE in record.getMessage()]
    none = "no reserve is kept (storage.disk_reserve_bytes: 0)"
    then = "the reserve is made anew" if reserve_bytes else none
    assert said == [
        f"{reserve} is a directory, not the disk reserve's file: set aside as {aside} "
        f"(nothing in it deleted); {then}"
    ], caplog.text
    if reserve_bytes:
        assert reserve.is_file() and reserve.stat().st_blocks * 512 >= reserve_bytes
    else:
        assert not reserve.exists()


def _sealed_more(store: LogStore, first: int) -> None:
    """Append records enough to roll segments, and wait until the sealer has sealed them (each seal keeps the
    reserve)."""
    for number in range(first, first + RECORDS // 4):
        store.append(TOPIC, make_record(number))
    store.flush()
    store.wait_sealed()


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if RESERVE_FILE in record.getMessage()]


def test_a_directory_made_where_the_reserve_is_while_the_broker_runs_is_set_aside_and_the_reserve_made_anew(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """The reserve replaced by a directory while the store is open was found only at the next start: until
    then the broker ran without a reserve, and a full disk's snapshot tried to delete the directory as the
    reserve. The next seal now sets it aside, all it holds kept, said in the WARNING line the open says it
    in, and makes the reserve anew."""
    store = _filled(tmp_path, disk_reserve_bytes=64 * 1024)
    reserve = tmp_path / "log" / RESERVE_FILE
    reserve.unlink()
    reserve.mkdir()
    (reserve / "notes.txt").write_text("made by hand")

    with caplog.at_level(logging.WARNING):
        _sealed_more(store, RECORDS)

    aside = tmp_path / "log" / f"{RESERVE_FILE}.set-aside-1"
    assert (aside / "notes.txt").read_text() == "made by hand"
    assert _said(caplog) == [
        f"{reserve} is a directory, not the disk reserve's file: set aside as {aside} (nothing in it "
        "deleted); the reserve is made anew"
    ], caplog.text
    assert reserve.is_file() and reserve.stat().st_blocks * 512 >= 64 * 1024
    store.close()


def test_a_reserve_deleted_while_the_broker_runs_is_made_again_at_the_next_seal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A reserve deleted by hand was counted as held until the next start, so a full disk found none to
    release."""
    store = _filled(tmp_path, disk_reserve_bytes=64 * 1024)
    reserve = tmp_path / "log" / RESERVE_FILE
    reserve.unlink()

    with caplog.at_level(logging.WARNING):
        _sealed_more(store, RECORDS)

    assert reserve.is_file() and reserve.stat().st_blocks * 512 >= 64 * 1024
    assert _said(caplog) == [f"{reserve} is gone: the disk reserve is made anew"], caplog.text
    store.close()


def test_a_directory_where_the_reserve_is_when_a_full_disk_needs_it_is_set_aside_not_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """A directory made where the reserve was, found as a full disk's snapshot releases the reserve: the
    store deleted it as the reserve, and the sealer's task failed at once on IsADirectoryError, at every
    pass. It is set aside, said at WARNING, nothing freed: the segments wait as without a reserve, and go
    once there is space, the reserve made anew then."""
    monkeypatch.setattr(sealer_module, "SHORTAGE_PATIENCE_S", 0.05)
    store = _filled(tmp_path, disk_reserve_bytes=64 * 1024)
    reserve = tmp_path / "log" / RESERVE_FILE
    reserve.unlink()
    reserve.mkdir()
    segments = len(partition_segments(tmp_path))
    disk = FullDisk(monkeypatch, tmp_path / "log")
    disk.full = True

    with caplog.at_level(logging.WARNING):
        deleted = _retention(store)

    aside = tmp_path / "log" / f"{RESERVE_FILE}.set-aside-1"
    assert deleted > 0 and aside.is_dir()
    assert store._sealer is not None and store._sealer.deletions_waiting
    assert len(partition_segments(tmp_path)) == segments, "no segment goes before the snapshot"
    assert f"{reserve} is a directory, not the disk reserve's file: set aside as {aside}" in caplog.text
    disk.full = False  # space freed by hand
    assert _retention(store) == 0 and not store._sealer.deletions_waiting
    assert len(partition_segments(tmp_path)) == segments - deleted
    assert reserve.is_file()
    store.close()


def test_a_negative_reserve_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"^storage\.disk_reserve_bytes: must be >= 0, got -1"):
        load_dataclass(BrokerConfig, {"storage": {"disk_reserve_bytes": -1}})
    assert (
        load_dataclass(BrokerConfig, {"storage": {"disk_reserve_bytes": 0}}).storage.disk_reserve_bytes == 0
    )


def test_a_seal_waiting_for_space_lets_the_segments_retention_gave_up_go_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The sealer runs one task at a time: a seal waiting out a full disk would hold back the snapshot that
    lets retention's segments go, and with it the space the seal waits for. It writes that snapshot itself."""
    monkeypatch.setattr(sealer_module, "SHORTAGE_PATIENCE_S", 30.0)
    store = _filled(tmp_path)
    segments = len(partition_segments(tmp_path))
    disk = FullDisk(monkeypatch, tmp_path / "log")
    waiting: list[str] = []
    real_index = sealer_module.write_index

    def write_index(path: str, data, sync: bool = True) -> None:
        if disk.full:
            waiting.append(path)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_index(path, data, sync)

    monkeypatch.setattr(sealer_module, "write_index", write_index)

    async def scenario() -> int:
        assert store._sealer is not None
        seals = store._sealer.seals
        disk.full = True
        for number in range(RECORDS, RECORDS + 100):  # rolls a segment: its seal meets the full disk
            store.append(TOPIC, make_record(number))
        await store.wait_durable()
        deadline = time.monotonic() + 10
        while not waiting:
            assert time.monotonic() < deadline, "no seal met the full disk"
            await asyncio.sleep(0.01)
        began = time.monotonic()
        deleted = store.apply_retention(now_ms=BASE_TIME_MS).segments_deleted
        store._sealer.wait_idle()
        assert time.monotonic() - began < 10, "the seal waited out its patience first"
        assert store._sealer.seals > seals and not store._sealer.seals_held
        return deleted

    deleted = asyncio.run(scenario())
    assert deleted > 0 and not disk.full
    assert segments > len(partition_segments(tmp_path)) == len(store._partitions[0].segments)  # files gone
    assert store._sealer is not None and not store._sealer.deletions_waiting and store._sealer.failure is None
    store.close()
