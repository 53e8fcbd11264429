"""Files of a store lost or damaged between runs, found while it opens (`recovery`): what the indexes left
without their data say the logs had reached (`Evidence`), a catalog missing or damaged under records (the
store does not open), segment files gone or cut (logged at ERROR, counted as records lost), and logs that now
end below the offsets they had given (kept as a gap, so that no offset is given twice)."""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Protocol

from .catalog import CatalogDamaged, TopicCatalog
from .partition_log import PartitionLog
from .quarantine import Quarantine
from .sealed_index import Group, SealedIndex
from .segment import Segment, segment_paths
from .topic_table import SealedState, Snapshot, TopicTable

__all__ = [
    "Evidence",
    "check_catalog_end",
    "find_missing_segments",
    "lost_ends",
    "refuse_without_catalog",
    "report_missing_segments",
    "report_short_segments",
]

log = logging.getLogger("broker_edge.storage.recovery")  # what a store's open says, under one name


class PartitionRepair(Protocol):
    """What a partition's open repaired (``recovery.PartitionRepair``): the counts kept here."""

    missing_segments: list[int]
    records_lost: int


@dataclass(slots=True)
class Evidence:
    """What indexes that no longer match their data recorded: offsets the logs had reached."""

    ends: dict[int, int] = field(default_factory=dict)
    """Topic id -> the end of its newest group in those indexes."""
    top_topic: int = -1
    """The highest topic id they name."""
    short: dict[tuple[int, int], tuple[int, int, int]] = field(default_factory=dict)
    """(partition, segment) -> (its size, the data bytes and the entries its sealed index recorded), for
    segments shorter than their sealed index says."""
    orphans: list[tuple[int, int, str, list[Group]]] = field(default_factory=list)
    """(partition, segment, index path, its groups) of sealed indexes whose segment file is gone."""

    def add(self, groups: list[Group]) -> None:
        ends = self.ends
        for group in groups:
            end = group.first_offset + group.count
            if end > ends.get(group.topic_id, -1):
                ends[group.topic_id] = end
        if groups:
            self.top_topic = max(self.top_topic, groups[-1].topic_id)


def refuse_without_catalog(log_directory: str, path: str, snapshot) -> None:
    """Raise `CatalogDamaged` when the catalog is gone but segments hold records (or the snapshot counts
    topics): the records' topic names are in no other file, and a new catalog would give their ids to other
    topics. A directory without segment data is a new store."""
    held = []
    for name in sorted(os.listdir(log_directory)):
        directory = os.path.join(log_directory, name)
        if not name.isdigit() or not os.path.isdir(directory):
            continue
        for file in sorted(os.listdir(directory)):
            if file.endswith(".log") and os.path.getsize(os.path.join(directory, file)) > 0:
                held.append(os.path.join(directory, file))
    if not held and (snapshot is None or not len(snapshot.sealed)):
        return
    if not held:
        what = f"the topic table snapshot counts {len(snapshot.sealed)} topics"
    elif len(held) == 1:
        what = f"{held[0]} holds records"
    else:
        what = f"{held[0]} and {len(held) - 1} more segment files hold records"
    raise CatalogDamaged(
        f"{path} is missing, but {what} of the topics it named: the store does not start empty over them. "
        f"Put the catalog back (from a backup), or move {os.path.dirname(log_directory)} aside to start "
        "with an empty store"
    )


def check_catalog_end(
    catalog: TopicCatalog,
    cut: int,
    snapshot,
    found: list[list[tuple[Segment, SealedIndex | None]]],
    evidence: Evidence,
) -> None:
    """Topics past the catalog's good entries that have records in sealed segments, or whose entries the
    snapshot counts as durable (such an entry was written and synced before the records; a torn entry at
    the end is one whose records were never acknowledged, cut by `TopicCatalog.cut_torn_end`): their
    entries are lost, so they get a lost name and are set aside (`TopicCatalog.keep_lost_end`), every other
    log opening; `CatalogDamaged` only when the snapshot counts bytes past the end but no topic more.
    Costs nothing more than the indexes' summaries unless the catalog has a damaged end (then one small
    pread per sealed segment)."""
    known = len(catalog)
    named, where = evidence.top_topic, "a sealed index whose segment is damaged or gone"
    for segments in found:
        for number, (segment, index) in enumerate(segments):
            if index is None or not index.groups:
                continue
            top = index.last_topic_id() if cut else index.summary[-1]
            if top >= known and _damaged(index):
                segments[number] = (segment, None)  # not the catalog's damage: made again from the data
                continue
            if top > named or (top == named and top >= known):
                named, where = top, segment.log_path
    covered = snapshot.catalog_bytes if snapshot is not None else 0
    if named < known and covered <= catalog.size:
        return
    damaged = f"its entries end at byte {catalog.size} ({known} topics)" + (
        f", followed by {cut} bytes that are not a valid entry" if cut else ""
    )
    if named >= known:
        why = f"{where} holds records of topic id {named}, whose entry is lost"
    else:
        why = f"the topic table snapshot counts {covered} bytes of it as written and synced"
    lost_until = max(
        named + 1, len(snapshot.sealed) if snapshot is not None and covered > catalog.size else 0
    )
    if lost_until <= known:  # bytes the snapshot counts, but no topic more: nothing to set aside
        raise CatalogDamaged(
            f"{catalog.path} is damaged: {damaged}, but {why} (an entry is synced before its topic's first "
            "record). Put the catalog back (from a backup); the store does not open without the names of its "
            "logs"
        )
    catalog.keep_lost_end(lost_until - known, f"{damaged}, but {why}")


