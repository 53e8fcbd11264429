"""What opening a partition log reads and repairs of its segment files: scanning a segment's entries from a
position, checking each (``SegmentScanner``), applying a sealed segment's index to the topics' sealed state
(``apply_groups``, the sealer's too), cutting a torn end, writing a fresh open-index header.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from .entry import (
    HEAD_SIZE,
    MARKER_BIT,
    EntryError,
    Marker,
    parse_head,
    parse_marker,
)
from .file_pool import FileHandlePool
from .open_index import header_bytes
from .quarantine import Quarantine
from .record import (
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

__all__ = [
    "ScanReport",
    "SegmentScanner",
    "apply_groups",
    "remove_file",
    "truncate_segment",
    "write_open_header",
]


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
    """Entries stepped over: a damaged topic id, or a record repeating an offset."""


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
    ) -> None:
        self.pool = pool
        self.path = path
        self.max_body = max_body
        self.topics = topics
        self.next_offset = next_offset
        self.expected: dict[int, int] = {}

    def scan(
        self,
        start: int,
        apply: Callable[[int, int, int, int, int], None],
        on_marker: Callable[[Marker, int], None],
        on_skip: Callable[[int], None],
    ) -> tuple[int, ScanReport]:
        """Scan from byte `start`; returns the position after the last valid entry and the report.
        `on_skip(position)` is called for each entry stepped over (a damaged topic id, a repeated offset)."""
        report = ScanReport()
        file_size = os.path.getsize(self.path)
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
                        return position, report
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
                return position, report
            size = end - at
            report.scanned += 1
            if marked & MARKER_BIT:
                try:
                    marker = parse_marker(view, at)
                except EntryError as error:
                    report.damage = error.reason
                    return position, report
                on_marker(marker, position)
                expected[marker.topic_id] = marker.offset
                position += size
                continue
            topic_id = marked
            if topic_id >= self.topics:
                report.damage = "unknown topic"
                return position, report
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
                            return position, report
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
                    return position, report
            apply(topic_id, position, want, timestamp, size)
            expected[topic_id] = want + 1
            report.records += 1
            position += size
        report.damage = None
        return position, report

    def _entry_size(self, position: int) -> int | None:
        head = self.pool.pread(self.path, HEAD_SIZE + PREFIX_SIZE, position)
        if len(head) < HEAD_SIZE + PREFIX_SIZE:
            return None
        body_length, _crc = PREFIX.unpack_from(head, HEAD_SIZE)
        return HEAD_SIZE + PREFIX_SIZE + body_length if body_length <= self.max_body else None

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
        if group.count == 0 and group.flags == FLAG_TRUNCATED:
            # Only a truncation marker: the topic's head stays in the segment its chain goes on in (as
            # `cut_live` left it), so that retention may delete this segment.
            head_seg[topic_id] = group.previous_segment
        else:
            head_seg[topic_id] = number
        head_first[topic_id] = group.first_offset
        end[topic_id] = group.first_offset + group.count
        if group.flags & FLAG_RESTART:
            total[topic_id] = group.bytes
            state.restarts[topic_id] = group.first_offset
        else:
            total[topic_id] += group.bytes - group.dropped
        if group.newest_time > newest_ms[topic_id]:
            newest_ms[topic_id] = group.newest_time
        if group.flags & FLAG_TRUNCATED:
            state.truncated.add(topic_id)
