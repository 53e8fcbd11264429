"""The latest logged messages by (topic, offset), shared by the sessions reading a log near its end.

Sessions catching up on the same topic ask for the same offsets; handing them one `Message` (and so one
set of its encodings) spares a decode per session. Live routing adds a whole batch of one topic at a time
(a C-level dict update, nothing per message in Python), reads add what they decode.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import count, islice
from typing import TYPE_CHECKING

from broker_edge.engine.message import Message

if TYPE_CHECKING:
    from broker_edge.engine.ports import AppendedRun

__all__ = ["TOPIC_WEIGHT", "RecentMessages"]

TOPIC_WEIGHT = 1
"""What a topic's own entry weighs against the bound, in messages: its dict and its place in the order cost
about what a kept message does (300 bytes). With a topic per device there is one per message, and counting
messages alone let the buffer hold twice the memory it held for a few topics (2.4 MB more at 100,000)."""


class RecentMessages:
    """At most `max_messages` messages, each topic weighing `TOPIC_WEIGHT` more; the topics added to least
    recently are dropped first, whole."""

    def __init__(self, max_messages: int) -> None:
        self.max_messages = max_messages
        self._topics: OrderedDict[str, dict[int, Message]] = OrderedDict()
        self._count = 0
        self._weight = 0
        """The messages and the topics' weight, against `max_messages`."""

    def __len__(self) -> int:
        return self._count

    def add(self, topic: str, first_offset: int, messages: Sequence[Message]) -> None:
        """Keep `messages`, the records of `topic` from `first_offset` on, in order."""
        self._put(topic, first_offset, messages)
        if self._weight > self.max_messages:
            self._shrink()

    def add_runs(self, runs: Iterable[AppendedRun]) -> None:
        """`add` of each run of a loop turn, the bound applied once after them all (least recent topics
        dropped first): with a topic per device, a turn drops topics in one pass, not one per message. A
        topic the turn adds to may keep messages that adding each run alone would have dropped with it."""
        topics, put = self._topics, self._put
        singles = 0  # a topic per device: a new entry of one message, made here and counted after the loop
        for run in runs:
            messages = run.messages
            if len(messages) == 1 and run.topic not in topics:
                topics[run.topic] = {run.first_offset: messages[0]}
                singles += 1
            else:
                put(run.topic, run.first_offset, messages)
        self._count += singles
        self._weight += singles * (TOPIC_WEIGHT + 1)
        if self._weight > self.max_messages:
            self._shrink()

    def _put(self, topic: str, first_offset: int, messages: Sequence[Message]) -> None:
        """`add` without applying the bound."""
        topics = self._topics
        by_offset = topics.get(topic)
        if by_offset is None and len(messages) == 1:  # a topic per device: a new entry of one message
            topics[topic] = {first_offset: messages[0]}
            self._count += 1
            self._weight += TOPIC_WEIGHT + 1
            return
        if by_offset is None:
            by_offset = topics[topic] = {}
            self._weight += TOPIC_WEIGHT
        elif topics[next(reversed(topics))] is not by_offset:
            topics.move_to_end(topic)
        before = len(by_offset)
        by_offset.update(zip(count(first_offset), messages))
        added = len(by_offset) - before
        self._count += added
        self._weight += added

    def get(self, topic: str, offset: int) -> Message | None:
        by_offset = self._topics.get(topic)
        return None if by_offset is None else by_offset.get(offset)

    def _shrink(self) -> None:
        """Drop the least recent topics; if the newest alone is over, keep the half of it added last."""
        topics, bound, pop = self._topics, self.max_messages, self._topics.popitem
        weight, dropped_messages = self._weight, 0  # (locals: a turn of a topic per device drops hundreds)
        while weight > bound and len(topics) > 1:
            dropped = len(pop(last=False)[1])
            dropped_messages += dropped
            weight -= dropped + TOPIC_WEIGHT
        self._weight = weight
        self._count -= dropped_messages
        if weight > bound:
            topic, by_offset = topics.popitem()
            kept = dict(islice(by_offset.items(), len(by_offset) - self.max_messages // 2, None))
            topics[topic] = kept
            self._count = len(kept)
            self._weight = len(kept) + TOPIC_WEIGHT
