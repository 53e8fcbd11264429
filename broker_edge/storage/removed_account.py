"""What retention deleted, per topic: the position below which every deleted record of the topic lay.

A reader by partition position (the Spark source) that finds positions it has not read deleted (below the
partition's start, or a segment gone between kept ones) must tell whether records of its own topics were
among them (data loss) or only other topics' (a topic kept shorter than its own: nothing of its lost). The
segment is gone by then, so the store keeps, per topic, `removed_below`: one past the position of the
newest record of the topic that went with a deleted segment (0: none). Retention deletes a topic's records
oldest first, so a reader at `position` lost records of the topic exactly when `removed_below > position`.

Per partition, `accounted_from` is the position from which every deleted position is accounted for: 0 for a
partition that has kept the account since it was made; for one of a store written before the account was
kept (or whose account file is damaged), the position past what was already gone when the account began;
for one that lost segment files between runs (a segment missing at open that retention did not delete),
the position past the last of them. Below it the store cannot tell, and readers count positions as before.
So the account also keeps the numbers of the segments retention deleted, above a floor per partition below
which every segment is gone and accounted for (moved up to the first segment left when the file is
rewritten).

On disk, `log/removed`: an 8-byte header (`TSRA`, version), then 16-byte entries appended in order,
`u32 key | u32 crc32c(key, value) | u64 value`. The key's top three bits say what it is: `0..`, a topic id
(value: its `removed_below`); `100`, a partition number (its `accounted_from`); `110`, a partition number
(value: a segment retention deleted); `111`, a partition number (its floor). Values only grow: the largest
of a key's entries holds. Entries are written and synced before the segment files they account for are
deleted, so a crash leaves the account ahead of the files, never behind (an overstated account reports
loss, never hides it). The file is rewritten whole (temporary file, rename) once it holds more than twice
its live entries.
"""

from __future__ import annotations

import logging
import os
import struct
from array import array
from bisect import bisect_right
from collections.abc import Generator, Sequence
from itertools import pairwise
from typing import TypeVar

from . import record
from .entry import HEAD_SIZE
from .partition_log import PartitionLog
from .record import PREFIX, PREFIX_SIZE
from .sealed_index import ENTRY_SIZE, MISSING, SPARSE_EVERY, Group, SealedIndex
from .segment import Segment, fsync_directory

__all__ = ["ACCOUNT_FILE", "RemovedAccount", "removed_positions", "unaccounted_from"]

log = logging.getLogger("broker_edge.storage.store")

ACCOUNT_FILE = "removed"
_MAGIC = b"TSRA\x01\x00\x00\x00"
_ENTRY = struct.Struct("<IIQ")
_KIND_MASK = 0b111 << 29
_ACCOUNTED_FROM = 0b100 << 29
_DELETED = 0b110 << 29
_FLOOR = 0b111 << 29
_KEY = struct.Struct("<IQ")
_STEP_CHUNK = 64 * 1024
_ONE_READ_BYTES = 1 << 20
SLICE_GROUPS = 4096
"""Groups (and records placed) between two yields of `removed_positions`."""

T = TypeVar("T")


