"""A child process told when its parent dies: Linux's ``PR_SET_PDEATHSIG``.

The members and the etcd that ``timestone broker --workers`` starts must not outlive it, however it ends
(SIGKILL included, where it has no chance to stop them): each asks the kernel, before it runs, for SIGTERM
when its parent goes, and stops as it does on SIGTERM.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM, parent: int | None = None) -> bool:
    """Get ``signum`` when the calling process's parent exits; False where the system cannot say so. With
    ``parent`` (the pid the caller knows as its parent), a parent already gone is told at once."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:  # it died before the request was made
        os.kill(os.getpid(), signum)
    return True
