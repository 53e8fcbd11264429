"""Finding a topic's records in a partition log: where each wanted record is (``locate``), and its frame.

A topic's state lives in the store's ``TopicTable`` (columns by topic id). Its newest segment and its last
row there are the head of a chain: rows in memory point at the previous row of the same topic
(``active_index``), sealed segments hold a group per topic pointing at the topic's previous segment
(``sealed_index``). ``locate`` walks that chain back from the head to the group holding an offset (a read
near the end stops at once) and returns where each wanted record is; ``frames`` reads them (the windows
written last from memory, older entries by preads, near ones merged into one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from .active_index import NO_PREVIOUS, UNKNOWN_ROW, pointed
from .entry import HEAD_SIZE, TOPIC_ID
from .errors import CorruptRecord
from .file_pool import FileHandlePool
from .recent import RecentWindows
from .record import (
    PREFIX_SIZE,
    FrameError,
)
from .sealed_index import MISSING
from .segment import Segment, mark_for_rebuild, segment_paths
from .topic_table import TopicTable

__all__ = ["Locating", "Piece", "live_ends"]

log = logging.getLogger("broker_edge.storage.partition_log")

_UNREAD = FrameError("unread")
"""In place of a frame of `Locating.frames` until its pread."""
_MERGE_GAP = 16 * 1024
"""Entries at most this far apart are read with one pread."""


@dataclass(slots=True)
class Piece:
    """One record to read: its segment, its entry's position and size, its offset."""

    segment: Segment
    position: int
    size: int
    offset: int


