"""What opening a partition log reads and repairs of its segment files: scanning a segment's entries from a
position, checking each (``SegmentScanner``), applying a sealed segment's index to the topics' sealed state
(``apply_groups``, the sealer's too), cutting a torn end, writing a fresh open-index header.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from .entry import (
    ENTRY_HEAD,
    HEAD_SIZE,
    MARKER_BIT,
    MARKER_BODY_SIZE,
    EntryError,
    Marker,
    check_of,
    parse_head,
    parse_marker,
)
from .file_pool import FileHandlePool
from .open_index import header_bytes
from .quarantine import Quarantine
from .record import (
    MIN_BODY_SIZE,
    PREFIX,
    PREFIX_SIZE,
    FrameError,
    check_frame,
)
from .sealed_index import FLAG_RESTART, FLAG_TRUNCATED, SealedIndex
from .segment import Segment
from .topic_table import NO_TIME, SealedState

log = logging.getLogger("broker_edge.storage.partition_log")

_SCAN_CHUNK = 4 * 1024 * 1024
_RESYNC_CHUNK = 1024 * 1024
"""Bytes searched at a time for the next valid entry after damage (`find_next_entry`)."""
_ID_AND_LENGTH = struct.Struct("<I4xI")
"""An entry's topic id and its frame's length prefix, as a candidate's position holds them."""
_SHORTEST_BODY = min(MIN_BODY_SIZE, MARKER_BODY_SIZE)
_SHORTEST_ENTRY = HEAD_SIZE + PREFIX_SIZE + MIN_BODY_SIZE
"""The fewest bytes a record's entry takes: damage over N bytes held at most N // it records of a topic."""

__all__ = [
    "ScanReport",
    "SegmentScanner",
    "apply_groups",
    "remove_file",
    "truncate_segment",
    "write_open_header",
]


FOREIGN = "another partition's topic"
"""The damage of an entry whose topic the catalog files in another partition."""


@dataclass(slots=True)
class ScanReport:
    """What scanning a segment at open found."""

    records: int = 0
    bytes_dropped: int = 0
    damaged_records: list[tuple[int, int]] = field(default_factory=list)
    """(topic id, offset) of records kept in place as holes (their frame failed its CRC)."""
    damage: str | None = None
    scanned: int = 0
    skipped: int = 0
    """Entries stepped over: a damaged topic id, a record repeating an offset, a damaged range."""
    bytes_skipped: int = 0
    """Bytes of damaged ranges stepped over to the valid entries after them (kept in the file)."""


