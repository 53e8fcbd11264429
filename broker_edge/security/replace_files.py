"""Files a service reads, replaced whole, keeping the owner, group and mode the operator gave them.

``replace_files`` first writes every file's new content to a temporary beside it (in the same directory, so a
rename never crosses file systems), synced, and renames them over their targets only once all are written: a
failure before that (a directory that is read-only, a full disk) leaves every target as it was, so a
certificate and its key are replaced together or not at all. A reader sees a file's old content or its new,
never half of one. A path that is a symbolic link (a deployment's files kept elsewhere) has the file it
names replaced, the link kept, where a rename over the link would replace it by a regular file and leave
the file it named as it was. A path that is not a regular file (``/dev/null``, a pipe) is refused, never
replaced by one.

A file that exists keeps its owner, group and mode (an operator's ``chgrp timestone`` and ``chmod 0640``, so
that a service running as ``User=timestone`` reads its key or password file, outlive ``timestone pki renew``
and ``timestone passwd``), but for others' permissions a new file would not get: a key or password file left
readable by every user (0644) is replaced by one they cannot read (0640); a new file gets the mode it is
written with, owned by whoever writes it. A process
that may not give the old owner (not root) keeps the group where it may; where it may not, the new file's
group gets none of the old group's permissions (they were meant for another group).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["NotReplaced", "replace_files"]


class NotReplaced(OSError):
    """A failure before any file was renamed: every target is as it was (``filename`` names the target)."""


def _keep_owner(descriptor: int, old: os.stat_result) -> int:
    """Give the open temporary the old file's owner and group where this process may; the mode it gets."""
    mode = stat.S_IMODE(old.st_mode)
    try:
        os.fchown(descriptor, old.st_uid, old.st_gid)
    except OSError:
        try:
            os.fchown(descriptor, -1, old.st_gid)
        except OSError:
            mode &= ~0o070
    return mode


def _stage(path: Path, data: bytes, mode: int) -> str:
    """A synced temporary beside ``path`` holding ``data``, as ``path`` is to be; its name."""
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory")
    try:
        old: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        old = None
    if old is not None and not stat.S_ISREG(old.st_mode):  # a device, a pipe: never replaced by a file
        raise OSError(errno.EINVAL, "not a regular file (a device, a pipe or a socket)", str(path))
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        kept = _keep_owner(descriptor, old) & (mode | 0o770) if old is not None else mode
        os.fchmod(descriptor, kept)
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return temporary


def replace_files(files: Sequence[tuple[Path, bytes, int]], new: bool = False) -> None:
    """Replace each ``(path, data, mode)`` whole; every temporary is written before any is renamed.

    ``mode`` is that of a new file; a file that exists keeps its own (less others' permissions ``mode``
    does not give), and its owner and group. ``NotReplaced``
    (an ``OSError`` naming the target) when writing a temporary failed, and so every file is as it was.
    ``new``: the files are made, never replaced, even by a writer racing this one (each name claimed with an
    exclusive create before the renames): ``FileExistsError`` naming the first that exists, none made.
    """
    staged: list[tuple[str, Path]] = []
    made: list[Path] = []
    try:
        for path, data, mode in files:
            target = Path(os.path.realpath(path))  # a link stays a link: the file it names is replaced
            try:
                staged.append((_stage(target, data, mode), target))
            except OSError as error:
                raise NotReplaced(error.errno, error.strerror, str(target)) from error
        for _, target in staged if new else ():
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
            made.append(target)
        for index, (temporary, target) in enumerate(staged):
            os.replace(temporary, target)
            staged[index] = ("", target)
    except BaseException:
        for temporary, _ in staged:
            if temporary:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary)
        for target in made:  # (this writer's own: no other could claim that name once it was)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target)
        raise
    for directory in {target.parent for _, target in staged}:
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
