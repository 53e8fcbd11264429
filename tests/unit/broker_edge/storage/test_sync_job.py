"""How the writer thread makes one job durable (``group_commit.sync_job``): the files it touches, not its
writes, decide between one syncfs and their fdatasyncs."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker_edge.storage import group_commit
from broker_edge.storage.file_pool import FileHandlePool
from broker_edge.storage.fs_sync import syncfs_available
from broker_edge.storage.group_commit import Job, SyncPlan, sync_job
from broker_edge.storage.segment import FileWrite


@dataclass
class _Pending:
    writes: list[FileWrite]
    bytes: int = 0


@dataclass
class _Calls:
    fdatasyncs: list[str] = field(default_factory=list)
    syncfs: int = 0


def _spied(monkeypatch: pytest.MonkeyPatch) -> _Calls:
    calls = _Calls()
    real_fdatasync, real_syncfs = FileHandlePool.fdatasync, group_commit.sync_filesystem

    def fdatasync(pool: FileHandlePool, path: str) -> None:
        calls.fdatasyncs.append(os.path.basename(path))
        real_fdatasync(pool, path)

    def syncfs(fd: int) -> None:
        calls.syncfs += 1
        real_syncfs(fd)

    monkeypatch.setattr(FileHandlePool, "fdatasync", fdatasync)
    monkeypatch.setattr(group_commit, "sync_filesystem", syncfs)
    return calls


def _job(pool: FileHandlePool, *writes: tuple[Path, int]) -> Job:
    """One pending of ``writes`` (file, position), 4 bytes each, already written as the loop writes them."""
    pending = _Pending([FileWrite(str(path), [b"data"], position) for path, position in writes])
    for write in pending.writes:
        write.write(pool)
    source: Any = object()
    return [(source, pending)]


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (["a.log", "a.log"], (0, ["a.log"])),  # two writes, one file: its fdatasync
        (["a.log", "b.log"], (1, [])),  # two files: one syncfs
    ],
)
def test_two_writes_into_one_file_are_one_fdatasync_and_two_files_one_syncfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: list[str], expected: tuple[int, list[str]]
) -> None:
    assert syncfs_available(tmp_path)
    calls = _spied(monkeypatch)
    pool = FileHandlePool()
    directory_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    plan = SyncPlan(sync=True, syncfs_fd=directory_fd, syncfs_min_segments=2)
    try:
        sync_job(
            _job(pool, *((tmp_path / name, 4 * number) for number, name in enumerate(files))), pool, plan
        )
    finally:
        plan.shutdown()
        pool.close()
        os.close(directory_fd)

    assert (calls.syncfs, calls.fdatasyncs) == expected
    assert plan.syncfs_calls == expected[0]
    assert (tmp_path / files[0]).read_bytes().startswith(b"data")
