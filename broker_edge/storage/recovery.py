"""Opening the partition logs: what the snapshot and the sealed indexes say, then what was not sealed.

1. The catalog (topic names, ids, partitions) is read; a torn entry at its end is cut, unless a sealed
   segment or the snapshot shows that it was synced (then, as without a catalog while segments hold
   records, the store does not open: `CatalogDamaged`).
2. The snapshot gives the sealed state as of some sealed segments; the sealed indexes newer than it are
   applied (their groups only, never their records).
3. Segments without a valid sealed index (the active one; one rolled whose seal did not finish; any after
   a damaged index) are loaded as rows in memory: from their open index up to its durable count, then
   by scanning the rest, entry by entry, checking each. A torn end is cut (and the segments after it,
   written in the same or later jobs, removed); a record whose frame fails its CRC between valid entries
   stays as a hole. Rolled ones go to the sealer once the store runs; the last one is the active segment.

Files lost between runs are found on the way and reported at ERROR (`lost_files`): a segment file gone
whose records were still its topics', a sealed segment shorter than its index, and a log that now ends
below what it had reached (the store keeps those offsets as a gap, never given again).

After a clean close step 3 finds nothing (close sealed every segment) and step 2 nothing newer than the
snapshot: an open reads the catalog, the snapshot and each segment's header and summary.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

from broker_edge.bounds import MAX_OFFSET

from .active_index import NO_PREVIOUS, UNKNOWN_ROW, ActiveIndex, pointer
from .catalog import CATALOG_FILE, LOST_NAME, TopicCatalog
from .entry import HEAD_SIZE, MARKER_BIT, RESTART, TRUNCATE, EntryError, Marker, parse_marker
from .file_pool import FileHandlePool
from .lost_files import (
    Evidence,
    check_catalog_end,
    find_missing_segments,
    lost_ends,
    refuse_without_catalog,
    report_missing_segments,
    report_short_segments,
)
from .open_index import read_open_index
from .partition_log import PartitionConfig, PartitionLog
from .quarantine import Quarantine
from .recent import RecentWindows
from .record import PREFIX, PREFIX_SIZE
from .sealed_index import GroupBlocks, SealedIndex, build, write_index
from .segment import SEALED, Segment, fsync_directory, rebuild_marker, segment_paths
from .segment_scan import SegmentScanner, apply_groups, remove_file, truncate_segment, write_open_header
from .topic_table import NO_TIME, SNAPSHOT_FILE, SealedState, Snapshot, TopicTable, read_snapshot

__all__ = ["Opened", "PartitionRepair", "open_partitions"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PartitionRepair:
    """What opening one partition found and repaired."""

    partition: int
    bytes_dropped: int = 0
    segments_dropped: int = 0
    damaged_segments: list[int] = field(default_factory=list)
    """Segments damaged beyond their readable part, kept whole (see `_load_rows`)."""
    damaged_records: list[tuple[str, int]] = field(default_factory=list)
    damage: str | None = None
    missing_segments: list[int] = field(default_factory=list)
    """Segments whose data file is gone while records of theirs were still the topics' (damage)."""
    records_lost: int = 0
    """Records the indexes or the snapshot counted that are no longer on disk (missing or cut segments)."""
    bytes_skipped: int = 0
    """Damaged bytes between valid entries of unsealed segments, stepped over (kept in the file)."""

    @property
    def repaired(self) -> bool:
        damage = self.bytes_dropped or self.bytes_skipped or self.segments_dropped or self.records_lost
        return bool(damage or self.damaged_records or self.damaged_segments or self.missing_segments)


@dataclass(slots=True)
class Opened:
    """Everything `open_partitions` loaded."""

    catalog: TopicCatalog
    table: TopicTable
    sealed: SealedState
    applied: dict[int, tuple[int, int]]
    partitions: list[PartitionLog]
    repairs: list[PartitionRepair]
    catalog_bytes_dropped: int = 0
    records_scanned: int = 0
    indexes_rebuilt: int = 0
    used_snapshot: bool = False
    quarantine: Quarantine = field(default_factory=Quarantine)
    """Topics set aside: their log cannot be opened (``quarantine``), the others opened all the same."""
    gaps: list[tuple[int, int, int]] = field(default_factory=list)
    """(topic id, next offset found, offset the log had reached): offsets assigned once whose records are
    gone from the end of a log. The store makes each a gap (a marker) before it takes appends, so that no
    offset is given twice."""
    orphan_indexes: list[str] = field(default_factory=list)
    """Sealed indexes whose segment file is gone: removed once the gaps are durable."""


