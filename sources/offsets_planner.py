"""Planning of the ``timestone`` source's micro-batches: pure functions, no Spark, no network.

From the checkpointed start offsets, the brokers' log listings and the options, decide where a batch ends
(``plan_end_offsets``) and how it is cut into Spark partitions (``plan_partitions``). The Spark glue only
lists logs and hands the results here, so every rule below (new topics, read limits, retention gaps,
brokers that are down) is a unit test.

Offsets are ``{broker id: {topic: next offset}}``: the offset of the next record to read, so a range is
``[start, end)``. They are always returned with sorted keys: Spark decides "no new data" by comparing the
JSON of two offsets, so the same content must always serialise the same way.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from operator import methodcaller
from typing import NoReturn, cast

from .options import EARLIEST, LATEST, StartingOffsets, StartKind
from .partition_offsets import REMOVED_POSITIONS, describe, is_partition_key

__all__ = [
    "BatchPlan",
    "DataLossError",
    "LogExtent",
    "LostRange",
    "PartitionPlan",
    "RestartedLog",
    "Slice",
    "batch_topics",
    "behind",
    "canonical",
    "check_offsets",
    "effective_start",
    "plan_end_offsets",
    "plan_partitions",
    "split_size",
    "starting_offsets",
]

Offsets = dict[str, dict[str, int]]
Listings = Mapping[str, Mapping[str, "LogExtent"]]

# A partition's slices go to the broker in one fetch request: bound the request, not only the records
# (the default of the source's maxTopicsPerPartition).
MAX_SLICES_PER_PARTITION = 500
# minPartitions does not cut a batch into partitions smaller than this: a task of a few records costs a fetch
# request and Spark's per-task overhead, more than reading them in a neighbouring task.
MIN_RECORDS_PER_SPLIT = 1_000


@dataclass(frozen=True, slots=True)
class LogExtent:
    """The records a broker holds for one topic: ``[start, end)`` (end = next offset to be written)."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Slice:
    """Records ``[start, end)`` of one topic.

    ``from_log_start`` marks a start that is only a lower bound (a topic new to the query whose log start
    was unknown at planning): a reader that finds the log starting later skips ahead without calling it
    data loss.
    """

    topic: str
    start: int
    end: int
    from_log_start: bool = False

    @property
    def records(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """One Spark partition: slices of one broker, fetched together by one task."""

    broker: str
    slices: tuple[Slice, ...]

    @property
    def records(self) -> int:
        return sum(piece.records for piece in self.slices)


@dataclass(frozen=True, slots=True)
class LostRange:
    """Records ``[start, end)`` of a topic that retention removed before the query read them."""

    broker: str
    topic: str
    start: int
    end: int

    @property
    def records(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class RestartedLog:
    """A log that ends (``end``) below the offset to read next (``expected``), read again from its start
    (``start``; None: not listed) with failOnDataLoss=false: recreated, or its store replaced unseen."""

    broker: str
    topic: str
    expected: int
    start: int | None
    end: int


@dataclass(frozen=True, slots=True)
class BatchPlan:
    partitions: tuple[PartitionPlan, ...]
    lost: tuple[LostRange, ...]
    restarted: tuple[RestartedLog, ...] = ()

    @property
    def records(self) -> int:
        return sum(partition.records for partition in self.partitions)

    @property
    def lost_records(self) -> int:
        return sum(lost.records for lost in self.lost)


class DataLossError(RuntimeError):
    """Records the query should have read are gone (retention, corruption, or a log that was recreated)."""

    def __init__(
        self,
        broker: str,
        topic: str,
        expected: int,
        why: str,
        log_start: int | None = None,
        log_end: int | None = None,
    ) -> None:
        holds = f", the log now holds [{log_start}, {log_end})" if log_start is not None else ""
        unit = "position" if is_partition_key(topic) else "offset"
        super().__init__(
            f"timestone source: data loss on broker {broker!r} {describe(topic)}: {why} (next {unit} to read "
            f"{expected}{holds}). Set failOnDataLoss=false to skip lost records and continue."
        )
        self.broker = broker
        self.topic = topic
        self.expected = expected
        self.log_start = log_start
        self.log_end = log_end


_SOURCE_KEY = re.compile(r"#(?:[pe]\d+|[stf].+)", re.DOTALL)
"""The ``#`` keys the source writes: positions and marks (``partition_offsets``), the store
(``broker_stores``), the filters read and listed (``partition_offsets``, ``listed_filters``)."""


def check_offsets(offsets: object) -> None:
    """Raise ValueError naming the broker and key where ``offsets`` (a batch's, from Spark's offset log) are
    not what the source writes: an edit by hand that would fail later naming nothing, or be taken silently."""
    brokers: list[tuple[str, object]] = [("?", offsets)]
    if isinstance(offsets, dict):
        brokers = list(offsets.items())
    for broker, keys in brokers:
        if isinstance(keys, dict) and _well_formed(keys):
            continue
        if not isinstance(keys, dict):
            _refuse(broker, f"are {keys!r}, not {{topic: offset}}")
        for key, value in keys.items():
            if key.startswith("#") and not _SOURCE_KEY.fullmatch(key):
                _refuse(broker, f"hold {key!r}, a key the source never writes (#p<n>, #e<n>, #s, #t, #f)")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                _refuse(broker, f"hold {key!r}: {value!r}, not an offset (a whole number >= 0)")
        _check_one_shape(broker, keys)


def _well_formed(keys: dict[object, object]) -> bool:
    """Whether one broker's offsets pass every check of ``check_offsets``, found in a few passes run in C
    (a topic per device is tens of thousands of keys per batch); False: check key by key for the error."""
    values = keys.values()
    if not set(map(type, keys)) <= {str} or not set(map(type, values)) <= {int}:
        return False
    if min(cast("Iterable[int]", values), default=0) < 0:
        return False
    marked = cast("list[str]", list(filter(_STARTS_WITH_MARK, keys)))
    if not all(_SOURCE_KEY.fullmatch(key) for key in marked):
        return False
    return len(marked) == len(keys) or not any(key.startswith(_POSITION_SHAPED) for key in marked)


_STARTS_WITH_MARK = methodcaller("startswith", "#")

_POSITION_SHAPED = ("#p", "#e", "#t")
"""Keys only a broker read by storage partition holds (positions, query-start marks, filters read)."""


def _check_one_shape(broker: str, keys: Mapping[str, object]) -> None:
    """A broker is read by partition or by topic: a topic offset beside positions (or a position beside
    topic offsets), which one way of reading would carry from batch to batch unread, is refused."""
    position = next((key for key in keys if key.startswith(_POSITION_SHAPED)), None)
    topic = next((key for key in keys if not key.startswith("#")), None)
    if position is not None and topic is not None:
        _refuse(
            broker,
            f"hold both positions of storage partitions ({position!r}) and topic offsets ({topic!r}): "
            "a broker is read one way, and the other's keys would never be read",
        )


def _refuse(broker: str, what: str) -> NoReturn:
    raise ValueError(
        f"timestone source: the checkpoint's offsets of broker {broker!r} {what}. Was the offset log "
        "(offsets/ in the checkpoint location) edited? Write them back as the source wrote them, or start "
        "the query on a new checkpoint"
    )


def canonical(offsets: Mapping[str, Mapping[str, int]]) -> Offsets:
    """A copy with brokers and topics in sorted order (see the module docstring)."""
    return {broker: dict(sorted(topics.items())) for broker, topics in sorted(offsets.items())}


def behind(listings: Listings, end: Mapping[str, Mapping[str, int]]) -> Offsets:
    """The listed end of each log that ``end`` (a batch's end offsets) does not reach, sorted; brokers with
    none are left out. What the source reports as its latest offsets: naming every log, a topic per device
    put tens of thousands of idle ones in every progress report of the query."""
    found: Offsets = {}
    for broker, logs in sorted(listings.items()):
        reached = end.get(broker, {})
        left = {topic: extent.end for topic, extent in logs.items() if extent.end > reached.get(topic, 0)}
        if left:
            found[broker] = dict(sorted(left.items()))
    return found


def starting_offsets(
    spec: StartingOffsets,
    listings: Listings,
    timestamp_offsets: Mapping[str, Mapping[str, int]] | None = None,
) -> Offsets:
    """The initial offsets of a new query from ``startingOffsets`` and the reachable brokers' listings.

    Topics not in the result are read from their log start when they are first seen, so a broker missing
    from ``listings`` (down) contributes nothing here. ``timestamp_offsets`` holds the offsets the brokers
    resolved for a ``time:`` start. In a JSON start, topics it does not name start at their log start, and
    a named offset of a topic no broker lists yet is kept for when the topic appears.
    """
    result: Offsets = {}
    for broker, logs in listings.items():
        topics: dict[str, int] = {}
        for topic, extent in logs.items():
            if spec.kind is StartKind.EARLIEST:
                topics[topic] = extent.start
            elif spec.kind is StartKind.LATEST:
                topics[topic] = extent.end
            elif spec.kind is StartKind.TIMESTAMP:
                resolved = (timestamp_offsets or {}).get(broker, {}).get(topic, extent.end)
                topics[topic] = min(max(resolved, extent.start), extent.end)
            else:
                wanted = (spec.specific or {}).get(broker, {}).get(topic, EARLIEST)
                topics[topic] = (
                    extent.start if wanted == EARLIEST else extent.end if wanted == LATEST else wanted
                )
        result[broker] = topics
    if spec.kind is StartKind.SPECIFIC:
        for broker, named in (spec.specific or {}).items():
            for topic, offset in named.items():
                if offset >= 0:
                    result.setdefault(broker, {}).setdefault(topic, offset)
    return canonical({broker: topics for broker, topics in result.items() if topics})


def effective_start(
    broker: str,
    topic: str,
    next_offset: int | None,
    extent: LogExtent | None,
    fail_on_data_loss: bool,
    end_may_lag: bool = False,
    appeared: bool = False,
) -> tuple[int, LostRange | None]:
    """Where reading a topic really starts, given its checkpointed next offset and its log's extent.

    A topic new to the query (``next_offset`` None) starts at its log start, unless it ``appeared`` since
    the query last listed its broker (``listed_filters``): then at 0, like any log. A log starting above the
    next offset lost records to retention; a log ending below it was recreated (its offsets went backwards):
    both raise DataLossError when ``fail_on_data_loss``, else reading resumes at the log start and the
    skipped range is returned. Unknown extent (broker down): trust the checkpoint. With ``end_may_lag`` (a
    cluster's replica, whose committed end may trail the one the checkpoint was read from, e.g. a leader
    elected a moment ago) an end below the checkpoint is not loss: the topic waits there.
    """
    if next_offset is None and appeared:
        next_offset = 0
        why = "the log appeared after the query last listed the broker; retention removed its first records"
    elif next_offset is None:
        return (extent.start if extent else 0), None
    else:
        why = REMOVED_POSITIONS if is_partition_key(topic) else "retention removed records not yet read"
    if extent is None:
        return next_offset, None
    if extent.start > next_offset:
        if fail_on_data_loss:
            raise DataLossError(broker, topic, next_offset, why, extent.start, extent.end)
        return extent.start, LostRange(broker, topic, next_offset, extent.start)
    if extent.end < next_offset:
        if end_may_lag:
            return next_offset, None
        if fail_on_data_loss:
            raise DataLossError(
                broker,
                topic,
                next_offset,
                "the log ends before the offset to read next (the checkpoint's; startingOffsets' if new)",
                extent.start,
                extent.end,
            )
        return extent.start, None  # what the old log held past its new end is unknowable: nothing counted
    return next_offset, None


def plan_end_offsets(
    start: Mapping[str, Mapping[str, int]],
    listings: Listings,
    *,
    max_records: int | None,
    fail_on_data_loss: bool,
    target: Mapping[str, Mapping[str, int]] | None = None,
    end_may_lag: bool = False,
    appeared: Mapping[str, Collection[str]] | None = None,
) -> Offsets:
    """The end offsets of the next batch.

    Every broker and topic of ``start`` is carried over (a broker that is down, a topic whose log is gone or
    no longer matches the patterns keep their offsets); listed topics advance to their log end, and a
    listed topic new to the query is recorded even when the batch reads none of it. With
    ``max_records`` the batch takes at most that many records, shared among topics in proportion to their
    backlog, like the Kafka source's maxOffsetsPerTrigger. With ``target`` (Trigger.AvailableNow) no topic
    goes past its target offset and topics or brokers absent from it are not read. ``end_may_lag`` and
    ``appeared`` (per broker): see ``effective_start``.
    Returns ``start`` unchanged (same JSON) when there is nothing new.
    """
    end: Offsets = {broker: dict(topics) for broker, topics in start.items()}
    backlog: list[tuple[str, str, int, int]] = []  # broker, topic, from, available
    for broker in sorted(listings):
        if target is not None and broker not in target:
            continue
        checkpointed = start.get(broker, {})
        new = (appeared or {}).get(broker, ())
        logs = listings[broker]
        moved = [  # idle since the checkpoint: nothing to plan (tens of thousands of device topics, unsorted)
            topic
            for topic, extent in logs.items()
            if not checkpointed.get(topic) == extent.end >= extent.start
        ]
        for topic in sorted(moved):
            extent = logs[topic]
            upper = extent.end
            if target is not None:
                if topic not in target[broker]:
                    continue
                upper = min(upper, target[broker][topic])
            at = checkpointed.get(topic)
            begin, _ = effective_start(
                broker, topic, at, extent, fail_on_data_loss, end_may_lag, topic in new
            )
            available = max(0, upper - begin)
            if available or (topic in checkpointed and begin != checkpointed[topic]):
                backlog.append((broker, topic, begin, available))
            elif topic not in checkpointed:  # nothing to read yet: known from now on all the same
                end.setdefault(broker, {})[topic] = begin

    batch = sum(begin for *_, begin, _ in backlog)  # moves every batch: the lottery below is drawn anew
    tie_breaks = [
        zlib.crc32(f"{broker}\0{topic}\0{begin}\0{batch}".encode()) for broker, topic, begin, _ in backlog
    ]
    shares = _share(max_records, [available for *_, available in backlog], tie_breaks)
    for (broker, topic, begin, _), take in zip(backlog, shares, strict=True):
        end.setdefault(broker, {})[topic] = begin + take
    return canonical(end)


def _share(limit: int | None, available: list[int], tie_breaks: list[int]) -> list[int]:
    """Split ``limit`` records among backlogs in proportion to their size.

    A backlog whose share rounds down to nothing (a quiet topic behind a hot one that brings more than
    ``limit`` each batch) would otherwise never be read: up to half the limit goes to such backlogs first,
    a record each, drawn by ``tie_breaks``, which change every batch, so none is passed over batch after
    batch; the rest is shared among the others in proportion. Rounding leftovers go to the starved backlogs
    not drawn, then to the largest remainders. An empty backlog gets nothing.
    """
    total = sum(available)
    if limit is None or total <= limit:
        return list(available)
    quotas = [limit * size // total for size in available]
    starved = sorted(
        (i for i, size in enumerate(available) if size and not quotas[i]), key=tie_breaks.__getitem__
    )
    drawn = set(starved[: limit // 2])
    budget, shared = limit - len(drawn), total - sum(available[i] for i in drawn)
    if drawn:
        quotas = [1 if i in drawn else budget * size // shared for i, size in enumerate(available)]
    order = sorted(
        (i for i, size in enumerate(available) if size and i not in drawn),
        key=lambda i: (quotas[i] > 0, -(budget * available[i] % shared) * (quotas[i] > 0), tie_breaks[i]),
    )
    for index in order[: limit - sum(quotas)]:
        quotas[index] += 1
    return quotas


def plan_partitions(
    start: Mapping[str, Mapping[str, int]],
    end: Mapping[str, Mapping[str, int]],
    listings: Listings,
    *,
    max_records_per_partition: int,
    fail_on_data_loss: bool,
    min_partitions: int = 1,
    end_may_lag: bool = False,
    max_slices_per_partition: int = MAX_SLICES_PER_PARTITION,
    appeared: Mapping[str, Collection[str]] | None = None,
) -> BatchPlan:
    """Cut the batch ``[start, end)`` into partitions of at most ``max_records_per_partition`` records.

    A topic's range is split into pieces of that size; small ranges of one broker are packed together, at
    most ``max_slices_per_partition`` to a partition, so a batch over thousands of quiet device topics does
    not become thousands of Spark tasks. With ``min_partitions`` the pieces shrink to about
    ``1 / min_partitions`` of the batch (never below MIN_RECORDS_PER_SPLIT records), so a batch keeps that
    many tasks busy (Kafka's ``minPartitions``).
    The plan depends only on the arguments: a replayed batch is cut the same way. ``listings`` may lack
    brokers (down): their ranges are planned from the checkpoint and checked by the reader.
    Raises DataLossError, or records the skipped ranges in the plan, as ``effective_start`` decides
    (``appeared``: the topics of ``end`` new since the query last listed their broker).
    """
    ranges: list[tuple[str, Slice]] = []
    lost: list[LostRange] = []
    restarted: list[RestartedLog] = []
    for broker, topics in sorted(end.items()):
        logs = listings.get(broker) or {}
        began = start.get(broker, {})
        new = (appeared or {}).get(broker, ())
        for topic in sorted(topics):
            stop = topics[topic]
            next_offset = began.get(topic)
            extent = logs.get(topic)
            if next_offset == stop and (extent is None or extent.start <= stop <= extent.end):
                continue  # nothing to read, nothing lost (``effective_start`` keeps the checkpoint's)
            if next_offset is not None and stop < next_offset:
                # the log was recreated and latestOffset already decided to restart it
                restarted.append(
                    RestartedLog(broker, topic, next_offset, extent.start if extent else None, stop)
                )
                next_offset = None
            fresh = next_offset is None and topic in new
            begin, gap = effective_start(
                broker, topic, next_offset, extent, fail_on_data_loss, end_may_lag, fresh
            )
            if gap is not None:
                lost.append(LostRange(broker, topic, gap.start, min(gap.end, stop)))
            if stop > begin:
                from_log_start = next_offset is None and extent is None and not fresh
                ranges.append((broker, Slice(topic, begin, stop, from_log_start)))
    size = split_size(sum(piece.records for _, piece in ranges), max_records_per_partition, min_partitions)
    pieces: dict[str, list[Slice]] = {}
    for broker, whole in ranges:
        pieces.setdefault(broker, []).extend(_split(whole, size))
    partitions = [
        PartitionPlan(broker, tuple(group))
        for broker, broker_pieces in pieces.items()
        for group in _pack(broker_pieces, size, max_slices_per_partition)
    ]
    return BatchPlan(tuple(partitions), tuple(gap for gap in lost if gap.records > 0), tuple(restarted))


def batch_topics(
    start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]], listings: Listings
) -> tuple[Offsets, Offsets]:
    """A batch's ``start`` and ``end`` without the topics ``plan_partitions`` passes over: offsets equal at
    both ends that their listed log (if listed) still holds. Read by topic, a batch of a topic per device
    moves a few of tens of thousands of offsets: the copies, checks and sorts of its planning then take
    only those. A broker whose keys of the source's own (``#``: its store, filters, positions, marks) differ
    between the two ends (a store replaced, filters changed, read by partition) is kept whole."""
    narrow_start: Offsets = {broker: dict(keys) for broker, keys in start.items() if broker not in end}
    narrow_end: Offsets = {}
    for broker, ends in end.items():
        began = start.get(broker, {})
        own = {key: value for key, value in ends.items() if key[:1] == "#"}
        if own != {key: value for key, value in began.items() if key[:1] == "#"}:
            narrow_start[broker], narrow_end[broker] = dict(began), dict(ends)
            continue
        moved = [topic for topic, offset in ends.items() if began.get(topic) != offset]
        moved += [  # equal at both ends, which the log no longer holds: loss, or a log recreated
            topic
            for topic, extent in (listings.get(broker) or {}).items()
            if (offset := ends.get(topic)) is not None
            and began.get(topic) == offset
            and not extent.start <= offset <= extent.end
        ]
        narrow_end[broker] = own | {topic: ends[topic] for topic in moved}
        narrow_start[broker] = own | {topic: began[topic] for topic in moved if topic in began}
    return narrow_start, narrow_end


def split_size(records: int, max_records_per_partition: int, min_partitions: int) -> int:
    """The most records of one partition for a batch of ``records``: at least ``min_partitions`` pieces.

    Never above ``max_records_per_partition``, never below MIN_RECORDS_PER_SPLIT (unless the maximum is).
    """
    wanted = max(MIN_RECORDS_PER_SPLIT, -(-records // max(1, min_partitions)))
    return max(1, min(max_records_per_partition, wanted))


def _split(whole: Slice, size: int) -> Iterable[Slice]:
    """``whole`` in pieces of ``size`` records, the last one shorter.

    Consecutive packing never puts two pieces of one topic in a partition (a full piece fills one, and
    only the last piece is short), which the reader relies on: it tracks its progress per topic.
    """
    for offset in range(whole.start, whole.end, size):
        yield Slice(whole.topic, offset, min(offset + size, whole.end), whole.from_log_start)


def _pack(pieces: list[Slice], capacity: int, max_slices: int) -> Iterable[list[Slice]]:
    """Group consecutive pieces while their total stays within ``capacity`` and their count ``max_slices``."""
    group: list[Slice] = []
    filled = 0
    for piece in pieces:
        if group and (filled + piece.records > capacity or len(group) == max_slices):
            yield group
            group, filled = [], 0
        group.append(piece)
        filled += piece.records
    if group:
        yield group
