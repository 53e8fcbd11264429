"""One partition log: the segments holding the records of its topics, interleaved, and how to find them.

Writing is split in three steps so that the store can keep disk work off its event loop:

    offset = part.append(topic_id, records, time)   # buffered in memory, offsets assigned (never change)
    firsts, count, size = part.append_many([(topic_id, records), ...], time)   # a loop turn's, many topics
    pending = part.take_pending()                     # hand the buffered bytes to a writer (positions fixed)
    for write in pending.writes: write.write(pool); write.make_durable(pool, sync=True)   # in order
    part.complete(pending)                            # the topics' durable ends advance

A topic's state lives in the store's `TopicTable` (columns by topic id). Finding a topic's records is
`partition_locate` (`locate`, `frames`); what opening reads and repairs of the segment files is
`segment_scan`.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from . import record
from .active_index import HOT, NO_PREVIOUS, UNKNOWN_ROW, ActiveIndex, pointer
from .entry import (
    HEAD_AND_PREFIX,
    HEAD_SIZE,
    TOPIC_ID,
    encode_marker,
    entries_of,
    head_of,
)
from .errors import InvalidRecord, RecordTooLarge, StorageError
from .file_pool import FileHandlePool
from .open_index import capacity_for, header_bytes
from .partition_locate import Locating, Piece, live_ends
from .recent import RecentWindows
from .record import (
    BODY_HEAD,
    FLAG_RETAIN,
    FORMAT_VERSION,
    PACKET_ID_VERSION,
    PREFIX,
    PREFIX_SIZE,
    U16,
    RecordFields,
    encode_framed,
)
from .sealed_index import MISSING, GroupBlocks, SealedIndex
from .segment import ACTIVE, ROLLED, SEALED, FileWrite, Segment
from .topic_table import NO_SEGMENT, NO_TIME, TopicTable

log = logging.getLogger(__name__)

__all__ = ["PartitionConfig", "PartitionLog", "PartitionPending", "Piece"]

_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|open|rebuild)$")
MAX_SEGMENT_BYTES = 2**32 - 1
MAX_SEGMENT_NUMBER = 2**31 - 1
"""The largest segment number (an i32 in sealed indexes); a file named past it is not the store's."""
_NO_FIELDS = (None, None, None, None, None)
"""(content type, payload format, expiry, response topic, correlation data) of a record that has none."""


@dataclass(frozen=True, slots=True)
class PartitionConfig:
    segment_bytes: int
    segment_ms: int | None
    max_record_bytes: int


@dataclass(slots=True)
class PartitionPending:
    """What a partition buffered since the previous take: run `writes` in order, then `complete` it."""

    writes: list[FileWrite]
    marks: list[tuple[Segment, int, int]]
    runs: list[tuple[int, int, int, int]]
    bytes: int
    coverage: tuple[int, int] = (0, 0)
    """For the catalog's job: its durable bytes and their CRC32C once this is written."""


