"""A bounded LRU of open file descriptors, so a broker with 100k logs never runs out of them.

Every segment and index access goes through the pool by path. Descriptors are opened read-write (one
descriptor serves both the event-loop readers and the writer thread, via pread/pwrite at explicit positions,
never a shared file position). A descriptor in use is pinned and never closed under its user; the pool may
briefly exceed its bound while more descriptors than that are pinned at once.

A process out of descriptors (EMFILE, ENFILE) is a passing shortage, not a failed write: the open is retried
after the pool closed its idle descriptors, or after a short wait (see ``_open_fd``); a shortage that outlasts
those retries is the group commit's to ride out (``errors.passing_shortage``). The process's budget
(``broker_edge.process.descriptors``) keeps connections from taking the store's share in the first place.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from .errors import DESCRIPTORS, passing_shortage

_IOV_MAX = 1024
_SHORTAGE_PATIENCE_S = 0.5
"""The longest single wait for a descriptor (the waits double from 1 ms: about a second in all)."""

log = logging.getLogger(__name__)


DELETED_WHILE_RUNNING = (
    "deleted while the broker ran (storage.directory removed, emptied or replaced?): what was written to it "
    "is in no file a start reads; appends are refused"
)

MIN_OPEN = 2
"""The fewest descriptors the pool works with: a segment and its index."""


def check_max_open(max_open: int) -> None:
    """Raise `ValueError` unless the pool can work with `max_open` descriptors (at least `MIN_OPEN`)."""
    if max_open < MIN_OPEN:
        raise ValueError(f"must be at least {MIN_OPEN} (a segment and its index), got {max_open}")


class _Handle:
    __slots__ = ("fd", "forgotten", "users")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.users = 0
        self.forgotten = False


class FileHandlePool:
    """LRU-bounded descriptors shared by the event loop (reads) and the writer thread (writes, fsync)."""

    def __init__(self, max_open: int = 1024) -> None:
        try:
            check_max_open(max_open)
        except ValueError as error:
            raise ValueError(f"max_open {error}") from None
        self.max_open = max_open
        self._handles: OrderedDict[str, _Handle] = OrderedDict()
        self._lock = threading.Lock()
        self.opened_total = 0
        """Descriptors opened since creation (a measure of pool churn)."""
        self.descriptor_shortages = 0
        """Opens that found the process out of descriptors (EMFILE, ENFILE) and were retried."""

    @property
    def open_count(self) -> int:
        """Descriptors open right now."""
        return len(self._handles)

    @contextmanager
    def open(self, path: str, create: bool = False) -> Iterator[int]:
        """Lend the descriptor of `path`, pinned for the duration of the block."""
        handle = self._checkout(path, create)
        try:
            yield handle.fd
        finally:
            self._checkin(path, handle)

    def pread(self, path: str, size: int, position: int) -> bytes:
        """Read `size` bytes at `position` in one call (short only at end of file)."""
        handle = self._checkout(path, False)
        try:
            data = os.pread(handle.fd, size, position)
            while len(data) < size:
                more = os.pread(handle.fd, size - len(data), position + len(data))
                if not more:
                    break
                data += more
            return data
        finally:
            self._checkin(path, handle)

    def pwritev(self, path: str, buffers: Sequence[bytes | memoryview], position: int) -> int:
        """Write `buffers` back to back at `position`, creating the file if needed; returns bytes written."""
        handle = self._checkout(path, True)
        try:
            return _pwritev_all(handle.fd, buffers, position)
        finally:
            self._checkin(path, handle)

    def fdatasync(self, path: str) -> None:
        """Make the data (and size) of `path` durable."""
        with self.open(path) as fd:
            os.fdatasync(fd)

    def check_linked(self, path: str) -> None:
        """Raise ``FileNotFoundError`` if `path` is no longer in its directory: deleted (its descriptor here
        still writes into it, but no start will read it), or replaced by another file."""
        try:
            with self.open(path) as fd:
                held = os.fstat(fd)
            if held.st_nlink > 0:
                return
            named = os.stat(path)  # a filesystem that counts no links: the name still leads to this file
            if (named.st_ino, named.st_dev) == (held.st_ino, held.st_dev):
                return
        except FileNotFoundError:
            pass
        raise FileNotFoundError(errno.ENOENT, DELETED_WHILE_RUNNING, path)

    def forget(self, path: str) -> None:
        """Close the descriptor of a file about to be deleted or truncated (deferred while it is pinned)."""
        with self._lock:
            handle = self._handles.pop(path, None)
            if handle is None:
                return
            if handle.users:
                handle.forgotten = True
                return
        os.close(handle.fd)

    def close(self) -> None:
        """Close every idle descriptor (pinned ones close when released)."""
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
            for handle in handles:
                handle.forgotten = True
        _close_all(handle.fd for handle in handles if not handle.users)

    def _checkout(self, path: str, create: bool) -> _Handle:
        with self._lock:
            handle = self._handles.get(path)
            if handle is not None:
                self._handles.move_to_end(path)
                handle.users += 1
                return handle
        fd = self._open_fd(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0))
        to_close: list[int] = []
        with self._lock:
            existing = self._handles.get(path)
            if existing is not None:
                to_close.append(fd)
                handle = existing
                self._handles.move_to_end(path)
            else:
                handle = _Handle(fd)
                self._handles[path] = handle
                self.opened_total += 1
            handle.users += 1
            to_close += self._evict_locked()
        _close_all(to_close)
        return handle

    def _open_fd(self, path: str, flags: int) -> int:
        """``os.open``, with the process out of descriptors (EMFILE, ENFILE) taken as a passing shortage:
        the pool gives back its idle descriptors and retries, waiting a little longer each time (back-pressure
        on the caller: the loop's appends or the writer thread), up to about a second."""
        delay = 0.001
        while True:
            try:
                return os.open(path, flags, 0o644)
            except OSError as error:
                if passing_shortage(error, syncing=False) is not DESCRIPTORS or delay > _SHORTAGE_PATIENCE_S:
                    raise
                self.descriptor_shortages += 1
                if self.descriptor_shortages == 1 or self.descriptor_shortages % 1000 == 0:
                    log.warning(
                        "out of file descriptors opening %s (%s): closing idle ones and retrying "
                        "(%d shortages so far; see limits.max_connections and storage.max_open_files)",
                        path,
                        error.strerror,
                        self.descriptor_shortages,
                    )
                if not self._close_idle():
                    time.sleep(delay)
                    delay *= 2

    def _close_idle(self) -> int:
        """Close every idle descriptor of the pool now; how many were closed."""
        with self._lock:
            idle = [path for path, handle in self._handles.items() if handle.users == 0]
            fds = [self._handles.pop(path).fd for path in idle]
        _close_all(fds)
        return len(fds)

    def _checkin(self, path: str, handle: _Handle) -> None:
        with self._lock:
            handle.users -= 1
            close_now = handle.forgotten and handle.users == 0
            to_close = self._evict_locked()
        if close_now:
            to_close.append(handle.fd)
        _close_all(to_close)

    def _evict_locked(self) -> list[int]:
        """Close the least recently used idle descriptors beyond the bound.

        Looks only as far as the first idle descriptor from the old end (pinned ones are few), not at the
        whole pool: with more logs than descriptors every append evicts one.
        """
        closed: list[int] = []
        while len(self._handles) > self.max_open:
            idle = next((path for path, handle in self._handles.items() if handle.users == 0), None)
            if idle is None:
                break
            closed.append(self._handles.pop(idle).fd)
        return closed


def _close_all(fds: Iterable[int]) -> None:
    """Close every descriptor of ``fds``. A close that fails (``EIO``: a failing disk reports a lost write
    there) has released its descriptor all the same, so the others are closed too; the first such error is
    raised once all are."""
    failure: OSError | None = None
    for fd in fds:
        try:
            os.close(fd)
        except OSError as error:
            failure = failure or error
    if failure is not None:
        raise failure


def _pwritev_all(fd: int, buffers: Sequence[bytes | memoryview], position: int) -> int:
    written = 0
    for start in range(0, len(buffers), _IOV_MAX):
        chunk = list(buffers[start : start + _IOV_MAX])
        remaining = sum(len(b) for b in chunk)
        while remaining:
            count = os.pwritev(fd, chunk, position + written)
            written += count
            remaining -= count
            if remaining:
                chunk = _drop_prefix(chunk, count)
    return written


def _drop_prefix(buffers: list[bytes | memoryview], count: int) -> list[bytes | memoryview]:
    """The buffers left after a short write of `count` bytes."""
    rest: list[bytes | memoryview] = []
    for buffer in buffers:
        if count >= len(buffer):
            count -= len(buffer)
            continue
        rest.append(memoryview(buffer)[count:] if count else buffer)
        count = 0
    return rest
