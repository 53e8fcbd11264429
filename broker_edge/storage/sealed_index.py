"""A sealed segment's index: its records grouped per topic, sorted by topic id, read with small preads.

File layout (little endian)::

    header   64 bytes: "TSGI", u16 version, u8 state, u8 0, i32 segment number, u64 base position,
             u64 entries, u64 data bytes, u32 groups, u32 rows, u32 sparse rows, i64 newest time, 8 zero bytes
    summary  u32 topic id of every 64th group (what the store keeps in memory)
    groups   48 bytes each, sorted by topic id: u32 topic_id | u32 count | u64 first_offset |
             u32 first_entry | u32 flags | i32 previous_segment | u32 bytes | u64 dropped | i64 newest time
    entries  16 bytes per record, group after group, by offset: u32 position | u32 size | i64 index time
             (position MISSING: a record lost to damage, never served)
    sparse   16 bytes per 256th row of the segment in log order: u32 position | u32 0 | i64 time

A group holds the topic's records in this segment, offsets `[first_offset, first_offset + count)`,
dense; `previous_segment` is the newest older segment holding the topic (-1: none, or the log restarted
here), `bytes` their frames' bytes, `dropped` the bytes a truncation cut from older segments, flag RESTART
that the topic's log restarted here. A topic whose only entries here were cut by a truncation has a group of
count 0 whose `first_offset` is where its log ends.

`build` makes the file's bytes from a segment's rows (`active_index`) in the sealer thread. A topic's rows
come from its chain (a busy topic's array of rows). Where numpy is installed, the entries of every topic
without a marker, a cut row or a gap in its offsets are gathered from the columns at once, each array
operation over the whole segment taking a few milliseconds (`sealed_columns`); the other topics' rows are
walked one by one. Without numpy, a topic's entries are read from the columns with `map`, a chunk of rows
per call, unless it has a marker, a cut row or a gap in its offsets, or fewer than `WALK_BELOW` rows: then
its rows are walked. Every other step takes at most `SORT_CHUNK` rows per call, so no single call holds the
interpreter for long while the event loop waits for it.
"""

from __future__ import annotations

import bisect
import heapq
import os
import struct
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from itertools import repeat
from operator import add, and_, ge, itemgetter, lshift, or_, sub
from typing import TYPE_CHECKING

from .active_index import ActiveIndex, pointed
from .entry import HEAD_SIZE, MARKER_BIT, RESTART, TRUNCATE
from .file_pool import FileHandlePool

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .sealed_columns import SegmentColumns

__all__ = [
    "FLAG_RESTART",
    "MISSING",
    "Group",
    "GroupBlocks",
    "SealedIndex",
    "build",
    "write_index",
]

MAGIC = b"TSGI"
VERSION = 1
STATE_SEALED = 1
HEADER = struct.Struct("<4sHBxiQQQIIIq8x")
GROUP = struct.Struct("<IIQIIiIQq")
ENTRY_SIZE = 16
SUMMARY_EVERY = 64
SPARSE_EVERY = 256
SORT_CHUNK = 16384
WALK_BELOW = 16
"""A topic with fewer rows in the segment is walked row by row: reading its columns costs more below it."""
MISSING = 0xFFFFFFFF
FLAG_RESTART = 1
FLAG_TRUNCATED = 2
"""The topic was truncated in this segment: groups of it in older segments may hold dead records."""
_MOST_DROPPED = 2**62
"""More bytes than a truncation can have cut from a topic's older segments (a damaged group's)."""
_TOPIC_MASK = ~MARKER_BIT & 0xFFFFFFFF
_ROW_MASK = 0xFFFFFFFF
_TOPIC_IDS_PER_GROUP = GROUP.size // 4


@dataclass(frozen=True, slots=True)
class Group:
    """One topic's records in one sealed segment."""

    topic_id: int
    count: int
    first_offset: int
    first_entry: int
    flags: int
    previous_segment: int
    bytes: int
    dropped: int
    newest_time: int

    @property
    def end(self) -> int:
        return self.first_offset + self.count


@dataclass(slots=True)
class Built:
    """What `build` made: the file's bytes and what the store keeps of it in memory."""

    data: bytes
    groups: list[Group]
    newest_time: int