def open_partitions(
    log_directory: str,
    partitions: int,
    config: PartitionConfig,
    pool: FileHandlePool,
    recent: RecentWindows,
    blocks: GroupBlocks,
) -> Opened:
    """Load (or create) the partition logs of `log_directory` (see the module docstring)."""
    os.makedirs(log_directory, exist_ok=True)
    snapshot = read_snapshot(os.path.join(log_directory, SNAPSHOT_FILE))
    catalog_path = os.path.join(log_directory, CATALOG_FILE)
    if not os.path.exists(catalog_path):
        refuse_without_catalog(log_directory, catalog_path, snapshot)
    catalog = TopicCatalog(catalog_path)
    catalog_dropped = (
        catalog.load(snapshot.catalog_bytes, snapshot.catalog_crc) if snapshot is not None else catalog.load()
    )
    quarantine = Quarantine()
    count = max(partitions, _existing_partitions(log_directory), 1)
    table = TopicTable()

    def partition_log(number: int) -> PartitionLog:
        directory = _partition_directory(log_directory, number)
        part = PartitionLog(number, directory, table, pool, recent, blocks, config)
        part.names = catalog.names
        return part

    present = {int(name) for name in os.listdir(log_directory) if name.isdigit()}
    parts = [partition_log(number) for number in range(count)]
    evidence = Evidence()
    found, failed = _found_segments(parts, pool, blocks, evidence)
    check_catalog_end(catalog, catalog_dropped, snapshot, found, evidence)
    catalog.cut_torn_end()
    _set_aside_strays(catalog, count, quarantine)
    for topic_id, reason in catalog.damaged.items():
        quarantine.set_aside(topic_id, reason)
    _set_aside_without_directory(catalog, present, log_directory, quarantine)
    opened = _load_sealed(parts, found, failed, catalog, snapshot, quarantine)
    sealed = opened.sealed
    topics = len(catalog)
    sealed.grow(topics)
    start = _column(snapshot.start if snapshot is not None and opened.used_snapshot else array("q"), topics)
    dropped = _column(
        snapshot.dropped if snapshot is not None and opened.used_snapshot else array("q"), topics
    )
    _shrink(sealed, topics)
    table.load(catalog.partitions, sealed, start, dropped)
    repairs = {
        part.number: PartitionRepair(part.number, damaged_segments=list(opened.damaged.get(part.number, ())))
        for part in parts
    }
    opened.repairs.extend(repairs.values())
    losses = find_missing_segments(parts, found, snapshot, table, evidence)
    for part, unsealed in zip(parts, opened.unsealed_by_partition, strict=True):
        repair = repairs[part.number]
        if part.number in opened.failed:
            continue
        try:
            for number, segment in enumerate(unsealed):
                last = number == len(unsealed) - 1
                cut = _load_rows(part, segment, topics, repair, opened, last, quarantine)
                if cut:
                    for later in unsealed[number + 1 :]:
                        later.delete(pool)
                        repair.segments_dropped += 1
                    break
        except (OSError, ValueError, EntryError) as unreadable:
            opened.failed[part.number] = unreadable
            continue
        part.resume_active()
    report_missing_segments(parts, losses, table, opened.marked, repairs)
    report_short_segments(parts, evidence, repairs)
    for number, why in sorted(opened.failed.items()):
        _refuse_if_not_damage(number, why)
    for number, why in sorted(opened.failed.items()):
        parts[number] = _set_partition_aside(parts[number], why, catalog, quarantine, partition_log)
    if opened.unused_snapshot is not None:
        _keep_what_only_the_snapshot_knows(table, opened.unused_snapshot)
    gaps = lost_ends(table, sealed, opened.unused_snapshot, opened.marked, opened.names, evidence, quarantine)
    return Opened(
        catalog,
        table,
        sealed,
        opened.applied,
        parts,
        opened.repairs,
        catalog_dropped,
        opened.records_scanned,
        opened.indexes_rebuilt,
        opened.used_snapshot,
        quarantine,
        gaps,
        [path for _part, _number, path, _groups in evidence.orphans],
    )


