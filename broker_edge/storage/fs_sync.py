"""One syncfs(2) for a whole filesystem, instead of one fdatasync per file when a window touches many.

With one log per device, a group-commit window can dirty thousands of segment files; an fdatasync each
would make the window (and every ack in it) as slow as thousands of journal commits. syncfs makes all of
them durable with one. It reports writeback errors only since Linux 5.8, so it is used only there.
It also flushes other processes' dirty data on the same filesystem (the price of the one call).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

_MIN_KERNEL = (5, 8)


def _load_syncfs():
    if not sys.platform.startswith("linux"):
        return None
    try:
        major, minor = (int(part) for part in platform.release().split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < _MIN_KERNEL:
        return None
    function = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
    if function is not None:
        function.argtypes = [ctypes.c_int]
        function.restype = ctypes.c_int
    return function


_syncfs = _load_syncfs()


def syncfs_available() -> bool:
    """True where syncfs exists and reports write errors (Linux >= 5.8)."""
    return _syncfs is not None


def sync_filesystem(fd: int) -> None:
    """Make every written file of the filesystem holding `fd` durable (raises OSError on failure)."""
    if _syncfs is None:
        raise OSError("syncfs is not available")
    if _syncfs(fd) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
