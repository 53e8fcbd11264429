"""Blocks of older records read once from disk and shared by every reader catching up on the same range.

The tail cache serves readers that are caught up. Readers behind it (subscribers replaying from an offset,
offline sessions coming back, Spark catching up) used to pay one pread and one decode each for the same
bytes. Here a log's offsets are cut into aligned blocks of `BLOCK_RECORDS`; the first reader of a block
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
start are dropped when retention moves the start, and all of a log's blocks when it closes.
"""

from __future__ import annotations

import bisect
from array import array
from collections import OrderedDict
from itertools import accumulate

from .record import Record
from .tail_cache import cache_cost

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


class LogBlocks:
    """The cached blocks of one log (owned by the log, accounted by the store's `ReadCache`)."""

    __slots__ = ("blocks", "cache")

    def __init__(self, cache: ReadCache) -> None:
        self.cache = cache
        self.blocks: dict[int, Block] = {}

    def get(self, number: int) -> Block | None:
        block = self.blocks.get(number)
        if block is not None:
            self.cache.touch(self, number)
        return block

    def put(self, number: int, block: Block) -> None:
        self.cache.put(self, number, block)

    def drop_below(self, offset: int) -> None:
        """Drop the blocks that end at or before `offset` (retention moved the log start)."""
        for number in [n for n, block in self.blocks.items() if block.first + len(block.records) <= offset]:
            self.cache.remove(self, number)

    def clear(self) -> None:
        for number in list(self.blocks):
            self.cache.remove(self, number)


class ReadCache:
    """The store-wide LRU of blocks, bounded by the memory they hold (`Block.cost`)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._lru: OrderedDict[tuple[LogBlocks, int], int] = OrderedDict()
        self.hits = 0
        """Reads served from a cached block."""
        self.fills = 0
        """Blocks read from disk (and kept, when final)."""

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def for_log(self) -> LogBlocks:
        return LogBlocks(self)

    def __len__(self) -> int:
        return len(self._lru)

    def touch(self, owner: LogBlocks, number: int) -> None:
        self.hits += 1
        self._lru.move_to_end((owner, number))

    def put(self, owner: LogBlocks, number: int, block: Block) -> None:
        cost = block.cost
        if cost > self.max_bytes:
            return
        self.remove(owner, number)
        owner.blocks[number] = block
        self._lru[owner, number] = cost
        self.bytes += cost
        while self.bytes > self.max_bytes:
            (old_owner, old_number), size = self._lru.popitem(last=False)
            del old_owner.blocks[old_number]
            self.bytes -= size

    def remove(self, owner: LogBlocks, number: int) -> None:
        size = self._lru.pop((owner, number), None)
        if size is not None:
            del owner.blocks[number]
            self.bytes -= size
