"""Topic name -> topic id, as an open-addressing hash table of ids in one `array`, over the names by id.

A `dict` from name to id costs tens of bytes per topic (its table, grown to twice the entries, plus an `int`
object per id). The names are already kept in a list by id, so the table needs only
the ids: 4 bytes per slot, at most half of the slots used, 8 to 16 bytes per topic. A lookup hashes the
name (CPython caches a string's hash), probes the slots linearly and compares the name found by id.

Growing the table never rehashes every topic at once (at a million topics that would hold the event loop
for a long while): the larger table takes the new ids at once and the older ones a few per insertion, while
lookups still missing in it look in the older table.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

__all__ = ["TopicIds"]

_EMPTY = -1
_MIN_SLOTS = 64
_MOVED_PER_ADD = 64
"""Ids moved from the older table to the larger one per insertion while it grows (the move ends long
before the larger table is half full)."""


def _slots_for(count: int) -> int:
    """A power of two at least twice `count`."""
    slots = _MIN_SLOTS
    while slots < 2 * count:
        slots *= 2
    return slots


class TopicIds:
    """The ids of the names in `names` (the list a topic's id indexes), by name."""

    __slots__ = ("_mask", "_move_end", "_moved", "_names", "_old", "_old_mask", "_slots")

    def __init__(self, names: Sequence[str]) -> None:
        """Index `names` (ids 0 .. len - 1); raises ValueError if a name occurs twice."""
        self._names = names
        self._slots = array("i", [_EMPTY]) * _slots_for(len(names))
        self._mask = len(self._slots) - 1
        self._old: array | None = None
        self._old_mask = 0
        self._moved = 0
        """While growing: ids below this are in the larger table (the rest only in `_old`)."""
        self._move_end = 0
        """While growing: the ids in `_old` (those below it)."""
        slots, mask = self._slots, self._mask
        for topic_id, name in enumerate(names):  # (inlined: at a million topics, this is the open's loop)
            index = hash(name) & mask
            while (found := slots[index]) != _EMPTY:
                if names[found] == name:
                    raise ValueError(f"topic {name!r} is named twice")
                index = (index + 1) & mask
            slots[index] = topic_id

    def __len__(self) -> int:
        return len(self._names)

    def get(self, name: str) -> int | None:
        """The id of `name`, None if it has none."""
        names, slots, mask = self._names, self._slots, self._mask
        index = hash(name) & mask
        while True:
            topic_id = slots[index]
            if topic_id == _EMPTY:
                break
            if names[topic_id] == name:
                return topic_id
            index = (index + 1) & mask
        old = self._old
        if old is None:
            return None
        mask = self._old_mask
        index = hash(name) & mask
        while True:
            topic_id = old[index]
            if topic_id == _EMPTY:
                return None
            if names[topic_id] == name:
                return topic_id
            index = (index + 1) & mask

    def __getitem__(self, name: str) -> int:
        topic_id = self.get(name)
        if topic_id is None:
            raise KeyError(name)
        return topic_id

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def added(self, topic_id: int) -> None:
        """Index the name just appended to the names as `topic_id` (its last position; not indexed yet)."""
        if 2 * len(self._names) > len(self._slots):
            self._grow()
        self._insert(self._slots, self._mask, self._names[topic_id], topic_id)
        if self._old is not None:
            self._move_some()

    def _grow(self) -> None:
        if self._old is not None:  # (cannot happen: a move ends before the larger table is half full)
            self._finish_move()
        self._old, self._old_mask = self._slots, self._mask
        self._slots = array("i", [_EMPTY]) * (2 * len(self._slots))
        self._mask = len(self._slots) - 1
        self._moved = 0
        self._move_end = len(self._names) - 1  # (the name being added is not in the older table)

    def _move_some(self) -> None:
        names, slots, mask = self._names, self._slots, self._mask
        stop = min(self._moved + _MOVED_PER_ADD, self._move_end)
        for topic_id in range(self._moved, stop):
            self._insert(slots, mask, names[topic_id], topic_id)
        self._moved = stop
        if stop >= self._move_end:
            self._old = None

    def _finish_move(self) -> None:
        while self._old is not None:
            self._move_some()

    @staticmethod
    def _insert(slots: array, mask: int, name: str, topic_id: int) -> None:
        """Put `topic_id` in the first free slot of `name`'s probe (unless it is there already)."""
        index = hash(name) & mask
        while (found := slots[index]) != _EMPTY:
            if found == topic_id:
                return
            index = (index + 1) & mask
        slots[index] = topic_id