def _damaged(index: SealedIndex) -> bool:
    """Whether an index naming a topic past the catalog's is itself damaged (then it is no evidence that
    the catalog lost an entry): logged, and its file forgotten."""
    damage = index.damage(1 << 32)
    if damage is None:
        return False
    log.error("%s: its sealed index is damaged (%s): made again from the data", index.path, damage)
    index.pool.forget(index.path)
    index.blocks.forget(index.path)
    return True


@dataclass(slots=True)
class SegmentLosses:
    """Records of segment files gone, found before the unsealed segments are replayed and reported after
    (`report_missing_segments`): a truncation or restart among them may have cut those records first."""

    by_segment: dict[tuple[int, int], list[tuple[int, int, int]]]
    """(partition, segment number) → (topic id, first offset, end offset) of each log's records lost."""
    orphaned: set[tuple[int, int]]
    """Of those, the segments whose sealed index is still there."""


def find_missing_segments(
    parts: list[PartitionLog],
    found: list[list[tuple[Segment, SealedIndex | None]]],
    snapshot,
    table: TopicTable,
    evidence: Evidence,
) -> SegmentLosses:
    """Segment files gone while records of theirs are still their topics' (at or above the topic's start:
    retention deletes a segment only once none is). Found by a sealed index left without its data
    (precise), or, for a segment whose index went too, by a topic whose newest segment it was; a segment
    gone from the middle of a topic's chain without either is found at the first read that needs it
    (``partition_locate``). The readers' walk steps over missing segments to the older ones, so every
    record still on disk is served."""
    starts = snapshot.start if snapshot is not None else array("q")

    def start_of(topic_id: int) -> int:
        start = table.start[topic_id]
        return max(start, starts[topic_id]) if topic_id < len(starts) else start

    losses: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for partition, number, _path, groups in evidence.orphans:
        for group in groups:
            topic_id = group.topic_id
            if topic_id >= len(table) or topic_id in table.truncated:
                continue
            first = max(group.first_offset, start_of(topic_id))
            end = group.first_offset + group.count
            if end > first:
                losses.setdefault((partition, number), []).append((topic_id, first, end))
    orphaned = {(partition, number) for partition, number, _path, _groups in evidence.orphans}
    gone: set[tuple[int, int]] = set()  # (partition, segment number) gone from the middle or the end
    for part, segments in zip(parts, found, strict=True):
        numbers = sorted(segment.number for segment, _index in segments)
        if not numbers:
            continue
        newest = numbers[-1]
        if snapshot is not None and part.number < len(snapshot.applied):
            newest = max(newest, snapshot.applied[part.number][0])
        gone.update((part.number, number) for number in _missing(numbers, newest, table.head_seg))
    gone -= orphaned
    heads = set(table.head_seg) if gone else set()
    hit = {(partition, number) for partition, number in gone if number in heads}
    for topic_id, head in enumerate(table.head_seg if hit else ()):
        partition = table.partition[topic_id]
        if (partition, head) not in hit or topic_id in table.truncated:
            continue
        first = max(table.head_first[topic_id], start_of(topic_id))
        if table.next[topic_id] > first:
            losses.setdefault((partition, head), []).append((topic_id, first, table.next[topic_id]))
    return SegmentLosses(losses, orphaned)