def _sorted_rows(rows: ActiveIndex, topics: set[int] | None = None) -> list[int]:
    """Every row (of ``topics`` only, unless None) as `topic_id << 32 | row`, sorted (markers with their
    topic, in log order)."""
    topic_ids = rows.topic_ids
    count = len(topic_ids)
    runs: list[list[int]] = []
    for start in range(0, count, SORT_CHUNK):
        chunk = topic_ids[start : start + SORT_CHUNK]
        if topics is None:
            keyed = [(topic_id & _TOPIC_MASK) << 32 | row for row, topic_id in enumerate(chunk, start)]
        else:
            keyed = [
                (topic_id & _TOPIC_MASK) << 32 | row
                for row, topic_id in enumerate(chunk, start)
                if topic_id & _TOPIC_MASK in topics
            ]
        runs.append(sorted(keyed))
    return _merged(runs)


def _merged(runs: list[list[int]]) -> list[int]:
    """Sorted lists merged into one."""
    if len(runs) == 1:
        return runs[0]
    return list(heapq.merge(*runs))


def _last_rows(rows: ActiveIndex) -> dict[int, int]:
    """Each topic id in the segment (a marker's with its bit) -> its last row, a chunk per call."""
    topic_ids = rows.topic_ids
    last: dict[int, int] = {}
    for start in range(0, len(topic_ids), SORT_CHUNK):
        stop = start + SORT_CHUNK
        last.update(zip(topic_ids[start:stop], range(start, min(stop, len(topic_ids))), strict=True))
    return last


def _chained_rows(rows: ActiveIndex, topic_id: int, last_row: int) -> list[int] | array:
    """A topic's rows in the segment, oldest first: its array of them when busy, else its chain."""
    hot = rows.hot.get(topic_id)
    if hot is not None:
        return hot
    prevs = rows.prevs
    chain = [last_row]
    row = prevs[last_row]
    while row >= 0:
        chain.append(row)
        row = prevs[row]
    chain.reverse()
    return chain


def _irregular_topics(rows: ActiveIndex) -> set[int]:
    """Topics with a marker or a cut row in the segment: their groups are walked row by row."""
    topic_ids = rows.topic_ids
    irregular = {topic_ids[row] & _TOPIC_MASK for row in rows.dead}
    if topic_ids and max(topic_ids) & MARKER_BIT:
        irregular.update(topic_id & _TOPIC_MASK for topic_id in topic_ids if topic_id & MARKER_BIT)
    return irregular


def _topic_groups(rows: ActiveIndex, walk_all: bool) -> list[tuple[int, Sequence[int], bool]]:
    """Each topic's rows in the segment, oldest first, in topic id order, and whether they are walked one
    by one (the topic has a marker or a cut row here; every topic when ``walk_all``). The others' rows come
    from their chains (a busy topic's array of rows), not from sorting every row."""
    last = _last_rows(rows)
    irregular = {topic_id & _TOPIC_MASK for topic_id in last} if walk_all else _irregular_topics(rows)
    chains: dict[int, Sequence[int]] = {}
    chained = 0
    for topic_id, row in last.items():
        if not topic_id & MARKER_BIT and topic_id not in irregular:
            chain = chains[topic_id] = _chained_rows(rows, topic_id, row)
            chained += len(chain)
    keys = _sorted_rows(rows, irregular) if irregular else []
    if chained + len(keys) != len(rows.topic_ids):  # a chain missed rows: sort all
        chains, keys = {}, _sorted_rows(rows)
    walked: dict[int, list[int]] = {}
    index, count = 0, len(keys)
    while index < count:
        topic_id = keys[index] >> 32
        end = bisect.bisect_left(keys, (topic_id + 1) << 32, index)
        walked[topic_id] = list(map(and_, keys[index:end], repeat(_ROW_MASK)))
        index = end
    ids = [*chains, *walked]
    order = _merged([sorted(ids[start : start + SORT_CHUNK]) for start in range(0, len(ids), SORT_CHUNK)])
    return [
        (topic_id, chains[topic_id], False) if topic_id in chains else (topic_id, walked[topic_id], True)
        for topic_id in order
    ]


def _dense(rows: ActiveIndex, group_rows: Sequence[int]) -> bool:
    """Whether a topic's rows hold consecutive offsets (no record lost to damage between them)."""
    offsets = rows.offsets
    return offsets[group_rows[-1]] - offsets[group_rows[0]] == len(group_rows) - 1


