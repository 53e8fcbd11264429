"""The offset index of one segment: a dense array of (file position, timestamp) per record.

Dense, not sparse: offsets inside a segment are dense, so entry `i` belongs to offset `base + i` and a
read finds its byte range with one small pread instead of scanning frames in Python (the costly part here).
It also gives exact timestamp lookups by bisection. The price is 16 bytes per record.

File layout: a 32-byte header (magic, version, state, base offset) then little-endian `i64 position,
i64 timestamp_ms` entries. The timestamp stored is the running maximum of record timestamps (so it is
sorted even if the wall clock stepped back); the record itself keeps its own time.

The index of the active segment is written whole, to a temporary file, fsynced and renamed, with state
`clean`, only when the segment is sealed (rolled) or the log is closed. While the segment is written its
newest entries live in memory and the older ones are moved, a few KiB at a time and never fsynced, to the
index file in state `open` (see `segment`). So a clean index on disk was complete when written; at open an
index is trusted only if it is clean and consistent with its segment (its last record ends the file,
checksum and offset valid), and is otherwise (open, absent, inconsistent) rebuilt by scanning the segment.
Appends after a clean close make the segment longer than its index says, which that check catches, so no
"dirty" marker has to be written (and fsynced) before appending.
"""

from __future__ import annotations

import bisect
import os
import struct
import sys
from array import array

from .file_pool import FileHandlePool

MAGIC = b"TSIX"
VERSION = 1
STATE_OPEN = 0
STATE_CLEAN = 1
HEADER = struct.Struct("<4sHBxQ16x")
HEADER_SIZE = HEADER.size
ENTRY_SIZE = 16
_IN_MEMORY_SEARCH_BYTES = 64 * 1024
_LITTLE_ENDIAN = sys.byteorder == "little"


def header_bytes(base_offset: int, clean: bool) -> bytes:
    """The index header for a segment starting at `base_offset`."""
    return HEADER.pack(MAGIC, VERSION, STATE_CLEAN if clean else STATE_OPEN, base_offset)


def parse_header(data: bytes) -> tuple[int, int] | None:
    """(state, base offset) of a header, or None when it is not a valid index header."""
    if len(data) < HEADER_SIZE:
        return None
    magic, version, state, base_offset = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or state not in (STATE_OPEN, STATE_CLEAN):
        return None
    return state, base_offset


def entries_bytes(entries: array) -> bytes:
    """Serialise interleaved (position, timestamp) pairs held in an `array('q')`."""
    if _LITTLE_ENDIAN:
        return entries.tobytes()
    swapped = array("q", entries)
    swapped.byteswap()
    return swapped.tobytes()


def entries_from_bytes(data: bytes) -> array:
    """Interleaved (position, timestamp) pairs from index file bytes."""
    entries = array("q")
    entries.frombytes(data[: len(data) - len(data) % ENTRY_SIZE])
    if not _LITTLE_ENDIAN:
        entries.byteswap()
    return entries


def entry_position(entry: int) -> int:
    """File position in the index of entry number `entry`."""
    return HEADER_SIZE + entry * ENTRY_SIZE


def write_index_file(path: str, base_offset: int, entries: bytes, clean: bool) -> None:
    """Replace the index at `path` atomically (temporary file, fsync when clean, rename)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as file:
        file.write(header_bytes(base_offset, clean=clean))
        file.write(entries)
        if clean:
            file.flush()
            os.fdatasync(file.fileno())
    os.replace(tmp, path)


class OffsetIndex:
    """Read access to one index file through the shared descriptor pool."""

    __slots__ = ("path", "pool")

    def __init__(self, path: str, pool: FileHandlePool) -> None:
        self.path = path
        self.pool = pool

    def entries(self, first: int, count: int) -> array:
        """Entries `first .. first+count-1` as interleaved (position, timestamp) pairs, in one pread."""
        if count <= 0:
            return array("q")
        data = self.pool.pread(self.path, count * ENTRY_SIZE, entry_position(first))
        return entries_from_bytes(data)

    def first_at_or_after(self, timestamp_ms: int, count: int) -> int:
        """Number of the first of the first `count` entries whose timestamp is >= `timestamp_ms`."""
        if count * ENTRY_SIZE <= _IN_MEMORY_SEARCH_BYTES:
            timestamps = self.entries(0, count)[1::2]
            return bisect.bisect_left(timestamps, timestamp_ms)
        return bisect.bisect_left(_TimestampsOnDisk(self), timestamp_ms, 0, count)


class _TimestampsOnDisk:
    """Timestamps read one pread per probe, so bisecting a large index reads ~log2(n) entries."""

    __slots__ = ("index",)

    def __init__(self, index: OffsetIndex) -> None:
        self.index = index

    def __getitem__(self, entry: int) -> int:
        return self.index.entries(entry, 1)[1]
