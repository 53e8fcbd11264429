"""Ctrl-C and SIGTERM held while Spark's JVM starts, and acted on once it has.

PySpark starts its JVM, which tells its port through a file in a temporary directory and then waits for
its standard input to close, to exit with the Python process. A ``KeyboardInterrupt`` or a ``SystemExit``
raised while PySpark waits for that file deletes the directory: the JVM cannot tell its port, never waits
on its input, and its gateway thread keeps it running after the command has exited, for ever (holding the
command's standard output: whoever reads it to its end waits for ever too). A signal that comes while the
session starts is held and raised again once it has: the command's own stop (or the signal's default
action) then ends the JVM with the process.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["signals_held_while_spark_starts"]

HELD = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def signals_held_while_spark_starts() -> Iterator[None]:
    """Hold SIGINT and SIGTERM (saying so once) until the block ends, then raise the first one again under
    the handlers there were before (the command's). With none held, a handler the block set meanwhile
    stays (PySpark's context takes SIGINT). Outside the main thread, where no handler can be set, nothing
    is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if not held:
            name = signal.Signals(signum).name
            print(f"\n{name}: stopping once Spark has started", file=sys.stderr, flush=True)
        held.append(signum)

    before = {signum: signal.getsignal(signum) for signum in HELD}
    for signum in HELD:
        signal.signal(signum, hold)
    try:
        yield
    finally:
        for signum, handler in before.items():
            if held or signal.getsignal(signum) is hold:
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if held:
            signal.raise_signal(held[0])
