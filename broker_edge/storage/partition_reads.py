"""Reads of a whole partition in log order: the records of every topic at once, by position.

A position is an entry's number in its partition (the records of every topic, and markers), counted from
the partition's creation; `PartitionLog.start_position` and `end_position` bound what it holds. A reader
of many topics (the Spark source over 100,000 device topics) keeps one position per partition instead of
an offset per topic, and reads the segments front to back: one pread per chunk of entries, whatever the
number of topics, never an index lookup per topic.

What a read passes over without serving it:

* entries of topics that do not match the reader's filters, and markers;
* records below their topic's start (retention moved the start past them while other topics kept the
  segment): counted per topic in `lost`, data loss for a reader that had not read them;
* records a truncation cut (only a store that was once a cluster's replica has them): found by the
  topic's index, passed over silently;
* entries failing their checks (`damaged`): a frame whose CRC fails is stepped over, and so is an entry
  whose topic id fails its check when a checked entry follows it (what open skipped); an entry whose
  length cannot be trusted ends the read of its segment, the rest of which is counted as damaged;
* the positions of a segment retention deleted while older ones stay (every record in it was below its
  topic's start, or cut): counted in `removed`, data loss for a reader that had not read them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

from broker_edge.protocol.topics import topic_matches

from . import record
from .entry import ENTRY_HEAD, HEAD_SIZE, MARKER_BIT, MARKER_BODY_SIZE, TOPIC_ID, EntryError, parse_head
from .errors import CorruptRecord, StorageError
from .partition_log import PartitionLog
from .record import PREFIX, PREFIX_SIZE, VERSIONS
from .segment import Segment
from .topic_table import TopicTable

__all__ = [
    "PartitionRead",
    "PositionOutOfRange",
    "TopicFilters",
    "position_for_timestamp",
    "read_entries",
]

_CHUNK = 1024 * 1024
"""Bytes read at a time (more when one entry is larger)."""
_MIN_CHUNK = 16 * 1024
_VERSION_AND_OFFSET = struct.Struct("<Bq")
_TIME = struct.Struct("<q")
_BODY_AT = HEAD_SIZE + PREFIX_SIZE
_TIME_AT = _BODY_AT + 9
_UNKNOWN, _MATCHES, _OTHER = 0, 1, 2


class PositionOutOfRange(StorageError):
    """The position is below the partition's start (retention deleted its segment) or past its end."""

    def __init__(self, partition: int, position: int, start: int, end: int) -> None:
        super().__init__(f"position {position} of partition {partition} is outside [{start}, {end}]")
        self.partition = partition
        self.position = position
        self.start = start
        self.end = end


@dataclass(slots=True)
class PartitionRead:
    """What one read of a partition found, in log order."""

    next_position: int
    """Where the next read goes on (after the last entry looked at)."""
    topic_ids: list[int] = field(default_factory=list)
    """The topic of each frame."""
    frames: list[memoryview] = field(default_factory=list)
    lost: dict[int, int] = field(default_factory=dict)
    """Per topic id: records passed over because they are below the topic's start."""
    damaged: int = 0
    """Entries passed over because they failed their checks."""
    removed: int = 0
    """Positions passed over because retention deleted their segment."""

    @property
    def size(self) -> int:
        return sum(len(frame) for frame in self.frames)


class TopicFilters:
    """Which topics match a list of MQTT filters, decided once per topic id and kept for the next reads.

    A store keeps the verdicts of its last few filter lists (a query asks with the same one every time)."""

    KEPT = 8

    def __init__(self, names: list[str]) -> None:
        self._names = names
        self._verdicts: dict[tuple[str, ...], bytearray] = {}

    def matcher(self, patterns: Sequence[str] | None) -> Callable[[int], bool]:
        """A test of topic ids against `patterns` (None, or a `#`: every topic)."""
        if patterns is None or "#" in patterns:
            return _every_topic
        key = tuple(sorted(set(patterns)))
        verdicts = self._verdicts.pop(key, None)
        if verdicts is None:
            verdicts = bytearray()
            if len(self._verdicts) >= self.KEPT:
                del self._verdicts[next(iter(self._verdicts))]
        self._verdicts[key] = verdicts
        names = self._names

        def matches(topic_id: int) -> bool:
            if topic_id >= len(verdicts):
                verdicts.extend(bytes(len(names) - len(verdicts)))
            verdict = verdicts[topic_id]
            if verdict == _UNKNOWN:
                name = names[topic_id]
                verdict = _MATCHES if any(topic_matches(p, name) for p in key) else _OTHER
                verdicts[topic_id] = verdict
            return verdict == _MATCHES

        return matches


