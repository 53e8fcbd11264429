"""Offsets of a broker read by storage partition: one position per partition instead of one offset per topic.

A broker's offsets in the checkpoint are either per topic (``{"plant/1/temp": 12, ...}``) or, when the query
reads it by partition, ``{"#p0": 51234, "#p1": 50877}``: the position (an entry number of the partition's
log, every topic's) to read next. MQTT topic names cannot hold ``#``, so the two never mix up. Positions
behave like a topic's offsets for the planner (a start, an end, a next value; retention moving the start
past the next value is data loss), so ``offsets_planner`` plans both with the same rules, and Spark's offset
log stays a few bytes per broker whatever the number of topics.

``#e<n>``, next to ``#p<n>`` until the query has read past it, is the partition's end when the query began:
records there below their topic's start were already removed by retention when the query started (an
``earliest`` or time start), so they are not data loss; later records are.

``#t<filter>`` (value 0) names each topic filter the positions were read with: a query restarted with a
filter they do not cover would skip that filter's records below the positions (``uncovered``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from operator import methodcaller
from typing import Protocol

from .broker_stores import STORE_PREFIX

__all__ = [
    "REMOVED_POSITIONS",
    "describe",
    "drop_passed_marks",
    "filter_keys",
    "filters_of",
    "first_batch_marks",
    "holds_positions",
    "is_partition_key",
    "mark_key",
    "marks_of",
    "partition_of",
    "position_key",
    "query_start_marks",
    "reads_partitions",
    "uncovered",
    "without_marks",
]

POSITION_PREFIX = "#p"
MARK_PREFIX = "#e"
FILTER_PREFIX = "#t"


REMOVED_POSITIONS = (
    "retention removed positions not yet read: entries of any topic of the partition, maybe only of topics "
    "this query does not read (kept shorter than its own), which the broker cannot tell apart"
)
"""What a gap in a partition's positions is: no account is kept of the topics a deleted segment held."""


def position_key(partition: int) -> str:
    return f"{POSITION_PREFIX}{partition}"


def mark_key(partition: int) -> str:
    return f"{MARK_PREFIX}{partition}"


def is_partition_key(key: str) -> bool:
    """Whether an offsets key is a partition's position (or its query-start mark), not a topic."""
    return key.startswith((POSITION_PREFIX, MARK_PREFIX))


#: Filters named in the offsets at most: a longer list (a topic per device, each named) is not kept, so
#: that the offsets stay small whatever the number of topics; it is then not checked.
MAX_KEPT_FILTERS = 64


def filter_keys(filters: Sequence[str]) -> dict[str, int]:
    """The keys naming the topic filters a broker's positions are read with (none past MAX_KEPT_FILTERS)."""
    if len(filters) > MAX_KEPT_FILTERS:
        return {}
    return {FILTER_PREFIX + topic_filter: 0 for topic_filter in filters}


def filters_of(offsets: Mapping[str, int]) -> set[str] | None:
    """The filters a broker's positions were read with (None: not recorded, a checkpoint written before)."""
    found = {key[len(FILTER_PREFIX) :] for key in offsets if key.startswith(FILTER_PREFIX)}
    return found or None


def uncovered(filters: Iterable[str], read: set[str]) -> list[str]:
    """The ``filters`` that match a topic none of ``read`` matches."""
    return [wanted for wanted in filters if not any(_covers(done, wanted) for done in read)]


def _covers(wide: str, narrow: str) -> bool:
    """Whether every topic ``narrow`` matches, ``wide`` matches too."""
    wide_levels, narrow_levels = wide.split("/"), narrow.split("/")
    if wide_levels[0] in ("+", "#") and narrow_levels[0].startswith("$"):
        return False
    for index, level in enumerate(wide_levels):
        if level == "#":
            return True
        if index >= len(narrow_levels) or narrow_levels[index] == "#":
            return False
        if level != "+" and (narrow_levels[index] == "+" or level != narrow_levels[index]):
            return False
    return len(wide_levels) == len(narrow_levels)


def partition_of(key: str) -> int:
    return int(key[len(POSITION_PREFIX) :])


def reads_partitions(offsets: Mapping[str, int]) -> bool | None:
    """How a broker's checkpointed offsets read it: by partition (True), by topic (False), unknown (None:
    nothing checkpointed for it yet)."""
    for key in offsets:
        if not key.startswith(STORE_PREFIX):  # (the store they were taken from: ``broker_stores``)
            return is_partition_key(key) or key.startswith(FILTER_PREFIX)
    return None


def describe(key: str) -> str:
    """How errors name a key: the topic, or the partition."""
    if key.startswith(POSITION_PREFIX):
        return f"partition {partition_of(key)} (positions)"
    return f"topic {key!r}"


class _HasEnd(Protocol):
    """What a mark needs of an extent (``offsets_planner.LogExtent``, which builds on this module)."""

    @property
    def end(self) -> int: ...


def query_start_marks(offsets: Mapping[str, int], extents: Mapping[str, _HasEnd]) -> dict[str, int]:
    """The marks of a new query's start: each partition's end, where its start is below it."""
    return {
        mark_key(partition_of(key)): extents[key].end
        for key, position in offsets.items()
        if key.startswith(POSITION_PREFIX) and key in extents and position < extents[key].end
    }


def marks_of(offsets: Mapping[str, int]) -> dict[int, int]:
    """Each partition's query-start mark (absent: 0, every record of it came after the query started)."""
    return {
        int(key[len(MARK_PREFIX) :]): value for key, value in offsets.items() if key.startswith(MARK_PREFIX)
    }


def drop_passed_marks(offsets: Mapping[str, int]) -> dict[str, int]:
    """`offsets` without the marks its positions have reached (they carry nothing any more)."""
    kept = dict(offsets)
    for key in filter(_IS_MARK, offsets):  # (in C: a broker read by topic holds a key per topic, no mark)
        if offsets.get(POSITION_PREFIX + key[len(MARK_PREFIX) :], 0) >= offsets[key]:
            del kept[key]
    return kept


_IS_MARK = methodcaller("startswith", MARK_PREFIX)


def holds_positions(offsets: Mapping[str, int]) -> bool:
    """Whether a broker's offsets hold positions: without, the query has not read it by partition yet."""
    return any(key.startswith(POSITION_PREFIX) for key in offsets)


def first_batch_marks(offsets: Mapping[str, int]) -> dict[int, int]:
    """The marks of a broker's first batch by partition (a broker down at the query's start, added to the
    brokers since, or whose store was replaced): its end positions, or its marks past them. Every entry up
    to there was written before the query listed the broker, as a new query's start marks say."""
    marks = marks_of(offsets)
    return {
        partition_of(key): max(position, marks.get(partition_of(key), 0))
        for key, position in offsets.items()
        if key.startswith(POSITION_PREFIX)
    }


def without_marks(offsets: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """``offsets`` without query-start marks: what the planner cuts into ranges (marks travel apart)."""
    return {
        broker: {key: value for key, value in keys.items() if not key.startswith(MARK_PREFIX)}
        for broker, keys in offsets.items()
    }
