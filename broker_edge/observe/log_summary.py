"""Expected conditions that repeat (publishes refused while a partition changes hands) logged once per
interval per kind, the repeats between counted and told with the next line: an incident's log stays
readable."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["LogSummary"]


class LogSummary:
    """``log(level, kind, message, *args)``: at most one line per ``interval_s`` per ``kind``; the next line
    of a kind says how many were left out since the last one."""

    def __init__(
        self, logger: logging.Logger, interval_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self._kinds: dict[str, tuple[float, int]] = {}
        """kind → (when its last line was written, how many were left out since)."""

    def log(self, level: int, kind: str, message: str, *args: object) -> None:
        now = self.clock()
        last = self._kinds.get(kind)
        if last is not None and now - last[0] < self.interval_s:
            self._kinds[kind] = (last[0], last[1] + 1)
            return
        left_out = last[1] if last is not None else 0
        self._kinds[kind] = (now, 0)
        if left_out:
            message += " (and %d more like it since the last such line)"
            args = (*args, left_out)
        self.logger.log(level, message, *args)