def _every_topic(_topic_id: int) -> bool:
    return True


def read_entries(
    part: PartitionLog,
    table: TopicTable,
    position: int,
    stop: int,
    max_bytes: int,
    wanted: Callable[[int], bool],
    max_body: int,
) -> PartitionRead:
    """The records of wanted topics among entries `[position, stop)` of the partition, frames totalling at
    most `max_bytes` (at least one frame when there is one). Raises `PositionOutOfRange`."""
    start, end = part.start_position, part.end_position
    if not start <= position <= end:
        raise PositionOutOfRange(part.number, position, start, end)
    read = PartitionRead(position)
    stop = min(stop, end)
    budget = max_bytes
    while position < stop:
        segment = _segment_from(part, position)
        if segment is None:
            read.damaged += stop - position
            position = stop
            break
        if segment.base > position:  # a segment retention deleted, or the end of a damaged one
            if _deleted_before(part, segment):
                read.removed += segment.base - position
            else:
                read.damaged += segment.base - position
            position = segment.base
            continue
        rows = segment.durable_rows if segment.in_memory else segment.row_count
        segment_stop = min(stop, segment.base + rows)
        if segment_stop <= position:  # (never: the partition's end is where its durable entries end)
            break
        position, budget = _read_segment(part, table, segment, position, segment_stop, budget, wanted,
                                         max_body, read)  # fmt: skip
        if position < segment_stop:
            break  # the byte budget is spent
    read.next_position = position
    return read


def _segment_from(part: PartitionLog, position: int) -> Segment | None:
    """The segment holding `position`, else the first one after it."""
    for segment in part.segments:
        if position < segment.base + segment.row_count:
            return segment
    return None


def _deleted_before(part: PartitionLog, segment: Segment) -> bool:
    """Whether a segment numbered between `segment` and the one before it is gone (segment numbers are
    consecutive: a gap is a deletion; no gap, the positions missing are what a damaged segment's index does
    not cover)."""
    index = part.segments.index(segment)
    return index > 0 and part.segments[index - 1].number + 1 < segment.number


def _data_end(segment: Segment) -> int:
    if segment.in_memory:
        return segment.durable_size
    assert segment.sealed is not None
    return segment.sealed.data_size


def _read_segment(
    part: PartitionLog,
    table: TopicTable,
    segment: Segment,
    position: int,
    stop: int,
    budget: int,
    wanted: Callable[[int], bool],
    max_body: int,
    read: PartitionRead,
) -> tuple[int, int]:
    """Read `[position, stop)` of one segment into `read`; returns the next position and the budget left."""
    byte = part.byte_position(segment, position - segment.base)
    data_end = _data_end(segment)
    chunk = _chunk_for(segment, stop - position, data_end, max(_CHUNK, budget))
    scan = _ChunkScan(part, table, segment, wanted, max_body, read)
    try:
        while position < stop and byte < data_end:
            buffer = part.pool.pread(segment.log_path, min(chunk, data_end - byte), byte)
            used, position, budget = scan.serve(buffer, byte, position, stop, budget)
            if not used and position < stop:  # an entry larger than the chunk
                whole = _whole_entry(part, segment, byte, data_end)
                if whole is None:
                    break  # it runs past the data
                used, position, budget = scan.serve(whole, byte, position, stop, budget)
            if used == _SPENT:
                return position, budget
            byte += used
    except EntryError:
        pass  # nothing after it can be found
    read.damaged += stop - position  # entries the data does not hold (none unless it is damaged)
    return stop, budget


