"""The topic names in sorted order, kept in chunks, so that listing never sorts them all at once.

Listings are sorted by topic, and a filter with a literal start (``devices/+/status``) only concerns the
names with that prefix. Sorting 300,000 names for every listing held the event loop for a tenth of a
second; here a new name costs a bisection and an insertion into a chunk of at most `CHUNK` names, and a
listing walks the chunks from the first name at or after the prefix, a chunk at a time if it likes.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

__all__ = ["CHUNK", "TopicOrder"]

CHUNK = 2048
"""Most names per chunk (a full chunk is split in two)."""


class TopicOrder:
    """Sorted topic names: `add` keeps the order, `chunks_from` walks it."""

    __slots__ = ("_chunks", "_lasts", "_size")

    def __init__(self, names: Iterable[str] = ()) -> None:
        ordered = sorted(names)
        self._chunks = [ordered[start : start + CHUNK // 2] for start in range(0, len(ordered), CHUNK // 2)]
        self._lasts = [chunk[-1] for chunk in self._chunks]
        self._size = len(ordered)

    def __len__(self) -> int:
        return self._size

    def add(self, name: str) -> None:
        """Insert a name not yet in the order."""
        self._size += 1
        if not self._chunks:
            self._chunks.append([name])
            self._lasts.append(name)
            return
        position = min(bisect.bisect_left(self._lasts, name), len(self._chunks) - 1)
        bisect.insort(self._chunks[position], name)
        self._settle(position)

    def add_many(self, names: Iterable[str]) -> None:
        """Insert names not yet in the order (a loop turn's new topics): each chunk they fall in is extended
        and sorted once (names of a fleet mostly land in one), not bisected into name by name."""
        ordered = sorted(names)
        if len(ordered) < 2:  # (one name: bisected into its chunk, which sorting would walk whole)
            for name in ordered:
                self.add(name)
            return
        self._size += len(ordered)
        chunks, lasts = self._chunks, self._lasts
        if not chunks:
            chunks.append([])
            lasts.append(ordered[-1])
        touched: list[int] = []
        start, last = 0, len(chunks) - 1
        while start < len(ordered):
            position = min(bisect.bisect_left(lasts, ordered[start]), last)
            end = len(ordered) if position == last else bisect.bisect_right(ordered, lasts[position], start)
            chunk = chunks[position]
            chunk += ordered[start:end]
            chunk.sort()
            touched.append(position)
            start = end
        for position in reversed(touched):  # (splitting one moves the chunks after it)
            self._settle(position)

    def _settle(self, position: int) -> None:
        """After names went into chunk `position`: its last name, and halves of `CHUNK` once it is full."""
        chunk = self._chunks[position]
        if len(chunk) < CHUNK:
            self._lasts[position] = chunk[-1]
            return
        pieces = [chunk[start : start + CHUNK // 2] for start in range(0, len(chunk), CHUNK // 2)]
        self._chunks[position : position + 1] = pieces
        self._lasts[position : position + 1] = [piece[-1] for piece in pieces]

    def chunks_from(self, prefix: str = "") -> Iterator[list[str]]:
        """The sorted names starting with `prefix`, a list per chunk (the last one may be cut short).

        Names added while the caller holds the iterator are seen if they sort after the last name yielded;
        none is yielded twice (each step continues after the last name it gave)."""
        after: str | None = None
        while True:
            lasts = self._lasts
            if after is None:
                position = bisect.bisect_left(lasts, prefix)
            else:
                position = bisect.bisect_right(lasts, after)
            if position >= len(lasts):
                return
            chunk = self._chunks[position]
            if after is None:
                names = chunk[bisect.bisect_left(chunk, prefix) :] if prefix else chunk[:]
            else:
                names = chunk[bisect.bisect_right(chunk, after) :]
            if not names:
                return
            if prefix and not names[-1].startswith(prefix):
                yield [name for name in names if name.startswith(prefix)]
                return
            yield names
            after = names[-1]

    def __iter__(self) -> Iterator[str]:
        for chunk in self.chunks_from():
            yield from chunk
