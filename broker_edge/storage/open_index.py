"""The active segment's rows checkpointed to disk, so that a crash rescans only what came after.

File layout (little endian): a 64-byte header, ``"TSOI" | u16 version | 2 zero bytes | i32 segment number |
u64 base position | u64 capacity | u64 durable rows``, then three columns at fixed places of a sparse file
(only what is written takes disk space): ``u32 topic id`` at 64, ``u32 position`` at ``64 + 4 * capacity``
and ``i64 index time`` at ``64 + 8 * capacity``, `capacity` rows each.

The header is written with the segment's first data (same job, same fsync), so a segment's number and base
position survive any crash. The sealer thread appends the columns of rows whose job completed, and every
`index_checkpoint_bytes` of records fdatasyncs them and then rewrites the durable row count: a count on disk
never covers a row that is not durable, whichever writes the crash lost. A row's offset is not stored: the
topic's offsets are dense, so recovery counts them from the sealed state. The file is deleted once the
segment's sealed index is written.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass

from .file_pool import FileHandlePool

__all__ = ["OpenIndex", "OpenRows", "capacity_for", "header_bytes", "read_open_index"]

MAGIC = b"TSOI"
VERSION = 1
HEADER = struct.Struct("<4sH2xiQQQ24x")
DURABLE_AT = struct.calcsize("<4sH2xiQQ")
"""Where the header keeps the durable row count (its last field before the padding)."""
_COUNT = struct.Struct("<Q")
MIN_ENTRY_BYTES = 8 + 8 + 17
"""The smallest entry: a marker (its header, a frame prefix and a 17-byte body); a record is at least 37."""


def capacity_for(segment_bytes: int) -> int:
    """Rows a segment of at most `segment_bytes` can hold."""
    return segment_bytes // MIN_ENTRY_BYTES + 1


def header_bytes(number: int, base: int, capacity: int, durable_rows: int = 0) -> bytes:
    return HEADER.pack(MAGIC, VERSION, number, base, capacity, durable_rows)


@dataclass(slots=True)
class OpenRows:
    """What an open index says: the segment's number and base, and its durable rows' columns."""

    number: int
    base: int
    capacity: int
    topic_ids: array
    positions: array
    times: array


def read_open_index(path: str, pool: FileHandlePool) -> OpenRows | None:
    """The open index at `path` (None when absent or not one)."""
    try:
        head = pool.pread(path, HEADER.size, 0)
    except FileNotFoundError:
        return None
    if len(head) < HEADER.size:
        return None
    magic, version, number, base, capacity, durable = HEADER.unpack_from(head)
    if magic != MAGIC or version != VERSION or durable > capacity:
        return None
    columns = []
    for typecode, at in (
        ("I", HEADER.size),
        ("I", HEADER.size + 4 * capacity),
        ("q", HEADER.size + 8 * capacity),
    ):
        column = array(typecode)
        width = column.itemsize * durable
        data = pool.pread(path, width, at) if durable else b""
        if len(data) != width:
            return OpenRows(number, base, capacity, array("I"), array("I"), array("q"))
        column.frombytes(data)
        columns.append(column)
    return OpenRows(number, base, capacity, *columns)


class OpenIndex:
    """The open index of one active segment, written by the sealer thread."""

    __slots__ = ("capacity", "durable", "path", "pool", "written")

    def __init__(self, path: str, pool: FileHandlePool, capacity: int, durable: int = 0) -> None:
        self.path = path
        self.pool = pool
        self.capacity = capacity
        self.written = durable
        """Rows whose columns are written (in the page cache)."""
        self.durable = durable
        """Rows the header on disk counts (their columns fdatasynced first)."""

    def append(self, topic_ids: array, positions: array, times: array) -> None:
        """Write the columns of the next rows (the caller's slices of the segment's rows)."""
        count = len(topic_ids)
        if not count:
            return
        first = self.written
        if first + count > self.capacity:
            raise ValueError(f"{self.path}: more rows than the segment can hold")
        pool, path, capacity = self.pool, self.path, self.capacity
        pool.pwritev(path, [topic_ids.tobytes()], HEADER.size + 4 * first)
        pool.pwritev(path, [positions.tobytes()], HEADER.size + 4 * capacity + 4 * first)
        pool.pwritev(path, [times.tobytes()], HEADER.size + 8 * capacity + 8 * first)
        self.written = first + count

    def checkpoint(self, sync: bool = True) -> None:
        """Make the written rows durable and count them in the header (columns first, then the count);
        without `sync` (the `none` policy) only write the count."""
        if self.durable == self.written:
            return
        if sync:
            self.pool.fdatasync(self.path)
        self.pool.pwritev(self.path, [_COUNT.pack(self.written)], DURABLE_AT)
        if sync:
            self.pool.fdatasync(self.path)
        self.durable = self.written
