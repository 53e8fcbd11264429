"""Logs that mirror another broker's: its stored frames appended verbatim at its offsets, once.

A hub holds each site's log this way (``$site/<site_id>/<topic>``), and a site the hub's downlinked topics.
``append_mirrored`` is the one rule, the same on a broker alone and on a cluster partition's leader: what
the log already holds is skipped (a batch sent again after its acknowledgement was lost), frames starting
past the log's end leave a gap (the sender's retention deleted records before they were sent: the log goes
on at the sender's offset, ``LogStore.append_frames``' ``at``), the rest is appended, every frame checked
as a replica checks its leader's.

``LocalMirrorLogs`` is the ``mirror_logs`` port (``broker_edge.engine.ports``) of a broker alone: appended
here, acknowledged once durable, and every log the hub's downlink reads is here. A cluster member's appends
on the leader of each log's partition, acknowledges once the in-sync replicas hold them, and reads the
downlinked logs it holds no copy of from a member that does (``broker_edge.cluster.mirror_logs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker_edge.storage import InvalidRecord
from broker_edge.storage.record import PREFIX, PREFIX_SIZE

if TYPE_CHECKING:
    from broker_edge.storage import LogStore
    from broker_edge.storage.record import Record

__all__ = [
    "LocalMirrorLogs",
    "MirrorAppend",
    "MirrorPart",
    "MirrorRefused",
    "append_mirrored",
    "frames_end",
]


class MirrorRefused(Exception):
    """Frames that cannot be acknowledged now (no leader for their partition, too few in-sync replicas,
    leadership moved): nothing is lost, the sender sends them again from the ends it is given next."""


@dataclass(frozen=True, slots=True)
class MirrorPart:
    """One log's part of a batch: ``count`` stored frames that start at the sender's offset ``first``."""

    topic: str
    first: int
    count: int
    frames: bytes | memoryview


@dataclass(slots=True)
class MirrorAppend:
    """What appending one log's frames at the sender's offsets did."""

    first: int
    """Where the appended records start (after a gap, its end)."""
    records: int = 0
    """Records appended (not those already held)."""
    duplicates: int = 0
    """Records the log already held."""
    gap: tuple[int, int] | None = None
    """Offsets ``[start, end)`` the sender never sent (its retention deleted them): a gap in the log."""
    end: int = 0
    """The log's end once acknowledged (durable alone; committed in a cluster), set by who waited."""


def append_mirrored(
    store: LogStore, topic: str, first: int, count: int, frames: bytes | memoryview
) -> MirrorAppend:
    """Append ``count`` frames of ``topic`` that start at offset ``first`` (see the module docstring).
    Nothing here waits for durability. ``InvalidRecord``: frames that do not continue the log or fail
    their check (none appended)."""
    held = store.durable_end(topic) if topic in store else 0
    at = None
    gap = None
    if first > held:
        gap = (held, first)
        at = held = first
    skip = held - first
    if skip >= count:
        return MirrorAppend(held, 0, count, gap)
    chunk = memoryview(frames)
    if skip:
        chunk = chunk[frames_end(chunk, skip) :]
    appended_at = store.append_frames(topic, bytes(chunk), at)
    return MirrorAppend(appended_at, count - skip, skip, gap)


def frames_end(chunk: memoryview, count: int) -> int:
    """The position after the first ``count`` frames of ``chunk``; ``InvalidRecord`` if it holds fewer."""
    position = 0
    for _ in range(count):
        if position + PREFIX_SIZE > len(chunk):
            raise InvalidRecord("the frames end before their count")
        body_length, _checksum = PREFIX.unpack_from(chunk, position)
        position += PREFIX_SIZE + body_length
    return position


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
