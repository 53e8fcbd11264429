"""Another broker's records into this store at that broker's offsets: a site's batch into its hub under
``$site/<site_id>/`` (the hub's half of "every record once"), and the hub's downlinked topics into a
site's store under their own names.

Each topic's frames go through ``append_mirrored`` (``broker_edge.storage.mirrored``): what is already
held is skipped, frames past the log's end leave a gap (returned for the caller to record), the rest is
appended verbatim and checked. A site applies a downlink batch to its own store (``apply_batch``; the caller
waits for durability); a hub hands each topic of a site's batch to its ``mirror_logs`` port
(``mirror_batch``), which appends it where the log is written (here, or on its partition's leader) and
returns once it is acknowledged there. ``LocalMirrorLogs`` is that port on a broker alone: the uplink's own,
over its store; a cluster member's is the cluster's (``broker_edge.cluster.mirror_logs``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker_edge.engine.ports import MirrorPart
from broker_edge.protocol.errors import InvalidTopic
from broker_edge.protocol.topics import validate_topic_name
from broker_edge.storage import LogStore, StorageError
from broker_edge.storage.mirrored import MirrorAppend, append_mirrored
from broker_edge.uplink.wire import Batch, BatchTopic, WireError

if TYPE_CHECKING:
    from broker_edge.engine.ports import MirrorLogs
    from broker_edge.storage.record import Record

__all__ = ["Applied", "Gap", "LocalMirrorLogs", "apply_batch", "mirror_batch", "mirrored_ends"]


@dataclass(frozen=True, slots=True)
class Gap:
    """Records ``[start, end)`` of a site's topic that never reached the hub."""

    topic: str
    start: int
    end: int


@dataclass(slots=True)
class Applied:
    records: int = 0
    """Records appended (not those already held)."""
    duplicates: int = 0
    """Records the hub already held."""


def apply_batch(store: LogStore, batch: Batch, gaps: list[Gap], local_name: Callable[[str], str]) -> Applied:
    """Append ``batch`` to ``store``, each topic as ``local_name(topic)``; every gap found is appended to
    ``gaps``. Nothing here waits for durability.

    Raises ``WireError`` for a topic name a site may not use, frames that do not continue the log, or a log
    set aside (the topics before it in the batch stay appended: they are whole and at their right offsets)."""
    applied = Applied()
    for part, chunk in _parts(batch):
        try:
            appended = append_mirrored(store, local_name(part.topic), part.first, part.count, chunk)
        except StorageError as error:  # frames that do not continue the log, a log set aside
            raise WireError(str(error)) from None
        _count(applied, gaps, part.topic, appended)
    return applied


async def mirror_batch(
    logs: MirrorLogs, batch: Batch, gaps: list[Gap], local_name: Callable[[str], str]
) -> tuple[Applied, dict[str, int]]:
    """Append ``batch`` through ``logs``, each topic as ``local_name(topic)``, and return once every topic
    is acknowledged, with each topic's acknowledged end (by the batch's names).

    Raises ``WireError`` as ``apply_batch`` does, or ``MirrorRefused`` when a topic is not acknowledged now
    (the others may be: whole, at their right offsets, and skipped when sent again)."""
    parts = _parts(batch)
    try:
        results = await logs.append(
            [MirrorPart(local_name(part.topic), part.first, part.count, chunk) for part, chunk in parts]
        )
    except StorageError as error:  # frames that do not continue the log, a log set aside
        raise WireError(str(error)) from None
    applied = Applied()
    ends: dict[str, int] = {}
    for (part, _chunk), appended in zip(parts, results, strict=True):
        _count(applied, gaps, part.topic, appended)
        ends[part.topic] = appended.end
    return applied, ends


async def mirrored_ends(logs: MirrorLogs, prefix: str) -> dict[str, int]:
    """Where each log under ``prefix`` ends, acknowledged, by its name without ``prefix``.

    Raises ``WireError`` when the store cannot say (it refuses appends: a full disk), ``MirrorRefused``
    when no leader answers."""
    try:
        ends = await logs.ends(prefix)
    except StorageError as error:  # appends in flight cannot become durable now
        raise WireError(str(error)) from None
    return {topic[len(prefix) :]: end for topic, end in ends.items()}


def _parts(batch: Batch) -> list[tuple[BatchTopic, memoryview]]:
    """Each topic of ``batch`` with its frames; ``WireError`` for a topic name a site may not use."""
    frames = memoryview(batch.frames)
    position = 0
    parts = []
    for part in batch.topics:
        _check_topic(part.topic)
        parts.append((part, frames[position : position + part.size]))
        position += part.size
    return parts


def _count(applied: Applied, gaps: list[Gap], topic: str, appended: MirrorAppend) -> None:
    applied.records += appended.records
    applied.duplicates += appended.duplicates
    if appended.gap is not None:
        gaps.append(Gap(topic, *appended.gap))


def _check_topic(topic: str) -> None:
    try:
        validate_topic_name(topic)
    except InvalidTopic as error:
        raise WireError(f"topic {topic!r}: {error}") from None
    if topic.startswith("$"):
        raise WireError(f"topic {topic!r}: the uplink carries no '$' topics")


class LocalMirrorLogs:
    """The ``mirror_logs`` port of a broker alone: appended here, acknowledged once durable here."""

    def __init__(self, store: LogStore) -> None:
        self.store = store

    async def append(self, parts: Sequence[MirrorPart]) -> list[MirrorAppend]:
        store = self.store
        appended = [append_mirrored(store, part.topic, part.first, part.count, part.frames) for part in parts]
        await store.wait_durable()  # the batch's topics together: one cut of the group commit
        for part, result in zip(parts, appended, strict=True):
            result.end = store.durable_end(part.topic)
        return appended

    async def ends(self, prefix: str) -> dict[str, int]:
        await self.store.wait_durable()  # appends still in flight count in the ends
        return {info.topic: info.end_offset for info in self.store.logs(prefix + "#")}

    def holds(self, topic: str) -> bool:
        return True

    async def logs_elsewhere(self, filters: Sequence[str]) -> dict[str, tuple[int, int]]:
        return {}

    async def read_elsewhere(self, topic: str, offset: int, max_bytes: int) -> list[Record]:
        return []