def _set_aside_strays(catalog: TopicCatalog, partitions: int, quarantine: Quarantine) -> None:
    """Set aside the topics the catalog files in a partition that is neither configured nor on disk (an
    entry no version of the store wrote: none of its records can exist); they count as partition 0's."""
    for topic_id, partition in enumerate(catalog.partitions):
        if partition >= partitions:
            quarantine.set_aside(
                topic_id,
                f"its catalog entry names partition {partition}, of {partitions} configured or on disk",
            )
            catalog.partitions[topic_id] = 0


def _set_aside_without_directory(
    catalog: TopicCatalog, present: set[int], log_directory: str, quarantine: Quarantine
) -> None:
    """Set aside the topics the catalog files in a partition whose directory was not there at open (a
    partition's directory is made at its first open and never removed: it was deleted or renamed). Their
    records are gone or elsewhere: serving or appending to them would give their offsets again."""
    for topic_id, partition in enumerate(catalog.partitions):
        if partition not in present:
            quarantine.set_aside(
                topic_id,
                f"the directory of its partition, {_partition_directory(log_directory, partition)}, is "
                "missing (deleted or renamed): put it back",
            )


_NOT_DAMAGE = {
    errno.EACCES: "the broker's user must be able to read and write every file of storage.directory: put its"
    " owner or mode right",
    errno.EPERM: "the broker's user must be able to read and write every file of storage.directory: put its"
    " owner, mode or attributes right",
    errno.EROFS: "storage.directory is on a read-only filesystem: mount it read-write",
    errno.ENOSPC: "free space on the filesystem of storage.directory",
    errno.EDQUOT: "raise the quota or free space on the filesystem of storage.directory",
    errno.EMFILE: "raise the broker's descriptor limit (ulimit -n, LimitNOFILE=)",
    errno.ENFILE: "the system is out of file descriptors",
}
"""Errors opening a partition that are the host's, not the files' damage, and what puts each right."""


def _refuse_if_not_damage(number: int, error: BaseException) -> None:
    """Raise, so that the store does not open, when a partition failed for the host's reason (permissions,
    a read-only mount, a full disk, descriptors): setting its topics aside would keep them aside (refused,
    not served) after the host is put right, and none of its files is damaged."""
    if not isinstance(error, OSError) or error.errno not in _NOT_DAMAGE:
        return
    where = f"{error.filename}: " if error.filename else ""
    raise OSError(
        error.errno,
        f"partition {number} cannot be opened: {where}{error.strerror}: {_NOT_DAMAGE[error.errno]}; nothing"
        " was set aside",
    ) from error


def _set_partition_aside(
    part: PartitionLog,
    error: BaseException,
    catalog: TopicCatalog,
    quarantine: Quarantine,
    partition_log: Callable[[int], PartitionLog],
) -> PartitionLog:
    """A partition log that could not be opened: its directory moved aside (kept as it is), every topic
    of it set aside, and an empty partition log in its place for the topics created from now on."""
    aside = f"{part.directory}.quarantined-{int(time.time())}"
    os.rename(part.directory, aside)
    reason = (
        f"partition {part.number} could not be opened ({type(error).__name__}: {error}); moved to {aside}"
    )
    log.error("%s", reason)
    for topic_id, partition in enumerate(catalog.partitions):
        if partition == part.number:
            quarantine.set_aside(topic_id, reason)
    fresh = partition_log(part.number)
    fresh.discover()
    # numbers and positions go on after the old ones: never reused (readers, cached index blocks)
    fresh.next_number = max([part.next_number, *(segment.number + 1 for segment in part.segments)])
    fresh.next_base = max([part.next_base, *(segment.base + segment.row_count for segment in part.segments)])
    return fresh


def _partition_directory(log_directory: str, number: int) -> str:
    return os.path.join(log_directory, f"{number:02d}")


def _existing_partitions(log_directory: str) -> int:
    numbers = [int(name) for name in os.listdir(log_directory) if name.isdigit()]
    return max(numbers) + 1 if numbers else 0


def _column(values: array, topics: int) -> array:
    column = array("q", values[:topics])
    if len(column) < topics:
        column.extend(array("q", bytes(8 * (topics - len(column)))))
    return column


def _shrink(sealed: SealedState, topics: int) -> None:
    """Forget rows past the catalog (topics whose catalog entry a crash cut: never acknowledged)."""
    for column in sealed.columns():
        del column[topics:]


