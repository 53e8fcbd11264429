"""Another broker's records into this store at that broker's offsets: a site's batch into its hub's store
under ``$site/<site_id>/`` (the hub's half of "every record once"), and the hub's downlinked topics into a
site's store under their own names.

Each topic's frames are appended verbatim (``LogStore.append_frames`` checks every frame's CRC and that it
continues the log exactly, as a replica appending its leader's frames). What the hub already holds is
skipped (a batch sent again after its acknowledgement was lost); a batch starting past the hub's end is a
gap (the site's retention deleted records before they were sent): the hub keeps what it holds and its copy
goes on at the site's offset, the offsets between missing (``LogStore.append_frames``' ``at``), so a reader
meets them as lost records (the Spark source's ``failOnDataLoss``), and the gap is returned for the caller
to record. Nothing here waits: the caller waits for durability.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from broker_edge.protocol.errors import InvalidTopic
from broker_edge.protocol.topics import validate_topic_name
from broker_edge.settings.uplink import site_topic
from broker_edge.storage import InvalidRecord, LogStore
from broker_edge.storage.record import PREFIX, PREFIX_SIZE
from broker_edge.uplink.wire import Batch, WireError

__all__ = ["Applied", "Gap", "apply_batch", "site_ends"]


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
    """Append ``batch``, each topic as ``local_name(topic)`` here; every gap found is appended to ``gaps``.

    Raises ``WireError`` for a topic name a site may not use or frames that do not continue the log (the
    topics before it in the batch stay appended: they are whole and at their right offsets)."""
    applied = Applied()
    frames = memoryview(batch.frames)
    position = 0
    for part in batch.topics:
        chunk = frames[position : position + part.size]
        position += part.size
        _check_topic(part.topic)
        topic = local_name(part.topic)
        held = store.durable_end(topic) if topic in store else 0
        first = part.first
        at = None
        if first > held:
            gaps.append(Gap(part.topic, held, first))
            at = held = first
        skip = held - first
        if skip >= part.count:
            applied.duplicates += part.count
            continue
        if skip:
            chunk = chunk[_frames_end(chunk, skip) :]
            applied.duplicates += skip
        try:
            store.append_frames(topic, bytes(chunk), at)
        except InvalidRecord as error:
            raise WireError(str(error)) from None
        applied.records += part.count - skip
    return applied


def site_ends(store: LogStore, site_id: str) -> dict[str, int]:
    """Where each of the site's topics ends on the hub (site's names), durable."""
    prefix = site_topic(site_id, "")
    return {info.topic[len(prefix) :]: info.end_offset for info in store.logs(prefix + "#")}


def _check_topic(topic: str) -> None:
    try:
        validate_topic_name(topic)
    except InvalidTopic as error:
        raise WireError(f"topic {topic!r}: {error}") from None
    if topic.startswith("$"):
        raise WireError(f"topic {topic!r}: the uplink carries no '$' topics")


def _frames_end(chunk: memoryview, count: int) -> int:
    """The position after the first ``count`` frames of ``chunk``."""
    position = 0
    for _ in range(count):
        if position + PREFIX_SIZE > len(chunk):
            raise WireError("a batch's frames end before its count")
        body_length, _checksum = PREFIX.unpack_from(chunk, position)
        position += PREFIX_SIZE + body_length
    return position
