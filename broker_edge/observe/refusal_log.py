"""Refusals said in the log at a bounded rate: a device publishing outside its ACL a hundred times a second,
or a store refusing every batch while a partition changes hands, must be visible without filling the disk.

Two shapes of one rule (``_Allowance``: so many lines per window per kind, the lines held back counted and
told with the next line written):

- ``RefusalLog``, one per broker, for refusals of a client: each reason (``acl_denied``,
  ``subscribe_denied``, ``bad_credentials``, ``tls_error``, ...) may write ``LINES_PER_WINDOW`` lines per
  ``WINDOW_S``; the first line of a later window carries the number held back as ``suppressed``. Every line
  is a WARNING with the fields of the refusal (``reason``, ``action``, ``topic``, ``username``, and the
  connection's ``client_id``, ``listener``, ``peer``): fields in JSON logs, ``key=value`` in text.
- The same, one per broker, for messages the broker dropped for a subscriber (``BrokerCounters.drop_for``:
  a slow subscriber, a full queue, a message larger than the client accepts), each line naming the
  subscriber.
- ``LogSummary``, for expected conditions that repeat (publishes refused while a partition changes hands, a
  store short of file descriptors): one line per interval per kind, the next one saying how many were left
  out since the last.
- ``FailingWrites``, for a file written again and again (the sessions file, the retained file, the QoS 2
  journal) that cannot be written: an ERROR when its writes start failing, naming the file and why, then
  one reminder per ``REMINDER_S`` at most while they keep failing, and a WARNING when one works again.

Sans-IO: ``RefusalLog`` is handed the time, ``LogSummary`` reads its clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "LINES_PER_WINDOW",
    "REMINDER_S",
    "WINDOW_S",
    "FailingWrites",
    "LogSummary",
    "Logger",
    "RefusalLog",
]

Logger = logging.Logger | logging.LoggerAdapter

LINES_PER_WINDOW = 20
WINDOW_S = 10.0
REMINDER_S = 60.0
"""How often ``FailingWrites`` says at most that a file's writes still fail."""


class _Allowance:
    """Lines allowed per window, per kind."""

    __slots__ = ("_windows", "lines_per_window", "window_s")

    def __init__(self, lines_per_window: int, window_s: float) -> None:
        self.lines_per_window = lines_per_window
        self.window_s = window_s
        self._windows: dict[str, list[float]] = {}
        """Kind → [window start, lines written in it, lines held back since the last one written]."""

    def take(self, kind: str, now: float) -> int | None:
        """None when a line of ``kind`` now is over the allowance (it is counted as held back); else how many
        were held back since the last line written."""
        window = self._windows.get(kind)
        if window is None:
            window = self._windows[kind] = [now, 0, 0]
        elif now - window[0] >= self.window_s:
            window[0], window[1] = now, 0
        if window[1] >= self.lines_per_window:
            window[2] += 1
            return None
        window[1] += 1
        held_back = int(window[2])
        window[2] = 0
        return held_back


class RefusalLog:
    """The refusal lines of one broker, limited per reason."""

    __slots__ = ("_allowance",)

    def __init__(self, lines_per_window: int = LINES_PER_WINDOW, window_s: float = WINDOW_S) -> None:
        self._allowance = _Allowance(lines_per_window, window_s)

    def write(
        self,
        log: Logger | Callable[[], Logger],
        now: float,
        reason: str,
        message: str,
        **fields: Any,
    ) -> bool:
        """Write ``message`` with ``fields`` (and ``reason``) unless this reason's lines are over their rate;
        whether it was written. ``log`` may be a function that makes the logger: it is called only for a line
        written (a connection's logger is made per line)."""
        held_back = self._allowance.take(reason, now)
        if held_back is None:
            return False
        if callable(log):
            log = log()
        extra: dict[str, Any] = {"reason": reason, **fields}
        if held_back:
            extra["suppressed"] = held_back
        log.warning(message, extra=extra)
        return True


class LogSummary:
    """``log(level, kind, message, *args)``: at most one line per ``interval_s`` per ``kind``; the next line
    of a kind says how many were left out since the last one."""

    __slots__ = ("_allowance", "clock", "logger")

    def __init__(
        self, logger: logging.Logger, interval_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.clock = clock
        self._allowance = _Allowance(1, interval_s)

    @property
    def interval_s(self) -> float:
        return self._allowance.window_s

    def log(
        self, level: int, kind: str, message: str, *args: object, extra: Mapping[str, object] | None = None
    ) -> None:
        """The line, unless one of ``kind`` was written within ``interval_s``; ``extra``: its fields."""
        left_out = self._allowance.take(kind, self.clock())
        if left_out is None:
            return
        if left_out:
            message += " (and %d more like it since the last such line)"
            args = (*args, left_out)
        self.logger.log(level, message, *args, extra=extra)


class FailingWrites:
    """The lines of one file's writes failing (see the module docstring): ``failed(exc)`` after each failed
    write, ``succeeded()`` after each one that worked. ``what`` names the writes ("writing persistent
    sessions"), ``consequence`` what their failing costs (said in the first line)."""

    __slots__ = (
        "_failures",
        "_last_said",
        "_since",
        "clock",
        "consequence",
        "logger",
        "path",
        "reminder_s",
        "what",
    )

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        path: object,
        consequence: str = "",
        reminder_s: float = REMINDER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.what = what
        self.path = path
        self.consequence = consequence
        self.reminder_s = reminder_s
        self.clock = clock
        self._since: float | None = None
        """When the writes started failing; None while they work."""
        self._last_said = 0.0
        self._failures = 0
        """Failed writes since the last line said."""

    @property
    def failing(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException) -> None:
        """A write failed: an ERROR if it is the first since the writes worked, or a reminder once
        ``reminder_s`` passed since the last line; else nothing (counted for the next reminder)."""
        now = self.clock()
        self._failures += 1
        if self._since is None:
            self._since, self._last_said, self._failures = now, now, 0
            consequence = f" ({self.consequence})" if self.consequence else ""
            self.logger.error(
                "%s to %s failed: %s%s; said again at most every %.0f s until it works again",
                self.what,
                self.path,
                exc,
                consequence,
                self.reminder_s,
            )
        elif now - self._last_said >= self.reminder_s:
            self.logger.error(
                "%s to %s still fails, for %.0f s now (%d failed writes since the last line): %s",
                self.what,
                self.path,
                now - self._since,
                self._failures,
                exc,
            )
            self._last_said, self._failures = now, 0

    def succeeded(self) -> None:
        """A write worked: a WARNING when the writes were failing until now."""
        since = self._since
        if since is None:
            return
        self._since, self._failures = None, 0
        self.logger.warning(
            "%s to %s works again, after failing for %.0f s", self.what, self.path, self.clock() - since
        )
