"""Blocks of older records read once from disk and shared by every reader catching up on the same range.

The tail cache serves readers that are caught up. Readers behind it (subscribers replaying from an offset,
offline sessions coming back, Spark catching up) would each pay one pread and one decode for the same bytes.
Here a log's offsets are cut into aligned blocks of `BLOCK_RECORDS`; the first reader of a block
reads it whole (one index lookup, one pread per segment it spans, CRCs checked once) and every later
reader of any offset in it gets the same decoded `Record` objects from memory. Fifty subscribers
replaying one range cost one disk read per block, not fifty.

The block at the log's end grows: a reader reaching past it reads only the new records and the block is
replaced by the longer one, shared again. A block cut short by its byte bound or by a damaged record stays
as it is; the offsets after it are read directly. All blocks of a store share one byte budget, least
recently used dropped first. The budget counts what a block holds in memory (`cache_cost`, as the tail
caches count theirs: frames, payloads and each record's Python objects), not its frame bytes alone, which
are a fraction of it for small records; 8 MiB by default: every cached record is a live Python object, and
many of them cost garbage-collector time on every other allocation of the broker. Blocks below a log's
start are dropped when retention moves the start, and a topic's blocks when it is truncated.
"""

from __future__ import annotations

import bisect
from array import array
from collections import OrderedDict
from collections.abc import Callable
from itertools import accumulate

from .record import Record

RECORD_OVERHEAD = 272
"""Bytes a cached record holds besides its frame and its payload: the `Record`, the frame's and the payload's
object headers, the list slot."""


def cache_cost(frame_bytes: int, records: int) -> int:
    """What `records` cached records of `frame_bytes` frame bytes in all hold in memory (an estimate that
    errs high: each payload is counted as large as its frame)."""
    return 2 * frame_bytes + records * RECORD_OVERHEAD


BLOCK_RECORDS = 256
"""Records per block: offsets `k * BLOCK_RECORDS` to `(k + 1) * BLOCK_RECORDS - 1` form block `k`."""
BLOCK_MAX_BYTES = 1024 * 1024
"""A block holds at most this many bytes of frames (at least one record); larger records cut it short."""


class Block:
    """Consecutive records of one log, from `first` on; `growing` while it ends at the log's end."""

    __slots__ = ("ends", "first", "growing", "records")

    def __init__(self, first: int, records: list[Record], growing: bool = False) -> None:
        self.first = first
        self.records = records
        self.growing = growing
        self.ends = array("q", accumulate(len(record.frame) for record in records))
        """Frame bytes up to and including each record: byte-bounded takes are bisections."""

    @property
    def size(self) -> int:
        """Frame bytes of all its records."""
        return self.ends[-1] if self.ends else 0

    @property
    def cost(self) -> int:
        """Memory its records hold (`cache_cost`): what the store's budget counts."""
        return cache_cost(self.size, len(self.records))

    @property
    def end(self) -> int:
        """The offset after its last record."""
        return self.first + len(self.records)

    def covers(self, offset: int) -> bool:
        return self.first <= offset < self.first + len(self.records)

    def take(self, offset: int, stop: int, max_bytes: int, at_least_one: bool) -> tuple[list[Record], int]:
        """Its records from `offset` (covered) towards `stop` within `max_bytes`, and their frame bytes."""
        start = offset - self.first
        last = min(len(self.records), stop - self.first)
        ends = self.ends
        before = ends[start - 1] if start else 0
        if ends[last - 1] - before > max_bytes:
            last = bisect.bisect_right(ends, before + max_bytes, start, last)
            if last == start:
                if not at_least_one:
                    return [], 0
                last += 1
        return self.records[start:last], ends[last - 1] - before


class ReadCache:
    """The store-wide LRU of blocks, keyed by (topic id, block number), bounded by the memory they hold."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._lru: OrderedDict[tuple[int, int], Block] = OrderedDict()
        self.hits = 0
        """Reads served from a cached block."""
        self.fills = 0
        """Blocks read from disk (and kept, when final)."""

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._lru)

    def get(self, topic_id: int, number: int) -> Block | None:
        block = self._lru.get((topic_id, number))
        if block is not None:
            self.hits += 1
            self._lru.move_to_end((topic_id, number))
        return block

    def put(self, topic_id: int, number: int, block: Block) -> None:
        cost = block.cost
        if cost > self.max_bytes:
            return
        self.remove(topic_id, number)
        self._lru[topic_id, number] = block
        self.bytes += cost
        while self.bytes > self.max_bytes:
            _key, old = self._lru.popitem(last=False)
            self.bytes -= old.cost

    def remove(self, topic_id: int, number: int) -> None:
        block = self._lru.pop((topic_id, number), None)
        if block is not None:
            self.bytes -= block.cost

    def clear(self) -> None:
        self._lru.clear()
        self.bytes = 0

    def drop_topic(self, topic_id: int, below: int | None = None) -> None:
        """Drop a topic's blocks (those ending at or before `below` when given: retention moved its start)."""
        for key in [key for key, block in self._lru.items() if key[0] == topic_id]:
            if below is None or self._lru[key].end <= below:
                self.remove(*key)

    def drop_below(self, starts: Callable[[int], int]) -> None:
        """Drop every block that ends at or before its topic's start (after a retention pass)."""
        for key in [key for key, block in self._lru.items() if block.end <= starts(key[0])]:
            self.remove(*key)
