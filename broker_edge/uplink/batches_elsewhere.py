"""The downlink's next batch of the logs the hub's member holds no copy of (a cluster hub with fewer replicas
than members), read through its ``mirror_logs`` port from a member that holds them.

Records come as stored, at the hub's offsets, so the batch is what ``next_batch`` would give from a copy
here: each topic from the site's position, a topic's share at most, committed records only. Records
missing before the first one read (retention, or a gap the log holds) are stepped over (``on_gap``), as
``next_batch`` does, and the site records the gap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from broker_edge.uplink.batches import MAX_TOPICS, MIN_TOPIC_SHARE
from broker_edge.uplink.wire import Batch, BatchTopic, join_frames

if TYPE_CHECKING:
    from broker_edge.engine.ports import MirrorLogs
    from broker_edge.storage.record import Record

__all__ = ["batch_elsewhere"]


async def batch_elsewhere(
    logs: MirrorLogs,
    seq: int,
    filters: Sequence[str],
    positions: dict[str, int],
    budget: int,
    on_gap: Callable[[str, int, int], None],
    keep: Callable[[str], bool] = lambda _topic: True,
) -> tuple[Batch | None, dict[str, tuple[int, int]]]:
    """The next batch of the logs matching ``filters`` held elsewhere (those ``keep`` keeps), from their
    ``positions``, which it advances; and those logs with their start and committed end (while any exist,
    the caller polls for more, as nothing here wakes it)."""
    bounds = {topic: ends for topic, ends in (await logs.logs_elsewhere(filters)).items() if keep(topic)}
    behind = [topic for topic, (_start, end) in sorted(bounds.items()) if positions.get(topic, 0) < end]
    share = max(MIN_TOPIC_SHARE, budget // max(1, min(len(behind), 16)))
    parts: list[BatchTopic] = []
    chunks: list[bytes] = []
    for topic in behind:
        if budget <= 0 or len(parts) >= MAX_TOPICS:
            break
        position = positions.get(topic, 0)
        records = _consecutive(await logs.read_elsewhere(topic, position, min(share, budget)))
        if not records:
            continue
        first = records[0].offset
        if first > position:
            on_gap(topic, position, first)
        frames = [bytes(record.frame) for record in records]
        size = sum(len(frame) for frame in frames)
        parts.append(BatchTopic(topic, first, len(records), size))
        chunks.extend(frames)
        budget -= size
        positions[topic] = first + len(records)
    batch = Batch(seq, parts, join_frames(chunks)) if parts else None
    return batch, bounds


def _consecutive(records: list[Record]) -> list[Record]:
    """The records up to the first one that does not follow its predecessor (a gap in the log: the next
    read starts after it and reports it)."""
    for index in range(1, len(records)):
        if records[index].offset != records[index - 1].offset + 1:
            return records[:index]
    return records
