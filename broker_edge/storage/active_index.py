"""The index of a segment whose rows are still in memory: one row per entry, in log order, as columns.

Per row: the topic id (with the marker bit for a marker), the entry's position in the segment, the topic
offset, the index time (for a marker: its kind) and the previous row of the same topic. A topic's rows in
the segment form a chain from its last row (which the topic table keeps) back to its first, whose `prev`
points at the topic's last row in an older segment (`pointer`), or is `NO_PREVIOUS`. Once a topic has `HOT`
rows in one segment it also gets an array of them (`hot`), so that no lookup walks more than `HOT` steps:
a quiet topic costs 32 bytes per record and nothing else, a busy one 4 bytes more.

The rows of a rolled segment are immutable (a truncation waits for its seal); the sealer thread sorts them
by topic into the sealed index (`sealed_index.build`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from itertools import repeat

from .entry import MARKER_BIT

__all__ = ["HOT", "NO_PREVIOUS", "SKIPPED", "ActiveIndex", "pointed", "pointer"]

HOT = 32
"""Rows of one topic in a segment from which it gets an array of them."""
NO_PREVIOUS = -1
SKIPPED = MARKER_BIT - 1
"""The topic id of an entry skipped as damaged at open (above every topic id a store gives)."""
_ROW_BITS = 32
_ROW_MASK = (1 << _ROW_BITS) - 1
UNKNOWN_ROW = -1


def pointer(segment: int, row: int) -> int:
    """A `prev` value pointing at `row` of segment number `segment` (`UNKNOWN_ROW`: look it up there)."""
    return -2 - ((segment << _ROW_BITS) | (row + 1))


def pointed(prev: int) -> tuple[int, int]:
    """(segment, row) of a `prev` made by `pointer` (row `UNKNOWN_ROW` when it was not in memory)."""
    value = -2 - prev
    return value >> _ROW_BITS, (value & _ROW_MASK) - 1


class ActiveIndex:
    """The rows of one segment, appended in log order."""

    __slots__ = (
        "dead",
        "hot",
        "marked",
        "marker_dropped",
        "offsets",
        "positions",
        "prevs",
        "times",
        "topic_ids",
    )

    def __init__(self) -> None:
        self.topic_ids = array("I")
        self.positions = array("I")
        self.offsets = array("q")
        self.times = array("q")
        self.prevs = array("q")
        self.hot: dict[int, array] = {}
        """Rows of each busy topic (`HOT` or more in this segment), in order."""
        self.dead: set[int] = set()
        """Rows a truncation or restart cut off (never served, left out of the sealed index)."""
        self.marker_dropped: dict[int, int] = {}
        """Each truncation marker's row -> the bytes it cut from sealed segments (markers are rare)."""
        self.marked: set[int] = set()
        """Topics with a marker row here."""

    def __len__(self) -> int:
        return len(self.topic_ids)

    def add_rows(
        self, topic_id: int, positions: list[int], first_offset: int, time: int, prev: int, count_before: int
    ) -> int:
        """Rows for `len(positions)` consecutive records of a topic; `prev` is the row (or `pointer`) before
        the first, `count_before` the topic's rows already here. Returns the last row."""
        count = len(positions)
        if count == 1 and count_before + 1 < HOT:
            return self.add_one(topic_id, positions[0], first_offset, time, prev)
        first_row = len(self.topic_ids)
        self.topic_ids.extend(repeat(topic_id, count))
        self.positions.extend(positions)
        self.offsets.extend(range(first_offset, first_offset + count))
        self.times.extend(repeat(time, count))
        prevs = self.prevs
        prevs.append(prev)
        if count > 1:
            prevs.extend(range(first_row, first_row + count - 1))
        last_row = first_row + count - 1
        hot = self.hot.get(topic_id)
        if hot is not None:
            hot.extend(range(first_row, last_row + 1))
        elif count_before + count >= HOT:
            self.hot[topic_id] = self._chain(last_row)
        return last_row

    def add_one(self, topic_id: int, position: int, offset: int, time: int, prev: int) -> int:
        """`add_rows` of a single record of a topic with fewer than `HOT` rows here before it: with a topic
        per device nearly every append is one, and appending to each column costs a third of extending it
        from iterators."""
        row = len(self.topic_ids)
        self.topic_ids.append(topic_id)
        self.positions.append(position)
        self.offsets.append(offset)
        self.times.append(time)
        self.prevs.append(prev)
        hot = self.hot.get(topic_id)
        if hot is not None:
            hot.append(row)
        return row

    def add_skipped(self, position: int) -> None:
        """A dead row for an entry found damaged between valid ones at open (its topic unknown): it keeps its
        place among the entries (its neighbours' sizes, the partition's positions), in no topic's chain,
        never served, left out of the sealed index. Its topic id is `SKIPPED`, which no topic has."""
        row = len(self.topic_ids)
        time = self.times[row - 1] if row else 0
        self.add_one(SKIPPED, position, -1, time, NO_PREVIOUS)
        self.dead.add(row)

    def add_marker(
        self, topic_id: int, position: int, offset: int, kind: int, dropped: int, prev: int
    ) -> int:
        """A marker row (see `entry`); returns its row."""
        row = len(self.topic_ids)
        self.topic_ids.append(topic_id | MARKER_BIT)
        self.positions.append(position)
        self.offsets.append(offset)
        self.times.append(kind)
        self.prevs.append(prev)
        self.marker_dropped[row] = dropped
        self.marked.add(topic_id)
        return row

    def _chain(self, last_row: int) -> array:
        """The rows of the chain ending at `last_row`, oldest first."""
        rows = [last_row]
        prevs = self.prevs
        row = prevs[last_row]
        while row >= 0:
            rows.append(row)
            row = prevs[row]
        rows.reverse()
        return array("I", rows)

    def first_row(self, last_row: int) -> int:
        """The first row of the chain ending at `last_row`."""
        prevs = self.prevs
        row = last_row
        while prevs[row] >= 0:
            row = prevs[row]
        return row

    def rows_of(self, topic_id: int, last_row: int, first_offset: int, stop: int) -> tuple[list[int], int]:
        """The topic's rows holding offsets `[first_offset, stop)` found walking back from `last_row`, oldest
        first, and the `prev` of its first row here when the walk reached it (else `last_row`'s own prev is
        irrelevant: 0). A row whose offset is below `first_offset` ends the walk. A chain may end at a
        truncation's marker (`PartitionLog.hold_cut`): that row is no record and is left out."""
        offsets = self.offsets
        hot = self.hot.get(topic_id)
        if hot is not None:
            base = offsets[hot[0]]
            reached_first = first_offset < base
            if offsets[hot[-1]] - base == len(hot) - 1:  # dense: a row per offset
                low = max(first_offset - base, 0)
                high = min(stop - base, len(hot))
            else:  # records lost to damage left a gap in its offsets here (found at open): bisected
                low = bisect_left(hot, first_offset, key=offsets.__getitem__)
                high = bisect_left(hot, stop, key=offsets.__getitem__)
            return (list(hot[low:high]) if high > low else []), self.prevs[hot[0]] if reached_first else 0
        rows: list[int] = []
        prevs, topic_ids = self.prevs, self.topic_ids
        row = last_row
        while True:
            offset = offsets[row]
            if offset < first_offset:
                rows.reverse()
                return rows, 0
            if offset < stop and topic_ids[row] == topic_id:  # (not a truncation's marker at the head)
                rows.append(row)
            previous = prevs[row]
            if previous < 0:
                rows.reverse()
                return rows, previous
            row = previous

    def first_offset_of(self, topic_id: int, last_row: int) -> tuple[int, int]:
        """(first offset, prev of the first row) of the topic's chain here ending at `last_row`."""
        hot = self.hot.get(topic_id)
        row = hot[0] if hot is not None else self.first_row(last_row)
        return self.offsets[row], self.prevs[row]

    def size_of(self, row: int, segment_size: int) -> int:
        """Bytes of the entry of `row` (its header and frame)."""
        positions = self.positions
        end = positions[row + 1] if row + 1 < len(positions) else segment_size
        return end - positions[row]

    def kill(self, topic_id: int, rows: list[int]) -> None:
        """Cut `rows` of the topic off (a truncation): never served, left out of the sealed index."""
        self.dead.update(rows)
        hot = self.hot.get(topic_id)
        if hot is not None:
            cut = set(rows)
            kept = array("I", (row for row in hot if row not in cut))
            if kept:
                self.hot[topic_id] = kept
            else:
                del self.hot[topic_id]

    def memory(self) -> int:
        """Bytes its columns hold (the busy topics' arrays included)."""
        rows = len(self.topic_ids)
        return rows * 32 + sum(4 * len(rows_of) for rows_of in self.hot.values())
