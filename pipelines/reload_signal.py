"""SIGHUP (``systemctl reload``, the unit's ``ExecReload``) changes nothing in a pipeline job, from its start.

A job reads its files at start, so a SIGHUP says so in one line and the job goes on. Python's default for
SIGHUP ends the process at once, and systemd, to which SIGHUP is a clean end, does not start it again: the
handler is installed as the ``timestone pipeline`` command starts, before its imports, configuration and
Spark session, which take seconds (a reload right after a start ended the job).
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

__all__ = ["say_nothing_to_reload"]


def say_nothing_to_reload(prefix: str) -> None:
    """From now on a SIGHUP only prints that there is nothing to reload, after ``prefix`` (main thread only:
    elsewhere, where Python runs no signal handler, nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def nothing_to_reload(signum: int, frame: FrameType | None) -> None:
        print(
            f"{prefix}: SIGHUP: nothing to reload (the job reads its files at start: restart it to apply a "
            "changed one)",
            file=sys.stderr,
            flush=True,
        )

    signal.signal(signal.SIGHUP, nothing_to_reload)
