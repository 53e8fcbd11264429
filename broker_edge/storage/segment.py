"""One segment of a log: a file of record frames named by its base offset, plus its offset index.

The segment file holds nothing but frames (no header), so a range of records is one contiguous byte range:
a read is one lookup of index entries and one pread of the data, split into records in memory.

Appends never touch the disk here. The log buffers them in the active segment (`pending_frames`, `entries`,
`size`, `count`: the log's append path updates them inline) and they are handed over as
a `SegmentWrite` whose file position is fixed when it is taken: its `write` (one pwritev) and its
`make_durable` (fdatasync, seal) may then run anywhere, in order, while appends continue. Records become
readable only when the owner reports the write done (`mark_durable`). The index of a segment still being
written is kept in memory (`entries`) only for its newest records: once `INDEX_MEMORY_ENTRIES` are held,
they are moved to the index file in its `open` state (which recovery never trusts: it rebuilds such an
index by scanning the segment, as it does a missing one), so an active segment costs a bounded amount of
memory however long it lives. The index is written whole, `clean`, when the segment is sealed.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .file_pool import FileHandlePool
from .index import (
    ENTRY_SIZE,
    HEADER_SIZE,
    STATE_CLEAN,
    OffsetIndex,
    entries_bytes,
    entry_position,
    parse_header,
    write_index_file,
)
from .record import PREFIX, PREFIX_SIZE, FrameError, Record, check_frame, decode_frames

if TYPE_CHECKING:
    from .frame_runs import FrameRun

log = logging.getLogger(__name__)

NO_TIMESTAMP = -(2**63)
_SCAN_CHUNK = 4 * 1024 * 1024
_NO_POSITIONS = array("q")
INDEX_MEMORY_ENTRIES = 64
"""Index entries of an active segment held in memory before they are moved to its (open) index file."""


def segment_paths(directory: str, base_offset: int) -> tuple[str, str]:
    """Paths of the segment and index files for `base_offset` (Kafka-style zero-padded names)."""
    stem = os.path.join(directory, f"{base_offset:020d}")
    return stem + ".log", stem + ".index"


def fsync_directory(path: str) -> None:
    """Make file creations and deletions in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class SegmentWrite:
    """One segment's share of a flush: prepared on the event loop, run by the writer thread in order."""

    log_path: str
    index_path: str
    base_offset: int
    data: list[bytes]
    data_position: int
    seal_index: bytes | None
    """The whole index, when this write seals the segment (it is then fsynced whatever the policy)."""
    directories_to_sync: list[str] = field(default_factory=list)

    @property
    def seals(self) -> bool:
        return self.seal_index is not None

    def write(self, pool: FileHandlePool) -> None:
        """Copy the data into the file (the page cache) in one call: quick, done where it is cut.

        The frames are joined first: one buffer copies into the page cache several times faster than
        a thousand small iovecs (and a window is bounded by `group_commit_max_bytes`).
        """
        data = self.data
        if data:
            pool.pwritev(self.log_path, [b"".join(data)] if len(data) > 1 else data, self.data_position)
            self.data = []

    @property
    def needs_data_sync(self) -> bool:
        """Whether `make_durable` fdatasyncs the data even without `sync` (a seal always does)."""
        return self.seal_index is not None

    def make_durable(self, pool: FileHandlePool, sync: bool, data_synced: bool = False) -> None:
        """fdatasync when `sync`, the seal, new directories: the blocking part, for the writer thread.

        `data_synced` says the caller already fdatasynced the data (several segments synced at once).
        """
        if (sync or self.seal_index is not None) and not data_synced:
            pool.fdatasync(self.log_path)
        if self.seal_index is not None:
            pool.forget(self.index_path)
            write_index_file(self.index_path, self.base_offset, self.seal_index, clean=True)
        if sync:
            for directory in self.directories_to_sync:
                fsync_directory(directory)

    def run(self, pool: FileHandlePool, sync: bool) -> None:
        """Both steps in the calling thread."""
        self.write(pool)
        self.make_durable(pool, sync)


