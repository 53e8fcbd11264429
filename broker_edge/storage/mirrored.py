"""Another broker's stored frames appended at that broker's offsets, once (a hub's copy of a site's log, a
site's of the hub's downlink).

``append_mirrored`` is the one rule, the same on a broker alone and on a cluster partition's leader: what
the log already holds is skipped (a batch sent again after its acknowledgement was lost), frames starting
past the log's end leave a gap (the sender's retention deleted records before they were sent: the log goes
on at the sender's offset, ``ReplicatedLog.append_at``' ``at``), the rest is appended, every frame checked
as a replica checks its leader's. Nothing here waits for durability.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import InvalidRecord
from .record import PREFIX, PREFIX_SIZE

if TYPE_CHECKING:
    from .store import LogStore

__all__ = ["MirrorAppend", "append_mirrored", "frames_end"]


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
    appended_at = store.replicated_log.append_at(topic, bytes(chunk), at)
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