class Locating:
    """The part of a partition log that finds a topic's records (see the module docstring)."""

    __slots__ = ()

    table: TopicTable
    pool: FileHandlePool
    recent: RecentWindows
    by_number: dict[int, Segment]
    segments: list[Segment]
    lost_segments: set[int]
    retention_deleted: Callable[[int], bool]
    names: list[str]
    directory: str
    number: int

    def locate(
        self, topic_id: int, offset: int, stop: int, max_bytes: int, at_least_one: bool
    ) -> list[Piece]:
        """Where the topic's records `[offset, stop)` are, as many as fit `max_bytes` of frames (at least
        one when `at_least_one`). Raises `CorruptRecord` when `offset` itself is missing (lost to damage)."""
        steps = self._steps(topic_id, offset)
        pieces: list[Piece] = []
        budget = max_bytes
        expected = offset
        caps = live_ends(steps, stop)
        for number in range(len(steps) - 1, -1, -1):
            step = steps[number]
            if expected >= stop:
                break
            segment = step[0]
            upto = caps[number]
            if len(step) == 3:
                found = self._rows_pieces(topic_id, segment, step[1], expected, upto)
            else:
                found = self._group_pieces(segment, step[1], expected, upto)
            for piece in found:
                if piece.offset != expected or piece.position == MISSING:
                    break
                frame_bytes = piece.size - HEAD_SIZE
                if frame_bytes > budget and (pieces or not at_least_one):
                    return pieces
                pieces.append(piece)
                budget -= frame_bytes
                expected += 1
            else:
                continue
            break
        if not pieces and at_least_one and offset < stop:
            raise CorruptRecord("", offset, self._next_present(topic_id, steps, offset, stop), "missing")
        return pieces

    def _steps(self, topic_id: int, offset: int, read: bool = True) -> list[tuple]:
        """The topic's groups from its newest back to the first starting at or below `offset`: (segment, last
        row, first offset) for segments in memory, (segment, group) for sealed ones. A segment missing from
        the chain is said (`_older_holding`) on a `read` only: a cut or retention walking past one needs
        none of its records."""
        table = self.table
        number = table.head_seg[topic_id]
        row = table.head_last[topic_id]
        steps: list[tuple] = []
        while number >= 0:
            segment = self.by_number.get(number)
            if segment is None:
                found = self._older_holding(topic_id, number, offset, say=read)
                if found is None:
                    break
                segment, row = found, UNKNOWN_ROW
            rows = segment.rows
            if rows is not None:
                if row < 0:
                    break  # an empty group (the log restarted here): nothing older
                first, previous = rows.first_offset_of(topic_id, row)
                steps.append((segment, row, first))
                if first <= offset:
                    break
                if previous == NO_PREVIOUS or previous >= 0:
                    break
                number, row = pointed(previous)
                if number >= segment.number:
                    break  # a chain goes to older segments only
                continue
            sealed = segment.sealed
            group = sealed.find(topic_id) if sealed is not None else None
            if group is None:  # the chain names a segment that lost the topic's records (damage)
                found = self._older_holding(topic_id, number, offset, present=True)
                if found is None or found.sealed is None:
                    break
                segment, sealed = found, found.sealed
                group = sealed.find(topic_id)
                if group is None:
                    break
            steps.append((segment, group))
            if group.first_offset <= offset or group.previous_segment >= segment.number:
                break  # (a chain goes to older segments only: a damaged index's may not)
            number, row = group.previous_segment, UNKNOWN_ROW
        return steps

    def _older_holding(
        self, topic_id: int, missing: int, offset: int, present: bool = False, say: bool = True
    ) -> Segment | None:
        """The newest sealed segment older than segment `missing` that holds the topic, when a chain names
        `missing` and its file is gone (damage, or retention, which deletes a segment once every record of
        it is below its topic's start: a read in a gap walks past it), or, `present`, is there without the
        topic's records (emptied or replaced by other data: its index was made again from what it holds).
        The walk goes on there: every record still on disk is served, those of the missing segment read as
        missing. Logged once per segment; never a segment retention deleted."""
        if (
            say
            and offset >= self.table.start[topic_id]
            and missing not in self.lost_segments
            and not self.retention_deleted(missing)
        ):
            self.lost_segments.add(missing)
            self._say_lost(topic_id, missing, offset, present)
        for segment in reversed(self.segments):
            if segment.number >= missing:
                continue
            if segment.rows is not None:
                return None  # segments in memory are the newest: none is older than a sealed one
            sealed = segment.sealed
            if sealed is not None and sealed.find(topic_id) is not None:
                return segment
        return None

    def _say_lost(self, topic_id: int, missing: int, offset: int, present: bool) -> None:
        """The ERROR line of a segment a read needs and cannot use: gone, without the topic's records, or
        with a sealed index whose groups are impossible (its records are on disk: the index is wrong)."""
        name = self.names[topic_id] if topic_id < len(self.names) else topic_id
        segment = self.by_number.get(missing) if present else None
        sealed = segment.sealed if segment is not None else None
        damage = sealed.damage(len(self.names)) if sealed is not None else None
        if sealed is not None and damage is not None:
            mark_for_rebuild(self.directory, missing)
            log.error(
                "%s: its sealed index %s is damaged (%s), and the log of %r needs it (read from offset %d): "
                "its records there are not served (reads answer that they are missing) until the next start "
                "makes it again from the data, which holds them",
                segment_paths(self.directory, missing)[0], sealed.path, damage, name, offset,
            )  # fmt: skip
            return
        log.error(
            "%s %s, and the log of %r needs it (read from offset %d): its records are lost "
            "(reads of them answer that they are missing); the other segments are served",
            segment_paths(self.directory, missing)[0],
            "holds none of the records its index chain names it for" if present else "is missing",
            name,
            offset,
        )

    def live_end(self, topic_id: int, segment: Segment, group) -> int:
        """The end of a sealed group's records that are still the topic's (a truncated topic's group may run
        past them): the first offset of the next newer group of its chain, or its end."""
        end = group.first_offset + group.count
        if topic_id not in self.table.truncated:
            return end
        newer = min(self.table.next[topic_id], end)
        for step in self._steps(topic_id, group.first_offset, read=False):
            if step[0] is segment:
                return newer
            newer = min(newer, step[2] if len(step) == 3 else step[1].first_offset)
        return min(group.first_offset, newer)  # not in the chain at all: every record of it was cut

    def _rows_pieces(
        self, topic_id: int, segment: Segment, last_row: int, offset: int, stop: int
    ) -> list[Piece]:
        rows = segment.rows
        assert rows is not None
        found, _previous = rows.rows_of(topic_id, last_row, offset, stop)
        positions, offsets = rows.positions, rows.offsets
        size = segment.size
        return [Piece(segment, positions[row], rows.size_of(row, size), offsets[row]) for row in found]

    def _group_pieces(self, segment: Segment, group, offset: int, stop: int) -> list[Piece]:
        sealed = segment.sealed
        assert sealed is not None
        first = max(offset - group.first_offset, 0)
        last = min(stop - group.first_offset, group.count)
        entries = sealed.entries_of(group, first, last)
        base = group.first_offset + first
        return [
            Piece(segment, entries[2 * n] & 0xFFFFFFFF, entries[2 * n] >> 32, base + n)
            for n in range(len(entries) // 2)
        ]

    def _next_present(self, topic_id: int, steps: list[tuple], offset: int, stop: int) -> int:
        """The first offset after a missing `offset` the topic still has (`CorruptRecord.next_offset`)."""
        for step in reversed(steps):
            segment = step[0]
            if len(step) == 3:
                found = self._rows_pieces(topic_id, segment, step[1], offset + 1, stop)
            else:
                found = self._group_pieces(segment, step[1], offset + 1, stop)
            for piece in found:
                if piece.position != MISSING and piece.offset > offset:
                    return piece.offset
        return stop

    def frames(self, topic_id: int, pieces: list[Piece]) -> list[memoryview | FrameError]:
        """The frames of `pieces` (from the recent windows, or preads merging neighbours), without their
        entry headers; a `FrameError` in place of one whose entry is not the topic's."""
        frames: list[memoryview | FrameError] = []
        keep = frames.append
        partition = self.number
        window = self.recent.window
        to_read: list[int] = []
        segment: Segment | None = None
        data, view, start, end = b"", memoryview(b""), 0, 0
        for index, piece in enumerate(pieces):
            position, size = piece.position, piece.size
            if not 0 < size <= piece.segment.size - position:  # a damaged index's entry: never read
                keep(FrameError("index"))
                continue
            if piece.segment is not segment or position < start or position + size > end:
                found = window((partition, piece.segment.number), position, size)
                if found is None:
                    segment = None
                    to_read.append(index)
                    keep(_UNREAD)
                    continue
                segment = piece.segment
                data, start = found
                view, end = memoryview(data), start + len(data)
            keep(_frame_of(data, view, position - start, size, topic_id))
        first_unread = 0
        while first_unread < len(to_read):
            first = pieces[to_read[first_unread]]
            after = first_unread + 1
            while (
                after < len(to_read)
                and pieces[to_read[after]].segment is first.segment
                and pieces[to_read[after]].position
                - (pieces[to_read[after - 1]].position + pieces[to_read[after - 1]].size)
                <= _MERGE_GAP
            ):
                after += 1
            last = pieces[to_read[after - 1]]
            span = last.position + last.size - first.position
            read = self.pool.pread(first.segment.log_path, span, first.position)
            read_view = memoryview(read)
            for index in to_read[first_unread:after]:
                piece = pieces[index]
                frames[index] = _frame_of(
                    read, read_view, piece.position - first.position, piece.size, topic_id
                )
            first_unread = after
        return frames


def _frame_of(data: bytes, view: memoryview, at: int, size: int, topic_id: int) -> memoryview | FrameError:
    """The frame of the entry of `size` bytes at `at` of `data` (`view` its memoryview), or a `FrameError`
    when it is too short to be one or not the topic's."""
    if (
        size < HEAD_SIZE + PREFIX_SIZE
        or at + size > len(data)
        or TOPIC_ID.unpack_from(data, at)[0] != topic_id
    ):
        return FrameError("index")
    return view[at + HEAD_SIZE : at + size]


def _first_of(step: tuple) -> int:
    """The first offset of a step of `PartitionLog._steps` (rows in memory, or a sealed group)."""
    return step[2] if len(step) == 3 else step[1].first_offset


def live_ends(steps: list[tuple], end: int) -> list[int]:
    """Where each step's live records end: at the first offset of every newer group (a truncated topic's
    older groups run past its cut, and the walk may pass groups of records it cut), and at `end`."""
    caps: list[int] = []
    for step in steps:
        caps.append(end)
        end = min(end, _first_of(step))
    return caps