@dataclass(slots=True)
class _Loading:
    sealed: SealedState
    applied: dict[int, tuple[int, int]]
    unsealed_by_partition: list[list[Segment]]
    repairs: list[PartitionRepair] = field(default_factory=list)
    records_scanned: int = 0
    indexes_rebuilt: int = 0
    used_snapshot: bool = False
    unused_snapshot: Snapshot | None = None
    """A snapshot that could not be used (see `_keep_what_only_the_snapshot_knows`)."""
    damaged: dict[int, list[int]] = field(default_factory=dict)
    """Per partition, segments damaged beyond their readable part whose index was rebuilt."""
    failed: dict[int, BaseException] = field(default_factory=dict)
    """Partitions whose files could not be read, with why (set aside: `_set_partition_aside`)."""
    marked: set[int] = field(default_factory=set)
    """Topics with a truncation or restart marker in the segments loaded as rows."""
    names: list[str] = field(default_factory=list)
    """Topic names by id (the catalog's)."""


def _found_segments(
    parts: list[PartitionLog], pool: FileHandlePool, blocks: GroupBlocks, evidence: Evidence
) -> tuple[list[list[tuple[Segment, SealedIndex | None]]], dict[int, BaseException]]:
    """Each partition's segments with their sealed index when it is valid (None otherwise), and the
    partitions whose files cannot be read, with why. What an index whose data file is shorter than it says,
    or whose data file is gone, recorded goes to `evidence` (read before that index is forgotten)."""
    found: list[list[tuple[Segment, SealedIndex | None]]] = []
    failed: dict[int, BaseException] = {}
    for part in parts:
        segments: list[tuple[Segment, SealedIndex | None]] = []
        try:
            for segment in part.discover():
                index = SealedIndex(segment.index_path, pool, blocks)
                size = os.path.getsize(segment.log_path)
                loaded = index.load(segment.number)
                valid = loaded and index.data_size == size and segment.number not in part.rebuild_marked
                if loaded and index.data_size > size:
                    groups = index.all_groups()
                    if index.damage(1 << 32, groups) is None:  # (a damaged index is no evidence)
                        evidence.short[(part.number, segment.number)] = (size, index.data_size, index.rows)
                        evidence.add(groups)
                if (
                    not valid
                ):  # its file is written again at the segment's seal: no descriptor may see this one
                    pool.forget(segment.index_path)
                    blocks.forget(segment.index_path)
                segments.append((segment, index if valid else None))
            for number in part.orphan_indexes:
                path = segment_paths(part.directory, number)[1]
                index = SealedIndex(path, pool, blocks)
                groups = index.all_groups() if index.load(number) else []
                if groups and index.damage(1 << 32, groups) is not None:
                    groups = []  # a damaged index is no evidence of what its segment held
                pool.forget(path)
                blocks.forget(path)
                evidence.orphans.append((part.number, number, path, groups))
                evidence.add(groups)
        except (OSError, ValueError) as unreadable:
            failed[part.number] = unreadable
            segments = []
        found.append(segments)
    return found, failed


def _load_sealed(
    parts: list[PartitionLog],
    found: list[list[tuple[Segment, SealedIndex | None]]],
    failed: dict[int, BaseException],
    catalog: TopicCatalog,
    snapshot,
    quarantine: Quarantine,
) -> _Loading:
    """Each partition's segments (`found`): sealed ones registered (and applied when newer than the
    snapshot), the unsealed suffix returned per partition. A snapshot that covers a segment whose index is
    now unusable is not used (every sealed index is applied from scratch). A partition whose files cannot be
    read is listed in `failed`, with nothing of it loaded."""
    use_snapshot = (
        snapshot is not None and len(snapshot.applied) <= len(parts) and len(snapshot.sealed) <= len(catalog)
    )
    if use_snapshot:
        for part, segments in zip(parts, found, strict=True):
            applied, _end = snapshot.applied[part.number] if part.number < len(snapshot.applied) else (-1, 0)
            if any(index is None for segment, index in segments if segment.number <= applied):
                use_snapshot = False  # it counts a segment whose index is gone: apply every index again
    if snapshot is not None and not use_snapshot:
        log.error(
            "the topic table snapshot counts a sealed index that is damaged: applying every index again"
        )
    sealed = snapshot.sealed if use_snapshot else SealedState()
    applied_by = {number: value for number, value in enumerate(snapshot.applied)} if use_snapshot else {}
    loading = _Loading(sealed, applied_by, [], used_snapshot=use_snapshot, failed=failed, names=catalog.names)
    for part in parts:  # numbers and positions are never reused, even when retention deleted every segment
        if snapshot is not None and part.number < len(snapshot.applied):
            number, end = snapshot.applied[part.number]
            part.next_number = max(part.next_number, number + 1)
            part.next_base = max(part.next_base, end)
    for part, segments in zip(parts, found, strict=True):
        unsealed: list[Segment] = []
        try:
            _register_sealed(part, segments, unsealed, loading, len(catalog), quarantine)
        except (OSError, ValueError, EntryError) as unreadable:
            failed[part.number] = unreadable
            unsealed = []
        loading.indexes_rebuilt += max(0, len(unsealed) - 1)  # only the last one had no index to have
        loading.unsealed_by_partition.append(unsealed)
    loading.unused_snapshot = snapshot if snapshot is not None and not use_snapshot else None
    return loading