class RemovedAccount:
    """The account of one store (see the module docstring): in memory, and its file."""

    def __init__(self, path: str, sync: bool, partitions: Sequence[PartitionLog]) -> None:
        self.path = path
        self.sync = sync
        self.partitions = partitions
        self.removed_below = array("q")
        """Per topic id (missing: 0)."""
        self.accounted_from: dict[int, int] = {}
        """Per partition (missing: 0)."""
        self.floor: dict[int, int] = {}
        """Per partition, the segment number below which every missing segment is accounted for (missing:
        0); `deleted` holds the numbers retention deleted at or above it."""
        self.deleted: dict[int, set[int]] = {}
        self._entries = 0

    def open(self) -> None:
        """Read the file; without one (a store written before the account), or with a damaged one, start
        one past what each partition had already lost (`unaccounted_from`). Then a segment missing that
        retention did not delete (its files lost between runs) moves its partition's account past it."""
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            data = None
        if data is None or not self._load(data):
            if data is not None:
                log.warning(
                    "%s is damaged: retention's account of deleted records starts again from each "
                    "partition's present extent (readers by position count positions deleted before as "
                    "they did)",
                    self.path,
                )
            self.removed_below = array("q")
            self.accounted_from, self.floor, self.deleted = {}, {}, {}
            for part in self.partitions:
                floor, number = unaccounted_from(part)
                self.accounted_from[part.number], self.floor[part.number] = floor, number
            self._rewrite()
        self.record((), [(part.number, self._past_lost(part)) for part in self.partitions])

    def _past_lost(self, part: PartitionLog) -> int:
        """Where `part`'s account must begin at least: past every segment missing that retention did not
        delete (0: none). Looks at the gaps between the segments present, never number by number (a file
        named as a far segment makes a gap of millions)."""
        deleted = self.deleted.get(part.number, set())
        last_lost = -1
        start = self.floor.get(part.number, 0)
        for stop in [*(segment.number for segment in part.segments), part.next_number]:
            number = stop - 1
            while number >= start and number in deleted:
                number -= 1
            if number >= start:
                last_lost = number
            start = max(start, stop + 1)
        if last_lost < 0:
            return 0
        after = [segment.base for segment in part.segments if segment.number > last_lost]
        return after[0] if after else part.end_position

    def _load(self, data: bytes) -> bool:
        if not data.startswith(_MAGIC):
            return False
        whole = (len(data) - len(_MAGIC)) // _ENTRY.size * _ENTRY.size  # a torn last entry: never synced
        for at in range(len(_MAGIC), len(_MAGIC) + whole, _ENTRY.size):
            key, check, value = _ENTRY.unpack_from(data, at)
            if check != record.crc32c(_KEY.pack(key, value)):
                if at + _ENTRY.size == len(_MAGIC) + whole:
                    break  # the last entry torn by a crash: never synced, its segments never deleted
                return False
            self._apply(key, value)
            self._entries += 1
        return True

    def _apply(self, key: int, value: int) -> None:
        kind, number = key & _KIND_MASK, key & ~_KIND_MASK
        if not key & _ACCOUNTED_FROM:  # (bit 31: not a topic)
            column = self.removed_below
            if key >= len(column):
                column.extend(bytes(8 * (key + 1 - len(column))))
            column[key] = max(column[key], value)
        elif kind == _ACCOUNTED_FROM:
            self.accounted_from[number] = max(self.accounted_from.get(number, 0), value)
        elif kind == _DELETED:
            self.deleted.setdefault(number, set()).add(value)
        elif kind == _FLOOR:
            self.floor[number] = max(self.floor.get(number, 0), value)

    def of(self, topic_id: int) -> int:
        column = self.removed_below
        return column[topic_id] if topic_id < len(column) else 0

    def deleted_segment(self, partition: int, number: int) -> bool:
        """Whether retention deleted segment `number` of `partition` (below its floor, or named)."""
        return number < self.floor.get(partition, 0) or number in self.deleted.get(partition, ())

    def from_position(self, partition: int) -> int:
        return self.accounted_from.get(partition, 0)

    def record(
        self,
        removed: Sequence[tuple[int, int]],
        partitions: Sequence[tuple[int, int]] = (),
        segments: Sequence[tuple[int, int]] = (),
    ) -> None:
        """Add `(topic id, removed_below)`, `(partition, accounted_from)` and `(partition, segment number)`
        (a segment retention deletes) entries, durably, before the files they account for go."""
        keys = [(topic_id, value) for topic_id, value in removed if value > self.of(topic_id)]
        keys += [
            (number | _ACCOUNTED_FROM, value)
            for number, value in partitions
            if value > self.from_position(number)
        ]
        keys += [(number | _DELETED, value) for number, value in segments]
        if not keys:
            return
        for key, value in keys:
            self._apply(key, value)
        self._entries += len(keys)
        live = sum(1 for value in self.removed_below if value) + 2 * len(self.accounted_from)
        if self._entries > 2 * (live + sum(map(len, self.deleted.values()))) + 1024:
            self._rewrite()
            return
        body = b"".join(_ENTRY.pack(key, record.crc32c(_KEY.pack(key, value)), value) for key, value in keys)
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            _write_all(descriptor, body)
            if self.sync:
                os.fdatasync(descriptor)
        finally:
            os.close(descriptor)

    def _rewrite(self) -> None:
        """Write the whole account anew; each partition's floor moves up to its first segment (every
        segment below it is gone, and accounted for)."""
        for part in self.partitions:
            floor = part.segments[0].number if part.segments else part.next_number
            number = part.number
            if floor > self.floor.get(number, 0):
                self.floor[number] = floor
                self.deleted[number] = {kept for kept in self.deleted.get(number, ()) if kept >= floor}
        # (a value 0 is what no entry says: a new store's account is its magic alone, written unchecksummed)
        keys = [
            (number | _ACCOUNTED_FROM, value)
            for number, value in sorted(self.accounted_from.items())
            if value
        ]
        keys += [(number | _FLOOR, value) for number, value in sorted(self.floor.items()) if value]
        keys += [
            (number | _DELETED, value) for number, kept in self.deleted.items() for value in sorted(kept)
        ]
        keys += [(topic_id, value) for topic_id, value in enumerate(self.removed_below) if value]
        body = b"".join(_ENTRY.pack(key, record.crc32c(_KEY.pack(key, value)), value) for key, value in keys)
        temporary = self.path + ".tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(descriptor, _MAGIC + body)
            if self.sync:
                os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, self.path)
        if self.sync:
            fsync_directory(os.path.dirname(self.path))
        self._entries = len(keys)


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]


