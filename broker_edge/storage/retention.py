"""Retention when topics share segments: per topic by groups, then whole segments.

A topic's records in one sealed segment form a group. By age, a group whose newest record is older than
its topic's `retention_ms` is past retention; by size, a topic's oldest groups are, while its log is larger
than its `retention_bytes`. The topic's start offset then moves past them (reads below it raise
`OffsetOutOfRange`, as when a topic's own segments were deleted) and their bytes stop counting. A segment
goes when every group in it is past retention or below its topic's start (a truncated or restarted topic's
dead records stay until then). Never the active segment, nor one still being sealed.

The pass is a generator that yields after every `SLICE_GROUPS` groups it reads, both while it judges them
and while it checks which segments can go, and every `SLICE_GROUPS` topics of the size bounds, so the broker
runs it on the event loop a slice per iteration (`LogStore.apply_retention_async`); `apply_retention` runs it
through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from .clock import ClockJump, ClockJumps, aged_time
from .config import LogConfig
from .entry import HEAD_SIZE
from .partition_log import PartitionLog
from .sealed_index import MISSING, Group, GroupCheck, SealedIndex
from .segment import SEALED, Segment, mark_for_rebuild
from .topic_table import TopicTable

__all__ = ["SLICE_GROUPS", "RetentionReport", "retention_pass"]

log = logging.getLogger(__name__)

SLICE_GROUPS = 4096
"""Groups looked at between two yields of a pass."""

_NO_GROUP = 2**63


@dataclass(slots=True)
class RetentionReport:
    """What one retention pass removed."""

    segments_deleted: int = 0
    bytes_deleted: int = 0
    topics_moved: int = 0
    """Topics whose start offset moved."""


def retention_pass(
    partitions: list[PartitionLog],
    table: TopicTable,
    log_config: Callable[[int], LogConfig],
    now_ms: int,
    delete: Callable[[PartitionLog, list[Segment]], None],
    size_limits: bool,
    shortest_ms: int | None = None,
    jumps: ClockJumps | None = None,
) -> Iterator[RetentionReport]:
    """One pass over every partition; yields the report so far after each slice (the last yield is final).

    `shortest_ms`, the shortest `retention_ms` of any log (None: judge every sealed segment), spares reading
    the groups of a segment whose groups' oldest newest time, kept from the pass that read them all, is not
    past it: none of them can be past retention by age (a sealed segment's groups never change). `jumps`: the
    wall clock's jumps, by which the groups' times of the segments written before them are moved (`clock`)."""
    report = RetentionReport()
    touched: dict[int, set[Segment]] = {}
    unusable: set[Segment] = set()  # segments whose groups cannot be read whole, or are impossible
    said: set[str] = set()  # files that could not be read, said once a pass
    young_from = None if shortest_ms is None else now_ms - shortest_ms
    for part in partitions:
        for segment in [s for s in part.segments if s.state == SEALED]:
            known = segment.oldest_group_ms
            if young_from is not None and known is not None and known >= young_from:
                continue
            moved = jumps.for_segment(part.number, segment.number) if jumps is not None else []
            alive = yield from _judge_by_age(
                part, segment, table, log_config, now_ms, report, unusable, said, moved
            )  # fmt: skip
            if not alive and _sealed_of(segment).groups:
                touched.setdefault(part.number, set()).add(segment)
    if size_limits:
        for topic_id in range(len(table)):
            if topic_id % SLICE_GROUPS == 0:
                yield report
            limit = log_config(topic_id).retention_bytes
            if limit is None or table.total[topic_id] - table.dropped[topic_id] <= limit:
                continue
            part = partitions[table.partition[topic_id]]
            try:
                for segment, group in _oldest_groups(part, topic_id, table.start[topic_id], unusable):
                    if table.total[topic_id] - table.dropped[topic_id] <= limit:
                        break
                    _move_start(table, segment, group, part.live_end(topic_id, segment, group), report)
                    touched.setdefault(part.number, set()).add(segment)
            except OSError as error:  # its chain goes through an index that cannot be read: left as it is
                _say_unreadable(part, None, error, said)
    for part in partitions:
        candidates = touched.get(part.number)
        if not candidates:
            continue
        dead: list[Segment] = []
        for segment in [s for s in part.segments if s in candidates and s.state == SEALED]:
            try:
                for groups in _group_slices(part, segment, len(table)):
                    if groups is None or not _all_dead(part, segment, groups, table):
                        break
                    yield report
                else:
                    dead.append(segment)
            except OSError as error:
                _say_unreadable(part, segment, error, said)
        if dead:
            for segment in dead:
                report.segments_deleted += 1
                report.bytes_deleted += segment.size
            delete(part, dead)
    yield report


def _judge_by_age(
    part: PartitionLog,
    segment: Segment,
    table: TopicTable,
    log_config: Callable[[int], LogConfig],
    now_ms: int,
    report: RetentionReport,
    unusable: set[Segment],
    said: set[str],
    moved: list[ClockJump],
) -> Generator[RetentionReport, None, bool]:
    """Move the starts of the topics whose groups in `segment` are past their age, once every group of it
    is read and possible (yielding after each slice); returns whether a group of it is still alive. A group's
    age is its newest record's time moved by the clock's jumps after it (`moved`)."""
    alive, whole = False, True
    oldest = _NO_GROUP
    moves: list[tuple[Group, int]] = []
    try:
        for groups in _group_slices(part, segment, len(table)):
            if groups is None:
                alive, whole = True, False  # groups it cannot read are not past retention
                unusable.add(segment)
                break
            for group in groups:
                newest = aged_time(group.newest_time, moved) if moved else group.newest_time
                if newest < oldest:
                    oldest = newest
                topic_id = group.topic_id
                end = part.live_end(topic_id, segment, group)
                if table.start[topic_id] >= end or group.first_offset >= end:
                    continue  # nothing of it is above the start, or a truncation cut all of it
                retention_ms = log_config(topic_id).retention_ms
                if retention_ms is not None and newest < now_ms - retention_ms and group.count:
                    moves.append((group, end))
                else:
                    alive = True
            yield report
        if whole:
            for group, end in moves:
                _move_start(table, segment, group, end, report)
    except OSError as error:  # an index deleted or unreadable while the broker runs
        _say_unreadable(part, segment, error, said)
        alive, whole = True, False
        unusable.add(segment)
    segment.oldest_group_ms = oldest if whole else None
    return alive


def _oldest_groups(
    part: PartitionLog, topic_id: int, start: int, unusable: set[Segment]
) -> list[tuple[Segment, Group]]:
    """The topic's sealed groups from the one holding `start` on, oldest first (in-memory ones left out),
    up to a segment whose groups are `unusable` (its records are not known: none after it is past)."""
    chain = part._steps(topic_id, start, read=False)
    steps = [(step[0], step[1]) for step in reversed(chain) if len(step) == 2]
    for number, (segment, _group) in enumerate(steps):
        if segment in unusable:
            return steps[:number]
    return steps


def _move_start(table: TopicTable, segment: Segment, group: Group, end: int, report: RetentionReport) -> None:
    """Move the topic's start to `end` (past `group`'s live records), counting the bytes of its records that
    were still above it."""
    topic_id = group.topic_id
    start = table.start[topic_id]
    if start <= group.first_offset and end == group.first_offset + group.count:
        dropped = group.bytes
    else:
        sealed = segment.sealed
        assert sealed is not None
        entries = sealed.entries_of(group, max(start - group.first_offset, 0), end - group.first_offset)
        dropped = sum(
            (entries[2 * n] >> 32) - HEAD_SIZE
            for n in range(len(entries) // 2)
            if entries[2 * n] & 0xFFFFFFFF != MISSING
        )
    table.start[topic_id] = end
    table.dropped[topic_id] = min(table.dropped[topic_id] + dropped, table.total[topic_id])
    report.topics_moved += 1


def _say_unreadable(part: PartitionLog, segment: Segment | None, error: OSError, said: set[str]) -> None:
    """An index (or segment) that cannot be read, at ERROR once a pass: what it holds is kept."""
    path = str(error.filename or (segment.sealed.path if segment is not None and segment.sealed else "?"))
    if path in said:
        return
    said.add(path)
    log.error(
        "retention keeps %s of partition %d: %s cannot be read (%s); the records it names are not deleted or "
        "moved past while it cannot, the other segments' are",
        f"segment {segment.number}" if segment is not None else "the logs whose records it names",
        part.number, path, error.strerror or error,
    )  # fmt: skip


def _sealed_of(segment: Segment) -> SealedIndex:
    sealed = segment.sealed
    assert sealed is not None
    return sealed


def _group_slices(part: PartitionLog, segment: Segment, topics: int) -> Iterator[list[Group] | None]:
    """A sealed segment's groups, `SLICE_GROUPS` at a time (one pread each); then None if its index holds
    fewer groups than its header says (cut or damaged since it was sealed) or groups that are impossible
    (`GroupCheck`, `topics` the catalog's count: damaged, no checksum covers them): the segment is to be
    kept, and every start where it is."""
    sealed = _sealed_of(segment)
    check = GroupCheck(sealed, topics)
    for first in range(0, sealed.groups, SLICE_GROUPS):
        groups = sealed.groups_from(first, SLICE_GROUPS)
        if len(groups) < min(SLICE_GROUPS, sealed.groups - first):
            log.error(
                "retention keeps segment %d of partition %d: its sealed index %s holds %d of its %d groups "
                "(cut or damaged since it was sealed)",
                segment.number,
                part.number,
                sealed.path,
                first + len(groups),
                sealed.groups,
            )
            yield None
            return
        damage = check.slice(first, groups)
        if damage is None and first + len(groups) >= sealed.groups:
            damage = check.end()
        if damage is not None:
            mark_for_rebuild(part.directory, segment.number)
            log.error(
                "retention keeps segment %d of partition %d and the records of its topics: its sealed index "
                "%s is damaged (%s); the next start makes it again from the data",
                segment.number, part.number, sealed.path, damage,
            )  # fmt: skip
            yield None
            return
        yield groups


def _all_dead(part: PartitionLog, segment: Segment, groups: list[Group], table: TopicTable) -> bool:
    """Whether none of `groups` (of `segment`) holds a record at or above its topic's start."""
    start = table.start
    return all(
        group.topic_id >= len(table) or start[group.topic_id] >= part.live_end(group.topic_id, segment, group)
        for group in groups
    )
