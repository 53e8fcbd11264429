"""One edge node's sequence numbers as a host application follows them live, for its Reorder Timeout.

Sparkplug 3.0 (5.8, Host Application Message Ordering): every message of an edge node but its NDEATH carries
the node's next sequence number (0 to 255, wrapping); the messages travel on several topics, so they may
arrive out of order. A number that does not follow the last one opens a window of ``Reorder Timeout``
seconds in which the numbers skipped must arrive; when they have, the window closes and nothing more is
done; when the timeout elapses first, the host asks the node for a rebirth. A number that came already (a
message repeated, or a node that numbers again from an earlier point without a birth) cannot be put in
order by any message that follows: it keeps the window open until it elapses. :class:`Sequence` is that
bookkeeping; :class:`~pipelines.sparkplug_host.host.SparkplugHost` runs the timer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from pipelines.payloads.sparkplug.session import SEQ_MODULO


@dataclass
class Sequence:
    """An edge node's sequence since its NBIRTH: the number expected next, those skipped and not yet
    arrived, and whether one came twice; ``timer``, the Reorder Timeout's while a window is open."""

    expected: int
    missing: set[int] = field(default_factory=set)
    repeated: bool = False
    timer: asyncio.TimerHandle | None = None

    @classmethod
    def after_birth(cls, seq: int) -> Sequence:
        """The sequence an NBIRTH of number ``seq`` starts."""
        return cls((seq + 1) % SEQ_MODULO)

    def take(self, seq: int) -> bool:
        """Note a message's number; whether the sequence is whole after it (nothing skipped is still
        missing, no number came twice). A number ahead of the expected one (by less than half the range)
        skips those between; one behind it is a late one that was missing, or else one that came twice."""
        ahead = (seq - self.expected) % SEQ_MODULO
        if seq in self.missing:
            self.missing.discard(seq)
        elif ahead == 0:
            self.expected = (seq + 1) % SEQ_MODULO
        elif ahead < SEQ_MODULO // 2:
            self.missing.update((self.expected + step) % SEQ_MODULO for step in range(ahead))
            self.expected = (seq + 1) % SEQ_MODULO
        else:
            self.repeated = True
        return self.whole

    @property
    def whole(self) -> bool:
        return not self.missing and not self.repeated

    def close(self) -> None:
        """End the window (the timeout elapsed, or the sequence ended): its timer and what it waited for."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.missing.clear()
        self.repeated = False
