"""One broker per data directory: an exclusive ``flock`` on ``<data>/.lock``, held for the process's life.

Two brokers appending to the same logs, writing the same ``sessions.json`` and the same clean-shutdown marker
lose acknowledged messages, so the second one refuses to start (a configuration error, exit 2) naming the
directory and the holder. The lock file holds the holder's pid, host and start time (written after the lock
is taken, for the error message only: the lock itself is the kernel's, released when the process ends, even
by SIGKILL or a power cut, so a stale file never blocks a start). ``.lock`` starts with a dot: no encoded
topic name does, so it never meets a topic log, whatever the layout.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time

from broker_edge.config.loader import ConfigError
from broker_edge.storage.layout import LOCK_FILE

__all__ = ["DataDirectoryLock"]


class DataDirectoryLock:
    """The lock on one data directory; ``acquire`` before the store opens, ``release`` after it closed."""

    def __init__(self, directory: str | os.PathLike[str], setting: str = "storage.directory") -> None:
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, LOCK_FILE)
        self.setting = setting
        """The dotted key that names the directory (in the error)."""
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock (creating the directory); ``ConfigError`` naming the directory and its holder when
        another process (or another broker of this one) holds it."""
        if self._fd is not None:
            return
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise ConfigError(
                self.setting,
                f"the data directory {os.path.abspath(self.directory)} is in use by another broker "
                f"({holder}); give each broker its own storage.directory",
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        _write_holder(fd, f"pid {os.getpid()} on host {socket.gethostname()}, since {stamp}\n")

    def release(self) -> None:
        """Let the next broker in (the file stays: removing it would race with a starting broker)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"


def _write_holder(fd: int, text: str) -> None:
    """Best effort: a full disk must not stop a broker that holds the lock (the lock is the kernel's)."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)
    except OSError:
        pass
