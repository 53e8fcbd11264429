"""SIGINT and SIGTERM noted from the first moment of ``timestone broker``, before its event loop exists.

Until the event loop takes them over (``serve``), a SIGINT would raise ``KeyboardInterrupt`` wherever the
process happens to be (imports, reading the configuration) and print a traceback, and a broker started in
the background of a shell, which inherits SIGINT ignored, would never hear one sent during its start.
``catch_early_stops`` makes both signals only noted here; ``serve`` stops at once when one was
(``requested``), and the loop's own handlers take over from there. After the loop is gone they are
noted again, so a second Ctrl-C during the last moments of a stop is not a traceback either.

SIGHUP (``systemctl reload``, a certificate renewal hook) would end the process as its default action: it
is noted the same way, and ``serve`` acts on one that came during the start once the broker serves
(``hangup_requested``), and on each later one (``take_hangups``); one during the last moments of a stop
changes nothing (``ignore_hangups``: ignored, as the interpreter's exit puts back the default action of the
signals it handled, not of those ignored). SIGHUP stays with this module's handler from the start to the
stop, never the event loop's: a loop gives a signal back to its default action when its handler is
removed, which for SIGHUP would end the process if one came just then.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["catch_early_stops", "hangup_requested", "ignore_hangups", "requested", "take_hangups"]

_noted: list[int] = []
_hangups: list[int] = []
_act_on_hangup: Callable[[], object] | None = None


def _note(signum: int, _frame: FrameType | None) -> None:
    _noted.append(signum)


def _note_hangup(signum: int, _frame: FrameType | None) -> None:
    if _act_on_hangup is None:
        _hangups.append(signum)
    else:
        _act_on_hangup()


def catch_early_stops() -> None:
    """From now on SIGINT and SIGTERM are only noted (what ``requested`` answers), and SIGHUP too
    (``hangup_requested``); nothing changes off the main thread, where Python runs no signal handler. A
    SIGHUP the process ignores (a ``--workers`` member starting) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    # SIGHUP first: whoever sees SIGTERM caught (a supervisor reading /proc/<pid>/status) may send a
    # SIGHUP at once, and it must not find the default action still in place.
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _note_hangup)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _note)


def requested() -> bool:
    """Whether a SIGINT or SIGTERM came since ``catch_early_stops``."""
    return bool(_noted)


def hangup_requested() -> bool:
    """Whether a SIGHUP came since the last call (or since ``catch_early_stops``); forgets it."""
    came = bool(_hangups)
    _hangups.clear()
    return came


def take_hangups(act: Callable[[], object]) -> None:
    """From now on a SIGHUP calls ``act``, where it was ignored too (a ``--workers`` member once it serves);
    main thread only. ``act`` runs between two steps of whatever the main thread runs: it should only
    schedule the work (``loop.call_soon_threadsafe``)."""
    global _act_on_hangup
    _act_on_hangup = act
    signal.signal(signal.SIGHUP, _note_hangup)


def ignore_hangups() -> None:
    """From now on (a stop's last moments, the interpreter's exit) SIGHUP is ignored, in one step from the
    handler it had; main thread only."""
    global _act_on_hangup
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _act_on_hangup = None