class PartitionLog(Locating):
    """The segments of one partition and the appends of its topics."""

    def __init__(
        self,
        number: int,
        directory: str,
        table: TopicTable,
        pool: FileHandlePool,
        recent: RecentWindows,
        blocks: GroupBlocks,
        config: PartitionConfig,
    ) -> None:
        self.number = number
        self.directory = directory
        self.table = table
        self.pool = pool
        self.recent = recent
        self.blocks = blocks
        self.config = config
        self.segments: list[Segment] = []
        self.by_number: dict[int, Segment] = {}
        self.names: list[str] = []
        """Topic names by id (the catalog's list), for errors and traces."""
        self.active: Segment | None = None
        self.orphan_indexes: list[int] = []
        self.rebuild_marked: set[int] = set()
        """Segments whose sealed index a read or retention found damaged: made again at open."""
        """Segments found at open with their sealed index but without their data (see `discover`)."""
        self.lost_segments: set[int] = set()
        """Segments found missing from a topic's chain at a read (logged once each)."""
        self.retention_deleted: Callable[[int], bool] = _none_deleted
        """Whether retention deleted a segment (its account's answer, once the store is open): no read needs
        its records (a read in a gap walks past it, and says nothing)."""
        self.next_number = 0
        self.next_base = 0
        """The base position of a first segment (when retention deleted every earlier one)."""
        self._runs: list[tuple[int, int, int, int]] = []
        self._rolled: list[Segment] = []
        """Rolled segments whose last data is not durable yet (then they go to the sealer)."""
        self._created: list[Segment] = []
        """Segments created since the last take (their open index header goes with their first data)."""
        self._directory_new = False
        self._roll_at = float("inf")
        self.last_append_size = 0
        self.pending_bytes = 0
        self.replicated = False
        """A cluster's store: readers see up to the committed ends, which `LogStore.commit` moves."""
        self._max_body = config.max_record_bytes
        self._capacity = capacity_for(min(config.segment_bytes, MAX_SEGMENT_BYTES))

    # -- state ---------------------------------------------------------------------------------------

    @property
    def start_position(self) -> int:
        """The first position the partition still holds."""
        return self.segments[0].base if self.segments else self.end_position

    @property
    def end_position(self) -> int:
        """The position after its last durable entry: a job writes the segments rolled before the active
        one too, so the first segment still in memory with entries not yet durable ends it."""
        if not self.segments:
            return self.next_base
        last = self.segments[-1]
        end = last.base + last.row_count
        for segment in reversed(self.segments):
            if not segment.in_memory:
                break
            if segment.durable_rows < segment.row_count:
                end = segment.base + segment.durable_rows
        return end

    @property
    def capacity(self) -> int:
        """Rows a segment can hold (its open index's capacity)."""
        return self._capacity

    def trace(self, pending: PartitionPending) -> list[tuple[str, int, int]]:
        """(topic, first offset, end) of the appends `pending` holds (for `path_trace`)."""
        names = self.names
        return [(names[topic_id], end - 1, end) for topic_id, end, _size, _newest in pending.runs]

    def segment_in_memory(self, number: int) -> bool:
        segment = self.by_number.get(number)
        return segment is not None and segment.rows is not None

    # -- writing -------------------------------------------------------------------------------------

    def append(self, topic_id: int, records: Sequence[RecordFields], timestamp: int) -> int:
        """Append `records` of one topic with one broker time; returns the first offset. All or nothing."""
        table = self.table
        offset = table.next[topic_id]
        if not records:
            return offset
        try:
            entries = encode_framed(offset, timestamp, records, head_of(topic_id))
        except (ValueError, OverflowError) as error:
            raise InvalidRecord(f"record cannot be stored: {error}") from error
        return self._add(topic_id, entries, offset, [timestamp] * len(entries), timestamp)

    def append_frames(
        self, topic_id: int, frames: Sequence[memoryview], times: list[int], crcs: Sequence[int]
    ) -> int:
        """Append frames of one topic verbatim (a leader's), given each one's time and CRC field; returns the
        first offset."""
        entries = entries_of(topic_id, frames, crcs)
        return self._add(topic_id, entries, self.table.next[topic_id], times, max(times))

    def append_many(
        self, appends: Sequence[tuple[int, Sequence[RecordFields]]], timestamp: int
    ) -> tuple[list[int | StorageError], int, int]:
        """`append` of each (topic id, records), in order, with one broker time: the first offset of each or
        the `StorageError` that refused it alone, and the records and bytes appended in all.

        A loop turn of a topic per device appends one record to each of many topics: such an append (a
        record without MQTT 5 fields) is encoded, indexed and accounted in this one loop, with the bytes,
        rows and offsets `append` gives, a busy topic's (`HOT` rows or more in the active segment) included;
        any other goes through `append`."""
        results: list[int | StorageError] = []
        result = results.append
        # Hoisted locals and the single record's path inlined: with a topic per device this body runs once
        # per publish, where a call chain per record cost more than the encoding itself.
        table = self.table
        next_offsets, index_ms = table.next, table.index_ms
        head_seg, head_first, head_last = table.head_seg, table.head_first, table.head_last
        pack_body, pack_headed, pack_id, pack_u16 = (
            BODY_HEAD.pack,
            HEAD_AND_PREFIX.pack,
            TOPIC_ID.pack,
            U16.pack,
        )
        checksum, add_run = record.crc32c, self._runs.append
        max_body, room = self._max_body, min(self.config.segment_bytes, MAX_SEGMENT_BYTES)
        records_added = bytes_added = inline_bytes = 0
        last_client, raw_id = None, b""
        hoisted: Segment | None = None  # the segment whose columns' appends and next row the locals hold
        row = 0
        for topic_id, records in appends:
            body = None
            if len(records) == 1:
                (payload, qos, retain, client_id, properties, content_type,
                 indicator, expiry, response, correlation) = records[0]  # fmt: skip
                if not properties and (content_type, indicator, expiry, response, correlation) == _NO_FIELDS:
                    offset = next_offsets[topic_id]
                    try:
                        if client_id is not last_client:
                            last_client, raw_id = client_id, client_id.encode()
                        flags = FLAG_RETAIN if retain else 0
                        if qos > 0xFF:  # QoS 2 keeping its packet id (`record.qos_with_packet_id`)
                            packet_id, qos = qos >> 8, qos & 0xFF
                            body = pack_body(PACKET_ID_VERSION, offset, timestamp, qos, flags, len(raw_id))
                            body += raw_id + pack_u16(packet_id)
                        else:
                            body = pack_body(FORMAT_VERSION, offset, timestamp, qos, flags, len(raw_id))
                            body += raw_id
                        body += payload
                    except (ValueError, OverflowError, struct.error):  # `append` raises what it means
                        body = None
            if body is None or len(body) > max_body:
                first = self._append_alone(topic_id, records, timestamp)
                hoisted = None
                result(first)
                if records and not isinstance(first, StorageError):
                    records_added += len(records)
                    bytes_added += self.last_append_size
                continue
            crc = checksum(body)
            entry = pack_headed(topic_id, checksum(pack_id(topic_id), crc), len(body), crc) + body
            total = len(entry)
            segment = self.active
            if (
                segment is None
                or segment is not hoisted
                or segment.size + total > room
                or timestamp >= self._roll_at
                or row >= segment.capacity
            ):
                segment = self._segment_for(total, 1, timestamp)
                if segment is not hoisted:  # (a new segment, or rows added outside this loop)
                    hoisted = segment
                    self._stamp(segment, timestamp)
                    rows = segment.rows
                    assert rows is not None
                    columns = rows.topic_ids, rows.positions, rows.offsets, rows.times, rows.prevs
                    add_topic, add_position, add_offset, add_time, add_prev = (c.append for c in columns)
                    hot, number, topic_ids = rows.hot, segment.number, rows.topic_ids
                    row = len(topic_ids)
            position = segment.size
            segment.pending.append(entry)
            segment.pending_rows += 1
            segment.size = position + total
            index_time = index_ms[topic_id]
            if timestamp > index_time:
                index_time = index_ms[topic_id] = timestamp
            head = head_seg[topic_id]
            if head == NO_SEGMENT:  # the topic's first record (in memory)
                head_seg[topic_id], head_first[topic_id], prev = number, offset, NO_PREVIOUS
            elif (
                head == number
                and head_last[topic_id] >= 0
                and (offset - head_first[topic_id] < HOT - 1 or topic_id in hot)
                and topic_ids[head_last[topic_id]] == topic_id  # (not a truncation's marker: `link`)
            ):
                prev = head_last[topic_id]  # the chain goes on here (a busy topic's rows kept as well)
            else:
                prev = None
            if prev is None:  # a new chain here, or the row that makes the topic busy
                self.link(topic_id, segment, [position], offset, index_time)
                row += 1
            else:  # `ActiveIndex.add_one`, its columns' appends hoisted
                add_topic(topic_id)
                add_position(position)
                add_offset(offset)
                add_time(index_time)
                add_prev(prev)
                if topic_id in hot:
                    hot[topic_id].append(row)
                head_last[topic_id] = row
                row += 1
            next_offsets[topic_id] = offset + 1
            add_run((topic_id, offset + 1, total - HEAD_SIZE, timestamp))
            result(offset)
            records_added += 1
            inline_bytes += total
        self.pending_bytes += inline_bytes
        self.last_append_size = bytes_added = bytes_added + inline_bytes
        return results, records_added, bytes_added

    def _append_alone(
        self, topic_id: int, records: Sequence[RecordFields], timestamp: int
    ) -> int | StorageError:
        """`append`, or the `StorageError` that refused it."""
        try:
            return self.append(topic_id, records, timestamp)
        except StorageError as error:
            return error

    def _segment_for(self, total: int, count: int, newest: int) -> Segment:
        """The active segment, rolled first when `count` entries of `total` bytes at time `newest` do not
        belong in it: its size or its age once it holds records, its rows' room even while it is empty (an
        empty one a roll left has room for `segment_bytes`' rows, a batch may have more)."""
        segment = self.active
        if (
            segment is None
            or (
                segment.size and (segment.size + total > self.config.segment_bytes or newest >= self._roll_at)
            )
            or (0 if segment.rows is None else len(segment.rows)) + count > segment.capacity
            or segment.size + total > MAX_SEGMENT_BYTES
        ):
            segment = self._roll(count)
        return segment

    def _stamp(self, segment: Segment, newest: int) -> None:
        """`segment` takes records of time `newest`: its first time (and roll time) and newest time."""
        if segment.first_time == NO_TIME:
            segment.first_time = newest
            if self.config.segment_ms is not None:
                self._roll_at = newest + self.config.segment_ms
        if newest > segment.newest_time:
            segment.newest_time = newest

    def _add(
        self, topic_id: int, entries: list[bytes], offset: int, times: Sequence[int], newest: int
    ) -> int:
        count = len(entries)
        if count == 1:  # a topic per device: nearly every append holds one record
            sizes = None
            total = len(entries[0])
            largest = total - HEAD_SIZE
        else:
            sizes = list(map(len, entries))
            largest = max(sizes) - HEAD_SIZE
            total = sum(sizes)
        if largest > self._max_body + PREFIX_SIZE:
            raise RecordTooLarge(largest, self._max_body)
        segment = self._segment_for(total, count, newest)
        table = self.table
        if sizes is None:
            positions = [segment.size]
        else:
            positions = list(accumulate(sizes, initial=segment.size))
            positions.pop()
        segment.pending += entries
        segment.pending_rows += count
        segment.size += total
        index_time = table.index_ms[topic_id]
        if newest > index_time:
            index_time = table.index_ms[topic_id] = newest
        self._stamp(segment, newest)
        self.link(topic_id, segment, positions, offset, index_time)
        end = offset + count
        table.next[topic_id] = end
        self._runs.append((topic_id, end, total - HEAD_SIZE * count, newest))
        self.pending_bytes += total
        self.last_append_size = total
        return offset

    def link(
        self, topic_id: int, segment: Segment, positions: list[int], offset: int, index_time: int
    ) -> None:
        """Add rows for the topic's records at `positions` (offsets from `offset`) to `segment`, chained to
        the topic's previous ones, and make them its head."""
        rows = segment.rows
        assert rows is not None, "the segment holds its rows"
        table = self.table
        number = segment.number
        head = table.head_seg[topic_id]
        last = table.head_last[topic_id]
        if head == number and last >= 0 and rows.topic_ids[last] != topic_id:
            # The head is a truncation's marker here (`hold_cut`): these records, at its offset, start the
            # chain where the marker's goes on (the group they make holds the cut as well).
            prev = rows.prevs[last]
            count_before = 0
            table.head_seg[topic_id] = number
            table.head_first[topic_id] = offset
        elif head == number:
            prev = last if last >= 0 else NO_PREVIOUS
            count_before = offset - table.head_first[topic_id]
        else:
            if head == NO_SEGMENT:
                prev = NO_PREVIOUS
            elif self.segment_in_memory(head):
                prev = pointer(head, last) if last >= 0 else NO_PREVIOUS  # an empty group: a restart
            else:
                prev = pointer(head, UNKNOWN_ROW)
            count_before = 0
            table.head_seg[topic_id] = number
            table.head_first[topic_id] = offset
        table.head_last[topic_id] = rows.add_rows(topic_id, positions, offset, index_time, prev, count_before)

    def marker_prev(self, topic_id: int, segment: Segment) -> int:
        """The `prev` of a marker row of the topic in `segment` (where its chain was when the marker came)."""
        table = self.table
        head = table.head_seg[topic_id]
        last = table.head_last[topic_id]
        if head == NO_SEGMENT:
            return NO_PREVIOUS
        if self.segment_in_memory(head):
            return pointer(head, last) if last >= 0 else NO_PREVIOUS
        return pointer(head, UNKNOWN_ROW)

    def append_marker(self, topic_id: int, kind: int, offset: int, dropped: int) -> tuple[Segment, int]:
        """Buffer a marker of the topic (made durable by the caller's flush); returns its segment and row."""
        entry = encode_marker(topic_id, kind, offset, dropped)
        segment = self.active
        if (
            segment is None
            or segment.size + len(entry) > MAX_SEGMENT_BYTES
            or len(segment.rows or ()) + 1 > segment.capacity
        ):
            segment = self._roll(1)
        rows = segment.rows
        assert rows is not None
        prev = self.marker_prev(topic_id, segment)
        row = rows.add_marker(topic_id, segment.size, offset, kind, dropped, prev)
        segment.pending.append(entry)
        segment.pending_rows += 1
        segment.size += len(entry)
        self.pending_bytes += len(entry)
        return segment, row

    def hold_cut(self, topic_id: int, segment: Segment, row: int, offset: int) -> None:
        """Make the truncation marker at `row` of `segment` (its cut at `offset` made by `cut_live`) the
        topic's head when the cut left the head in a sealed segment. A sealed group keeps the records cut
        from it, and without this only the log's end would say where its live ones stop: a gap, moving the
        end on, would serve them again. As the head (an empty group at `offset` whose chain goes on to the
        sealed one) the marker caps that group at the cut for every read, and so does its sealed index
        (`segment_scan.apply_groups`)."""
        table = self.table
        head = table.head_seg[topic_id]
        if head != NO_SEGMENT and not self.segment_in_memory(head):
            table.head_seg[topic_id] = segment.number
            table.head_first[topic_id] = offset
            table.head_last[topic_id] = row

    def leave_active_segment(self, topic_id: int) -> None:
        """Roll the active segment when it holds the topic's newest records or a marker of it, before the
        topic continues past a gap in its offsets: the gap then falls between two segments' groups (a sealed
        group is dense, and would hold an entry for every offset of the gap; with a marker before it, the
        seal took the log's end, or the cut below the gap, from that marker)."""
        active = self.active
        if active is not None and (
            self.table.head_seg[topic_id] == active.number
            or (active.rows is not None and topic_id in active.rows.marked)
        ):
            self._roll(1)

    def roll_if_old(self, now_ms: int) -> bool:
        """Roll the active segment if it holds records and is `segment_ms` old at `now_ms`, though nothing
        was appended since (a quiet partition), so that retention can judge its records; returns whether it
        rolled (its new segment is then to be written)."""
        active = self.active
        if active is None or not active.size or now_ms < self._roll_at:
            return False
        self._roll(1)
        return True

    def roll_now(self) -> bool:
        """Roll the active segment if it holds records; returns whether it rolled (its new segment is then
        to be written). Records appended from now on go to a segment of their own."""
        active = self.active
        if active is None or not active.size:
            return False
        self._roll(1)
        return True

    def _roll(self, rows: int) -> Segment:
        """Start a new active segment with room for at least `rows` rows (an oversized first batch)."""
        previous = self.active
        if previous is not None:
            previous.state = ROLLED
            self._rolled.append(previous)
        base = previous.base + len(previous.rows or ()) if previous is not None else self._base_after_last()
        segment = Segment(self.directory, self.next_number, base, max(self._capacity, rows))
        segment.rows = ActiveIndex()
        self.next_number += 1
        self.segments.append(segment)
        self.by_number[segment.number] = segment
        self.active = segment
        self._created.append(segment)
        self._roll_at = float("inf")
        return segment

    def _base_after_last(self) -> int:
        if not self.segments:
            return self.next_base
        last = self.segments[-1]
        return last.base + last.row_count

    def take_pending(self) -> PartitionPending | None:
        """Detach everything buffered for a writer; None if nothing."""
        writes: list[FileWrite] = []
        marks: list[tuple[Segment, int, int]] = []
        created = set(self._created)
        writable = self._writable()
        self._created = []
        for segment in writable:
            if segment in created:
                directories = [self.directory]
                if self._directory_new:
                    directories.append(os.path.dirname(self.directory))
                    self._directory_new = False
                header = header_bytes(segment.number, segment.base, segment.capacity)
                writes.append(FileWrite(segment.open_path, [header], 0, holds_records=False))
            else:
                directories = []
            position = segment.submitted_size
            write = segment.take_write()
            if write is None:
                if directories:
                    writes.append(FileWrite(segment.log_path, [b""], 0, directories))
                continue
            if len(write.data) > 1:
                write.data = [b"".join(write.data)]
            self.recent.add((self.number, segment.number), position, bytes(write.data[0]))
            write.directories_to_sync = directories
            writes.append(write)
            marks.append((segment, segment.size, segment.written_rows))
        if not writes:
            return None
        runs, self._runs = self._runs, []
        pending = PartitionPending(writes, marks, runs, self.pending_bytes)
        self.pending_bytes = 0
        return pending

    def _writable(self) -> list[Segment]:
        """Segments with buffered data: the rolled ones waiting, then the active one."""
        segments = [segment for segment in self._rolled if segment.pending]
        if self.active is not None and (self.active.pending or self.active in self._created):
            segments.append(self.active)
        for segment in self._created:  # a segment rolled before any data reached it
            if segment not in segments:
                segments.append(segment)
        return segments

    def complete(self, pending: PartitionPending, synced: bool) -> list[tuple[int, int]]:
        """The writes of `pending` are done (and fsynced if `synced`): durable ends advance. Returns (topic
        id, readable end before) for every topic whose readable end moved (none when `replicated`: there
        `commit` moves them)."""
        replicated = self.replicated
        for segment, size, rows in pending.marks:
            if size > segment.durable_size:
                segment.durable_size = size
                segment.durable_rows = rows
        table = self.table
        durable, total, durable_ms = table.durable, table.total, table.durable_ms
        advanced: list[tuple[int, int]] = []
        for topic_id, end, size, newest in pending.runs:
            before = durable[topic_id]
            if end > before:
                durable[topic_id] = end
                if not replicated:
                    advanced.append((topic_id, before))
            total[topic_id] += size
            if newest > durable_ms[topic_id]:
                durable_ms[topic_id] = newest
        return advanced

    def ready_to_seal(self) -> list[Segment]:
        """Rolled segments whose data is all durable (and no longer waited for): hand them to the sealer."""
        ready = [s for s in self._rolled if not s.pending and s.durable_size == s.size]
        if ready:
            self._rolled = [s for s in self._rolled if s not in ready]
        return ready

    def sealed(self, segment: Segment, index: SealedIndex) -> None:
        """The sealer wrote `segment`'s sealed index: readers use it from now on, its rows go."""
        segment.sealed = index
        segment.state = SEALED
        segment.rows = None
        segment.open_index = None

    # -- locating records ----------------------------------------------------------------------------

    # -- truncation ----------------------------------------------------------------------------------

    def cut_live(self, topic_id: int, offset: int, below: int = -1) -> tuple[int, int]:
        """Cut the topic's log to `[.., offset)` in memory (rows killed, head moved back); returns the bytes
        of its records cut from sealed segments (what a truncation marker carries) and those cut from rows of
        segments numbered below `below` (at open: segments a crash took the seal of). The caller moved
        nothing."""
        table = self.table
        table.truncated.add(topic_id)
        steps = self._steps(topic_id, max(offset - 1, -1), read=False)
        dropped_sealed = 0
        dropped_rows = 0
        dropped_below = 0
        new_head: tuple[int, int, int] | None = None  # segment, first offset, last row
        caps = live_ends(steps, table.next[topic_id])  # records past a newer group's start are dead already
        for number, step in enumerate(steps):
            segment = step[0]
            upto = caps[number]
            if len(step) == 3:
                _segment, last_row, first = step
                rows = segment.rows
                assert rows is not None
                found, _previous = rows.rows_of(topic_id, last_row, offset, upto)
                if found:
                    cut = sum(rows.size_of(row, segment.size) - HEAD_SIZE for row in found)
                    dropped_rows += cut
                    if segment.number < below:
                        dropped_below += cut
                    rows.kill(topic_id, found)
                if first < offset:
                    kept, _ = rows.rows_of(topic_id, last_row, first, offset)
                    new_head = (segment.number, first, kept[-1] if kept else last_row)  # (else: a marker)
                    break
            else:
                group = step[1]
                cut_to = min(group.count, upto - group.first_offset)
                if group.first_offset + cut_to > offset:
                    cut_from = max(offset - group.first_offset, 0)
                    entries = segment.sealed.entries_of(group, cut_from, cut_to)
                    dropped_sealed += sum(
                        (entries[2 * n] >> 32) - HEAD_SIZE
                        for n in range(len(entries) // 2)
                        if entries[2 * n] & 0xFFFFFFFF != MISSING
                    )
                if group.first_offset < offset or (group.count == 0 and group.first_offset == offset):
                    new_head = (segment.number, group.first_offset, UNKNOWN_ROW)
                    break
        if new_head is None:
            table.head_seg[topic_id] = NO_SEGMENT
            table.head_first[topic_id] = offset
            table.head_last[topic_id] = -1
        else:
            table.head_seg[topic_id], table.head_first[topic_id], table.head_last[topic_id] = new_head
        table.total[topic_id] -= dropped_sealed + dropped_rows
        return dropped_sealed, dropped_below

    def restart_live(self, topic_id: int, offset: int, number: int) -> None:
        """Empty the topic's log in memory to go on at `offset` (its rows in memory killed); its (empty)
        head is segment `number`, the one holding the restart marker."""
        table = self.table
        for step in self._steps(topic_id, -1, read=False):
            if len(step) == 3:
                segment, last_row, first = step
                rows = segment.rows
                assert rows is not None
                found, _previous = rows.rows_of(topic_id, last_row, first, 2**63 - 1)
                rows.kill(topic_id, found)
        table.head_seg[topic_id] = number
        table.head_first[topic_id] = offset
        table.head_last[topic_id] = -1
        table.total[topic_id] = 0
        table.dropped[topic_id] = 0

    # -- whole-partition reads -------------------------------------------------------------------------

    def byte_position(self, segment: Segment, row: int) -> int:
        """The byte position of `row` of `segment` (a sealed one: from its sparse rows, then its entries)."""
        rows = segment.rows
        if rows is not None:
            return rows.positions[row] if row < len(rows) else segment.size
        sealed = segment.sealed
        assert sealed is not None
        if row >= sealed.rows:
            return sealed.data_size
        sparse = sealed.sparse_rows()
        at = row // 256
        position = sparse[2 * at]
        skip = row - at * 256
        # the entries between the sparse row and `row` are read a chunk at a time, not one read per entry
        # (a partition read starts at any row: up to 255 reads of an entry's head each time)
        chunk = _skip_chunk(skip, sealed.data_size // sealed.rows)
        while skip:
            buffer = self.pool.pread(segment.log_path, chunk, position)
            end = len(buffer) - HEAD_SIZE - PREFIX_SIZE
            step = 0
            while skip and step <= end:
                body_length, _crc = PREFIX.unpack_from(buffer, step + HEAD_SIZE)
                step += HEAD_SIZE + PREFIX_SIZE + body_length
                skip -= 1
            if not step:  # not even a head left: what the data does not hold
                PREFIX.unpack_from(buffer, HEAD_SIZE)
            position += step
        return position

    # -- recovery ------------------------------------------------------------------------------------

    def discover(self) -> list[Segment]:
        """The partition's segments found on disk (in number order), strays removed; the numbers of sealed
        indexes whose segment file is gone go to `orphan_indexes` (recovery reads, reports, removes them)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            os.makedirs(self.directory, exist_ok=True)
            self._directory_new = True
            return []
        found: dict[int, set[str]] = {}
        for name in names:
            match = _SEGMENT_FILE.match(name)
            if match is None:
                if name.endswith(".tmp"):
                    os.unlink(os.path.join(self.directory, name))
                continue
            number = int(match.group(1))
            if number > MAX_SEGMENT_NUMBER:
                log.warning(
                    "%s: not a segment of this store (its numbers end at %d): left as it is, not read",
                    os.path.join(self.directory, name), MAX_SEGMENT_NUMBER,
                )  # fmt: skip
                continue
            found.setdefault(number, set()).add(match.group(2))
        segments: list[Segment] = []
        for number in sorted(found):
            kinds = found[number]
            if "log" not in kinds:
                for kind in kinds - {"index"}:
                    os.unlink(os.path.join(self.directory, f"{number:020d}.{kind}"))
                if "index" in kinds:
                    self.orphan_indexes.append(number)
                continue
            if "rebuild" in kinds:
                self.rebuild_marked.add(number)
            segments.append(Segment(self.directory, number, 0))
        return segments

    def add_loaded(self, segment: Segment) -> None:
        self.segments.append(segment)
        self.by_number[segment.number] = segment
        self.next_number = max(self.next_number, segment.number + 1)

    def resume_active(self) -> None:
        """After open: the last segment, if it holds rows in memory, is the active one."""
        if self.segments and self.segments[-1].rows is not None:
            active = self.active = self.segments[-1]
            active.state = ACTIVE
            if active.first_time != NO_TIME and self.config.segment_ms is not None:
                self._roll_at = active.first_time + self.config.segment_ms
        for segment in self.segments[:-1]:
            if segment.rows is not None:
                segment.state = ROLLED


def _none_deleted(_number: int) -> bool:
    """`PartitionLog.retention_deleted` until the store's account is open."""
    return False


def _skip_chunk(entries: int, average: int) -> int:
    """Bytes to read to step over `entries` entries of about `average` bytes: a quarter more, at least 4 KiB
    and at most 1 MiB (an entry past the chunk is stepped over from its head: the next read starts after)."""
    return min(1 << 20, max(4096, entries * average * 5 // 4))