def _plain_entries(rows: ActiveIndex, group_rows: Sequence[int], ends: array, entries: array) -> int | None:
    """Add to ``entries`` those of a topic's rows without a marker, a cut or a gap in their offsets; returns
    their frames' bytes, or None (nothing added) when the offsets have a gap (records lost to damage: walked).
    Each column is taken for a chunk of the rows with one ``itemgetter`` call, not a statement per row;
    ``ends[row]`` is where the entry of ``row - 1`` ends."""
    positions, times = rows.positions, rows.times
    count = len(group_rows)
    if not _dense(rows, group_rows):
        return None
    size = 0
    for start in range(0, count, SORT_CHUNK):
        part = group_rows[start : start + SORT_CHUNK]
        take = _taker(part)
        starts = take(positions)
        sizes = list(map(sub, _taker(list(map(add, part, repeat(1))))(ends), starts))
        chunk = [0] * (2 * len(sizes))
        chunk[0::2] = map(or_, starts, map(lshift, sizes, repeat(32)))
        chunk[1::2] = take(times)
        entries.extend(chunk)
        size += sum(sizes)
    return size - HEAD_SIZE * count


def _columns(rows: ActiveIndex, data_size: int) -> SegmentColumns | None:
    """The segment's columns as numpy arrays where numpy is installed, else None."""
    try:
        from .sealed_columns import SegmentColumns
    except ImportError:  # numpy comes with the `arrow` extra
        return None
    return SegmentColumns(rows, data_size)


class _Gathered:
    """The entries of a segment's regular topics (no marker, cut row or gap in their offsets), gathered at
    once with numpy: ``take(k, entries)`` adds those of the ``k``-th topic group of `_topic_groups`."""

    __slots__ = ("_at", "_entries")

    def __init__(
        self,
        rows: ActiveIndex,
        topic_groups: list[tuple[int, Sequence[int], bool]],
        columns: SegmentColumns,
    ) -> None:
        regular = [
            (k, group_rows)
            for k, (_, group_rows, walk) in enumerate(topic_groups)
            if not walk and _dense(rows, group_rows)
        ]
        data, sizes = columns.gather([group_rows for _, group_rows in regular])
        self._entries = memoryview(data)
        self._at: dict[int, tuple[int, int, int]] = {}
        """Group ``k`` -> its entries' first and last byte in ``_entries``, and its frames' bytes."""
        start = 0
        for (k, group_rows), size in zip(regular, sizes, strict=True):
            end = start + ENTRY_SIZE * len(group_rows)
            self._at[k] = (start, end, size - HEAD_SIZE * len(group_rows))
            start = end

    def take(self, k: int, entries: array) -> int | None:
        """Add group ``k``'s entries; their frames' bytes, or None when the group is not regular."""
        at = self._at.get(k)
        if at is None:
            return None
        start, end, size = at
        entries.frombytes(self._entries[start:end])
        return size


def _taker(part: Sequence[int]) -> Callable[[array], tuple[int, ...]]:
    """What takes the items of ``part`` (row numbers) from a column, as a tuple (one C call)."""
    if len(part) > 1:
        return itemgetter(*part)
    row = part[0]  # ``itemgetter`` of one item gives the item itself
    return lambda column: (column[row],)


