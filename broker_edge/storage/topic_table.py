"""Every topic's state as columns (`array`s indexed by topic id): no Python object per topic.

A broker with a topic per device has hundreds of thousands of topics, most of them quiet. An object per
topic (its log, its tail cache, its index) would cost kilobytes each and make every full garbage collection
walk them all; a row in a few arrays costs about 100 bytes and nothing for the collector.

`TopicTable` is the live state the event loop reads and writes. `SealedState` is what the sealed segments
alone say (the sealer thread applies each sealed index's groups to it, in order), and what the snapshot file
(`write_snapshot`, `read_snapshot`) records, so that an open after a crash only applies the segments sealed
since the snapshot and scans what was not sealed.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from broker_edge.bounds import MAX_OFFSET

from . import record
from .segment import fsync_directory

__all__ = ["NO_RULE", "NO_TIME", "SNAPSHOT_FILE", "SealedState", "Snapshot", "TopicTable"]

NO_TIME = -(2**63)
NO_RULE = 255
NO_SEGMENT = -1
SNAPSHOT_FILE = "topics.state"
_MAGIC = b"TSTS"
_VERSION = 1
_HEADER = struct.Struct("<4sHHIQQI")
"""magic, version, partitions, topics, catalog bytes covered, catalog CRC, CRC of the rest."""


class TopicTable:
    """The live state of every topic, one column per field, indexed by topic id."""

    __slots__ = (
        "committed",
        "dropped",
        "durable",
        "durable_ms",
        "head_first",
        "head_last",
        "head_seg",
        "index_ms",
        "next",
        "partition",
        "rule",
        "start",
        "total",
        "truncated",
    )

    def __init__(self) -> None:
        self.partition = array("H")
        self.next = array("q")
        """The offset the next append gets."""
        self.durable = array("q")
        """Offset after the last record durable here."""
        self.committed: array | None = None
        """A replicated store's committed ends (None: the durable end is what readers see)."""
        self.start = array("q")
        """The oldest offset readers may ask for (retention moves it)."""
        self.head_seg = array("i")
        """The newest segment holding one of the topic's records (or its marker), -1 for none."""
        self.head_first = array("q")
        """The topic's first offset in `head_seg`."""
        self.head_last = array("i")
        """The topic's last row in `head_seg` while that segment's rows are in memory."""
        self.total = array("q")
        """Frame bytes of the topic's durable records, ever (less what a truncation cut)."""
        self.dropped = array("q")
        """Of `total`, the bytes below `start` (retention)."""
        self.index_ms = array("q")
        """Running maximum of the topic's record times (what its index entries hold)."""
        self.durable_ms = array("q")
        """The newest time among its durable records (NO_TIME for none)."""
        self.rule = array("B")
        """Its persistence rule's number (NO_RULE: not looked up yet)."""
        self.truncated: set[int] = set()
        """Topics ever truncated: groups of theirs in sealed segments may run past their live records (a
        follower's, rare), so retention finds their live ends through their chain."""

    def __len__(self) -> int:
        return len(self.next)

    def add(self, partition: int) -> int:
        """A row for a new topic (an empty log at offset 0); returns its id."""
        return self.add_many(array("H", (partition,)), array("B", (NO_RULE,)))

    def add_many(self, partitions: array, rules: array) -> int:
        """Rows for new topics (empty logs at offset 0) of `partitions` and persistence `rules` (`NO_RULE`:
        not looked up yet), one extension per column; returns the first one's id."""
        topic_id = len(self.next)
        count = len(partitions)
        self.partition.extend(partitions)
        zeros = array("q", bytes(8 * count))
        for column in (self.next, self.durable, self.start, self.head_first, self.total, self.dropped):
            column.extend(zeros)
        if self.committed is not None:
            self.committed.extend(zeros)
        self.head_seg.extend(array("i", (NO_SEGMENT,)) * count)
        self.head_last.extend(array("i", (-1,)) * count)
        times = array("q", (NO_TIME,)) * count
        self.index_ms.extend(times)
        self.durable_ms.extend(times)
        self.rule.extend(rules)
        return topic_id

    def load(self, partitions: Sequence[int], sealed: SealedState, start: array, dropped: array) -> None:
        """Start from the sealed state (what an open found sealed) for topics with `partitions` by id."""
        count = len(partitions)
        self.partition = array("H", partitions)
        self.head_seg = array("i", sealed.head_seg)
        self.head_first = array("q", sealed.head_first)
        self.next = array("q", sealed.end)
        self.durable = array("q", sealed.end)
        self.total = array("q", sealed.total)
        self.durable_ms = array("q", sealed.newest_ms)
        self.index_ms = array("q", sealed.newest_ms)
        self.start = array("q", start)
        self.dropped = array("q", dropped)
        for topic_id, offset in sealed.restarts.items():
            # The log starts at the restart, below the snapshot's start too: a restart's group applied
            # since the snapshot came after it (the segment holding it was sealed later), and its offset is
            # also where a cut below the start left it, restarted or not. The snapshot's drops came before
            # the restart (no later segment was sealed by then, so none was deleted) and the sealed total
            # counts from the restart on, as `restart_live` does.
            self.start[topic_id] = offset
            self.dropped[topic_id] = 0
        for topic_id, (offset, total_then) in sealed.cuts.items():
            if self.start[topic_id] > offset:
                self.start[topic_id] = offset
                self.dropped[topic_id] = total_then
        self.head_last = array("i", [-1]) * count
        self.rule = array("B", [NO_RULE]) * count
        self.truncated = set(sealed.truncated)

    def end(self, topic_id: int) -> int:
        """What readers may read up to: the committed end when replicated, else the durable end."""
        committed = self.committed
        return committed[topic_id] if committed is not None else self.durable[topic_id]


