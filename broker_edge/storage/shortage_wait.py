"""The pauses between tries of storage work that met a passing shortage (``errors.passing_shortage``).

The log's writer thread and the sealer wait a shortage out the same way: a pause doubling from
``RETRY_FIRST_S`` up to ``RETRY_MAX_S`` between tries, and, once the store closes, for at most the cause's
``closing_patience_s`` more (a stop does not wait long for descriptors, nor at all for disk space).
"""

from __future__ import annotations

import time

from .errors import ShortageCause

__all__ = ["RETRY_FIRST_S", "RETRY_MAX_S", "ShortageWait"]

RETRY_FIRST_S = 0.01
RETRY_MAX_S = 1.0
"""The pauses between tries of work that met a shortage: doubling up to this."""


class ShortageWait:
    """The waiting of one piece of work through a shortage; ``patience_s`` bounds it in all (None: until
    it passes, or the store closes)."""

    __slots__ = ("_closing_waited", "_pause", "patience_s", "waited")

    def __init__(self, patience_s: float | None = None) -> None:
        self.patience_s = patience_s
        self.waited = 0.0
        """Seconds paused so far (0 before the first pause)."""
        self._closing_waited = 0.0
        self._pause = RETRY_FIRST_S

    def gives_up(self, cause: ShortageCause) -> bool:
        """Whether the work stops trying: its patience is spent, or the store's closing patience for
        ``cause``."""
        spent = self.patience_s is not None and self.waited >= self.patience_s
        return spent or self._closing_waited > cause.closing_patience_s

    def pause(self, closing: bool) -> None:
        """Sleep before the next try (``closing``: the store closes, which counts against its patience)."""
        time.sleep(self._pause)
        self.waited += self._pause
        if closing:
            self._closing_waited += self._pause
        self._pause = min(self._pause * 2, RETRY_MAX_S)