def _walked_entries(
    rows: ActiveIndex, group_rows: Sequence[int], data_size: int, previous_segment: int
) -> tuple[list[int], int, int, int, int, int] | None:
    """A topic's rows taken one by one, applying its markers and leaving out cut rows: (entries, frames'
    bytes, first offset, flags, dropped bytes, previous segment); None when every row was cut."""
    topic_ids, positions, offsets, times, prevs = (
        rows.topic_ids, rows.positions, rows.offsets, rows.times, rows.prevs
    )  # fmt: skip
    dead, row_count = rows.dead, len(topic_ids)
    flags = dropped = size = 0
    group_entries: list[int] = []
    first_offset = -1
    expected = -1
    for row in group_rows:
        if topic_ids[row] & MARKER_BIT:
            kind, offset = times[row], offsets[row]
            if kind == RESTART:
                flags, dropped, size, previous_segment = FLAG_RESTART | (flags & FLAG_TRUNCATED), 0, 0, -1
                group_entries = []
                first_offset = expected = offset
            elif kind == TRUNCATE:
                flags |= FLAG_TRUNCATED
                dropped += rows.marker_dropped.get(row, 0)
                if first_offset < 0 or offset < first_offset:
                    first_offset = expected = offset
                    group_entries = []
                    previous = prevs[row]  # the cut reached below this segment: the chain goes on there
                    previous_segment = pointed(previous)[0] if previous < -1 else -1
                else:
                    del group_entries[2 * (offset - first_offset) :]
                    expected = offset
            continue
        if row in dead:
            continue
        offset = offsets[row]
        if first_offset < 0:
            first_offset = expected = offset
        while expected < offset:  # records lost to damage keep their offsets, never served
            group_entries += (MISSING, times[row])
            expected += 1
        entry_end = positions[row + 1] if row + 1 < row_count else data_size
        entry_size = entry_end - positions[row]
        group_entries += (positions[row] | (entry_size << 32), times[row])
        size += entry_size - HEAD_SIZE
        expected += 1
    if first_offset < 0:
        return None  # every row of the topic here was cut (its truncation marker is in a newer segment)
    return group_entries, size, first_offset, flags, dropped, previous_segment


def build(rows: ActiveIndex, number: int, base: int, data_size: int, walk_all: bool = False) -> Built:
    """The sealed index of segment `number` (base position `base`, `data_size` bytes) from its rows.

    A topic's entries are made from its rows column by column (with numpy, every such topic's at once),
    unless it has a marker, a cut row or a gap in its offsets here, or (without numpy) fewer than
    `WALK_BELOW` rows: then its rows are walked one by one (``walk_all``: every topic's are, what tests
    compare with)."""
    topic_ids, positions, offsets, times, prevs = (
        rows.topic_ids, rows.positions, rows.offsets, rows.times, rows.prevs
    )  # fmt: skip
    row_count = len(topic_ids)
    columns = None if walk_all else _columns(rows, data_size)
    ends = array("q")  # what the pure-Python path reads
    if columns is None:
        for start in range(0, row_count, SORT_CHUNK):
            ends.extend(positions[start : start + SORT_CHUNK].tolist())
        ends.append(data_size)  # the end of the last row's entry
    groups: list[Group] = []
    entries = array("q")
    newest = -(2**63)
    topic_groups = _topic_groups(rows, walk_all)
    gathered = None if columns is None else _Gathered(rows, topic_groups, columns)
    for k, (topic_id, group_rows, walk) in enumerate(topic_groups):
        previous = prevs[group_rows[0]]
        previous_segment = pointed(previous)[0] if previous < -1 else -1
        first_entry = len(entries) // 2
        if gathered is not None:
            size = gathered.take(k, entries)
        elif walk or len(group_rows) < WALK_BELOW:
            size = None
        else:
            size = _plain_entries(rows, group_rows, ends, entries)
        if size is not None:
            first_offset, flags, dropped = offsets[group_rows[0]], 0, 0
        else:
            walked = _walked_entries(rows, group_rows, data_size, previous_segment)
            if walked is None:
                continue
            group_entries, size, first_offset, flags, dropped, previous_segment = walked
            entries.extend(group_entries)
        count = len(entries) // 2 - first_entry
        group_newest = entries[-1] if count else -(2**63)
        newest = max(newest, group_newest)
        groups.append(
            Group(topic_id, count, first_offset, first_entry, flags, previous_segment, size, dropped,
                  group_newest)
        )  # fmt: skip
    sparse: list[int] = []
    for row in range(0, row_count, SPARSE_EVERY):
        sparse += (positions[row], 0 if topic_ids[row] & MARKER_BIT else times[row])
    summary = array("I", (group.topic_id for group in groups[::SUMMARY_EVERY]))
    header = HEADER.pack(
        MAGIC, VERSION, STATE_SEALED, number, base, len(entries) // 2, data_size, len(groups), row_count,
        len(sparse) // 2, newest
    )  # fmt: skip
    pack = GROUP.pack
    parts = [
        header,
        summary.tobytes(),
        b"".join(
            pack(
                g.topic_id,
                g.count,
                g.first_offset,
                g.first_entry,
                g.flags,
                g.previous_segment,
                g.bytes,
                g.dropped,
                g.newest_time,
            )
            for g in groups
        ),
        entries.tobytes(),
        array("q", sparse).tobytes(),
    ]
    return Built(b"".join(parts), groups, newest)