def _register_sealed(
    part: PartitionLog,
    segments: list[tuple[Segment, SealedIndex | None]],
    unsealed: list[Segment],
    loading: _Loading,
    topics: int,
    quarantine: Quarantine,
) -> None:
    """One partition's sealed segments registered (their indexes applied when newer than the snapshot, one
    that is gone between sealed ones rebuilt); the segments after them go to `unsealed`."""
    sealed = loading.sealed
    pool = part.pool
    last_sealed = max((n for n, (_s, index) in enumerate(segments) if index is not None), default=-1)
    for number, (segment, found_index) in enumerate(segments):
        damaged_index = (
            found_index is not None
            and not unsealed
            and segment.number > loading.applied.get(part.number, (-1, 0))[0]
            and _damaged_index(part, segment, found_index, topics)
        )
        if (found_index is None and number < last_sealed) or damaged_index:  # gone between sealed, damaged
            if segment.base < 0 or not segment.base:
                segment.base = _following_base(part)
            found_index, damage = _rebuild_index(part, segment, sealed, topics, quarantine)
            loading.indexes_rebuilt += 1
            if damage is not None:
                loading.damaged.setdefault(part.number, []).append(segment.number)
        if found_index is not None and not unsealed:
            index = found_index
            segment.base = index.base
            segment.sealed = index
            segment.state = SEALED
            segment.size = segment.submitted_size = segment.durable_size = index.data_size
            segment.newest_time = index.newest_time
            part.add_loaded(segment)
            if segment.number > loading.applied.get(part.number, (-1, 0))[0]:
                apply_groups(sealed, index, quarantine)
                loading.applied[part.number] = (segment.number, index.base + index.rows)
            remove_file(segment.open_path)
            continue
        open_rows = read_open_index(segment.open_path, pool)
        segment.base = open_rows.base if open_rows is not None and open_rows.number == segment.number else -1
        unsealed.append(segment)


def _following_base(part: PartitionLog) -> int:
    """The first position of a segment whose base nothing on disk records: after the segment loaded before
    it, and after every segment the snapshot counts (one retention deleted between them included)."""
    previous = part.segments[-1] if part.segments else None
    after_previous = previous.base + previous.row_count if previous is not None else 0
    return max(after_previous, part.next_base)


def _damaged_index(part: PartitionLog, segment: Segment, index: SealedIndex, topics: int) -> bool:
    """Whether a sealed index about to be applied holds impossible groups (a flipped bit: logged, and the
    file forgotten so that it is made again from the segment's data)."""
    damage = index.damage(topics)
    if damage is None:
        return False
    log.error(
        "%s: its sealed index is damaged (%s): it is made again from the data", segment.index_path, damage
    )
    part.pool.forget(segment.index_path)
    part.blocks.forget(segment.index_path)
    return True


def _keep_what_only_the_snapshot_knows(table: TopicTable, snapshot) -> None:
    """After applying every sealed index again (a damaged one made the snapshot unusable): topics no segment
    holds any more (retention deleted theirs: every record was below the start) keep the snapshot's end, so
    that their offsets go on where they were, and every topic keeps at least the snapshot's start. Records
    above the start that no segment holds any more are lost: `lost_files.lost_ends`."""
    old = snapshot.sealed
    for topic_id in range(min(len(old), len(table))):
        if (
            table.head_seg[topic_id] < 0
            and old.end[topic_id] > table.next[topic_id]
            and (snapshot.start[topic_id] >= old.end[topic_id] or topic_id in table.truncated)
        ):
            table.next[topic_id] = table.durable[topic_id] = old.end[topic_id]
            table.head_first[topic_id] = old.end[topic_id]
            table.total[topic_id] = table.dropped[topic_id] = old.total[topic_id]
        start = min(snapshot.start[topic_id], table.next[topic_id])
        if start > table.start[topic_id]:
            table.start[topic_id] = start


