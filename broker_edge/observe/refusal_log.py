"""Every refusal said in the log, at a bounded rate: a device publishing outside its ACL a hundred times a
second must be visible without filling the disk.

Each reason (``acl_denied``, ``subscribe_denied``, ``bad_credentials``, ``tls_error``, ...) may write
``LINES_PER_WINDOW`` lines per ``WINDOW_S``; the lines held back after that are counted, and the first
line of a later window carries their number as ``suppressed``. Sans-IO: the caller hands in the time.
Every line is a WARNING with the fields of the refusal (``reason``, ``action``, ``topic``, ``username``, and
the connection's ``client_id``, ``listener``, ``peer``): fields in JSON logs, ``key=value`` in text.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["LINES_PER_WINDOW", "WINDOW_S", "RefusalLog"]

LINES_PER_WINDOW = 20
WINDOW_S = 10.0


class RefusalLog:
    """The refusal lines of one broker, limited per reason."""

    __slots__ = ("_windows", "lines_per_window", "window_s")

    def __init__(self, lines_per_window: int = LINES_PER_WINDOW, window_s: float = WINDOW_S) -> None:
        self.lines_per_window = lines_per_window
        self.window_s = window_s
        self._windows: dict[str, list[float]] = {}
        """Reason → [window start, lines written in it, lines held back since the last one written]."""

    def write(
        self,
        log: logging.Logger | logging.LoggerAdapter,
        now: float,
        reason: str,
        message: str,
        **fields: Any,
    ) -> bool:
        """Write ``message`` with ``fields`` (and ``reason``) unless this reason's lines are over their rate;
        whether it was written."""
        window = self._windows.get(reason)
        if window is None:
            window = self._windows[reason] = [now, 0, 0]
        elif now - window[0] >= self.window_s:
            window[0], window[1] = now, 0
        if window[1] >= self.lines_per_window:
            window[2] += 1
            return False
        window[1] += 1
        extra: dict[str, Any] = {"reason": reason, **fields}
        if window[2]:
            extra["suppressed"] = int(window[2])
            window[2] = 0
        log.warning(message, extra=extra)
        return True
