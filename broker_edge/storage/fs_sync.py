"""One syncfs(2) for a whole filesystem, instead of one fdatasync per file when a window touches many.

With one log per device, a group-commit window can dirty thousands of segment files; an fdatasync each
would make the window (and every ack in it) as slow as thousands of journal commits. syncfs makes all of
them durable with one. It reports writeback errors only since Linux 5.8, so it is used only there.
It also flushes other processes' dirty data on the same filesystem (the price of the one call).
On FUSE filesystems Linux passes syncfs on to the filesystem's server only for virtiofs: elsewhere it returns
success without the server syncing anything, so a store there uses fdatasync, which does reach it.
ctypes and platform, which finding the calls needs, are loaded by the first question, not with the broker.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

_MIN_KERNEL = (5, 8)


@functools.cache
def _calls() -> tuple[Any, Any]:
    """The libc syncfs and statfs functions (None where syncfs is missing or reports no write errors)."""
    if not sys.platform.startswith("linux"):
        return None, None
    import ctypes

    try:  # (os.uname, not platform.release: the platform module costs milliseconds to import)
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return None, None
    if (major, minor) < _MIN_KERNEL:
        return None, None
    libc = ctypes.CDLL(None, use_errno=True)
    function = getattr(libc, "syncfs", None)
    if function is None:
        return None, None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function, getattr(libc, "statfs", None)


FUSE_SUPER_MAGIC = 0x65735546
"""statfs(2) f_type of every FUSE mount (virtiofs included)."""


def filesystem_type(directory: str | Path) -> int | None:
    """statfs(2) f_type of the filesystem holding `directory` (None if it cannot be read)."""
    statfs = _calls()[1]
    if statfs is None:
        return None
    import ctypes

    buffer = ctypes.create_string_buffer(256)  # struct statfs, whose first member is f_type
    if statfs(os.fsencode(directory), buffer) != 0:
        return None
    return ctypes.c_long.from_buffer(buffer).value


def syncfs_available(directory: str | Path | None = None) -> bool:
    """True where syncfs exists and reports write errors (Linux >= 5.8), and, given a directory, reaches its
    filesystem (not FUSE, where the kernel does not pass it on)."""
    if _calls()[0] is None:
        return False
    return directory is None or filesystem_type(directory) != FUSE_SUPER_MAGIC


def sync_filesystem(fd: int) -> None:
    """Make every written file of the filesystem holding `fd` durable (raises OSError on failure)."""
    syncfs = _calls()[0]
    if syncfs is None:
        raise OSError("syncfs is not available")
    if syncfs(fd) != 0:
        import ctypes

        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
