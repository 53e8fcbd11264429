"""In-memory tails of the logs, so caught-up readers share the same `Record` objects without disk reads.

Each log keeps its most recent records (bounded by count and bytes). An append stores only a tuple of
what it was given (time, frame and the publish's fields; the offset follows from the position), built in
C for a batch; the `Record` is built the first time a reader asks for it and then shared by every later
reader, so appends nobody reads from memory cost no object construction.
A store-wide `TailCacheBudget` bounds all tails together by what they hold in memory (`TailCache.cost`:
the frames, the payloads and the Python objects around them, not the frame bytes alone): when over budget,
the tails of the logs appended to least recently are dropped whole.
"""

from __future__ import annotations

import bisect
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from itertools import repeat
from typing import TYPE_CHECKING, cast

from .record import Record, RecordFields, decode_frame

if TYPE_CHECKING:
    from .frame_runs import FrameRun

Frame = bytes
"""An encoded record (a name of its own: ``TailCache.bytes`` shadows the builtin in the class's scope)."""
RECORD_OVERHEAD = 272
"""Bytes a cached record holds besides its frame and its payload: the entry tuple and its time, the fields
tuple (or, once read, the `Record`), the frame's and the payload's object headers, list and array slots."""
Appended = tuple[int, Frame | memoryview, RecordFields | None]
"""(timestamp_ms, frame, fields) of an append not yet read from the cache; its offset is its position.
Fields are None for a frame copied from a leader (checked, and decoded on first read)."""


def cache_cost(frame_bytes: int, records: int) -> int:
    """What `records` cached records of `frame_bytes` frame bytes in all hold in memory (an estimate that
    errs high: each payload is counted as large as its frame)."""
    return 2 * frame_bytes + records * RECORD_OVERHEAD


def _materialize(entry: Appended, offset: int) -> Record:
    timestamp, frame, fields = entry
    if fields is None:
        return decode_frame(frame, offset, len(frame))
    (payload, qos, retain, client_id, user_properties, content_type,
     indicator, expiry, response, correlation) = fields  # fmt: skip
    record = Record(
        offset, timestamp, client_id, qos, retain, payload, user_properties, content_type, indicator, frame
    )
    if expiry is not None or response is not None or correlation is not None:
        record.message_expiry_interval, record.response_topic, record.correlation_data = (
            expiry, response, correlation
        )  # fmt: skip
    return record