_SPENT = -1
"""`_ChunkScan.serve`'s bytes used when the byte budget ran out."""


class _ChunkScan:
    """Serves the entries of one segment's chunks: what `parse_head` checks of each entry's head, then the
    frame's own checks, inline in one loop (a read of a topic per device serves hundreds of thousands of
    entries: a call, a generator step and a view per entry were most of its CPU)."""

    __slots__ = ("ends", "max_body", "part", "read", "segment", "table", "wanted")

    def __init__(
        self,
        part: PartitionLog,
        table: TopicTable,
        segment: Segment,
        wanted: Callable[[int], bool],
        max_body: int,
        read: PartitionRead,
    ) -> None:
        self.part, self.table, self.segment, self.wanted = part, table, segment, wanted
        self.max_body, self.read = max_body, read
        self.ends = table.committed if table.committed is not None else table.durable  # `TopicTable.end`

    def serve(self, buffer: bytes, byte: int, position: int, stop: int, budget: int) -> tuple[int, int, int]:
        """Serve the whole entries at the start of `buffer` (read at `byte`) until `stop`: (bytes they
        take, else `_SPENT` when the budget ran out; the next position; the budget left). Raises
        `EntryError` at an entry whose length or check fails."""
        read, wanted, ends = self.read, self.wanted, self.ends
        starts, truncated, topics, max_body = (
            self.table.start,
            self.table.truncated,
            len(self.table),
            self.max_body,
        )
        ids, frames = read.topic_ids, read.frames
        crc32c, pack_id = record.crc32c, TOPIC_ID.pack
        view = memoryview(buffer)
        size = len(buffer)
        last_head = size - _BODY_AT
        at = 0
        while position < stop and at <= last_head:
            topic_id, check = ENTRY_HEAD.unpack_from(buffer, at)
            body_length, frame_crc = PREFIX.unpack_from(buffer, at + HEAD_SIZE)
            if body_length > max_body or (topic_id & MARKER_BIT and body_length != MARKER_BODY_SIZE):
                raise EntryError("length")
            end = at + _BODY_AT + body_length
            if end > size:
                break  # it goes on past this chunk: the next chunk starts with it
            if check != crc32c(pack_id(topic_id), frame_crc):
                if not _valid_head(buffer, end, max_body):
                    raise EntryError("check")
                read.damaged += 1  # its id damaged, a checked entry after it: stepped over (as at open)
                position += 1
                at = end
                continue
            if not topic_id & MARKER_BIT:
                if topic_id >= topics:
                    read.damaged += 1
                elif wanted(topic_id):
                    version, offset = _VERSION_AND_OFFSET.unpack_from(buffer, at + _BODY_AT)
                    if version not in VERSIONS or crc32c(view[at + _BODY_AT : end]) != frame_crc:
                        read.damaged += 1
                    elif offset < starts[topic_id]:
                        read.lost[topic_id] = read.lost.get(topic_id, 0) + 1
                    elif offset < ends[topic_id] and (
                        topic_id not in truncated
                        or _live(self.part, topic_id, offset, self.segment, byte + at)
                    ):  # (else a replica's record not committed yet, or one a truncation cut)
                        if budget < end - at - HEAD_SIZE and frames:
                            return _SPENT, position, budget
                        ids.append(topic_id)
                        frames.append(view[at + HEAD_SIZE : end])
                        budget -= end - at - HEAD_SIZE
            position += 1
            at = end
        return at, position, budget