def report_missing_segments(
    parts: list[PartitionLog],
    losses: SegmentLosses,
    table: TopicTable,
    marked: set[int],
    repairs: Mapping[int, PartitionRepair],
) -> None:
    """The records `find_missing_segments` found gone, logged at ERROR and counted in each partition's
    repair, but for the logs a truncation or restart replayed since (`marked`, `table.truncated`) emptied
    there: retention deletes a segment whose records all were cut, not only the oldest."""
    orphaned = losses.orphaned
    for (partition, number), found_lost in sorted(losses.by_segment.items()):
        lost = [loss for loss in found_lost if loss[0] not in marked and loss[0] not in table.truncated]
        if not lost:
            continue
        repair = repairs[partition]
        repair.missing_segments.append(number)
        records = sum(end - first for _topic, first, end in lost)
        repair.records_lost += records
        ranges = ", ".join(
            f"{parts[partition].names[topic_id]!r} offsets {first} to {end - 1}"
            for topic_id, first, end in lost[:NAMED]
        )
        more = f" and {len(lost) - NAMED} more logs" if len(lost) > NAMED else ""
        log.error(
            "%s is missing%s: %d records of %d logs are lost (%s%s); reads of them answer that they are "
            "missing, the records of the other segments are served",
            segment_paths(parts[partition].directory, number)[0],
            " (its sealed index is there)" if (partition, number) in orphaned else "",
            records, len(lost), ranges, more,
        )  # fmt: skip


NAMED = 10
"""Logs named in one line about records lost (the count says how many more)."""

ENUMERATED = 4096
"""Most missing segment numbers of a partition listed one by one; past it, only topics' newest ones."""


def _missing(numbers: list[int], newest: int, heads: array) -> list[int]:
    """Segment numbers from the oldest of `numbers` (sorted) to `newest` that are not among them: each one
    while they are few, else only those some topic's newest segment is (one stray file named far past the
    store's segments is a gap of millions of numbers that no log needs)."""
    bounds = [*numbers, newest + 1]
    gaps = [(low + 1, high) for low, high in pairwise(bounds) if high > low + 1]
    if sum(high - low for low, high in gaps) <= ENUMERATED:
        return [number for low, high in gaps for number in range(low, high)]
    present = set(numbers)
    return sorted(head for head in set(heads) if numbers[0] < head <= newest and head not in present)


def report_short_segments(
    parts: list[PartitionLog], evidence: Evidence, repairs: Mapping[int, PartitionRepair]
) -> None:
    """Sealed segments whose file is shorter than their sealed index says (cut, or its end lost), read
    again from their data: logged at ERROR with the bytes and entries missing, counted as records lost."""
    for (partition, number), (size, data_size, rows) in sorted(evidence.short.items()):
        segment = parts[partition].by_number.get(number)
        if segment is None:
            continue
        missing = max(rows - segment.row_count, 0)
        repairs[partition].records_lost += missing
        log.error(
            "%s is %d bytes shorter than its sealed index says (%d of %d bytes): %d of its %d entries are "
            "lost; the segment was read again from its data",
            segment.log_path, data_size - size, size, data_size, missing, rows,
        )  # fmt: skip


def lost_ends(
    table: TopicTable,
    sealed: SealedState,
    unused_snapshot: Snapshot | None,
    marked: set[int],
    names: list[str],
    evidence: Evidence,
    quarantine: Quarantine,
) -> list[tuple[int, int, int]]:
    """Topics whose log now ends below an offset the log had reached, by the snapshot (one that could not
    be used) or the indexes of segments now short or gone: (topic id, next offset, that end). Logged at
    ERROR. The store keeps the offsets between as a gap, so that none is given to a new record. Topics
    truncated or restarted by a marker (a follower's, legitimately below what it once held) are left out."""
    reached = dict(evidence.ends)
    snapshot = unused_snapshot
    if snapshot is not None:
        ends = snapshot.sealed.end
        for topic_id in range(min(len(ends), len(table))):
            if ends[topic_id] > reached.get(topic_id, -1):
                reached[topic_id] = ends[topic_id]
    skip = table.truncated | sealed.restarts.keys() | marked
    gaps = [
        (topic_id, table.next[topic_id], end)
        for topic_id, end in sorted(reached.items())
        if topic_id < len(table)
        and end > table.next[topic_id]
        and topic_id not in skip
        and topic_id not in quarantine
    ]
    if gaps:
        ranges = ", ".join(
            f"{names[topic_id]!r} offsets {first} to {end - 1}" for topic_id, first, end in gaps[:NAMED]
        )
        more = f" and {len(gaps) - NAMED} more logs" if len(gaps) > NAMED else ""
        log.error(
            "%d records at the end of %d logs are lost (%s%s): their offsets stay a gap (reads of them "
            "answer that they are missing) and new records go on after them",
            sum(end - first for _topic, first, end in gaps), len(gaps), ranges, more,
        )  # fmt: skip
    return gaps
