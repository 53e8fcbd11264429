"""One syncfs(2) for a whole filesystem, instead of one fdatasync per file when a window touches many.

With one log per device, a group-commit window can dirty thousands of segment files; an fdatasync each
would make the window (and every ack in it) as slow as thousands of journal commits. syncfs makes all of
them durable with one. It reports writeback errors only since Linux 5.8, so it is used only there.
It also flushes other processes' dirty data on the same filesystem (the price of the one call).
On FUSE filesystems Linux passes syncfs on to the filesystem's server only for virtiofs: elsewhere it returns
success without the server syncing anything, so a store there uses fdatasync, which does reach it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from pathlib import Path

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
_statfs = getattr(ctypes.CDLL(None, use_errno=True), "statfs", None) if _syncfs is not None else None

FUSE_SUPER_MAGIC = 0x65735546
"""statfs(2) f_type of every FUSE mount (virtiofs included)."""


def filesystem_type(directory: str | Path) -> int | None:
    """statfs(2) f_type of the filesystem holding `directory` (None if it cannot be read)."""
    if _statfs is None:
        return None
    buffer = ctypes.create_string_buffer(256)  # struct statfs, whose first member is f_type
    if _statfs(os.fsencode(directory), buffer) != 0:
        return None
    return ctypes.c_long.from_buffer(buffer).value


def syncfs_available(directory: str | Path | None = None) -> bool:
    """True where syncfs exists and reports write errors (Linux >= 5.8), and, given a directory, reaches its
    filesystem (not FUSE, where the kernel does not pass it on)."""
    if _syncfs is None:
        return False
    return directory is None or filesystem_type(directory) != FUSE_SUPER_MAGIC


def sync_filesystem(fd: int) -> None:
    """Make every written file of the filesystem holding `fd` durable (raises OSError on failure)."""
    if _syncfs is None:
        raise OSError("syncfs is not available")
    if _syncfs(fd) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
