"""One segment of a partition log: a file of entries back to back, and what the store knows of it.

The segment file holds nothing but entries (no header), so a run of neighbouring records is one contiguous
byte range. Appends never touch the disk here: the partition log buffers them (`pending`) and hands them
over as a `FileWrite` whose file position is fixed when it is taken; its `write` (one pwritev) and its
`make_durable` (fdatasync, new directories) may then run anywhere, in order, while appends continue.

A segment is `ACTIVE` (appended to), `ROLLED` (full, its rows still in memory until the sealer thread has
written its sealed index) or `SEALED` (its index on disk: `sealed`, rows dropped).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .file_pool import FileHandlePool

if TYPE_CHECKING:
    from .active_index import ActiveIndex
    from .open_index import OpenIndex
    from .sealed_index import SealedIndex

__all__ = ["ACTIVE", "ROLLED", "SEALED", "FileWrite", "Segment", "fsync_directory", "segment_paths"]

ACTIVE = 0
ROLLED = 1
SEALED = 2


def segment_paths(directory: str, number: int) -> tuple[str, str, str]:
    """Paths of a segment's data, sealed index and open index (zero-padded numbers, Kafka-style)."""
    stem = os.path.join(directory, f"{number:020d}")
    return stem + ".log", stem + ".index", stem + ".open"


def rebuild_marker(directory: str, number: int) -> str:
    """The file that asks the next open to make segment `number`'s sealed index again from its data (its
    groups were found damaged while the store ran; a clean open does not read them)."""
    return os.path.join(directory, f"{number:020d}.rebuild")


def mark_for_rebuild(directory: str, number: int) -> None:
    """Leave `rebuild_marker` (best effort: a disk that cannot take it is found damaged again later)."""
    with contextlib.suppress(OSError), open(rebuild_marker(directory, number), "ab"):
        pass


def fsync_directory(path: str) -> None:
    """Make file creations and deletions in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class FileWrite:
    """Bytes to put at a fixed position of one file: written on the loop, made durable by the writer."""

    path: str
    data: list[bytes | memoryview]
    position: int
    directories_to_sync: list[str] = field(default_factory=list)
    always_sync: bool = False
    """Synced whatever the policy (the catalog: a topic known to exist survives a power cut even under
    `none`, which only leaves records unsynced)."""
    holds_records: bool = True
    """Checked still linked after its sync (`sync_job`): records or catalog entries, never acknowledged into
    a deleted file. False for an open index's header (the sealer deletes that file once the segment is
    sealed)."""

    def write(self, pool: FileHandlePool) -> None:
        """Copy the data into the file (the page cache) in one call, creating the file if needed.

        The buffers are joined first: one buffer copies into the page cache several times faster than a
        thousand small iovecs (and a window is bounded by `group_commit_max_bytes`).
        """
        data = self.data
        if data:
            pool.pwritev(self.path, [b"".join(data)] if len(data) > 1 else data, self.position)
            self.data = []

    def make_durable(self, pool: FileHandlePool, sync: bool, data_synced: bool = False) -> None:
        """fdatasync (unless `data_synced`: the caller synced several files at once) and new directories."""
        if not sync:
            return
        if not data_synced:
            pool.fdatasync(self.path)
        for directory in self.directories_to_sync:
            fsync_directory(directory)


class Segment:
    """One segment as the event loop sees it; all disk access goes through the shared pool."""

    __slots__ = (
        "base",
        "capacity",
        "checkpointed_size",
        "durable_rows",
        "durable_size",
        "first_time",
        "index_path",
        "log_path",
        "newest_time",
        "number",
        "oldest_group_ms",
        "open_index",
        "open_path",
        "pending",
        "pending_rows",
        "rows",
        "sealed",
        "size",
        "state",
        "submitted_size",
        "written_rows",
    )

    def __init__(self, directory: str, number: int, base: int, capacity: int = 0) -> None:
        self.number = number
        self.capacity = capacity
        """Rows it may hold (its open index's columns' room), fixed when it is created."""
        self.base = base
        """Entries of the partition before this segment's first (its base position)."""
        self.log_path, self.index_path, self.open_path = segment_paths(directory, number)
        self.state = ACTIVE
        self.size = 0
        """Bytes appended (buffered included)."""
        self.submitted_size = 0
        """Bytes handed to the writer."""
        self.durable_size = 0
        """Bytes whose job completed."""
        self.pending: list[bytes | memoryview] = []
        self.pending_rows = 0
        """Rows whose entries are buffered (not yet handed to the writer)."""
        self.written_rows = 0
        """Rows handed to the writer."""
        self.durable_rows = 0
        """Rows whose job completed."""
        self.checkpointed_size = 0
        """Bytes whose rows were handed to the sealer for the open index."""
        self.rows: ActiveIndex | None = None
        self.sealed: SealedIndex | None = None
        self.open_index: OpenIndex | None = None
        self.first_time = -(2**63)
        self.newest_time = -(2**63)
        self.oldest_group_ms: int | None = None
        """Sealed: the oldest newest time of its groups, once a retention pass read them all (None: not yet):
        later passes read none of its groups while that is not past the shortest retention."""

    @property
    def row_count(self) -> int:
        """Entries in the segment (markers included)."""
        if self.rows is not None:
            return len(self.rows)
        return self.sealed.rows if self.sealed is not None else 0

    @property
    def in_memory(self) -> bool:
        return self.rows is not None

    def take_write(self) -> FileWrite | None:
        """Hand everything buffered to the writer; None when there is nothing."""
        if not self.pending:
            return None
        write = FileWrite(self.log_path, self.pending, self.submitted_size)
        self.pending = []
        self.submitted_size = self.size
        self.written_rows += self.pending_rows
        self.pending_rows = 0
        return write

    def delete(self, pool: FileHandlePool) -> None:
        """Remove its files (retention); descriptors are closed first."""
        for path in (self.log_path, self.index_path, self.open_path):
            pool.forget(path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
