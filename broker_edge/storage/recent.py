"""The buffers of the windows written last, kept in memory so that caught-up readers never pread.

Each group-commit window writes one buffer per dirty segment; the store keeps the newest of them, whole
(one `bytes` each, no object per record), up to `tail_cache_total_bytes`, and a read of a record inside one
slices it. This replaces the per-topic tail caches of layout 2, whose cost grew with the topics appended to:
a caught-up reader of any topic finds its newest records here, and a topic nobody reads costs nothing.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict

__all__ = ["RecentWindows"]


class RecentWindows:
    """Recently written buffers per segment (`(partition, segment number)`), oldest dropped first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        """Bytes held now."""
        self._starts: dict[tuple[int, int], list[int]] = {}
        self._buffers: dict[tuple[int, int], list[bytes]] = {}
        self._order: OrderedDict[tuple[tuple[int, int], int], int] = OrderedDict()
        self.hits = 0

    def add(self, segment: tuple[int, int], position: int, data: bytes) -> None:
        """`data` was written at `position` of `segment` (appended after what is kept for it)."""
        size = len(data)
        if not size or size > self.max_bytes:
            return
        starts = self._starts.setdefault(segment, [])
        buffers = self._buffers.setdefault(segment, [])
        starts.append(position)
        buffers.append(data)
        self._order[(segment, position)] = size
        self.bytes += size
        while self.bytes > self.max_bytes:
            (old_segment, old_position), old_size = self._order.popitem(last=False)
            self._drop_first(old_segment, old_position)
            self.bytes -= old_size

    def _drop_first(self, segment: tuple[int, int], position: int) -> None:
        starts = self._starts[segment]
        index = bisect.bisect_left(starts, position)
        del starts[index]
        del self._buffers[segment][index]
        if not starts:
            del self._starts[segment]
            del self._buffers[segment]

    def window(self, segment: tuple[int, int], position: int, size: int) -> tuple[bytes, int] | None:
        """The kept buffer of `segment` holding all of bytes `[position, position + size)`, and the position
        it starts at (None when no one buffer holds them)."""
        starts = self._starts.get(segment)
        if starts is None:
            return None
        index = bisect.bisect_right(starts, position) - 1
        if index < 0:
            return None
        start = starts[index]
        data = self._buffers[segment][index]
        if position + size > start + len(data):
            return None
        self.hits += 1
        return data, start

    def forget(self, segment: tuple[int, int]) -> None:
        """Drop what is kept of a segment (deleted, or truncated by recovery)."""
        for position in self._starts.pop(segment, []):
            self.bytes -= self._order.pop((segment, position))
        self._buffers.pop(segment, None)
