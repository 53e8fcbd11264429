"""Space held back for the topic table snapshot, so that retention can free a full disk by itself.

Retention deletes a segment's files only once a snapshot recording the starts that passed it is durable
(`Sealer.delete_after_snapshot`): the snapshot is what keeps a topic's offsets going on where they were once
none of its segments is left. A snapshot is a new file written beside the old one, so on a full disk it
cannot be written, and then no segment can go: a broker whose own log filled its disk would refuse QoS 1/2
publishes until someone freed space by hand. The store therefore keeps a file of preallocated blocks,
``log/disk-reserve``, as large as a snapshot needs (made once the store holds logs: at open, or at the first
seal): when writing the snapshot finds the disk full, the sealer
deletes the reserve, writes the snapshot into the space it gave back, and deletes the segments retention
gave up; the reserve is made again once there is space.

Anything else at that path (a directory made by hand, a link, a pipe) is no reserve: the file could not be
made, and deleting it for a snapshot would fail on a full disk, when it is needed. At open it is renamed
``disk-reserve.set-aside-<n>`` beside it, all it holds kept, said in one WARNING line, and the reserve made
anew: a missing safety margin is not worth a broker that refuses to start, nor anything of an operator's
deleted. The broker looks again whenever it keeps the reserve (after each seal and snapshot) and when it
would release it: one made there while it runs is set aside the same way then, and a reserve deleted while
it runs is made again (said at WARNING), rather than both waiting for the next start.
"""

from __future__ import annotations

import logging
import os
import stat

from .segment import fsync_directory

__all__ = ["RESERVE_FILE", "DiskReserve"]

log = logging.getLogger(__name__)

RESERVE_FILE = "disk-reserve"


class DiskReserve:
    """The reserve file at ``path``: at least ``floor_bytes``, and half as much again as the snapshot it must
    make room for (``keep``); ``floor_bytes`` 0 keeps none."""

    def __init__(self, path: str, floor_bytes: int) -> None:
        self.path = path
        self.floor_bytes = floor_bytes
        self.held = 0
        """Bytes the reserve holds now (0: none, or released)."""

    def keep(self, snapshot_path: str) -> None:
        """Make or grow the reserve to hold the snapshot at ``snapshot_path`` (none yet: the floor), grown by
        half for the topics still to come. A disk without the space leaves it as it is: the next try does."""
        if not self.floor_bytes:
            return
        try:
            snapshot_bytes = os.path.getsize(snapshot_path)
        except FileNotFoundError:
            snapshot_bytes = 0
        wanted = max(self.floor_bytes, snapshot_bytes + snapshot_bytes // 2)
        self._look()
        if self.held >= wanted:
            return
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(descriptor, 0, wanted)
            finally:
                os.close(descriptor)
        except OSError as error:
            log.debug("disk reserve %s not made to %d bytes: %s", self.path, wanted, error)
            self.held = _size_of(self.path)
            return
        self.held = wanted

    def adopt(self) -> None:
        """At open: count the reserve a previous run left, or delete it when none is to be kept now;
        anything there that is not a file is set aside first (:func:`_set_aside_other_than_file`)."""
        _set_aside_other_than_file(self.path, kept=bool(self.floor_bytes))
        self.held = _size_of(self.path)
        if self.held and not self.floor_bytes:
            os.unlink(self.path)
            self.held = 0

    def release(self) -> int:
        """Delete the reserve (the disk is full and a snapshot must be written): the bytes given back (none
        when something else than the reserve's file is there: it is set aside, not deleted)."""
        self._look()
        freed = _size_of(self.path)
        if not freed:
            return 0
        os.unlink(self.path)
        self.held = 0
        return freed

    def _look(self) -> None:
        """What is at the path now, while the broker runs: anything but a file is set aside (no reserve is
        held then), and a reserve deleted by hand is none."""
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            if self.held:
                log.warning("%s is gone: the disk reserve is made anew", self.path)
            self.held = 0
            return
        if not stat.S_ISREG(mode):
            _set_aside_other_than_file(self.path, kept=True)
            self.held = 0


def _size_of(path: str) -> int:
    try:
        return os.stat(path).st_blocks * 512  # what it holds on the disk, not its apparent length
    except FileNotFoundError:
        return 0


def _set_aside_other_than_file(path: str, kept: bool) -> None:
    """Rename whatever is at ``path`` unless it is a regular file (or nothing) to the first free
    ``<path>.set-aside-<n>``, said in one line; ``kept``: whether a reserve is to be made there."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        return
    kind = "a directory" if stat.S_ISDIR(mode) else "a link" if stat.S_ISLNK(mode) else "no regular file"
    then = "the reserve is made anew" if kept else "no reserve is kept (storage.disk_reserve_bytes: 0)"
    number = 1
    while os.path.lexists(aside := f"{path}.set-aside-{number}"):
        number += 1
    try:
        os.rename(path, aside)
        fsync_directory(os.path.dirname(path))
    except OSError as error:
        log.warning(
            "%s is %s, not the disk reserve's file, and could not be set aside (%s): the broker runs without "
            "a disk reserve until it is moved away",
            path,
            kind,
            error,
        )
        return
    log.warning(
        "%s is %s, not the disk reserve's file: set aside as %s (nothing in it deleted); %s",
        path,
        kind,
        aside,
        then,
    )
