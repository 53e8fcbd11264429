"""SIGINT and SIGTERM noted from the first moment of ``timestone broker``, before its event loop exists.

Until the event loop takes them over (``serve``), a SIGINT would raise ``KeyboardInterrupt`` wherever the
process happens to be (imports, reading the configuration) and print a traceback, and a broker started in
the background of a shell, which inherits SIGINT ignored, would never hear one sent during its start.
``catch_early_stops`` makes both signals only noted here; ``serve`` stops at once when one was
(``requested``), and the loop's own handlers take over from there. After the loop is gone they are
noted again, so a second Ctrl-C during the last moments of a stop is not a traceback either.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

__all__ = ["catch_early_stops", "requested"]

_noted: list[int] = []


def _note(signum: int, _frame: FrameType | None) -> None:
    _noted.append(signum)


def catch_early_stops() -> None:
    """From now on SIGINT and SIGTERM are only noted (what ``requested`` answers); nothing changes off the
    main thread, where Python runs no signal handler."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _note)


def requested() -> bool:
    """Whether a SIGINT or SIGTERM came since ``catch_early_stops``."""
    return bool(_noted)
