"""A full disk is a passing shortage when a write meets it, a failure when a sync does.

``errors.passing_shortage`` decides from where an error came; the stores below meet ENOSPC through the real
write and sync calls of the group commit (``os.pwritev`` and ``os.fdatasync`` answer it while the "disk" is
full, as the kernel does; the real call runs otherwise). A full tmpfs under a running broker is
tests/e2e/refusals/test_disk_full.py.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
from pathlib import Path

import pytest

from broker_edge.storage import LogStore, StorageConfig, StorageFailed
from broker_edge.storage import sealer as sealer_module
from broker_edge.storage.errors import DESCRIPTORS, DISK_FULL, StorageShortage, passing_shortage
from broker_edge.storage.file_pool import FileHandlePool
from broker_edge.storage.open_index import read_open_index
from broker_edge.storage.segment import SEALED
from tests.unit.broker_edge.storage.log_helpers import make_record

TOPIC = "site/gateway-3/temp"


@pytest.mark.parametrize(
    ("code", "syncing", "cause"),
    [
        (errno.EMFILE, False, DESCRIPTORS),
        (errno.ENFILE, True, DESCRIPTORS),  # an open before the sync failed: nothing was synced
        (errno.ENOSPC, False, DISK_FULL),
        (errno.EDQUOT, False, DISK_FULL),
        (errno.ENOSPC, True, None),  # a sync's: its dirty pages may be gone
        (errno.EDQUOT, True, None),
        (errno.EIO, False, None),
        (errno.EIO, True, None),
    ],
)
def test_a_write_out_of_space_is_passing_and_a_sync_out_of_space_is_not(code, syncing, cause):
    assert passing_shortage(OSError(code, os.strerror(code)), syncing=syncing) is cause


def test_an_error_that_is_no_os_error_is_no_shortage():
    assert passing_shortage(ValueError("bad"), syncing=False) is None


class FullDisk:
    """``os.pwritev`` as a filesystem that fills up: while ``full`` is set a write stores part of its bytes
    (a short write, as the kernel gives when the space ends inside it), then only ENOSPC."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = threading.Event()
        self.refused = 0
        self._short_given = False
        real = os.pwritev

        def pwritev(fd: int, buffers, position: int, *flags: int) -> int:
            if not self.full.is_set():
                return real(fd, buffers, position, *flags)
            if not self._short_given:
                self._short_given = True
                first = bytes(buffers[0])
                return real(fd, [first[: max(1, len(first) // 2)]], position)
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "pwritev", pwritev)


async def _until(condition, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition did not come")


def test_a_full_disk_refuses_appends_while_it_lasts_and_the_log_keeps_no_hole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    disk = FullDisk(monkeypatch)

    async def scenario() -> tuple[list[BaseException], BaseException | None, LogStore]:
        store = LogStore(tmp_path, StorageConfig(durability="group"))
        store.open()
        store.append(TOPIC, make_record(0))
        await store.wait_durable()
        disk.full.set()
        told: list[BaseException] = []
        store.append(TOPIC, make_record(1))  # taken, and its window's write meets the full disk
        store.when_durable(lambda: told.append(AssertionError("durable while full")), told.append)
        await _until(lambda: bool(told))
        refused: BaseException | None = None
        try:
            store.append(TOPIC, make_record(2))
        except StorageShortage as error:
            refused = error
        assert store.committer.short_of(DISK_FULL)
        await _until(lambda: disk.refused >= 3)  # the writer thread tries it again, and again
        disk.full.clear()  # space freed
        await _until(lambda: store.committer.shortage is None)
        store.append(TOPIC, make_record(3))
        await store.wait_durable()
        return told, refused, store

    with caplog.at_level(logging.WARNING, logger="broker_edge.storage.group_commit"):
        told, refused, store = asyncio.run(scenario())

    assert len(told) == 1 and isinstance(told[0], StorageShortage) and told[0].cause is DISK_FULL
    assert isinstance(refused, StorageShortage) and "out of disk space" in str(refused)
    assert store.committer.failure is None and store.committer.shortages["disk_full"] == 1
    records = store.read(TOPIC, 0, max_records=10)
    # record 1 was appended before the disk filled: written once space came back (at least once); record 2
    # was refused and kept nowhere; record 3 follows without a gap
    assert [(r.offset, r.payload) for r in records] == [
        (0, make_record(0).payload),
        (1, make_record(1).payload),
        (2, make_record(3).payload),
    ]
    lines = [record.getMessage() for record in caplog.records]
    assert sum("out of disk space writing the log" in line for line in lines) == 1
    assert sum("disk space available again" in line for line in lines) == 1
    store.close()
    again = LogStore(tmp_path, StorageConfig())
    report = again.open()
    assert report.clean_shutdown and not report.repaired  # the half-written range was written again whole
    assert [r.payload for r in again.read(TOPIC, 0, max_records=10)] == [r.payload for r in records]
    again.close()


@pytest.mark.parametrize("inline_sync_max_bytes", [0, 16384], ids=["writer-thread", "on-the-loop"])
def test_a_sync_out_of_space_fails_the_store_and_space_coming_back_does_not_undo_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inline_sync_max_bytes: int
):
    real = os.fdatasync
    full = threading.Event()

    def fdatasync(fd: int) -> None:
        if full.is_set():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)

    async def scenario() -> tuple[list[BaseException], LogStore]:
        store = LogStore(
            tmp_path, StorageConfig(durability="group", inline_sync_max_bytes=inline_sync_max_bytes)
        )
        store.open()
        store.append(TOPIC, make_record(0))
        await store.wait_durable()
        full.set()
        told: list[BaseException] = []
        store.append(TOPIC, make_record(1))
        store.when_durable(lambda: told.append(AssertionError("durable after a failed sync")), told.append)
        with pytest.raises(StorageFailed):
            await store.wait_durable()
        full.clear()
        await asyncio.sleep(0.05)
        return told, store

    told, store = asyncio.run(scenario())

    assert len(told) == 1 and isinstance(told[0], StorageFailed)
    assert store.committer.shortage is None and not store.committer.shortages
    with pytest.raises(StorageFailed):  # for good: a sync that failed cannot be trusted to be redone
        store.append(TOPIC, make_record(2))
    assert [record.offset for record in store.read(TOPIC, 0)] == [0]
    store.close()


class DroppingDisk:
    """A disk whose first fdatasync of an open index after ``arm()`` fails with ENOSPC and, as a kernel may,
    loses what was written to it since its last sync (those bytes read back as zeros)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = False
        self.failed = 0
        self._unsynced: list[tuple[int, int]] = []
        real_pwritev, real_fdatasync = os.pwritev, os.fdatasync

        def pwritev(fd: int, buffers, position: int, *flags: int) -> int:
            written = real_pwritev(fd, buffers, position, *flags)
            if _is_open_index(fd):
                self._unsynced.append((position, written))
            return written

        def fdatasync(fd: int) -> None:
            if self.armed and _is_open_index(fd):
                self.armed = False
                self.failed += 1
                for position, size in self._unsynced:
                    os.pwrite(fd, bytes(size), position)
                self._unsynced.clear()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_fdatasync(fd)
            if _is_open_index(fd):
                self._unsynced.clear()

        monkeypatch.setattr(os, "pwritev", pwritev)
        monkeypatch.setattr(os, "fdatasync", fdatasync)

    def arm(self) -> None:
        self.armed = True


def _is_open_index(fd: int) -> bool:
    return os.readlink(f"/proc/self/fd/{fd}").endswith(".open")


def test_an_index_checkpoint_whose_sync_fails_for_space_writes_its_rows_again(tmp_path: Path, monkeypatch):
    """The sealer may retry after a failed sync (unlike the log) because it writes again every row its
    header does not count yet: the rows the failed sync lost are on disk after the retry."""
    disk = DroppingDisk(monkeypatch)
    store = LogStore(tmp_path, StorageConfig(partitions=1, index_checkpoint_bytes=1))  # every job
    store.open()
    for number in range(5):
        store.append(TOPIC, make_record(number))
    store.flush()  # the segment, its open index's header and a first checkpoint
    disk.arm()
    for number in range(5, 10):
        store.append(TOPIC, make_record(number))
    store.flush()  # this checkpoint's sync fails and drops its rows; tried again

    assert disk.failed == 1 and store._sealer is not None and store._sealer.failure is None
    active = store._partitions[0].active
    assert active is not None and active.rows is not None and active.open_index is not None
    on_disk = read_open_index(active.open_path, FileHandlePool())
    assert on_disk is not None and len(on_disk.positions) == 10
    assert list(on_disk.positions) == list(active.rows.positions[:10])
    assert list(on_disk.topic_ids) == list(active.rows.topic_ids[:10])
    store.close()


def test_a_seal_whose_snapshot_meets_a_full_disk_is_tried_again_and_applied_once(tmp_path: Path, monkeypatch):
    """A seal writes the snapshot when one is due; a full disk there makes the sealer try the task again,
    which must not apply the segment's groups a second time."""
    monkeypatch.setattr(sealer_module, "SNAPSHOT_INTERVAL_S", 0.0)  # a snapshot after every seal
    store = LogStore(tmp_path, StorageConfig(partitions=1, segment_bytes=4096))
    store.open()
    assert store._sealer is not None
    snapshot_temporary = store._sealer.snapshot_path + ".tmp"
    refused: list[int] = []
    real = os.write

    def write(fd: int, data) -> int:
        if not refused and os.readlink(f"/proc/self/fd/{fd}") == snapshot_temporary:
            refused.append(fd)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)

    async def scenario() -> None:
        for number in range(60):
            store.append(TOPIC, make_record(number, payload_size=200))
        await store.wait_durable()  # the rolled segments go to the sealer thread, a snapshot after each seal
        assert store._sealer is not None
        store._sealer.wait_idle()

    asyncio.run(scenario())

    sealer = store._sealer
    sealed = [segment for segment in store._partitions[0].segments if segment.state == SEALED]
    assert refused and sealer.failure is None
    assert sealed and sealer.seals == len(sealed)
    records = store.read(TOPIC, 0, max_records=100, max_bytes=1 << 20)
    assert [(r.offset, r.payload) for r in records] == [(n, make_record(n, 200).payload) for n in range(60)]
    store.close()