@dataclass(slots=True)
class SegmentLoad:
    """What opening an existing segment found."""

    records: int
    bytes_dropped: int
    index_rebuilt: bool
    damage: str | None
    """Why a non-tail segment stops before its end (checksum, torn, ...), None when it is whole."""
    damaged_records: list[int] = field(default_factory=list)
    """Offsets of records that failed their checksum between valid ones: kept in place, never served."""


class Segment:
    """State of one segment as seen from the event loop; all disk access goes through the shared pool."""

    __slots__ = (
        "base_offset",
        "count",
        "damage",
        "durable_count",
        "durable_size",
        "entries",
        "file_created",
        "first_timestamp",
        "index",
        "index_on_disk",
        "index_path",
        "log_path",
        "max_timestamp",
        "pending_frames",
        "pool",
        "seal_durable",
        "seal_submitted",
        "sealed",
        "size",
        "spilled",
        "submitted_size",
        "synced_size",
    )

    def __init__(self, directory: str, base_offset: int, pool: FileHandlePool) -> None:
        self.base_offset = base_offset
        self.log_path, self.index_path = segment_paths(directory, base_offset)
        self.pool = pool
        self.index = OffsetIndex(self.index_path, pool)
        self.entries: array | None = array("q")
        """Interleaved (position, timestamp) of the records from `spilled` on while the segment is written
        (None once it is sealed: its whole index is then on disk)."""
        self.spilled = 0
        """Entries moved from memory to the open index file (the first records' entries)."""
        self.index_on_disk = -1
        """Entries in the clean index file on disk (-1: none)."""
        self.count = 0
        self.size = 0
        self.submitted_size = 0
        self.durable_count = 0
        self.durable_size = 0
        self.synced_size = 0
        self.first_timestamp = NO_TIMESTAMP
        self.max_timestamp = NO_TIMESTAMP
        self.pending_frames: list[bytes] = []
        self.file_created = False
        self.sealed = False
        self.seal_submitted = False
        self.seal_durable = False
        self.damage: str | None = None

    @property
    def end_offset(self) -> int:
        """Offset after the last record appended to this segment."""
        return self.base_offset + self.count

    @property
    def readable_end(self) -> int:
        """Offset after the last record a reader may get from this segment."""
        return self.base_offset + self.durable_count

    def take_write(self, directories_to_sync: list[str]) -> SegmentWrite | None:
        """Hand everything buffered (and the seal, once sealed) to the writer; None when nothing to do."""
        seal = self.sealed and not self.seal_submitted
        if not self.pending_frames and not seal:
            return None
        if seal and self.spilled:
            self.entries = self.all_entries()  # readers use memory until the clean index replaces the file
            self.spilled = 0
        write = SegmentWrite(
            log_path=self.log_path,
            index_path=self.index_path,
            base_offset=self.base_offset,
            data=self.pending_frames,
            data_position=self.submitted_size,
            seal_index=entries_bytes(self.entries) if seal and self.entries is not None else None,
            directories_to_sync=[] if self.file_created else directories_to_sync,
        )
        self.file_created = True
        self.pending_frames = []
        self.submitted_size = self.size
        self.seal_submitted = self.seal_submitted or seal
        if not seal and self.entries is not None and len(self.entries) >= 2 * INDEX_MEMORY_ENTRIES:
            self.spill_index()
        return write

    def spill_index(self) -> None:
        """Move the index entries held in memory to the end of the open index file (page cache only).

        The first move replaces whatever index file there is (a clean one of a segment appended to again)
        with an open one, atomically, so no clean header ever describes entries written after it.
        """
        entries = self.entries
        if entries is None or not entries:
            return
        data = entries_bytes(entries)
        if self.spilled:
            self.pool.pwritev(self.index_path, [data], entry_position(self.spilled))
        else:
            self.pool.forget(self.index_path)
            write_index_file(self.index_path, self.base_offset, data, clean=False)
            self.index_on_disk = -1
        self.spilled += len(entries) // 2
        self.entries = array("q")

    def all_entries(self) -> array:
        """The whole index of a segment being written: the entries moved to its file, then those in memory."""
        assert self.entries is not None, "only a segment being written holds entries in memory"
        if not self.spilled:
            return self.entries
        return self.index.entries(0, self.spilled) + self.entries

    def mark_durable(self, count: int, size: int, sealed: bool, synced: bool) -> None:
        """Records up to `count` (`size` bytes) are written (fsynced if `synced`): readers may get them."""
        if count > self.durable_count:
            self.durable_count = count
            self.durable_size = size
        if synced or sealed:
            self.synced_size = max(self.synced_size, size)
        if sealed:
            self.seal_durable = True
            self.index_on_disk = count
            self.entries = None

    def sync(self) -> None:
        """fdatasync the data written so far unless a flush already did."""
        if self.file_created and self.synced_size < self.durable_size:
            self.pool.fdatasync(self.log_path)
            self.synced_size = self.durable_size

    def write_index(self) -> None:
        """Persist the in-memory index as clean (at close), after the data it describes is fsynced."""
        if self.entries is None or self.index_on_disk == self.count or self.damage is not None:
            return
        self.sync()
        entries = self.all_entries()
        self.pool.forget(self.index_path)
        write_index_file(self.index_path, self.base_offset, entries_bytes(entries), clean=True)
        self.entries = entries
        self.spilled = 0
        self.index_on_disk = self.count

    # -- reading -------------------------------------------------------------------------------------

    def read(
        self, offset: int, stop: int, max_bytes: int, at_least_one: bool, max_body: int
    ) -> tuple[list[Record], int, FrameError | None]:
        """Records from `offset` (inclusive) to `stop` (exclusive, <= readable_end) within `max_bytes`.

        One index lookup (memory or one pread) and one data pread. Returns the valid records, their frame
        bytes and, if a frame was damaged, its error (the records before it are still returned).
        """
        data, positions, error = self._read_frames(offset, stop, max_bytes, at_least_one)
        if data is None:
            return [], 0, error
        records, error = decode_frames(data, offset, max_body)
        if error is None and len(records) != len(positions) - 1:
            error = FrameError("index")
        if error is not None:
            return records, sum(len(record.frame) for record in records), error
        return records, len(data), None

    def read_run(
        self, offset: int, stop: int, max_bytes: int, at_least_one: bool, max_body: int
    ) -> tuple[FrameRun | None, int, FrameError | None]:
        """Like `read`, but the frames stay one buffer (see `frame_runs`): checked as a whole, and when a
        check fails, decoded one by one so the damage is found and reported exactly as `read` does.

        numpy (which `frame_runs` needs) is imported by the first such read, not with the broker.
        """
        from .frame_runs import checked_run, run_of_records

        data, positions, error = self._read_frames(offset, stop, max_bytes, at_least_one)
        if data is None:
            return None, 0, error
        run = checked_run(data, positions, offset, max_body)
        if run is not None:
            return run, run.size, None
        records, error = decode_frames(data, offset, max_body)
        if error is None and len(records) != len(positions) - 1:
            error = FrameError("index")
        run = run_of_records(records, offset) if records else None
        return run, run.size if run is not None else 0, error

    def read_raw(self, offset: int, stop: int, max_bytes: int, at_least_one: bool) -> tuple[bytes, int]:
        """The frames from `offset` towards `stop` (<= readable_end) within `max_bytes`, as one pread and
        unchecked (a replica checks them), and how many they are (0 when none fit or the index is off)."""
        data, positions, _error = self._read_frames(offset, stop, max_bytes, at_least_one)
        if data is None:
            return b"", 0
        return data, len(positions) - 1

    def _read_frames(
        self, offset: int, stop: int, max_bytes: int, at_least_one: bool
    ) -> tuple[bytes | None, array, FrameError | None]:
        """The frames of `read` as one pread buffer and their file positions (one more than the frames;
        data None when there are none)."""
        first = offset - self.base_offset
        last = stop - self.base_offset
        positions = self._positions(first, last)
        if len(positions) != last - first + 1:
            return None, _NO_POSITIONS, FrameError("index")
        start = positions[0]
        count = bisect.bisect_right(positions, start + max_bytes) - 1
        if count < 1:
            if not at_least_one:
                return None, _NO_POSITIONS, None
            count = 1
        size = positions[count] - start
        if start < 0 or size <= 0:
            return None, _NO_POSITIONS, FrameError("index")
        return self.pool.pread(self.log_path, size, start), positions[: count + 1], None

    def _positions(self, first: int, last: int) -> array:
        """File positions of records `first .. last-1` plus the end of record `last-1`."""
        has_next = last < self.durable_count
        wanted = last - first + (1 if has_next else 0)
        entries = self.entries
        stop = first + wanted
        spilled = self.spilled if entries is not None else stop
        if first < spilled:
            positions = self.index.entries(first, min(stop, spilled) - first)[0::2]
            if stop > spilled:
                assert entries is not None
                positions += entries[0 : 2 * (stop - spilled) : 2]
        else:
            assert entries is not None
            positions = entries[2 * (first - spilled) : 2 * (stop - spilled) : 2]
        if not has_next:
            positions.append(self.durable_size)
        return positions

    def first_at_or_after(self, timestamp_ms: int) -> int:
        """Number of the first readable record whose index timestamp is >= `timestamp_ms`."""
        count = self.durable_count
        entries = self.entries
        if entries is None:
            return self.index.first_at_or_after(timestamp_ms, count)
        spilled = min(self.spilled, count)
        if spilled:
            found = self.index.first_at_or_after(timestamp_ms, spilled)
            if found < spilled or count == spilled:
                return found
        return spilled + bisect.bisect_left(entries[1 : 2 * (count - spilled) : 2], timestamp_ms)

    # -- lifecycle -----------------------------------------------------------------------------------

    def delete(self) -> None:
        """Remove both files (retention); the descriptors are closed first."""
        for path in (self.log_path, self.index_path):
            self.pool.forget(path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def load(self, is_tail: bool, max_body: int, previous_max_timestamp: int) -> SegmentLoad:
        """Open an existing segment: trust a clean, consistent index; otherwise rebuild it by scanning.

        A record that fails its checksum while the frame after it is valid (a flipped bit, not a torn
        write) keeps its offset and stays in the index: reading it raises `CorruptRecord`, the records
        around it are served. A tail segment is truncated after its last valid record when its end is
        torn or corrupt. A non-tail segment damaged beyond repair (a broken length prefix) keeps its bytes
        (for inspection) and its readable part ends before the damage, so nothing past it is served.
        """
        self.file_created = True
        file_size = os.path.getsize(self.log_path)
        count = self._clean_index_count(file_size, max_body)
        if count is not None:
            self.index_on_disk = count
            entries = self.index.entries(0, count) if is_tail else None
            self._set_loaded(count, file_size, entries, is_tail)
            return SegmentLoad(count, 0, False, None)
        entries, valid_size, damage, damaged_records = self._scan(file_size, max_body, previous_max_timestamp)
        if damaged_records:
            log.error(
                "%s: records %s failed their checksum; kept in place, never served (the records around "
                "them are)",
                self.log_path,
                damaged_records,
            )
        count = len(entries) // 2
        dropped = file_size - valid_size
        if is_tail and dropped:
            self.pool.forget(self.log_path)
            os.truncate(self.log_path, valid_size)
            log.warning(
                "%s: truncated after record %d (%s): kept %d records, dropped %d bytes",
                self.log_path,
                self.base_offset + count - 1,
                damage,
                count,
                dropped,
            )
        self._set_loaded(count, valid_size, entries, is_tail)
        if is_tail:
            return SegmentLoad(count, dropped, True, None, damaged_records)
        if damage is None:
            self.pool.forget(self.index_path)
            write_index_file(self.index_path, self.base_offset, entries_bytes(entries), clean=True)
            self.index_on_disk = count
            self.entries = None
            return SegmentLoad(count, 0, True, None, damaged_records)
        self.damage = damage
        log.error(
            "%s: damaged after record %d (%s); records from %d on are not served",
            self.log_path,
            self.base_offset + count - 1,
            damage,
            self.base_offset + count,
        )
        return SegmentLoad(count, 0, True, damage, damaged_records)

    def _set_loaded(self, count: int, size: int, entries: array | None, is_tail: bool) -> None:
        self.count = self.durable_count = count
        self.size = self.submitted_size = self.durable_size = self.synced_size = size
        self.entries = entries
        self.spilled = 0
        self.sealed = self.seal_submitted = self.seal_durable = not is_tail
        if count:
            if entries is None:
                entries = self.index.entries(0, 1) + self.index.entries(count - 1, 1)
            self.first_timestamp = entries[1]
            self.max_timestamp = entries[-1]

    def _clean_index_count(self, file_size: int, max_body: int) -> int | None:
        """Entries of a clean index consistent with the segment (its last record ends the file), or None."""
        try:
            index_size = os.path.getsize(self.index_path)
        except FileNotFoundError:
            return None
        if index_size < HEADER_SIZE or (index_size - HEADER_SIZE) % ENTRY_SIZE:
            return None
        header = parse_header(self.pool.pread(self.index_path, HEADER_SIZE, 0))
        if header != (STATE_CLEAN, self.base_offset):
            return None
        count = (index_size - HEADER_SIZE) // ENTRY_SIZE
        if count == 0:
            return 0 if file_size == 0 else None
        first_position = self.index.entries(0, 1)[0]
        last_position = self.index.entries(count - 1, 1)[0]
        if first_position != 0 or not 0 <= last_position < file_size:
            return None
        frame = self.pool.pread(self.log_path, file_size - last_position, last_position)
        try:
            end, _ = check_frame(frame, 0, self.base_offset + count - 1, max_body)
        except FrameError:
            return None
        return count if end == len(frame) else None

    def _scan(
        self, file_size: int, max_body: int, max_timestamp: int
    ) -> tuple[array, int, str | None, list[int]]:
        """Validate every frame from the start, in chunks of a few MiB.

        Returns the index entries, the size up to the last frame kept, why the scan stopped early (None
        when it reached the end) and the offsets of damaged records stepped over (see `load`).
        """
        entries = array("q")
        damaged: list[int] = []
        offset = self.base_offset
        position = 0
        chunk_start = 0
        view = memoryview(b"")
        while position < file_size:
            try:
                end, timestamp = check_frame(view, position - chunk_start, offset, max_body)
            except FrameError as error:
                chunk_end = chunk_start + len(view)
                if error.reason == "torn" and chunk_end < file_size:
                    needed = self._frame_size(position, max_body) or _SCAN_CHUNK
                    if chunk_start == position and len(view) >= needed:
                        return entries, position, "torn", damaged
                    chunk_start = position
                    view = memoryview(
                        self.pool.pread(
                            self.log_path, min(max(_SCAN_CHUNK, needed), file_size - position), position
                        )
                    )
                    continue
                following = position + (self._frame_size(position, max_body) or file_size)
                if error.reason == "checksum" and self._valid_at(following, offset + 1, file_size, max_body):
                    entries.append(position)
                    entries.append(max_timestamp)
                    damaged.append(offset)
                    offset += 1
                    position = following
                    continue
                return entries, position, error.reason, damaged
            max_timestamp = max(max_timestamp, timestamp)
            entries.append(position)
            entries.append(max_timestamp)
            position = chunk_start + end
            offset += 1
        return entries, position, None, damaged

    def _valid_at(self, position: int, offset: int, file_size: int, max_body: int) -> bool:
        """Whether a valid frame of `offset` starts at `position` (a resync point after a damaged one)."""
        size = self._frame_size(position, max_body) if position < file_size else None
        if size is None or position + size > file_size:
            return False
        try:
            check_frame(self.pool.pread(self.log_path, size, position), 0, offset, max_body)
        except FrameError:
            return False
        return True

    def _frame_size(self, position: int, max_body: int) -> int | None:
        prefix = self.pool.pread(self.log_path, PREFIX_SIZE, position)
        if len(prefix) < PREFIX_SIZE:
            return None
        body_length, _ = PREFIX.unpack(prefix)
        return PREFIX_SIZE + body_length if body_length <= max_body else None