def _chunk_for(segment: Segment, entries: int, data_end: int, most: int) -> int:
    """Bytes to read at once for `entries` entries: about what they hold (the segment's average entry, a
    quarter more), at most `most`. Reading up to the byte budget instead made every slice of 256 entries
    of a paced read copy the rest of the segment (tens of megabytes, on the event loop)."""
    rows = segment.durable_rows if segment.in_memory else segment.row_count
    average = data_end // rows if rows else _MIN_CHUNK
    return min(most, max(_MIN_CHUNK, entries * average * 5 // 4))


def _entries(
    part: PartitionLog, segment: Segment, byte: int, data_end: int, max_body: int, chunk: int
) -> Generator[tuple[bytes, int, int, int, int]]:
    """(buffer, position in it, topic id, end in it, buffer's byte position) of each entry from `byte`, read
    a chunk at a time. Raises `EntryError` at an entry that cannot be stepped over."""
    while byte < data_end:
        buffer = part.pool.pread(segment.log_path, min(chunk, data_end - byte), byte)
        at = 0
        while at < len(buffer):
            try:
                topic_id, entry_end = parse_head(buffer, at, max_body)
            except EntryError as error:
                if error.reason != "torn":
                    raise
                if at:
                    break  # it goes on past this chunk: the next chunk starts with it
                whole = _whole_entry(part, segment, byte, data_end)
                if whole is None:
                    raise
                buffer = whole
                continue
            yield buffer, at, topic_id, entry_end, byte
            at = entry_end
        if not at:
            return
        byte += at


def _valid_head(buffer: bytes, at: int, max_body: int) -> bool:
    """Whether a whole entry whose head passes its check starts at `at` of `buffer`."""
    try:
        parse_head(buffer, at, max_body)
    except EntryError:
        return False
    return True


def _whole_entry(part: PartitionLog, segment: Segment, byte: int, data_end: int) -> bytes | None:
    """The entry at `byte` read whole (larger than a chunk); None when its length runs past the data."""
    head = part.pool.pread(segment.log_path, HEAD_SIZE + PREFIX_SIZE, byte)
    if len(head) < HEAD_SIZE + PREFIX_SIZE:
        return None
    body_length, _crc = PREFIX.unpack_from(head, HEAD_SIZE)
    size = HEAD_SIZE + PREFIX_SIZE + body_length
    if byte + size > data_end:
        return None
    return part.pool.pread(segment.log_path, size, byte)


def _live(part: PartitionLog, topic_id: int, offset: int, segment: Segment, byte: int) -> bool:
    """Whether the topic's index still points at this entry for `offset` (a truncation may have cut it)."""
    try:
        pieces = part.locate(topic_id, offset, offset + 1, 1 << 62, False)
    except CorruptRecord:
        return False
    return bool(pieces) and pieces[0].segment is segment and pieces[0].position == byte


def position_for_timestamp(part: PartitionLog, timestamp_ms: int, max_body: int) -> int:
    """The position of the partition's first record stamped at or after `timestamp_ms` (broker time; the
    end position if none). Segments whose newest record is older are skipped whole; in the first one that
    is not, entries are read from its last sparse row older than the time."""
    end = part.end_position
    for segment in part.segments:
        sealed = segment.sealed
        if (segment.newest_time if sealed is None else sealed.newest_time) < timestamp_ms:
            continue
        row = 0
        if sealed is not None:
            sparse = sealed.sparse_rows()
            for number in range(1, len(sparse) // 2):
                if sparse[2 * number + 1] >= timestamp_ms:
                    break
                row = number * 256
        rows = segment.durable_rows if segment.in_memory else segment.row_count
        found = _first_at_or_after(part, segment, row, rows, timestamp_ms, max_body)
        if found is not None:
            return found
    return end


def _first_at_or_after(
    part: PartitionLog, segment: Segment, row: int, rows: int, timestamp_ms: int, max_body: int
) -> int | None:
    entries = _entries(part, segment, part.byte_position(segment, row), _data_end(segment), max_body, _CHUNK)
    try:
        for buffer, at, topic_id, _end, _byte in entries:
            if row >= rows:
                break
            if not topic_id & MARKER_BIT and _TIME.unpack_from(buffer, at + _TIME_AT)[0] >= timestamp_ms:
                return segment.base + row
            row += 1
    except EntryError:
        return None
    finally:
        entries.close()
    return None