def write_index(path: str, data: bytes, sync: bool = True) -> None:
    """Write a sealed index whole: temporary file, fdatasync (unless not `sync`: the `none` policy), rename
    (the caller syncs the directory)."""
    temporary = path + ".tmp"
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        if sync:
            os.fdatasync(file.fileno())
    os.replace(temporary, path)


class GroupBlocks:
    """An LRU of blocks of groups read from sealed indexes, bounded in bytes (shared by a store)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._blocks: OrderedDict[tuple[str, int], bytes] = OrderedDict()

    def get(self, key: tuple[str, int]) -> bytes | None:
        data = self._blocks.get(key)
        if data is not None:
            self._blocks.move_to_end(key)
        return data

    def put(self, key: tuple[str, int], data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        self._blocks[key] = data
        self.bytes += len(data)
        while self.bytes > self.max_bytes:
            _key, old = self._blocks.popitem(last=False)
            self.bytes -= len(old)

    def forget(self, path: str) -> None:
        for key in [key for key in self._blocks if key[0] == path]:
            self.bytes -= len(self._blocks.pop(key))


class SealedIndex:
    """Read access to one sealed index: its header and summary in memory, groups and entries by pread."""

    __slots__ = (
        "base",
        "blocks",
        "data_size",
        "entries",
        "groups",
        "newest_time",
        "number",
        "path",
        "pool",
        "rows",
        "sparse",
        "summary",
    )

    def __init__(self, path: str, pool: FileHandlePool, blocks: GroupBlocks) -> None:
        self.path = path
        self.pool = pool
        self.blocks = blocks
        self.number = -1
        self.base = 0
        self.entries = 0
        self.data_size = 0
        self.groups = 0
        self.rows = 0
        self.sparse = 0
        self.newest_time = -(2**63)
        self.summary = array("I")

    def load(self, expected_number: int) -> bool:
        """Read the header and summary; False when the file is not a sealed index of that segment."""
        try:
            file_size = os.path.getsize(self.path)
        except FileNotFoundError:
            return False
        head = self.pool.pread(self.path, HEADER.size, 0)
        if len(head) < HEADER.size:
            return False
        (magic, version, state, number, base, entries, data_size, groups, rows, sparse,
         newest) = HEADER.unpack_from(head)  # fmt: skip
        summary_count = -(-groups // SUMMARY_EVERY)
        expected = HEADER.size + 4 * summary_count + GROUP.size * groups + ENTRY_SIZE * (entries + sparse)
        if (magic, version, state, number) != (MAGIC, VERSION, STATE_SEALED, expected_number):
            return False
        if file_size != expected:
            return False
        self.number, self.base, self.entries, self.data_size = number, base, entries, data_size
        self.groups, self.rows, self.sparse, self.newest_time = groups, rows, sparse, newest
        summary = array("I")
        summary.frombytes(self.pool.pread(self.path, 4 * summary_count, HEADER.size))
        if any(map(ge, summary, summary[1:])):  # every 64th group's topic id, rising: a flipped bit
            return False
        self.summary = summary
        return True

    @property
    def _groups_at(self) -> int:
        return HEADER.size + 4 * len(self.summary)

    @property
    def _entries_at(self) -> int:
        return self._groups_at + GROUP.size * self.groups

    def find(self, topic_id: int) -> Group | None:
        """The topic's group here (None: the segment holds none of its records)."""
        block = bisect.bisect_right(self.summary, topic_id) - 1
        if block < 0:
            return None
        data = self._block(block)
        ids = memoryview(data).cast("I")[::_TOPIC_IDS_PER_GROUP]
        position = bisect.bisect_left(ids, topic_id)
        if position >= len(ids) or ids[position] != topic_id:
            return None
        return Group(*GROUP.unpack_from(data, position * GROUP.size))

    def _block(self, block: int) -> bytes:
        key = (self.path, block)
        data = self.blocks.get(key)
        if data is None:
            count = min(SUMMARY_EVERY, self.groups - block * SUMMARY_EVERY)
            at = self._groups_at + block * SUMMARY_EVERY * GROUP.size
            data = self.pool.pread(self.path, count * GROUP.size, at)
            self.blocks.put(key, data)
        return data

    def last_topic_id(self) -> int:
        """The highest topic id with a group here (-1: none): one small pread."""
        if not self.groups:
            return -1
        data = self.pool.pread(self.path, 4, self._groups_at + (self.groups - 1) * GROUP.size)
        return int.from_bytes(data, "little") if len(data) == 4 else -1

    def groups_from(self, first: int, count: int) -> list[Group]:
        """Groups `first .. first + count - 1` (fewer at the end, or where the file was cut): one pread, a
        slice of a long walk."""
        count = max(0, min(count, self.groups - first))
        data = self.pool.pread(self.path, GROUP.size * count, self._groups_at + first * GROUP.size)
        whole = len(data) - len(data) % GROUP.size
        return [Group(*fields) for fields in GROUP.iter_unpack(memoryview(data)[:whole])]

    def all_groups(self) -> list[Group]:
        """Every group (retention, the sealer applying the segment): one pread of the groups."""
        data = self.pool.pread(self.path, GROUP.size * self.groups, self._groups_at)
        return [Group(*fields) for fields in GROUP.iter_unpack(data)]

    def damage(self, topics: int, groups: list[Group] | None = None) -> str | None:
        """What makes this index's groups impossible (None: nothing), ``topics`` being the catalog's count:
        groups out of topic id order or naming a topic the catalog does not, entries that are not laid
        group after group, a previous segment that is not older, bytes past the segment's, unknown flags.
        A flipped bit in the groups (no checksum covers them) is found before it is applied at open."""
        check = GroupCheck(self, topics)
        return check.slice(0, self.all_groups() if groups is None else groups) or check.end()

    def entries_of(self, group: Group, first: int, stop: int) -> array:
        """Entries `first .. stop - 1` of a group (numbers within it): (position | size << 32, time) pairs."""
        count = stop - first
        if count <= 0:
            return array("q")
        at = self._entries_at + (group.first_entry + first) * ENTRY_SIZE
        result = array("q")
        result.frombytes(self.pool.pread(self.path, count * ENTRY_SIZE, at))
        return result

    def sparse_rows(self) -> array:
        """(position, time) of every `SPARSE_EVERY`th row, in log order."""
        at = self._entries_at + self.entries * ENTRY_SIZE
        result = array("q")
        result.frombytes(self.pool.pread(self.path, self.sparse * ENTRY_SIZE, at))
        return result