def unaccounted_from(part: PartitionLog) -> tuple[int, int]:
    """The position past every position of `part` already deleted (its start, or the base of the segment
    after its last gap), and that segment's number (the next one when none is left): where an account
    begun now accounts from."""
    segments = part.segments
    if not segments:
        return part.end_position, part.next_number
    first = segments[0]
    for before, after in pairwise(segments):
        if before.number + 1 < after.number:
            first = after
    return first.base, first.number


def removed_positions(
    part: PartitionLog, segment: Segment, tick: T
) -> Generator[T, None, list[tuple[int, int]]]:
    """Per topic with records in sealed `segment` (about to be deleted): one past the position of its last
    record there; yields `tick` after every `SLICE_GROUPS` groups (the event loop runs between). A record
    whose index entry lost its position counts up to the segment's end."""
    sealed = segment.sealed
    assert sealed is not None
    end = segment.base + sealed.rows
    lasts: list[tuple[int, int]] = []  # (byte position, topic id)
    removed: list[tuple[int, int]] = []
    for first in range(0, sealed.groups, SLICE_GROUPS):
        groups = [group for group in sealed.groups_from(first, SLICE_GROUPS) if group.count]
        for group, entry in zip(groups, _last_entries(sealed, groups), strict=True):
            byte = entry & 0xFFFFFFFF
            if byte == MISSING:
                removed.append((group.topic_id, end))
            else:
                lasts.append((byte, group.topic_id))
        yield tick
    lasts.sort()
    sparse = sealed.sparse_rows()[0::2] if lasts else array("q")
    row = byte = -1
    for number, (target, topic_id) in enumerate(lasts, 1):
        window = bisect_right(sparse, target) - 1
        if row < 0 or byte > target or window * SPARSE_EVERY > row:
            row, byte = window * SPARSE_EVERY, sparse[window]
        row, byte = _step_to(part, segment, row, byte, target)
        removed.append((topic_id, min(segment.base + row + 1, end)))
        if number % SLICE_GROUPS == 0:
            yield tick
    return removed


def _last_entries(sealed: SealedIndex, groups: list[Group]) -> list[int]:
    """The index entry of each group's last record: one read for the groups' entries when they are few
    bytes (a topic per device: a record or two each), else one read per group."""
    if not groups:
        return []
    first = groups[0].first_entry
    span = groups[-1].first_entry + groups[-1].count - first
    if span * ENTRY_SIZE > _ONE_READ_BYTES:
        return [sealed.entries_of(group, group.count - 1, group.count)[0] for group in groups]
    entries = sealed.entries_of(groups[0], 0, span)  # (a sealed index lays the entries group after group)
    return [entries[2 * (group.first_entry + group.count - 1 - first)] for group in groups]


def _step_to(part: PartitionLog, segment: Segment, row: int, byte: int, target: int) -> tuple[int, int]:
    """Step entry by entry from `row` at `byte` to the entry at byte `target`: (its row, `target`)."""
    while byte < target:
        size = min(_STEP_CHUNK, target - byte + HEAD_SIZE + PREFIX_SIZE)
        buffer = part.pool.pread(segment.log_path, size, byte)
        at = 0
        while byte + at < target and at + HEAD_SIZE + PREFIX_SIZE <= len(buffer):
            body_length, _crc = PREFIX.unpack_from(buffer, at + HEAD_SIZE)
            at += HEAD_SIZE + PREFIX_SIZE + body_length
            row += 1
        if not at:
            raise OSError(f"{segment.log_path}: no entry at byte {byte}")
        byte += at
    return row, byte
