"""One topic's log: dense offsets from 0, segments rolled by size or age, recovery, retention, reads.

Writing is split in three steps so an owner can keep disk work off its event loop:

    offset = log.append(AppendRecord(...))   # buffered in memory, offset assigned (never changes)
    pending = log.take_pending()             # hand the buffered bytes to a writer (positions are fixed)
    for write in pending.writes: write.run(pool, sync=True)   # in any thread, in order
    log.complete(pending)                    # now readable: end_offset (the high watermark) advances

`flush()` does the three in the calling thread. Readers only ever see records up to `end_offset`;
`next_offset` is what the next append gets. A replicated log (a cluster's) tells apart `durable_end` (on
disk here) and `end_offset`, the committed end (held by every in-sync replica), which only `commit` moves;
otherwise the two are one. A follower copies its leader's frames with `append_frames` and drops a diverging
tail with `truncate`. Reads below `start_offset` raise `OffsetOutOfRange`, reads at
`end_offset` return [] (the caller long-polls), and a damaged record raises `CorruptRecord`, never served.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import re
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import LogConfig
from .errors import CorruptRecord, InvalidRecord, OffsetOutOfRange, RecordTooLarge, StorageError
from .file_pool import FileHandlePool
from .read_cache import BLOCK_MAX_BYTES, BLOCK_RECORDS, Block, ReadCache
from .record import (
    PREFIX_SIZE,
    AppendRecord,
    FrameError,
    Record,
    RecordFields,
    check_frame,
    encode_frame,
    encode_frames,
)
from .segment import NO_TIMESTAMP, Segment, SegmentWrite, fsync_directory
from .tail_cache import TailCache, TailCacheBudget

if TYPE_CHECKING:
    from .frame_runs import FrameRun

log = logging.getLogger(__name__)

_SEGMENT_NAME = re.compile(r"^(\d{20})\.log$")


_time_ns = time.time_ns


def _make_directory(path: str) -> bool:
    """Create the log directory `path` (and missing parents); False when it exists already.

    One mkdir for a new log (a burst to thousands of new topics creates thousands), not a stat first."""
    try:
        os.mkdir(path)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return False
    except FileNotFoundError:
        os.makedirs(path, exist_ok=True)
    return True


def _now_ms() -> int:
    """The broker clock in milliseconds since the epoch (what a record gets when no time is given)."""
    return _time_ns() // 1_000_000


@dataclass(slots=True)
class PendingWrite:
    """What a log buffered since the previous take: run `writes` in order, then pass this to `complete`."""

    writes: list[SegmentWrite]
    end_offset: int
    max_timestamp: int
    bytes: int
    marks: list[tuple[Segment, int, int, bool]] = field(repr=False)


@dataclass(slots=True)
class LogRecovery:
    """What opening a log found and repaired."""

    topic: str
    segments: int = 0
    records: int = 0
    """Records kept across all segments."""
    bytes_dropped: int = 0
    """Bytes truncated from the tail (a torn or corrupt end)."""
    indexes_rebuilt: int = 0
    damaged_segments: list[int] = field(default_factory=list)
    """Base offsets of non-tail segments with a damaged part that is never served."""
    damaged_records: list[int] = field(default_factory=list)
    """Offsets of single records that failed their checksum between valid ones (never served)."""

    @property
    def repaired(self) -> bool:
        """Recovery dropped a tail or found damage (a clean restart and a rebuilt index are not repairs)."""
        return bool(self.bytes_dropped or self.damaged_segments or self.damaged_records)


@dataclass(slots=True)
class RetentionResult:
    """What one retention pass removed from a log."""

    segments_deleted: int = 0
    bytes_deleted: int = 0
    start_offset: int = 0


class CommitLog:
    """The append-only log of one topic in `directory`; recovered from disk on construction."""

    __slots__ = (
        "_active",
        "_bases",
        "_blocks",
        "_cache",
        "_cache_budget",
        "_closed",
        "_durable_end",
        "_durable_max_timestamp",
        "_end_offset",
        "_max_body",
        "_max_frame",
        "_max_timestamp",
        "_next_offset",
        "_owns_pool",
        "_parent_to_sync",
        "_pending_bytes",
        "_pool",
        "_replicated",
        "_roll_at",
        "_segment_bytes",
        "_segment_ms",
        "_segments",
        "_write_from",
        "config",
        "directory",
        "last_append_size",
        "recovery",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        directory: str | Path,
        config: LogConfig | None = None,
        *,
        pool: FileHandlePool | None = None,
        cache_budget: TailCacheBudget | None = None,
        read_cache: ReadCache | None = None,
    ) -> None:
        self.topic = topic
        self.directory = str(directory)
        self.config = config or LogConfig()
        self._owns_pool = pool is None
        self._pool = pool or FileHandlePool()
        self._cache_budget = cache_budget
        created = _make_directory(self.directory)
        self._parent_to_sync = [os.path.dirname(os.path.abspath(self.directory))] if created else []
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._max_timestamp = NO_TIMESTAMP
        self.recovery = LogRecovery(topic) if created else self._recover()  # a new directory is empty
        self._next_offset = self._segments[-1].end_offset if self._segments else 0
        self._end_offset = self._durable_end = self._next_offset
        self._replicated = False
        self._durable_max_timestamp = self._max_timestamp
        self._write_from = max(0, len(self._segments) - 1)
        self._pending_bytes = 0
        self.last_append_size = 0
        """Encoded size of the latest append (lets an owner total its pending bytes cheaply)."""
        self._max_body = self.config.max_record_bytes
        self._max_frame = self._max_body + PREFIX_SIZE
        self._segment_bytes = self.config.segment_bytes
        self._segment_ms = self.config.segment_ms
        self._active: Segment | None = self._segments[-1] if self._segments else None
        """The segment appends go to (the last one)."""
        self._roll_at = self._first_roll_deadline()
        self._cache = TailCache(
            self.config.tail_cache_records, self.config.tail_cache_bytes, self._next_offset, cache_budget
        )
        self._blocks = read_cache.for_log() if read_cache is not None and read_cache.enabled else None
        self._closed = False

    # -- state ---------------------------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        """Oldest offset still stored (moves up when retention deletes segments)."""
        return self._segments[0].base_offset if self._segments else self._next_offset

    @property
    def end_offset(self) -> int:
        """Offset after the last readable (written, and synced per policy) record: the high watermark."""
        return self._end_offset

    @property
    def durable_end(self) -> int:
        """Offset after the last record durable here (the end a follower has, or a leader may send)."""
        return self._durable_end

    @property
    def replicated(self) -> bool:
        """Whether `end_offset` (what readers see) waits for `commit` instead of following `durable_end`."""
        return self._replicated

    def set_replicated(self, replicated: bool) -> None:
        """Make readers wait for `commit` (a cluster's log), or follow durability again (everything durable
        becomes readable at once)."""
        self._replicated = replicated
        if not replicated:
            self._end_offset = self._durable_end

    def restore_committed(self, offset: int) -> None:
        """Start a replicated log committed up to a saved end (capped at what is durable here), after a
        restart: lower than what it holds when its tail was never committed."""
        self._end_offset = max(self.start_offset, min(offset, self._durable_end))

    def commit(self, offset: int) -> int:
        """Let readers see records below `offset` (capped at `durable_end`); returns the new `end_offset`."""
        if offset > self._durable_end:
            offset = self._durable_end
        if offset > self._end_offset:
            self._end_offset = offset
        return self._end_offset

    @property
    def next_offset(self) -> int:
        """Offset the next append gets (>= end_offset while appends are buffered)."""
        return self._next_offset

    @property
    def size_bytes(self) -> int:
        """Bytes of readable records on disk."""
        return sum(segment.durable_size for segment in self._segments)

    @property
    def last_append_ms(self) -> int | None:
        """Broker time of the newest readable record (None for a log that never had one)."""
        return None if self._durable_max_timestamp == NO_TIMESTAMP else self._durable_max_timestamp

    @property
    def pending_bytes(self) -> int:
        """Bytes appended but not yet handed to a writer."""
        return self._pending_bytes

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def active_segment_bytes(self) -> int:
        """Size of the segment being appended to (what a rebuild of its index would have to scan)."""
        return self._segments[-1].size if self._segments else 0

    @property
    def tail_cache(self) -> TailCache:
        return self._cache

    # -- writing -------------------------------------------------------------------------------------

    def append(self, record: AppendRecord) -> int:
        """Buffer `record` and return its offset; it becomes readable after the next completed write."""
        return self.append_message(*record.fields())

    def append_message(
        self,
        payload: bytes,
        qos: int = 1,
        retain: bool = False,
        client_id: str = "",
        user_properties: Sequence[tuple[str, str]] = (),
        content_type: str | None = None,
        payload_format_indicator: int | None = None,
        timestamp_ms: int | None = None,
        message_expiry_interval: int | None = None,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
    ) -> int:
        """`append` for callers holding the fields (the broker): no `AppendRecord` built per publish.

        The hot path of every logged publish: one encode, bookkeeping in memory, no system call.
        """
        offset = self._next_offset
        timestamp = _time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms  # _now_ms inline
        try:
            frame = encode_frame(
                offset, timestamp, payload, qos, retain, client_id, user_properties, content_type,
                payload_format_indicator, message_expiry_interval, response_topic, correlation_data
            )  # fmt: skip
        except (ValueError, OverflowError, struct.error) as error:
            raise InvalidRecord(f"record for {self.topic!r} cannot be stored: {error}") from error
        size = len(frame)
        if size > self._max_frame:
            raise RecordTooLarge(size, self._max_body)
        segment = self._active
        if segment is None or (
            segment.count and (segment.size + size > self._segment_bytes or timestamp >= self._roll_at)
        ):
            segment = self._roll(offset)
        index_timestamp = self._index_timestamp(segment, timestamp)
        # Segment bookkeeping, inline on this hot path: buffer the frame, index entry, sizes.
        segment.pending_frames.append(frame)
        entries = segment.entries
        assert entries is not None, "the active segment holds its index"
        entries.append(segment.size)
        entries.append(index_timestamp)
        segment.size += size
        segment.count += 1
        segment.max_timestamp = index_timestamp
        self._next_offset = offset + 1
        self._pending_bytes += size
        self.last_append_size = size
        fields = (
            payload, qos, retain, client_id, user_properties, content_type, payload_format_indicator,
            message_expiry_interval, response_topic, correlation_data
        )  # fmt: skip
        self._cache.add((timestamp, frame, fields), size)
        return offset

    def append_batch(self, records: Sequence[RecordFields], timestamp_ms: int | None = None) -> int:
        """Append several records with one broker time; returns the first offset (record i gets it + i).

        `records` hold the fields of `append_message` but the time, one tuple each. All or nothing: a
        record that cannot be stored raises before anything is appended. Per record this costs the frame
        encoding and a few list appends: the broker appends each loop iteration's publishes to one topic
        this way, and a peer copying a log would too.
        """
        offset = self._next_offset
        if not records:
            return offset
        timestamp = _time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        try:
            frames = encode_frames(offset, timestamp, records)
        except (ValueError, OverflowError, struct.error) as error:
            raise InvalidRecord(f"record for {self.topic!r} cannot be stored: {error}") from error
        sizes = list(map(len, frames))
        largest = max(sizes)
        if largest > self._max_frame:
            raise RecordTooLarge(largest, self._max_body)
        ends = list(accumulate(sizes))
        size = ends[-1]
        segment = self._active
        if (
            segment is None
            or segment.size + size > self._segment_bytes
            or (segment.count and timestamp >= self._roll_at)
        ):
            for fields in records:  # the batch may roll a segment: one record at a time
                self.append_message(*fields[:7], timestamp, *fields[7:])
            self.last_append_size = size
            return offset
        index_timestamp = self._index_timestamp(segment, timestamp)
        base = segment.size
        appended = len(records)
        segment.pending_frames += frames
        pairs = [index_timestamp] * (2 * appended)  # index entries: (position, time) per record
        positions = list(accumulate(sizes, initial=base))
        positions.pop()  # the end of the last frame
        pairs[0::2] = positions
        entries = segment.entries
        assert entries is not None, "the active segment holds its index"
        entries.extend(pairs)
        segment.size = base + size
        segment.count += appended
        segment.max_timestamp = index_timestamp
        self._next_offset = offset + appended
        self._pending_bytes += size
        self.last_append_size = size
        self._cache.add_many(timestamp, frames, records, ends)
        return offset

    def _index_timestamp(self, segment: Segment, timestamp: int) -> int:
        """The index time of records appended at `timestamp` (never below an earlier one: the index stays
        sorted even if the clock steps back); starts `segment`'s age when it is still empty."""
        index_timestamp = self._max_timestamp
        if timestamp > index_timestamp:
            index_timestamp = self._max_timestamp = timestamp
        if not segment.count:
            segment.first_timestamp = index_timestamp
            if self._segment_ms is not None:
                self._roll_at = index_timestamp + self._segment_ms
        return index_timestamp

    def take_pending(self) -> PendingWrite | None:
        """Detach everything buffered (and seals of rolled segments) for a writer; None if nothing."""
        writes: list[SegmentWrite] = []
        marks: list[tuple[Segment, int, int, bool]] = []
        for segment in self._segments[self._write_from :]:
            directories: list[str] = []
            if not segment.file_created:
                directories = [self.directory, *self._parent_to_sync]
                self._parent_to_sync = []
            write = segment.take_write(directories)
            if write is not None:
                writes.append(write)
                marks.append((segment, segment.count, segment.size, write.seals))
        self._write_from = max(0, len(self._segments) - 1)
        if not writes:
            return None
        pending = PendingWrite(writes, self._next_offset, self._max_timestamp, self._pending_bytes, marks)
        self._pending_bytes = 0
        return pending

    def complete(self, pending: PendingWrite, synced: bool = True) -> None:
        """The writes of `pending` are done (and fsynced if `synced`): make its records readable."""
        for segment, count, size, sealed in pending.marks:
            segment.mark_durable(count, size, sealed, synced)
        if pending.end_offset > self._durable_end:
            self._durable_end = pending.end_offset
            self._durable_max_timestamp = pending.max_timestamp
            if not self._replicated:
                self._end_offset = pending.end_offset

    def flush(self, sync: bool = True) -> int:
        """Write (and with `sync`, fsync) everything buffered, in the calling thread; returns end_offset."""
        pending = self.take_pending()
        if pending is not None:
            for write in pending.writes:
                write.run(self._pool, sync)
            self.complete(pending, sync)
        return self._end_offset

    def close(self, write_index: bool = True) -> None:
        """Flush and fsync everything; with `write_index`, persist the active segment's index as clean.

        Without it the next open rebuilds that index by scanning the segment (cheap for a small one),
        which saves an index write and fsync per log when a broker with many logs shuts down.
        """
        if self._closed:
            return
        self.flush(sync=True)
        if self._segments:
            active = self._segments[-1]
            if write_index:
                active.write_index()
            else:
                active.sync()
        for segment in self._segments:
            self._pool.forget(segment.log_path)
            self._pool.forget(segment.index_path)
        if self._cache_budget is not None:
            self._cache_budget.forget(self._cache)
        if self._blocks is not None:
            self._blocks.clear()
        if self._owns_pool:
            self._pool.close()
        self._closed = True

    def _first_roll_deadline(self) -> float:
        """When the active segment found at open gets too old to append to (`segment_ms`)."""
        if self.config.segment_ms is None or not self._segments or not self._segments[-1].count:
            return float("inf")
        return self._segments[-1].first_timestamp + self.config.segment_ms

    def _roll(self, base_offset: int) -> Segment:
        if self._segments:
            self._segments[-1].sealed = True
        segment = self._active = Segment(self.directory, base_offset, self._pool)
        self._segments.append(segment)
        self._bases.append(base_offset)
        return segment

    # -- reading -------------------------------------------------------------------------------------

    def read(self, offset: int, max_records: int = 1000, max_bytes: int = 1024 * 1024) -> list[Record]:
        """Readable records from `offset`, at most `max_records` and `max_bytes` (but at least one record).

        Records in the tail cache come from memory; older ones from the store's shared blocks (see
        `read_cache`) or with one pread per segment touched, each checked against its CRC. Raises
        `OffsetOutOfRange` outside [start_offset, end_offset].
        """
        stop = self._read_stop(offset, max_records, max_bytes)
        if offset == stop:
            return []
        cache = self._cache
        if offset >= cache.first_offset:
            return cache.slice(offset, stop, max_bytes)
        records: list[Record] = []
        budget = max_bytes
        while offset < stop:
            if offset >= cache.first_offset:
                records += cache.slice(offset, stop, budget, at_least_one=not records)
                break
            batch, size, go_on = self._read_stored(offset, stop, budget, at_least_one=not records)
            records += batch
            offset += len(batch)
            budget -= size
            if not go_on or budget <= 0:
                break
        return records

    def read_runs(self, offset: int, max_records: int = 1000, max_bytes: int = 1024 * 1024) -> list[FrameRun]:
        """The records `read` would return, as runs of frames (see `frame_runs`): for columnar readers.

        Same limits, errors and damage handling as `read`; the frames of stored records are checked as a
        whole, read directly (one pread per segment touched, not through the shared blocks of `Record`s),
        and those of the tail cache are joined from memory.
        """
        stop = self._read_stop(offset, max_records, max_bytes)
        runs: list[FrameRun] = []
        budget = max_bytes
        cache = self._cache
        while offset < stop:
            if offset >= cache.first_offset:
                runs.append(cache.run(offset, stop, budget, at_least_one=not runs))
                break
            run, size, go_on = self._read_segment(offset, stop, budget, not runs, columnar=True)
            if run is None:
                break
            runs.append(run)
            offset += len(run)
            budget -= size
            if not go_on or budget <= 0:
                break
        return [run for run in runs if len(run)]

    def _read_stop(self, offset: int, max_records: int, max_bytes: int) -> int:
        """The offset a read from `offset` stops before at the latest (checks the arguments and bounds)."""
        if max_records < 1 or max_bytes < 1:
            raise ValueError("max_records and max_bytes must be positive")
        end = self._end_offset
        if offset < self.start_offset or offset > end:
            raise OffsetOutOfRange(self.topic, offset, self.start_offset, end)
        return min(end, offset + max_records)

    def _read_stored(
        self, offset: int, stop: int, budget: int, at_least_one: bool
    ) -> tuple[list[Record], int, bool]:
        """Records from a shared block, else from the segment, and their frame bytes; the flag says the
        read may go on after them."""
        if self._blocks is not None:
            block = self._block(offset)
            if block is not None:
                batch, size = block.take(offset, stop, budget, at_least_one)
                return batch, size, offset + len(batch) == min(stop, block.end)
        return self._read_segment(offset, stop, budget, at_least_one)

    def _block(self, offset: int) -> Block | None:
        """The shared block holding `offset`, read on first use; None when `offset` is read directly.

        The block at the log's end is kept too and grows as readers reach past it (one read of the new
        records, shared again). A block cut short by its byte bound or by a damaged record stays as it
        is: the offsets after it are read directly.
        """
        blocks = self._blocks
        assert blocks is not None
        number = offset // BLOCK_RECORDS
        block_end = (number + 1) * BLOCK_RECORDS
        block = blocks.get(number)
        if block is not None:
            if block.covers(offset):
                return block
            if not block.growing or offset != block.end:
                return None
            first, known, budget = block.first, block.records, BLOCK_MAX_BYTES - block.size
        else:
            first, known, budget = max(number * BLOCK_RECORDS, self.start_offset), [], BLOCK_MAX_BYTES
        stop = min(block_end, self._end_offset)
        more = self._read_range(first + len(known), stop, budget) if budget > 0 else []
        if not more:
            return None
        block = Block(first, known + more, growing=first + len(known) + len(more) == stop < block_end)
        blocks.put(number, block)
        blocks.cache.fills += 1
        return block if block.covers(offset) else None

    def _read_range(self, offset: int, stop: int, max_bytes: int) -> list[Record]:
        """Valid records from `offset` towards `stop` within `max_bytes` (at least one), from the segments;
        stops early (without raising) at a damaged record."""
        records: list[Record] = []
        budget = max_bytes
        while offset < stop and budget > 0:
            try:
                batch, size, segment_done = self._read_segment(offset, stop, budget, at_least_one=not records)
            except CorruptRecord:
                break
            records += batch
            offset += len(batch)
            budget -= size
            if not segment_done:
                break
        return records

    def _read_segment(
        self, offset: int, stop: int, budget: int, at_least_one: bool, columnar: bool = False
    ) -> tuple[Any, int, bool]:
        """Records of the segment holding `offset` (a `FrameRun` or None when `columnar`) and their frame
        bytes; the flag says the read reached the segment's end."""
        position = bisect.bisect_right(self._bases, offset) - 1
        segment = self._segments[position]
        readable_end = segment.readable_end
        if offset >= readable_end:
            if not at_least_one:
                return (None if columnar else []), 0, False
            next_offset = self._bases[position + 1] if position + 1 < len(self._bases) else self._end_offset
            raise CorruptRecord(self.topic, offset, next_offset, segment.damage or "missing")
        segment_stop = min(stop, readable_end)
        read = segment.read_run if columnar else segment.read
        batch, size, error = read(offset, segment_stop, budget, at_least_one, self._max_body)
        count = len(batch) if batch is not None else 0
        if error is not None:
            damaged = offset + count
            log.error(
                "%s: record %d of %r is damaged (%s)", segment.log_path, damaged, self.topic, error.reason
            )
            if not count and at_least_one:
                raise CorruptRecord(self.topic, damaged, damaged + 1, error.reason)
            return batch, size, False
        return batch, size, offset + count == segment_stop

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """First readable offset whose broker time is >= `timestamp_ms` (end_offset if none is)."""
        position = bisect.bisect_left(self._segments, timestamp_ms, key=lambda segment: segment.max_timestamp)
        for segment in self._segments[position:]:
            count = segment.durable_count
            if count:
                entry = segment.first_at_or_after(timestamp_ms)
                if entry < count:
                    return min(segment.base_offset + entry, self._end_offset)
        return self._end_offset

    # -- retention -----------------------------------------------------------------------------------

    def apply_retention(self, now_ms: int | None = None) -> RetentionResult:
        """Delete whole old segments beyond the age and size limits; never the active segment."""
        now_ms = _now_ms() if now_ms is None else now_ms
        result = RetentionResult()
        max_age = self.config.retention_ms
        max_bytes = self.config.retention_bytes
        total = self.size_bytes
        while len(self._segments) > 1 and self._segments[0].seal_durable:
            oldest = self._segments[0]
            too_old = max_age is not None and oldest.max_timestamp < now_ms - max_age
            too_big = max_bytes is not None and total > max_bytes
            if not (too_old or too_big):
                break
            oldest.delete()
            del self._segments[0]
            del self._bases[0]
            self._write_from = max(0, self._write_from - 1)
            total -= oldest.durable_size
            result.segments_deleted += 1
            result.bytes_deleted += oldest.durable_size
        result.start_offset = self.start_offset
        if result.segments_deleted and self._blocks is not None:
            self._blocks.drop_below(result.start_offset)
        if result.segments_deleted:
            log.info(
                "%r: retention deleted %d segments (%d bytes); log starts at %d",
                self.topic,
                result.segments_deleted,
                result.bytes_deleted,
                result.start_offset,
            )
        return result

    # -- replication -----------------------------------------------------------------------------------

    def append_frames(self, data: bytes) -> int:
        """Append a leader's frames verbatim (they carry their offsets and times); returns the first offset.

        Every frame is checked (framing, CRC, version) and must continue this log exactly: the first one at
        `next_offset`, the next ones dense. All or nothing: `InvalidRecord` names the first bad frame and
        nothing is appended. Segments roll by the same per-record rule as `append_message`, so a replica
        with the same configuration holds byte-identical segment files.
        """
        first = self._next_offset
        view = memoryview(data)
        size = len(data)
        max_body = self._max_body
        frames: list[memoryview] = []
        times: list[int] = []
        position = 0
        offset = first
        try:
            while position < size:
                end, timestamp = check_frame(view, position, offset, max_body)
                frames.append(view[position:end])
                times.append(timestamp)
                position = end
                offset += 1
        except FrameError as error:
            raise InvalidRecord(
                f"frames for {self.topic!r} refused at offset {offset}: {error.reason} "
                f"(the log continues at {first})"
            ) from None
        cache = self._cache
        offset = first
        for frame, timestamp in zip(frames, times, strict=True):
            frame_size = len(frame)
            segment = self._active
            if segment is None or (
                segment.count
                and (segment.size + frame_size > self._segment_bytes or timestamp >= self._roll_at)
            ):
                segment = self._roll(offset)
            index_timestamp = self._index_timestamp(segment, timestamp)
            segment.pending_frames.append(frame)  # a view of `data`, joined when written
            entries = segment.entries
            assert entries is not None, "the active segment holds its index"
            entries.append(segment.size)
            entries.append(index_timestamp)
            segment.size += frame_size
            segment.count += 1
            segment.max_timestamp = index_timestamp
            cache.add((timestamp, frame, None), frame_size)  # decoded when a reader first asks for it
            offset += 1
        self._next_offset = offset
        self._pending_bytes += size
        self.last_append_size = size
        return first

    def read_frames(self, offset: int, max_bytes: int, stop: int | None = None) -> tuple[list[bytes], int]:
        """Stored frames from `offset` towards `durable_end` (or `stop` before it) within `max_bytes` (at
        least one), as buffers to send as they are, and how many records they hold. Not checked here: the
        replica appending them checks every frame. Raises `OffsetOutOfRange` outside
        [start_offset, durable_end]."""
        end = self._durable_end
        if offset < self.start_offset or offset > end:
            raise OffsetOutOfRange(self.topic, offset, self.start_offset, end)
        if stop is not None and stop < end:
            end = stop
        chunks: list[bytes] = []
        count = 0
        budget = max_bytes
        cache = self._cache
        while offset < end and budget > 0:
            if offset >= cache.first_offset:
                frames = cache.frames(offset, end, budget, at_least_one=not chunks)
                chunks += frames
                count += len(frames)
                break
            position = bisect.bisect_right(self._bases, offset) - 1
            segment = self._segments[position]
            segment_stop = min(end, segment.readable_end)
            if offset >= segment_stop:
                break
            data, records = segment.read_raw(offset, segment_stop, budget, at_least_one=not chunks)
            if not records:
                break
            chunks.append(data)
            count += records
            offset += records
            budget -= len(data)
        return chunks, count

    def truncate(self, offset: int) -> None:
        """Drop the records at and after `offset` (a follower's tail its leader does not have), crash-safe.

        Newer segments are deleted first (newest first, then the directory is synced), then the segment
        holding `offset` is cut and synced and its index removed (rebuilt from the data if the broker stops
        before the segment is sealed again), so a crash at any point leaves a prefix of the log. Refused
        while appends are buffered or being written.
        """
        if offset >= self._next_offset:
            return
        self._check_settled("truncate")
        offset = max(offset, 0)
        deleted = False
        while self._segments and self._segments[-1].base_offset >= offset:
            self._segments.pop().delete()
            self._bases.pop()
            deleted = True
        if deleted:
            fsync_directory(self.directory)
        if self._segments:
            self._cut_segment(self._segments[-1], offset)
        self._reset_tail(offset)
        log.warning("%r truncated to %d records", self.topic, offset)

    def restart_at(self, offset: int) -> None:
        """Drop every record and continue at `offset` (a follower whose leader's log starts later)."""
        self._check_settled("restart")
        for segment in reversed(self._segments):
            segment.delete()
        self._segments.clear()
        self._bases.clear()
        fsync_directory(self.directory)
        self._durable_end = self._end_offset = offset
        self._reset_tail(offset)
        log.warning("%r restarted empty at offset %d", self.topic, offset)

    def _check_settled(self, action: str) -> None:
        if self._pending_bytes or self._next_offset != self._durable_end:
            raise StorageError(f"cannot {action} the log of {self.topic!r} while appends are being written")

    def _cut_segment(self, segment: Segment, offset: int) -> None:
        """Cut `segment` (the last one kept) to its records before `offset`; it becomes the active one."""
        keep = offset - segment.base_offset
        if keep >= segment.count:
            return
        if segment.entries is not None:
            entries = segment.all_entries()
        else:
            entries = segment.index.entries(0, segment.count)
        position = entries[2 * keep]
        del entries[2 * keep :]
        self._pool.forget(segment.log_path)
        os.truncate(segment.log_path, position)
        self._pool.fdatasync(segment.log_path)
        self._pool.forget(segment.index_path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(segment.index_path)
        segment.entries = entries
        segment.spilled = 0
        segment.count = segment.durable_count = keep
        segment.size = segment.submitted_size = segment.durable_size = segment.synced_size = position
        segment.sealed = segment.seal_submitted = segment.seal_durable = False
        segment.index_on_disk = -1
        segment.pending_frames = []
        segment.max_timestamp = entries[-1]
        segment.first_timestamp = entries[1]

    def _reset_tail(self, offset: int) -> None:
        """After a truncation or restart: offsets, the active segment, the caches."""
        self._next_offset = offset
        self._durable_end = min(self._durable_end, offset)
        self._end_offset = min(self._end_offset, offset)
        self._active = self._segments[-1] if self._segments else None
        self._write_from = max(0, len(self._segments) - 1)
        self._max_timestamp = self._active.max_timestamp if self._active is not None else NO_TIMESTAMP
        self._durable_max_timestamp = self._max_timestamp
        self._roll_at = self._first_roll_deadline()
        freed = self._cache.reset(offset)
        if self._cache_budget is not None:
            self._cache_budget.bytes -= freed
        if self._blocks is not None:
            self._blocks.clear()

    # -- recovery ------------------------------------------------------------------------------------

    def _recover(self) -> LogRecovery:
        report = LogRecovery(self.topic)
        bases = sorted(
            int(match.group(1)) for name in os.listdir(self.directory) if (match := _SEGMENT_NAME.match(name))
        )
        self._remove_strays(set(bases))
        for number, base in enumerate(bases):
            segment = Segment(self.directory, base, self._pool)
            is_tail = number == len(bases) - 1
            loaded = segment.load(is_tail, self.config.max_record_bytes, self._max_timestamp)
            if self._segments and base != self._segments[-1].end_offset:
                self._note_gap(self._segments[-1], base)
            self._segments.append(segment)
            self._bases.append(base)
            if segment.count:
                self._max_timestamp = max(self._max_timestamp, segment.max_timestamp)
            report.segments += 1
            report.records += loaded.records
            report.bytes_dropped += loaded.bytes_dropped
            report.indexes_rebuilt += int(loaded.index_rebuilt)
            if loaded.damage is not None:
                report.damaged_segments.append(base)
            report.damaged_records += loaded.damaged_records
        if report.repaired:
            log.warning(
                "%r recovered: %d records kept in %d segments, %d bytes dropped, %d indexes rebuilt, "
                "damaged segments %s, damaged records %s",
                self.topic,
                report.records,
                report.segments,
                report.bytes_dropped,
                report.indexes_rebuilt,
                report.damaged_segments,
                report.damaged_records,
            )
        return report

    def _note_gap(self, previous: Segment, next_base: int) -> None:
        if next_base > previous.end_offset:
            previous.damage = previous.damage or "missing"
            return
        log.error(
            "%r: segment %d overlaps segment %d; serving up to %d",
            self.topic,
            previous.base_offset,
            next_base,
            next_base,
        )
        previous.durable_count = min(previous.durable_count, next_base - previous.base_offset)
        previous.damage = previous.damage or "overlap"

    def _remove_strays(self, bases: set[int]) -> None:
        """Delete leftovers of an interrupted index rebuild and indexes whose segment is gone."""
        for name in os.listdir(self.directory):
            stem, _, suffix = name.partition(".")
            stray = suffix == "index.tmp" or (suffix == "index" and stem.isdigit() and int(stem) not in bases)
            if stray:
                os.unlink(os.path.join(self.directory, name))