def _rebuild_index(
    part: PartitionLog, segment: Segment, sealed: SealedState, topics: int, quarantine: Quarantine
) -> tuple[SealedIndex, str | None]:
    """Write again the sealed index of a segment whose index is gone (between sealed ones), from its data,
    the topics' state before it being `sealed` (as applied so far). A damage it cannot step over ends what
    the index covers: the rest of the segment is kept, never served."""
    rows = ActiveIndex()
    last_rows: dict[int, int] = {}
    times: dict[int, int] = {}

    def head_pointer(topic_id: int) -> int:
        head = sealed.head_seg[topic_id] if topic_id < len(sealed) else -1
        return pointer(head, UNKNOWN_ROW) if head >= 0 else NO_PREVIOUS

    def apply(topic_id: int, position: int, offset: int, time: int, _size: int) -> None:
        if quarantine.past_ceiling(topic_id, offset + 1, "a record ending"):
            return
        last = last_rows.get(topic_id)
        index_time = times[topic_id] = max(times.get(topic_id, time), time)
        if last is None:
            last_rows[topic_id] = rows.add_rows(
                topic_id, [position], offset, index_time, head_pointer(topic_id), 0
            )
        else:
            first, _prev = rows.first_offset_of(topic_id, last)
            last_rows[topic_id] = rows.add_rows(
                topic_id, [position], offset, index_time, last, offset - first
            )

    def on_marker(marker: Marker, position: int) -> None:
        topic_id = marker.topic_id
        if quarantine.past_ceiling(topic_id, marker.offset, "a marker"):
            return
        last = last_rows.get(topic_id)
        prev = pointer(segment.number, last) if last is not None else head_pointer(topic_id)
        rows.add_marker(topic_id, position, marker.offset, marker.kind, marker.dropped, prev)
        if last is None:
            return
        cut_from = marker.offset if marker.kind == TRUNCATE else -1
        first, _prev = rows.first_offset_of(topic_id, last)
        dead, _previous = rows.rows_of(topic_id, last, max(cut_from, first), 2**63 - 1)
        rows.kill(topic_id, dead)
        kept, _previous = rows.rows_of(topic_id, last, first, max(cut_from, first))
        if kept:
            last_rows[topic_id] = kept[-1]
        else:
            del last_rows[topic_id]

    scanner = SegmentScanner(
        part.pool,
        segment.log_path,
        part.config.max_record_bytes,
        topics,
        lambda topic_id: sealed.end[topic_id] if topic_id < len(sealed) else 0,
        _filed_in(part),
    )
    end, report = scanner.scan(0, apply, on_marker, rows.add_skipped)
    cut_short = end < os.path.getsize(segment.log_path)
    damage = report.damage if cut_short or report.bytes_skipped else None
    if cut_short:
        log.error(
            "%s: damaged at byte %d (%s); kept whole, the records after the damage are not served",
            segment.log_path, end, report.damage,
        )  # fmt: skip
    built = build(rows, segment.number, segment.base, end)
    write_index(segment.index_path, built.data)
    fsync_directory(part.directory)
    index = SealedIndex(segment.index_path, part.pool, part.blocks)
    if not index.load(segment.number):
        raise OSError(f"{segment.index_path}: the index rebuilt does not read back")
    remove_file(rebuild_marker(part.directory, segment.number))
    log.warning("%s: its sealed index was missing or damaged: rebuilt from the data", segment.log_path)
    return index, damage


