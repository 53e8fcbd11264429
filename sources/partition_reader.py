"""The executor side of a broker read by storage partition: planned position ranges, fetched completely.

A Spark task gets slices whose "topic" is a partition key (``#p<n>``, see ``partition_offsets``) and whose
range is positions; it reads each range front to back with ``GET /v1/partitions/{n}/records`` (every
matching topic's records in log order, as Arrow) until the broker says it has passed the range's end. What
the broker passed over is data loss, handled per ``failOnDataLoss``:

* positions below the partition's start (retention deleted their segment since the batch was planned);
* records below their topic's start (retention moved it past them while other topics kept the segment),
  and the positions of a segment retention deleted while older ones stay, except before the partition's
  query-start mark: those were gone before the query began;
* entries that failed their checks on the broker.

Deleted positions are loss only when the broker's account of what retention deleted names a topic of the
query among them, or cannot tell (``removed_topics``): positions that held only other topics' records
(kept shorter than the query's) are passed over without a word.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from broker_edge.offsets_api.client import OffsetsClient, PartitionFetch, PositionOutOfRangeError

from .broker_stores import answer_store_matches
from .offsets_planner import DataLossError, Slice
from .partition_offsets import REMOVED_POSITIONS, partition_of
from .removed_topics import RemovedTopics, removed_topics, removed_why
from .slice_reader import FetchSettings, log_lost, to_source_batch
from .topic_cover import TopicMatcher, sent_filters

__all__ = ["MAX_ENTRIES_PER_REQUEST", "read_positions"]

log = logging.getLogger(__name__)

MAX_ENTRIES_PER_REQUEST = 100_000
"""What the offsets API accepts for one partition read."""


def read_positions(
    fetch: FetchSettings, slices: Sequence[Slice], patterns: Sequence[str], marks: Mapping[int, int]
) -> Iterator[pa.RecordBatch]:
    """Yield the records of topics matching `patterns` in the position ranges `slices` (one broker's), as
    batches of the source's schema. `marks`: each partition's query-start mark (see the module docstring)."""
    client = fetch.client()
    sent = sent_filters(patterns)
    keep = None if sent == tuple(patterns) else TopicMatcher(patterns)  # (sent a cover: ``topic_cover``)
    lost = removed = 0  # records of the query's topics; positions whose topics are not known
    same_store = True  # (every answer tells its store: one from another than the batch's ends the task)
    try:
        for piece in slices:
            partition = partition_of(piece.topic)
            mark = 0 if piece.from_log_start else marks.get(partition, 0)
            position = piece.start
            while same_store and position < piece.end:
                upto = min(piece.end, mark) if position < mark else piece.end
                try:
                    fetched: PartitionFetch | None = _read(
                        fetch, client, partition, position, upto, sent or ()
                    )
                except PositionOutOfRangeError as error:
                    fetched, refused = None, error
                same_store = answer_store_matches(
                    fetch.broker, fetch.store, client.store, fetch.fail_on_data_loss
                )
                if not same_store:
                    break
                asked = partial(removed_topics, fetch, client, partition, patterns=patterns)
                if fetched is None:
                    resume, counted = _past_the_start(fetch, piece, position, refused, mark, asked)
                    removed += counted
                    position = resume
                    continue
                if fetched.next_position <= position:
                    raise RuntimeError(
                        f"timestone source: broker {fetch.broker!r} partition {partition} returned nothing "
                        f"from position {position} although it was listed up to {piece.end}"
                    )
                if keep is not None:
                    fetched = _kept(fetched, keep)
                strict = position >= mark and not piece.from_log_start
                records, positions = _passed_over(fetch, piece, position, fetched, strict, asked)
                lost, removed = lost + records, removed + positions
                position = fetched.next_position
                for batch in fetched.table.to_batches():
                    if batch.num_rows:
                        yield to_source_batch(batch, fetch.broker)
    finally:
        client.close()
    log_lost(lost, fetch.broker)
    if removed:
        log.warning(
            "timestone source: skipped %d positions of broker %r removed while reading "
            "(failOnDataLoss=false): %s",
            removed,
            fetch.broker,
            REMOVED_POSITIONS.split(": ", 1)[1],
        )


def _read(
    fetch: FetchSettings,
    client: OffsetsClient,
    partition: int,
    position: int,
    upto: int,
    patterns: Sequence[str],
) -> PartitionFetch:
    entries = min(MAX_ENTRIES_PER_REQUEST, upto - position)
    return fetch.call(
        partial(client.read_partition, partition, position, entries, fetch.max_bytes, tuple(patterns))
    )


def _kept(fetched: PartitionFetch, keep: TopicMatcher) -> PartitionFetch:
    """``fetched`` (read with a cover of the query's filters) with the rows and losses of its topics only."""
    topics = fetched.table.column("topic")
    wanted = [topic for topic in pc.unique(topics).to_pylist() if keep(topic)]
    table = fetched.table.filter(pc.is_in(topics, value_set=pa.array(wanted, topics.type)))
    lost = {topic: count for topic, count in fetched.lost.items() if keep(topic)}
    return replace(fetched, table=table, lost=lost)


def _past_the_start(
    fetch: FetchSettings,
    piece: Slice,
    position: int,
    error: PositionOutOfRangeError,
    mark: int,
    asked: Callable[..., RemovedTopics],
) -> tuple[int, int]:
    """Where to go on when `position` is no longer in the partition, and the positions skipped that count
    as loss (raises `DataLossError` per the option).

    Below its start: retention deleted the segment since planning (a range planned from the log's start of
    a broker that was down is not loss, nor are positions that held none of the query's topics). Past its
    end: the broker's data directory was replaced."""
    if position < error.start:
        resume = min(error.start, piece.end)
        if piece.from_log_start and position == piece.start:
            return resume, 0
        topics = asked(since=max(position, mark))
        if topics == {}:
            return resume, 0
        why = removed_why(topics)
    else:
        resume = piece.end
        why = "the partition ends before this range"
    if fetch.fail_on_data_loss:
        raise DataLossError(fetch.broker, piece.topic, position, why, error.start, error.end)
    return resume, resume - position


def _passed_over(
    fetch: FetchSettings,
    piece: Slice,
    position: int,
    fetched: PartitionFetch,
    strict: bool,
    asked: Callable[..., RemovedTopics],
) -> tuple[int, int]:
    """Records and positions the broker passed over in one read that count as data loss (raising per the
    option). Positions of a deleted segment that held none of the query's topics are not."""
    lost, removed = (sum(fetched.lost.values()), fetched.removed) if strict else (0, 0)
    topics: RemovedTopics = None
    if removed:
        topics = asked(since=position)
        if topics == {}:
            removed = 0
    if not lost and not removed and not fetched.damaged:
        return 0, 0
    if fetch.fail_on_data_loss:
        if fetched.damaged:
            why = f"{fetched.damaged} entries from position {position} are corrupt on the broker"
            raise DataLossError(fetch.broker, piece.topic, position, why)
        if not fetched.lost:
            why = f"{removed_why(topics)} ({fetched.removed} positions)"
            raise DataLossError(fetch.broker, piece.topic, position, why)
        topic, count = next(iter(fetched.lost.items()))
        why = (
            f"retention removed {count} records of topic {topic!r} not yet read (positions "
            f"[{position}, {fetched.next_position}))"
        )
        raise DataLossError(fetch.broker, piece.topic, position, why)
    return lost + fetched.damaged, removed