class GroupCheck:
    """`SealedIndex.damage` a slice of groups at a time, in order (retention reads them by slices)."""

    __slots__ = ("entry", "index", "last_topic", "seen", "topics")

    def __init__(self, index: SealedIndex, topics: int) -> None:
        self.index = index
        self.topics = topics
        self.entry = 0
        self.last_topic = -1
        self.seen = 0

    def slice(self, first: int, groups: list[Group]) -> str | None:
        """What makes groups `first ..` impossible after the ones before them (None: nothing)."""
        index = self.index
        for group in groups:
            if not self.last_topic < group.topic_id < self.topics:
                return (
                    f"a group of topic id {group.topic_id} after {self.last_topic} "
                    f"(the catalog has {self.topics})"
                )
            if group.first_entry != self.entry or group.flags & ~(FLAG_RESTART | FLAG_TRUNCATED):
                return f"the group of topic id {group.topic_id} does not follow the one before it"
            if not -1 <= group.previous_segment < index.number or group.bytes > index.data_size:
                return (
                    f"the group of topic id {group.topic_id} names another segment or more bytes than it has"
                )
            if group.dropped >= _MOST_DROPPED:
                return f"the group of topic id {group.topic_id} dropped {group.dropped} bytes"
            self.entry += group.count
            self.last_topic = group.topic_id
        self.seen = first + len(groups)
        skip = -first % SUMMARY_EVERY
        named = index.summary[(first + skip) // SUMMARY_EVERY :][: len(groups[skip::SUMMARY_EVERY])].tolist()
        if named != [group.topic_id for group in groups[skip::SUMMARY_EVERY]]:
            return "its summary does not name its groups' topic ids"
        return None

    def end(self) -> str | None:
        """What the groups seen, all of them, contradict in the header (None: nothing)."""
        if self.entry != self.index.entries:
            return f"its groups hold {self.entry} entries, its header says {self.index.entries}"
        if len(self.index.summary) != -(-self.seen // SUMMARY_EVERY):
            return "its summary does not name its groups' topic ids"
        return None