def _load_rows(
    part: PartitionLog,
    segment: Segment,
    topics: int,
    repair: PartitionRepair,
    loading: _Loading,
    last: bool,
    quarantine: Quarantine,
) -> bool:
    """Load an unsealed segment's rows into memory (open index, then a scan); True when its end was torn
    and cut and the segments after it must go.

    A segment that cannot be scanned to its end is cut there when it was never sealed (the last one, or one
    rolled whose seal did not finish: it still has its open index): what follows it was written in the same
    or later jobs, never acknowledged. One that was sealed once and lost its index (damage, or an operator
    deleting it to have it rebuilt) is kept whole: its readable part is served, the records after the damage
    are missing (reads of them raise `CorruptRecord` with the next offset each topic still has), and the
    segments after it stay. Damage followed by valid entries is stepped over by the scan, not cut."""
    pool = part.pool
    if segment.base < 0:  # no open index header: it follows the segment before it
        segment.base = _following_base(part)
    segment.rows = ActiveIndex()
    part.add_loaded(segment)
    open_rows = read_open_index(segment.open_path, pool)
    start = 0
    if open_rows is not None and open_rows.number == segment.number:
        segment.capacity = open_rows.capacity
        if len(open_rows.topic_ids):
            start = _replay_open_rows(part, segment, open_rows, topics, quarantine, loading)
    scanner = SegmentScanner(
        pool,
        segment.log_path,
        part.config.max_record_bytes,
        topics,
        part.table.next.__getitem__,
        _filed_in(part),
    )
    end, report = scanner.scan(
        start,
        lambda topic_id, position, offset, time, size: replay_row(
            part, segment, topic_id, position, offset, time, size, quarantine
        ),
        lambda marker, position: replay_marker(part, segment, marker, position, quarantine, loading),
        segment.rows.add_skipped,
    )
    loading.records_scanned += report.scanned
    if report.bytes_skipped:
        repair.bytes_skipped += report.bytes_skipped
        repair.damage = report.damage
    names = part.names
    repair.damaged_records += [(names[topic_id], offset) for topic_id, offset in report.damaged_records]
    if report.damaged_records:
        log.error(
            "%s: records %s failed their checksum; kept in place, never served (the records around them are)",
            segment.log_path,
            [offset for _topic, offset in report.damaged_records],
        )
    file_size = os.path.getsize(segment.log_path)
    segment.size = segment.submitted_size = segment.durable_size = end
    segment.written_rows = segment.durable_rows = len(segment.rows)
    never_sealed = open_rows is not None and open_rows.number == segment.number
    if end < file_size and not (last or never_sealed):
        repair.damaged_segments.append(segment.number)
        repair.damage = report.damage
        log.error(
            "%s: damaged at byte %d (%s); kept whole, the records after the damage are not served",
            segment.log_path, end, report.damage,
        )  # fmt: skip
        return False
    cut = end < file_size
    if cut:
        truncate_segment(segment, end, pool)
        repair.bytes_dropped += file_size - end
        repair.damage = report.damage
        log.warning(
            "%s: truncated at byte %d (%s): dropped %d bytes", segment.log_path, end, report.damage,
            file_size - end,
        )  # fmt: skip
    if segment.rows is not None and len(segment.rows) and segment.first_time == NO_TIME:
        segment.first_time = segment.rows.times[0]
    if open_rows is None or open_rows.number != segment.number or segment.capacity < len(segment.rows):
        segment.capacity = max(part.capacity, len(segment.rows))
        write_open_header(segment, segment.capacity, pool)  # a fresh one, counting no row
    return cut


def _replay_open_rows(
    part: PartitionLog, segment: Segment, rows, topics: int, quarantine: Quarantine, loading: _Loading
) -> int:
    """Replay the open index's durable rows (checked against the data at the last one); returns the byte
    position after them (0 when they cannot be trusted: everything is scanned)."""
    pool = part.pool
    topic_ids, positions, times = rows.topic_ids, rows.positions, rows.times
    count = len(topic_ids)
    last_position = positions[count - 1]
    head = pool.pread(segment.log_path, HEAD_SIZE + PREFIX_SIZE, last_position)
    if len(head) < HEAD_SIZE + PREFIX_SIZE or int.from_bytes(head[:4], "little") != topic_ids[count - 1]:
        return 0  # the count on disk does not match the data: scan everything
    body_length, _crc = PREFIX.unpack_from(head, HEAD_SIZE)
    end = last_position + HEAD_SIZE + PREFIX_SIZE + body_length
    table = part.table
    for row in range(count):
        position = positions[row]
        size = (positions[row + 1] if row + 1 < count else end) - position
        marked = topic_ids[row]
        if marked >= topics and not marked & MARKER_BIT:
            return position
        if marked & MARKER_BIT:
            data = pool.pread(segment.log_path, size, position)
            try:
                marker = parse_marker(data, 0)
            except EntryError:
                return position
            replay_marker(part, segment, marker, position, quarantine, loading)
            continue
        replay_row(part, segment, marked, position, table.next[marked], times[row], size, quarantine)
    return end