class SealedState:
    """Per topic, what the sealed segments say: its newest segment, its first offset there, its end, its
    bytes and newest time. Owned by the sealer thread once the store is open."""

    __slots__ = ("cuts", "end", "head_first", "head_seg", "newest_ms", "restarts", "total", "truncated")

    def __init__(self, topics: int = 0) -> None:
        self.truncated: set[int] = set()
        self.restarts: dict[int, int] = {}
        """Topics whose log restarted at a later offset in a sealed segment applied since the snapshot: their
        start (the snapshot's start column has the earlier ones)."""
        self.cuts: dict[int, tuple[int, int]] = {}
        """Topics truncated in a sealed segment applied since the snapshot (and not restarted after): the
        lowest offset cut to and the topic's total bytes right after that cut. A cut below the snapshot's
        start empties the log there, as `ReplicatedLog.truncate_to` did live."""
        self.head_seg = array("i", [NO_SEGMENT]) * topics
        self.head_first = array("q", bytes(8 * topics))
        self.end = array("q", bytes(8 * topics))
        self.total = array("q", bytes(8 * topics))
        self.newest_ms = array("q", [NO_TIME]) * topics

    def __len__(self) -> int:
        return len(self.end)

    def grow(self, topics: int) -> None:
        """Rows for topics created since (empty logs)."""
        missing = topics - len(self.end)
        if missing > 0:
            self.head_seg.extend(array("i", [NO_SEGMENT]) * missing)
            self.head_first.extend(array("q", bytes(8 * missing)))
            self.end.extend(array("q", bytes(8 * missing)))
            self.total.extend(array("q", bytes(8 * missing)))
            self.newest_ms.extend(array("q", [NO_TIME]) * missing)

    def columns(self) -> tuple[array, ...]:
        return (self.head_seg, self.head_first, self.end, self.total, self.newest_ms)


@dataclass(slots=True)
class Snapshot:
    """A snapshot file's content: the sealed state, the live start and dropped columns, and what it covers."""

    sealed: SealedState
    start: array
    dropped: array
    applied: list[tuple[int, int]]
    """Per partition, the newest segment whose sealed index the state includes (-1: none) and the position
    after it: a partition whose segments retention all deleted goes on from there, never reusing either."""
    catalog_bytes: int
    catalog_crc: int


def write_snapshot(path: str, snapshot: Snapshot, sync: bool = True) -> None:
    """Replace the snapshot at `path`, atomically and durably (temporary file, fsync unless not `sync`,
    rename)."""
    sealed = snapshot.sealed
    topics = len(sealed)
    columns = [*sealed.columns(), snapshot.start[:topics], snapshot.dropped[:topics]]
    applied = array("q", [value for pair in snapshot.applied for value in pair])
    truncated = array("I", sorted(sealed.truncated))
    parts = [applied.tobytes(), *(column.tobytes() for column in columns), truncated.tobytes()]
    checksum = 0
    for part in parts:
        checksum = record.crc32c(part, checksum)
    header = _HEADER.pack(
        _MAGIC,
        _VERSION,
        len(snapshot.applied),
        topics,
        snapshot.catalog_bytes,
        snapshot.catalog_crc,
        checksum,
    )
    temporary = path + ".tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for part in (header, *parts):
            view = memoryview(part)
            while view:
                view = view[os.write(descriptor, view) :]
        if sync:
            os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)
    if sync:
        fsync_directory(os.path.dirname(path))


def read_snapshot(path: str) -> Snapshot | None:
    """The snapshot at `path` (None when there is none or it is damaged: every sealed index is applied)."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    if len(data) < _HEADER.size:
        return None
    magic, version, partitions, topics, catalog_bytes, catalog_crc, checksum = _HEADER.unpack_from(data)
    expected = _HEADER.size + 16 * partitions + topics * (4 + 8 * 6)
    if magic != _MAGIC or version != _VERSION or len(data) < expected or (len(data) - expected) % 4:
        return None
    if record.crc32c(memoryview(data)[_HEADER.size :]) != checksum:
        return None
    position = _HEADER.size
    applied = array("q")
    applied.frombytes(data[position : position + 16 * partitions])
    position += 16 * partitions
    columns: list[array] = []
    for typecode in ("i", "q", "q", "q", "q", "q", "q"):
        column = array(typecode)
        width = column.itemsize * topics
        column.frombytes(data[position : position + width])
        position += width
        columns.append(column)
    if any(_outside_a_log(columns[number]) for number in (1, 2, 5)):  # head_first, end, start
        return None  # offsets no log holds (damage the CRC missed): every sealed index is applied instead
    sealed = SealedState()
    sealed.head_seg, sealed.head_first, sealed.end, sealed.total, sealed.newest_ms = columns[:5]
    truncated = array("I")
    truncated.frombytes(data[position:])
    sealed.truncated = set(truncated)
    pairs = list(zip(applied[0::2], applied[1::2], strict=True))
    return Snapshot(sealed, columns[5], columns[6], pairs, catalog_bytes, catalog_crc)


def _outside_a_log(offsets: array) -> bool:
    return bool(offsets) and (max(offsets) > MAX_OFFSET or min(offsets) < 0)