class TailCache:
    """The most recent records of one log, oldest first.

    `_ends[i]` is the running total of frame bytes up to and including entry `i` (`_base` before entry
    0), so trimming by bytes and slicing within a byte budget are bisections, not loops over records.
    """

    __slots__ = (
        "_base",
        "_built",
        "_ends",
        "_entries",
        "_head",
        "_next_offset",
        "_start_total",
        "_total",
        "budget",
        "max_bytes",
        "max_records",
    )

    def __init__(
        self, max_records: int, max_bytes: int, next_offset: int, budget: TailCacheBudget | None = None
    ):
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.budget = budget
        self._entries: list[Record | Appended] = []
        self._ends = array("q")
        self._head = 0
        self._built = 0
        """Entries before this index are `Record`s already."""
        self._total = 0
        """Frame bytes of every entry added since the last clear."""
        self._base = 0
        """Frame bytes of the entries dropped from the list (the running total before entry 0)."""
        self._start_total = 0
        """Frame bytes of the entries before the head."""
        self._next_offset = next_offset

    @property
    def first_offset(self) -> int:
        """Offset of the oldest cached record (the log's next offset when the cache is empty)."""
        return self._next_offset - (len(self._entries) - self._head)

    @property
    def bytes(self) -> int:
        """Encoded size of the cached records."""
        return self._total - self._start_total

    @property
    def cost(self) -> int:
        """Memory held by the cached records (`cache_cost`): what the store-wide budget counts."""
        return cache_cost(self._total - self._start_total, len(self._entries) - self._head)

    def __len__(self) -> int:
        return len(self._entries) - self._head

    def add(self, entry: Appended, size: int) -> None:
        """Cache a just-appended record (at the log's next offset) whose frame is `size` bytes."""
        entries = self._entries
        entries.append(entry)
        self._total += size
        self._ends.append(self._total)
        self._next_offset += 1
        self._account(size, 1)

    def add_many(
        self, timestamp: int, frames: list[Frame], fields: Sequence[RecordFields], ends: Sequence[int]
    ) -> None:
        """Cache just-appended records (from the log's next offset on), all of time `timestamp`; `ends[i]` is
        the bytes of `frames[: i + 1]` (one eviction check and one budget update for all of them)."""
        if not frames:
            return
        total = self._total
        self._entries += zip(repeat(timestamp), frames, fields)
        self._ends.extend(map(total.__add__, ends))
        added = ends[-1]
        self._total = total + added
        self._next_offset += len(frames)
        self._account(added, len(frames))

    def _account(self, added: int, records: int) -> None:
        """After `records` of `added` frame bytes were cached: evict past the limits, and charge the
        store-wide budget what they hold (less what the eviction freed)."""
        freed = 0
        if (
            len(self._entries) - self._head > self.max_records
            or self._total - self._start_total > self.max_bytes
        ):
            freed = self._evict()
        budget = self.budget
        if budget is not None:
            budget.bytes += cache_cost(added, records) - freed
            if budget.newest is not self or budget.bytes > budget.max_bytes:
                budget.touched(self)

    def slice(self, offset: int, stop: int, max_bytes: int, at_least_one: bool = True) -> list[Record]:
        """Cached records from `offset` to `stop` (exclusive) within `max_bytes`; `offset` must be cached."""
        entries = self._entries
        first, last = self._bounds(offset, stop, max_bytes, at_least_one)
        if last > self._built:
            to_offset = self._next_offset - len(entries)  # entry i holds offset i + to_offset
            for index in range(max(self._built, self._head), last):
                entry = entries[index]
                if not isinstance(entry, Record):
                    entries[index] = _materialize(entry, index + to_offset)
            self._built = last
        return cast("list[Record]", entries[first:last])  # every entry up to _built is a Record

    def run(self, offset: int, stop: int, max_bytes: int, at_least_one: bool = True) -> FrameRun:
        """The frames of the records `slice` would return, joined into one run (no `Record` is built)."""
        from .frame_runs import run_of_frames  # numpy, loaded by the first columnar read

        first, last = self._bounds(offset, stop, max_bytes, at_least_one)
        frames = [
            entry.frame if isinstance(entry, Record) else entry[1] for entry in self._entries[first:last]
        ]
        return run_of_frames(frames, offset)

    def frames(self, offset: int, stop: int, max_bytes: int, at_least_one: bool = True) -> list[Frame]:
        """The frames of the records `slice` would return, as stored (no `Record` is built)."""
        first, last = self._bounds(offset, stop, max_bytes, at_least_one)
        return [entry.frame if isinstance(entry, Record) else entry[1] for entry in self._entries[first:last]]

    def reset(self, next_offset: int) -> int:
        """Drop every cached record and continue at `next_offset` (the log was truncated); returns the memory
        freed, as `cost` (the caller settles the budget)."""
        freed = self.clear()
        self._next_offset = next_offset
        return freed

    def _bounds(self, offset: int, stop: int, max_bytes: int, at_least_one: bool) -> tuple[int, int]:
        """Entry indexes [first, last) of the records from `offset` towards `stop` within `max_bytes`."""
        first = self._head + offset - self.first_offset
        last = first + stop - offset
        ends = self._ends
        before = ends[first - 1] if first else self._base
        if ends[last - 1] - before > max_bytes:
            last = bisect.bisect_right(ends, before + max_bytes, first, last)
            if last == first and at_least_one:
                last += 1
        return first, last

    def clear(self) -> int:
        """Drop every cached record; returns the memory freed, as `cost`."""
        freed = self.cost
        self._entries = []
        self._ends = array("q")
        self._head = self._built = self._total = self._start_total = self._base = 0
        return freed

    def _evict(self) -> int:
        """Trim to 7/8 of the limits, so eviction runs once per many appends rather than on each; returns the
        memory freed, as `cost`."""
        entries, ends = self._entries, self._ends
        count = len(entries)
        keep_bytes = self.max_bytes - self.max_bytes // 8
        head = max(self._head, count - (self.max_records - self.max_records // 8))
        if self._total - (ends[head - 1] if head else self._base) > keep_bytes:
            head = bisect.bisect_left(ends, self._total - keep_bytes, head, count) + 1
        head = min(head, count - 1)  # always keep the newest record
        start_total = ends[head - 1] if head else self._base
        freed = cache_cost(start_total - self._start_total, head - self._head)
        self._start_total = start_total
        self._head = head
        if head:  # the dropped entries leave the list now: until then they would hold their memory
            self._base = start_total
            del entries[:head]
            del ends[:head]
            self._built = max(0, self._built - head)
            self._head = 0
        return freed


class TailCacheBudget:
    """Bounds the memory held by all tail caches of a store, as their `cost` (least recently appended
    dropped first)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        """Memory held by all accounted caches, their `cost` (kept up to date by `TailCache.add`)."""
        self.newest: TailCache | None = None
        self._caches: OrderedDict[TailCache, None] = OrderedDict()

    def touched(self, cache: TailCache) -> None:
        """`cache` was just appended to: make it the most recent, and drop the oldest caches if over."""
        if cache is not self.newest:
            self._caches[cache] = None
            self._caches.move_to_end(cache)
            self.newest = cache
        while self.bytes > self.max_bytes and len(self._caches) > 1:
            oldest, _ = self._caches.popitem(last=False)
            self.bytes -= oldest.clear()

    def forget(self, cache: TailCache) -> None:
        """Stop accounting for a cache whose log is closed or deleted."""
        if cache in self._caches:
            del self._caches[cache]
            self.bytes -= cache.clear()
        if cache is self.newest:
            self.newest = None
