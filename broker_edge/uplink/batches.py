"""The next batch of stored frames from topics taken in turn: what both ends of the uplink send (a site its
logs, a hub its downlinked topics).

Each topic gives at most its share of a batch, then the next one has its turn, so a topic with a long
backlog never holds back the live records of the others; within a topic, oldest first. Only committed
records go (durable here, and replicated in a cluster).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from broker_edge.storage import CorruptRecord, LogStore, OffsetOutOfRange
from broker_edge.uplink.wire import Batch, BatchTopic, join_frames

__all__ = ["MAX_TOPICS", "MIN_TOPIC_SHARE", "next_batch"]

MIN_TOPIC_SHARE = 64 * 1024
"""Stored bytes one topic may put in a batch before the others get their turn (at least)."""
MAX_TOPICS = 256
"""Topics in one batch, at most: a receiver creating a log per new topic (a fleet's first records, one
topic per device) appends one batch between two turns of its event loop, so a batch stays short."""


def next_batch(
    store: LogStore,
    seq: int,
    positions: dict[str, int],
    pending: collections.OrderedDict[str, None],
    budget: int,
    on_gap: Callable[[str, int, int], None],
) -> Batch | None:
    """The next batch from the topics of ``pending`` (those that may have records to send), from their
    ``positions``, which it advances; a topic sent up to its end leaves ``pending``, one that has more goes
    to its back. ``on_gap(topic, position, start)`` is told of records retention deleted before they were
    sent, or that are missing in the log (damaged, or a gap it holds), which are stepped over. None:
    nothing to send."""
    share = max(MIN_TOPIC_SHARE, budget // max(1, min(len(pending), 16)))
    parts: list[BatchTopic] = []
    chunks: list[bytes] = []
    for topic in list(pending):
        if budget <= 0 or len(parts) >= MAX_TOPICS:
            break
        end = store.committed_end(topic)
        start = store.start_offset(topic)
        position = positions.get(topic, 0)
        if position < start:
            on_gap(topic, position, start)
            position = start
        if position >= end:
            del pending[topic]
            continue
        try:
            position, frames, count = _read_over_gaps(store, topic, position, min(share, budget), end, on_gap)
        except OffsetOutOfRange:
            continue  # retention ran meanwhile: the next round starts at the new start
        if not count:
            positions[topic] = position
            del pending[topic]
            continue
        size = sum(len(frame) for frame in frames)
        parts.append(BatchTopic(topic, position, count, size))
        chunks.extend(frames)
        budget -= size
        positions[topic] = position + count
        if position + count >= end:
            del pending[topic]
        else:
            pending.move_to_end(topic)
    if not parts:
        return None
    return Batch(seq, parts, join_frames(chunks))


def _read_over_gaps(
    store: LogStore,
    topic: str,
    position: int,
    max_bytes: int,
    end: int,
    on_gap: Callable[[str, int, int], None],
) -> tuple[int, list[bytes], int]:
    """Frames of ``topic`` from ``position``, stepping over records missing in the log (damaged, or a gap
    it holds: ``on_gap`` is told, and the receiver records the gap); the position they start at."""
    while True:
        frames, count = store.replicated_log.read_frames(topic, position, max_bytes, end)
        if count or position >= end:
            return position, frames, count
        try:
            store.read(topic, position, end - position)  # raises at once: `position` is missing
        except CorruptRecord as missing:
            after = min(missing.next_offset, end)
            on_gap(topic, position, after)
            position = after
            continue
        return position, frames, count
