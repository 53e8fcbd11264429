"""A test-only FUSE filesystem that loses, at a simulated power cut, every write not yet made durable.

Modelled on LazyFS (used by Jepsen): a pass-through over a backing directory in which file data written
through the mount stays in this process's memory (the "page cache") until the file is fsynced, and only
then reaches the backing directory (the "disk"). A power cut drops the memory; remounting the backing
directory shows exactly what had been made durable.

What it models, precisely:

* Data: `write` and `truncate` change only the in-memory copy of a file. `fsync` and `fdatasync` (FUSE
  passes both to the `fsync` callback, `datasync` telling them apart) copy that file's changed range and its
  size to the backing file; both count as making data and size durable.
* syncfs(2): Linux passes syncfs to a FUSE server only for virtiofs (`fc->sync_fs`); on a /dev/fuse mount
  the kernel returns 0 without asking the server, so this layer never sees it. A process that wants its
  syncfs modelled sets the extended attribute `user.lazyfs.syncfs` on any path of the mount right after
  its syncfs: every file becomes durable. (The power-loss test's broker does this; see
  `syncfs_forwarding.py`.)
* Metadata (create, mkdir, unlink, rename, rmdir, chmod, utimens) goes to the backing directory at once,
  as if every directory operation were synced: the layer loses data, not names. Torn writes (part of a
  write surviving) are not modelled: an unsynced write is lost whole.
* Power cut: setting `user.lazyfs.power_cut` on the mount's root drops every unsynced change; from then on
  every operation fails with EIO (the machine is off) until the layer is unmounted.
* `user.lazyfs.stats` (getxattr on the root) returns JSON counters: fsync, fdatasync, syncfs calls.

Run: python -m tests.e2e.powerloss.lazyfs BACKING_DIR MOUNTPOINT   (foreground; `fusermount -u` ends it)
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from fuse import FUSE, FuseOSError, Operations

SYNCFS = "user.lazyfs.syncfs"
POWER_CUT = "user.lazyfs.power_cut"
STATS = "user.lazyfs.stats"


@dataclass
class CachedFile:
    """A file's content as readers see it, and the part of it the backing file does not have yet."""

    data: bytearray
    dirty_from: int | None = None  # first byte changed since the last sync (None: clean)
    size_dirty: bool = False

    def write(self, buffer: bytes, offset: int) -> None:
        end = offset + len(buffer)
        if end > len(self.data):
            self.data.extend(bytes(end - len(self.data)))
        self.data[offset:end] = buffer
        self._changed(offset)

    def truncate(self, length: int) -> None:
        if length < len(self.data):
            del self.data[length:]
        else:
            self.data.extend(bytes(length - len(self.data)))
        self.size_dirty = True
        self._changed(min(length, len(self.data)))

    def _changed(self, offset: int) -> None:
        self.dirty_from = offset if self.dirty_from is None else min(self.dirty_from, offset)

    @property
    def dirty(self) -> bool:
        return self.dirty_from is not None or self.size_dirty


class LazyFS(Operations):
    """The filesystem: backing directory `root`, unsynced data in `cache`, one lock around everything."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.cache: dict[str, CachedFile] = {}
        self.calls: Counter[str] = Counter()
        self.off = False
        self.lock = threading.Lock()

    def __call__(self, op: str, path: str, *args: Any) -> Any:
        with self.lock:
            if self.off and not (op in ("setxattr", "getxattr") and args and args[0] in (POWER_CUT, STATS)):
                raise FuseOSError(errno.EIO)
            return super().__call__(op, path, *args)

    def _real(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _cached(self, path: str) -> CachedFile:
        cached = self.cache.get(path)
        if cached is None:
            with open(self._real(path), "rb") as file:
                cached = self.cache[path] = CachedFile(bytearray(file.read()))
        return cached

    def _sync(self, path: str) -> None:
        cached = self.cache.get(path)
        if cached is None or not cached.dirty:
            return
        fd = os.open(self._real(path), os.O_WRONLY)
        try:
            start = cached.dirty_from if cached.dirty_from is not None else len(cached.data)
            os.pwrite(fd, bytes(cached.data[start:]), start)
            os.ftruncate(fd, len(cached.data))
        finally:
            os.close(fd)
        cached.dirty_from, cached.size_dirty = None, False

    # --- data -------------------------------------------------------------------------------------------
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        cached = self.cache.get(path)
        if cached is not None:
            return bytes(cached.data[offset : offset + size])
        fd = os.open(self._real(path), os.O_RDONLY)
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._cached(path).write(data, offset)
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        self._cached(path).truncate(length)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        self.calls["fdatasync" if datasync else "fsync"] += 1
        self._sync(path)

    def flush(self, path: str, fh: int) -> None:
        """close(2): makes nothing durable."""

    def release(self, path: str, fh: int) -> None:
        """The last close: makes nothing durable."""

    # --- the control attributes ----------------------------------------------------------------------------
    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> None:
        if name == SYNCFS:
            self.calls["syncfs"] += 1
            for cached_path in list(self.cache):
                self._sync(cached_path)
        elif name == POWER_CUT:
            self.cache.clear()
            self.off = True
        else:
            raise FuseOSError(errno.ENOTSUP)

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        if name == STATS:
            return json.dumps(dict(self.calls)).encode()
        raise FuseOSError(errno.ENODATA)

    def listxattr(self, path: str) -> list[str]:
        return []

    # --- metadata: straight to the backing directory ----------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        try:
            st = os.lstat(self._real(path))
        except OSError as exc:
            raise FuseOSError(exc.errno) from None
        attrs = {
            key: getattr(st, key)
            for key in (
                "st_mode",
                "st_nlink",
                "st_uid",
                "st_gid",
                "st_size",
                "st_atime",
                "st_mtime",
                "st_ctime",
            )
        }
        cached = self.cache.get(path)
        if cached is not None:
            attrs["st_size"] = len(cached.data)
        return attrs

    def access(self, path: str, amode: int) -> None:
        if not os.access(self._real(path), amode):
            raise FuseOSError(errno.EACCES)

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def open(self, path: str, flags: int) -> int:
        if not os.path.exists(self._real(path)):
            raise FuseOSError(errno.ENOENT)
        return 0

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        os.close(os.open(self._real(path), os.O_WRONLY | os.O_CREAT, mode))
        return 0

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._real(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._real(path))

    def unlink(self, path: str) -> None:
        os.unlink(self._real(path))
        self.cache.pop(path, None)

    def rename(self, old: str, new: str) -> None:
        os.rename(self._real(old), self._real(new))
        self.cache.pop(new, None)
        if old in self.cache:
            self.cache[new] = self.cache.pop(old)

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._real(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self._real(path), uid, gid)

    def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
        os.utime(self._real(path), times)

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self._real(path))
        return {
            key: getattr(st, key)
            for key in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_flag",
                "f_namemax",
            )
        }

    def opendir(self, path: str) -> int:
        return 0

    def releasedir(self, path: str, fh: int) -> None:
        """Nothing to release."""

    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        """Directory operations are durable at once (see the module docstring)."""


def main(backing: str, mountpoint: str) -> None:
    """Serve `backing` at `mountpoint` until unmounted."""
    FUSE(LazyFS(backing), mountpoint, foreground=True, nothreads=False, default_permissions=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