def replay_row(
    part: PartitionLog,
    segment: Segment,
    topic_id: int,
    position: int,
    offset: int,
    time: int,
    size: int,
    quarantine: Quarantine,
) -> None:
    """A durable record found at open: its row, and the topic's state moved past it (for a topic set aside,
    or that this record sets aside, ending past what a log holds: a dead row, keeping its neighbours' sizes
    and the partition's positions)."""
    if offset >= MAX_OFFSET or topic_id in quarantine:
        quarantine.past_ceiling(topic_id, offset + 1, "a record ending")
        _dead_row(segment, position)
        return
    table = part.table
    index_time = table.index_ms[topic_id]
    if time > index_time:
        index_time = table.index_ms[topic_id] = time
    part.link(topic_id, segment, [position], offset, index_time)
    table.next[topic_id] = table.durable[topic_id] = offset + 1
    table.total[topic_id] += size - HEAD_SIZE
    if time > table.durable_ms[topic_id]:
        table.durable_ms[topic_id] = time
    if segment.first_time == NO_TIME:
        segment.first_time = index_time
    if time > segment.newest_time:
        segment.newest_time = time


def _dead_row(segment: Segment, position: int) -> None:
    """The row of an entry of a log set aside: in no chain, never served, left out of the sealed index."""
    if segment.rows is not None:
        segment.rows.add_skipped(position)


def replay_marker(
    part: PartitionLog,
    segment: Segment,
    marker: Marker,
    position: int,
    quarantine: Quarantine,
    loading: _Loading,
) -> None:
    """A truncation or restart found at open: its row, and the topic's log cut or restarted again (nothing
    for a topic set aside, or that this marker sets aside); the topic goes to `loading.marked`."""
    table = part.table
    topic_id = marker.topic_id
    if quarantine.past_ceiling(topic_id, marker.offset, "a marker"):
        _dead_row(segment, position)
        return
    loading.marked.add(topic_id)
    rows = segment.rows
    assert rows is not None
    if marker.kind == TRUNCATE:
        # As `LogStore.truncate` did: the cut first, then the marker's row chained where the cut left the
        # topic, carrying the bytes cut from segments sealed now (a segment sealed before the crash may be
        # in memory again, its cut rows dead: its seal will not count them, so neither may the marker).
        segment.size = position  # (what the rows cut end at: the scan sets the segment's size at its end)
        cut = marker.offset < table.next[topic_id]  # (a gap's marker, past the end, cuts nothing: no walk)
        table.truncated.add(topic_id)
        dropped, unsealed = part.cut_live(topic_id, marker.offset, segment.number) if cut else (0, 0)
        # What the marker carried and no segment gave back: records cut from sealed segments retention deleted
        # since, which the sealed total counts when it reaches past the cut (a segment sealed again at open
        # without the records cut never does). Never more than the log has left.
        counted_past_cut = topic_id < len(loading.sealed) and loading.sealed.end[topic_id] > marker.offset
        deleted = min(marker.dropped - dropped - unsealed, table.total[topic_id] - table.dropped[topic_id])
        if deleted > 0 and counted_past_cut:
            table.total[topic_id] -= deleted
            dropped += deleted
        row = rows.add_marker(
            topic_id, position, marker.offset, TRUNCATE, dropped, part.marker_prev(topic_id, segment)
        )
        if cut:
            part.hold_cut(topic_id, segment, row, marker.offset)
        table.next[topic_id] = table.durable[topic_id] = marker.offset
        if table.start[topic_id] > marker.offset:
            table.start[topic_id] = marker.offset
            table.dropped[topic_id] = table.total[topic_id]
    elif marker.kind == RESTART:
        rows.add_marker(topic_id, position, marker.offset, RESTART, 0, part.marker_prev(topic_id, segment))
        part.restart_live(topic_id, marker.offset, segment.number)
        table.next[topic_id] = table.durable[topic_id] = table.start[topic_id] = marker.offset


def _filed_in(part: PartitionLog) -> Callable[[int], bool]:
    """Whether the catalog files a topic id in `part` (its scan takes no other partition's entries). A topic
    whose entry was lost to damage (`catalog.LOST_NAME`) may be in any: its partition is not known."""
    filed, number, names = part.table.partition, part.number, part.names
    lost = LOST_NAME.format("")
    return lambda topic_id: (
        topic_id >= len(filed) or filed[topic_id] == number or names[topic_id].startswith(lost)
    )