class SegmentScanner:
    """Reads a segment's entries from a position, checking each, into rows (recovery).

    `next_offsets` gives each topic's next offset before the segment (what its records must continue);
    `apply(topic_id, position, offset, time, size)` is called for each valid record, `on_marker(marker,
    position)` for each marker. Scanning stops at an entry that cannot be stepped over (the caller truncates
    a tail there); a record whose frame fails its CRC between valid ones is reported as a hole and applied.
    """

    def __init__(
        self,
        pool: FileHandlePool,
        path: str,
        max_body: int,
        topics: int,
        next_offset: Callable[[int], int],
        ours: Callable[[int], bool] = lambda _topic_id: True,
    ) -> None:
        self.pool = pool
        self.path = path
        self.max_body = max_body
        self.topics = topics
        self.next_offset = next_offset
        self.ours = ours
        """Whether a topic id is filed in this segment's partition (the catalog's): an entry of another
        partition's topic (that partition's file copied over this one) is not this log's."""
        self.expected: dict[int, int] = {}

    def scan(
        self,
        start: int,
        apply: Callable[[int, int, int, int, int], None],
        on_marker: Callable[[Marker, int], None],
        on_skip: Callable[[int], None],
    ) -> tuple[int, ScanReport]:
        """Scan from byte `start`; returns the position after the last valid entry and the report.
        `on_skip(position)` is called for each entry or damaged range stepped over (a damaged topic id, a
        repeated offset, bytes that are no entry followed by valid ones: zeroed or overwritten pages)."""
        report = ScanReport()
        file_size = os.path.getsize(self.path)
        position = self._scan_from(start, file_size, apply, on_marker, on_skip, report)
        stepped_over = None
        while position < file_size:
            found = self.find_next_entry(position + 1, file_size)
            if found is None:
                return position, report  # nothing valid after the damage: a torn or damaged end
            stepped_over = report.damage
            log.error(
                "%s: bytes %d to %d are damaged (%s); stepped over to the valid entries after them (the"
                " records they held are lost)",
                self.path,
                position,
                found,
                report.damage,
            )
            on_skip(position)
            report.skipped += 1
            report.bytes_skipped += found - position
            position = self._scan_from(found, file_size, apply, on_marker, on_skip, report)
        report.damage = stepped_over
        return position, report

    def _scan_from(
        self,
        start: int,
        file_size: int,
        apply: Callable[[int, int, int, int, int], None],
        on_marker: Callable[[Marker, int], None],
        on_skip: Callable[[int], None],
        report: ScanReport,
    ) -> int:
        """Scan from byte `start` up to the end or to an entry that cannot be stepped over (its reason in
        `report.damage`); returns the position reached."""
        position = start
        chunk_start = start
        view = memoryview(b"")
        expected = self.expected
        max_body = self.max_body
        while position < file_size:
            at = position - chunk_start
            try:
                marked, end = parse_head(view, at, max_body)
            except EntryError as error:
                if error.reason == "torn" and chunk_start + len(view) < file_size:
                    chunk_start = position
                    needed = self._entry_size(position) or _SCAN_CHUNK
                    view = memoryview(
                        self.pool.pread(
                            self.path, min(max(_SCAN_CHUNK, needed), file_size - position), position
                        )
                    )
                    if len(view) < needed and needed != _SCAN_CHUNK:
                        report.damage = "torn"
                        return position
                    continue
                report.damage = error.reason
                skip = self._entry_size(position) if error.reason == "check" else None
                if skip and self._valid_after(position + skip, file_size):
                    log.error(
                        "%s: entry at %d fails its topic id check; skipped (%d bytes)",
                        self.path,
                        position,
                        skip,
                    )
                    on_skip(position)
                    position += skip  # an entry whose topic id is damaged: skipped, the entries after it kept
                    report.skipped += 1
                    continue
                return position
            size = end - at
            report.scanned += 1
            if marked & MARKER_BIT:
                try:
                    marker = parse_marker(view, at)
                except EntryError as error:
                    report.damage = error.reason
                    return position
                if not self.ours(marker.topic_id):
                    report.damage = FOREIGN
                    return position
                on_marker(marker, position)
                expected[marker.topic_id] = marker.offset
                position += size
                continue
            topic_id = marked
            if topic_id >= self.topics:
                report.damage = "unknown topic"
                return position
            if not self.ours(topic_id):
                report.damage = FOREIGN
                return position
            want = expected.get(topic_id)
            if want is None:
                want = self.next_offset(topic_id)
            try:
                _end, timestamp = check_frame(view, at + HEAD_SIZE, want, max_body)
            except FrameError as error:
                if error.reason == "offset":
                    found = int.from_bytes(view[at + HEAD_SIZE + 9 : at + HEAD_SIZE + 17], "little")
                    if found > want:  # records lost to damage before this one: a gap, then this record
                        try:
                            _end, timestamp = check_frame(view, at + HEAD_SIZE, found, max_body)
                        except FrameError:
                            report.damage = "offset"
                            return position
                        want = found
                    else:  # an offset going back without a marker: a stray entry, skipped
                        log.error(
                            "%s: entry at %d repeats offset %d of topic %d; skipped",
                            self.path,
                            position,
                            found,
                            topic_id,
                        )
                        report.skipped += 1
                        on_skip(position)
                        position += size
                        continue
                elif error.reason == "checksum" and self._valid_after(position + size, file_size):
                    report.damaged_records.append((topic_id, want))
                    timestamp = NO_TIME
                else:
                    report.damage = error.reason
                    return position
            apply(topic_id, position, want, timestamp, size)
            expected[topic_id] = want + 1
            report.records += 1
            position += size
        report.damage = None
        return position

    def _entry_size(self, position: int) -> int | None:
        head = self.pool.pread(self.path, HEAD_SIZE + PREFIX_SIZE, position)
        if len(head) < HEAD_SIZE + PREFIX_SIZE:
            return None
        body_length, _crc = PREFIX.unpack_from(head, HEAD_SIZE)
        return HEAD_SIZE + PREFIX_SIZE + body_length if body_length <= self.max_body else None

    def find_next_entry(self, start: int, file_size: int) -> int | None:
        """The first position from `start` where a valid entry begins (its head's check, its frame's CRC,
        version and length, or a marker's) followed by another entry's checked head or the end of the file:
        where the scan goes on after damage it cannot step over (`start` is the byte after the damage's
        first). None when there is none."""
        shortest = HEAD_SIZE + PREFIX_SIZE + _SHORTEST_BODY
        chunk_start = start
        while chunk_start + shortest <= file_size:
            data = self.pool.pread(self.path, min(_RESYNC_CHUNK, file_size - chunk_start), chunk_start)
            for at in self._candidates(data):
                if self._entry_at(chunk_start + at, file_size, start - 1):
                    return chunk_start + at
            if chunk_start + len(data) >= file_size:
                return None
            chunk_start += len(data) - shortest + 1  # the next chunk overlaps: no head is cut in two
        return None

    def _candidates(self, data: bytes) -> list[int]:
        """Positions in `data` whose topic id (a known topic's, or a marker's) and length prefix are
        plausible, in order: found on whole arrays with numpy where it is installed (a zeroed or random range
        costs no Python per byte), else word by word (a broker installed without the `arrow` extra)."""
        try:
            import numpy as np
        except ImportError:
            return self._candidates_word_by_word(data)
        found: list[np.ndarray] = []
        for align in range(4):
            words = np.frombuffer(data, dtype="<u4", count=(len(data) - align) // 4, offset=align)
            if len(words) < 4:
                continue
            ids, lengths = words[:-3], words[2:-1]
            plain = (ids < self.topics) & (lengths >= MIN_BODY_SIZE) & (lengths <= self.max_body)
            marker = ((ids & MARKER_BIT) != 0) & (lengths == MARKER_BODY_SIZE)
            found.append(np.flatnonzero(plain | marker) * 4 + align)
        return sorted(np.concatenate(found).tolist()) if found else []

    def _candidates_word_by_word(self, data: bytes) -> list[int]:
        """`_candidates` without numpy: the same test at every position, in Python."""
        unpack = _ID_AND_LENGTH.unpack_from
        found: list[int] = []
        for at in range(len(data) - _ID_AND_LENGTH.size - 3):
            topic_id, length = unpack(data, at)
            plain = topic_id < self.topics and MIN_BODY_SIZE <= length <= self.max_body
            if plain or (topic_id & MARKER_BIT and length == MARKER_BODY_SIZE):
                found.append(at)
        return found

    def _entry_at(self, position: int, file_size: int, damaged_from: int) -> bool:
        """Whether a whole valid entry starts at `position`, followed by a checked head or the end; a record's
        offset must be one its topic can have after losing what the damage from `damaged_from` held (so
        that an entry inside a record's payload is not taken for one of the log's)."""
        head = self.pool.pread(self.path, HEAD_SIZE + PREFIX_SIZE, position)
        marked, check = ENTRY_HEAD.unpack_from(head)
        body_length, frame_crc = PREFIX.unpack_from(head, HEAD_SIZE)
        size = HEAD_SIZE + PREFIX_SIZE + body_length
        if position + size > file_size or check != check_of(marked, frame_crc):
            return False  # (checked before its body is read: a candidate may claim megabytes)
        data = self.pool.pread(self.path, size, position)
        try:
            parse_head(data, 0, self.max_body)
            if marked & MARKER_BIT:
                if not self.ours(parse_marker(data, 0).topic_id):
                    return False
            elif not self.ours(marked):
                return False
            else:
                found = int.from_bytes(data[HEAD_SIZE + 9 : HEAD_SIZE + 17], "little")
                check_frame(data, HEAD_SIZE, found, self.max_body)
                want = self.expected.get(marked)
                want = self.next_offset(marked) if want is None else want
                if not want <= found <= want + (position - damaged_from) // _SHORTEST_ENTRY + 1:
                    return False
        except (EntryError, FrameError):
            return False
        return position + size == file_size or self._valid_after(position + size, file_size)

    def _valid_after(self, position: int, file_size: int) -> bool:
        """Whether a checked entry starts at `position` (a resync point after a damaged one), or the file
        ends exactly there."""
        if position == file_size:
            return False
        size = self._entry_size(position)
        if size is None or position + size > file_size:
            return False
        data = self.pool.pread(self.path, size, position)
        try:
            parse_head(data, 0, self.max_body)
        except EntryError:
            return False
        return True


def write_open_header(segment: Segment, capacity: int, pool: FileHandlePool) -> None:
    """(Re)write a segment's open index header with no durable rows (recovery: its rows are rescanned)."""
    pool.pwritev(segment.open_path, [header_bytes(segment.number, segment.base, capacity)], 0)
    pool.fdatasync(segment.open_path)


def truncate_segment(segment: Segment, size: int, pool: FileHandlePool) -> None:
    """Cut a segment file to `size` bytes, durably (recovery of a torn end)."""
    pool.forget(segment.log_path)
    os.truncate(segment.log_path, size)
    pool.fdatasync(segment.log_path)


def remove_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def apply_groups(state: SealedState, index: SealedIndex, quarantine: Quarantine | None = None) -> None:
    """Apply a sealed segment's groups to the sealed state (segments in order). At open (``quarantine``),
    a group whose offsets no log holds sets its topic aside, and the groups of topics set aside are not
    applied."""
    groups = index.all_groups()
    if groups:
        state.grow(groups[-1].topic_id + 1)
    head_seg, head_first, end, total, newest_ms = state.columns()
    number = index.number
    for group in groups:
        topic_id = group.topic_id
        if quarantine is not None and quarantine.past_ceiling(
            topic_id, group.first_offset + group.count, f"sealed index {index.number}: a group ending"
        ):
            continue
        if group.count == 0 and group.flags == FLAG_TRUNCATED and group.first_offset >= end[topic_id]:
            # Only a gap's marker (past the log's end, cutting nothing): the topic's head stays in the
            # segment its chain goes on in, so that retention may delete this segment. A truncation's
            # marker is the head (`PartitionLog.hold_cut`): it caps the groups before it at its cut.
            head_seg[topic_id] = group.previous_segment
        else:
            head_seg[topic_id] = number
        head_first[topic_id] = group.first_offset
        end[topic_id] = group.first_offset + group.count
        if group.flags & FLAG_RESTART:
            total[topic_id] = group.bytes
            state.restarts[topic_id] = group.first_offset
            state.cuts.pop(topic_id, None)
        else:
            total[topic_id] += group.bytes - group.dropped
            if group.flags & FLAG_TRUNCATED:
                cut = state.cuts.get(topic_id)
                if cut is None or group.first_offset < cut[0]:
                    state.cuts[topic_id] = (group.first_offset, total[topic_id] - group.bytes)
        if group.newest_time > newest_ms[topic_id]:
            newest_ms[topic_id] = group.newest_time
        if group.flags & FLAG_TRUNCATED:
            state.truncated.add(topic_id)
