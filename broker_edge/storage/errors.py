"""Storage errors; each carries what a caller needs to recover (current bounds, the bad offset)."""

from __future__ import annotations


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


class StorageFailed(StorageError):
    """A write or fsync failed; the store stops accepting appends (durability can no longer be promised)."""


class DescriptorShortage(StorageError):
    """The process is out of file descriptors (EMFILE, ENFILE): this append is refused, nothing of it kept.

    A passing condition, never a failed store: what the store already holds is retried until it is
    written, and appends are taken again once it is (``GroupCommitter.shortage``)."""
