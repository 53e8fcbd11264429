"""Storage errors; each carries what a caller needs to recover (current bounds, the bad offset, the cause
of a shortage), and which OS errors are a passing shortage rather than a failure (`passing_shortage`)."""

from __future__ import annotations

import errno
from dataclasses import dataclass


class StorageError(Exception):
    """Base of every storage error."""


class UnknownTopic(StorageError):
    """No log exists for the topic."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"no log for topic {topic!r}")
        self.topic = topic


class OffsetOutOfRange(StorageError):
    """The offset is below the log start (retention removed it) or past its end; never silently moved."""

    def __init__(self, topic: str, offset: int, start: int, end: int) -> None:
        super().__init__(f"offset {offset} of {topic!r} is outside [{start}, {end}]")
        self.topic = topic
        self.offset = offset
        self.start = start
        self.end = end


class CorruptRecord(StorageError):
    """The record at `offset` failed its checksum or framing; it is never served.

    `next_offset` is the first offset after the damaged range, for readers that choose to skip it.
    """

    def __init__(self, topic: str, offset: int, next_offset: int, reason: str) -> None:
        super().__init__(
            f"record {offset} of {topic!r} is corrupt ({reason}); next readable offset {next_offset}"
        )
        self.topic = topic
        self.offset = offset
        self.next_offset = next_offset
        self.reason = reason


class TooManyTopics(StorageError):
    """Creating another log would exceed `StorageConfig.max_topics`."""

    def __init__(self, topic: str, limit: int) -> None:
        super().__init__(f"cannot create a log for {topic!r}: the broker keeps at most {limit} logs")
        self.topic = topic
        self.limit = limit


class RecordTooLarge(StorageError):
    """The encoded record exceeds `max_record_bytes`."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"record of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class InvalidRecord(StorageError):
    """A field of the record does not fit the record format (a string over 64 KiB, too many properties)."""


class StoreDamaged(StorageError):
    """A file the store needs is damaged beyond what recovery repairs (the message names it): the store does
    not open."""


class StorageFailed(StorageError):
    """A write or fsync failed; the store stops accepting appends (durability can no longer be promised)."""


@dataclass(frozen=True, slots=True)
class ShortageCause:
    """What a passing shortage lacks, as the broker names it in its refusals, logs and metrics."""

    reason: str
    """Its name in metrics: ``messages_dropped_total{reason}``, ``log_shortage{cause}``."""
    lacking: str
    """What the store is out of, for messages ("out of disk space")."""
    remedy: str
    """What an operator does about it, for the log line."""
    back: str
    """What came back when it ends, for the log line."""
    closing_patience_s: float
    """How long a closing store still waits for it before it gives up (and says what it could not write)."""


DESCRIPTORS = ShortageCause(
    "descriptor_shortage",
    "out of file descriptors",
    "see limits.max_connections, storage.max_open_files and ulimit -n",
    "file descriptors available again",
    5.0,  # connections closing give some back
)
DISK_FULL = ShortageCause(
    "disk_full",
    "out of disk space",
    "free space on the filesystem of storage.directory",
    "disk space available again",
    0.0,  # a stop does not wait for an operator: the next start recovers what was not written
)
NOT_WRITABLE = ShortageCause(
    "not_writable",
    "no write access to storage.directory",
    "give the broker's user write access to storage.directory: its owner, mode or mount",
    "write access to storage.directory again",
    0.0,  # an operator's fix: the next start recovers what was not written
)
SHORTAGE_CAUSES = (DESCRIPTORS, DISK_FULL, NOT_WRITABLE)

_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)
_OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NOT_ALLOWED = (errno.EACCES, errno.EPERM, errno.EROFS)


def passing_shortage(error: BaseException, *, syncing: bool) -> ShortageCause | None:
    """The shortage ``error`` is, when the store may wait it out and try the same thing again; None when it
    is a failure. ``syncing``: it came from an fsync, fdatasync or syncfs, not from an open or a write.

    * Out of descriptors (EMFILE, ENFILE) is always passing: an open failed, so nothing was written or synced.
    * Out of space (ENOSPC, EDQUOT) is passing from a write at a fixed position: the bytes did not all reach
      the page cache, and writing the whole range again at the same position is idempotent. From a sync it
      is a failure: the kernel may have dropped the dirty pages it could not write back, so a later sync
      that passes would not bring them back (the fsync reasoning of ``group_commit``).
    * No write access (EACCES, EPERM, EROFS: a directory made read-only, a file's owner changed, a read-only
      mount) is passing from an open or a write: a file that could not be created or opened holds nothing of
      the job, and a write is tried again whole at its position. From a sync it is a failure, as above.
    """
    if not isinstance(error, OSError):
        return None
    if error.errno in _OUT_OF_DESCRIPTORS:
        return DESCRIPTORS
    if error.errno in _OUT_OF_SPACE and not syncing:
        return DISK_FULL
    if error.errno in _NOT_ALLOWED and not syncing:
        return NOT_WRITABLE
    return None


class StorageShortage(StorageError):
    """The store is short of something it needs to write (``cause``: file descriptors, disk space): this
    append is refused, nothing of it kept.

    A passing condition, never a failed store: what the store already holds is retried until it is
    written, and appends are taken again once it is (``GroupCommitter.shortage``)."""

    def __init__(self, cause: ShortageCause, detail: str) -> None:
        super().__init__(f"{cause.lacking} ({detail}): appends refused until the log is written")
        self.cause = cause
        self.detail = detail
