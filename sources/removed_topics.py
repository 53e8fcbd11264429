"""Whether positions retention deleted under a query reading by partition held records of its topics.

A broker's partition holds every topic's records, so positions the query has not read may be deleted
because another topic is kept shorter (``debug/#`` for an hour): nothing of the query's topics lost. The
broker keeps, per topic, where the newest of its records retention deleted lay (docs/commitlog.md,
"What retention deleted"), and tells the topics matching the query's filters that lost records at or past a
position (``GET /v1/partitions/{p}/removed``). Only those are data loss. A broker older than that account,
or positions deleted before the broker began it, cannot tell: such positions count as loss, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from broker_edge.offsets_api.client import OffsetsApiError, OffsetsClient

from .offsets_planner import DataLossError, LogExtent
from .partition_offsets import POSITION_PREFIX, REMOVED_POSITIONS, holds_positions, marks_of, partition_of
from .slice_reader import FetchSettings
from .topic_cover import TopicMatcher, sent_filters

__all__ = ["RemovedTopics", "past_removed", "removed_topics", "removed_why"]

log = logging.getLogger(__name__)

RemovedTopics = Mapping[str, int] | None
"""The query's topics that lost records with deleted positions (each: one past the position of its newest
record deleted), empty when none did; None: the broker cannot tell (count the positions as loss)."""


def removed_topics(
    fetch: FetchSettings, client: OffsetsClient, partition: int, since: int, patterns: Sequence[str]
) -> RemovedTopics:
    """The topics matching `patterns` whose records retention deleted with their segments at or past
    position `since` of `partition` (see the module docstring)."""
    sent = sent_filters(patterns)
    keep = None if sent == tuple(patterns) else TopicMatcher(patterns)  # (a cover: ``topic_cover``)
    try:
        removed = fetch.call(partial(client.removed_since, partition, since, sent or ()))
    except OffsetsApiError as error:
        if error.status == 404:  # a broker older than the account
            return None
        raise
    if not removed.accounts_for(since):
        return None
    return {topic: below for topic, below in removed.removed_below.items() if keep is None or keep(topic)}


def removed_why(topics: RemovedTopics, most: int = 5) -> str:
    """What deleted positions held, for messages: the query's topics that lost records there, or that this
    is not known."""
    if topics is None:
        return REMOVED_POSITIONS
    listed = ", ".join(repr(topic) for topic in sorted(topics)[:most])
    more = f" and {len(topics) - most} more" if len(topics) > most else ""
    return f"retention removed records not yet read of topics {listed}{more}"


def past_removed(
    offsets: Mapping[str, Mapping[str, int]],
    listings: Mapping[str, Mapping[str, LogExtent]],
    ask: Callable[[str, int, int], RemovedTopics],
    fail_on_data_loss: bool,
    say: bool = False,
) -> dict[str, dict[str, int]]:
    """`offsets` with each position below its partition's start moved to that start where the positions
    retention deleted held none of the query's topics (``ask(broker, partition, since)``: ``removed_topics``),
    so that the planner does not take them for loss. Where they held some, `DataLossError` names them, or
    without ``fail_on_data_loss`` the position moves all the same and (``say``) a WARNING names them with the
    positions skipped. Where the broker cannot tell, the position stays for the planner (which fails, or
    skips and counts the positions, as the option says). From a partition's query-start mark on
    (``partition_offsets``): records gone below it were gone before the query began."""
    moved = {broker: dict(keys) for broker, keys in offsets.items()}
    for broker, keys in offsets.items():
        logs = listings.get(broker)
        if logs is None or not holds_positions(keys):
            continue
        marks = marks_of(keys)
        for key, position in keys.items():
            extent = logs.get(key) if key.startswith(POSITION_PREFIX) else None
            if extent is None or not position < extent.start <= extent.end:
                continue
            partition = partition_of(key)
            topics = ask(broker, partition, max(position, marks.get(partition, 0)))
            if topics == {}:
                log.info(
                    "timestone source: broker %r partition %d: positions [%d, %d) retention deleted held no "
                    "record of the query's topics; reading goes on at %d",
                    broker, partition, position, extent.start, extent.start,
                )  # fmt: skip
                moved[broker][key] = extent.start
            elif topics and fail_on_data_loss:
                raise DataLossError(broker, key, position, removed_why(topics), extent.start, extent.end)
            elif topics:
                if say:
                    _say_skipped(broker, partition, position, extent.start, topics)
                moved[broker][key] = extent.start
    return moved


def _say_skipped(broker: str, partition: int, position: int, start: int, topics: Mapping[str, int]) -> None:
    log.warning(
        "timestone source: skipping %d positions (failOnDataLoss=false) of broker %r partition %d "
        "[%d, %d): %s",
        start - position, broker, partition, position, start, removed_why(topics),
    )  # fmt: skip
