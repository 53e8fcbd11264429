"""A frame as a partition log stores it: the topic id and a check in front of it, or a marker.

Entry layout (little endian)::

    u32 topic_id | u32 check | frame
    check = crc32c(topic_id as 4 bytes) continued from the frame's CRC field

The frame is exactly the record frame of `record` (what replicas and the offsets API's `frames` format hold),
so a topic's records are byte for byte the same whatever the other topics of the partition are. The check
ties the id to the frame: a flipped bit in the id, or a frame that ended up under another id, fails it.

A marker is an entry whose topic id has bit 31 set and whose frame is ``u32 length (17) | u32 crc32c(body) |
u8 kind | u64 offset | u64 dropped``: a truncation (the topic's log ends at ``offset``; ``dropped`` is the
bytes of its records in segments already sealed when it was cut) or a restart (the log is empty and goes on
at ``offset``). Markers make a follower's truncation durable in log order; they are never served.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from . import record
from .record import PREFIX, PREFIX_SIZE, EntryHead

__all__ = [
    "ENTRY_HEAD",
    "HEAD_AND_PREFIX",
    "HEAD_SIZE",
    "MARKER_BIT",
    "MARKER_BODY_SIZE",
    "RESTART",
    "TOPIC_ID",
    "TRUNCATE",
    "EntryError",
    "Marker",
    "check_of",
    "encode_marker",
    "entries_of",
    "head_of",
    "parse_head",
    "parse_marker",
]

ENTRY_HEAD = struct.Struct("<II")
HEAD_SIZE = ENTRY_HEAD.size
HEAD_AND_PREFIX = struct.Struct("<IIII")
"""An entry's header and its frame's length prefix (`record.PREFIX`), packed in one call."""
TOPIC_ID = struct.Struct("<I")
"""A topic id as the check starts from it."""
MARKER_BIT = 0x80000000
TRUNCATE = 1
RESTART = 2
_MARKER_BODY = struct.Struct("<BQQ")
MARKER_BODY_SIZE = _MARKER_BODY.size
MARKER_FRAME_SIZE = PREFIX_SIZE + MARKER_BODY_SIZE
MAX_TOPIC_ID = MARKER_BIT - 1


class EntryError(ValueError):
    """An entry failed its framing or check; `reason` says which (`torn`, `length`, `check`, ...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Marker:
    """A truncation or restart of one topic's log, in log order."""

    topic_id: int
    kind: int
    offset: int
    dropped: int


def check_of(topic_id: int, frame_crc: int) -> int:
    """The check of an entry holding a frame whose CRC field is `frame_crc`."""
    return record.crc32c(TOPIC_ID.pack(topic_id), frame_crc)


def head_of(topic_id: int) -> EntryHead:
    """How `record.encode_framed` heads the frames of one topic (`record.EntryHead`)."""
    return topic_id, TOPIC_ID.pack(topic_id), HEAD_AND_PREFIX.pack


def entries_of(topic_id: int, frames: Sequence[memoryview], crcs: Sequence[int]) -> list[bytes]:
    """The entries of checked `frames` of one topic whose CRC fields are `crcs` (a leader's, appended
    verbatim): each frame behind its header."""
    raw, pack, checksum = TOPIC_ID.pack(topic_id), ENTRY_HEAD.pack, record.crc32c
    return [pack(topic_id, checksum(raw, crc)) + frame for frame, crc in zip(frames, crcs, strict=True)]


def parse_head(buf: bytes | memoryview, pos: int, max_body: int) -> tuple[int, int]:
    """(topic id with its marker bit, end of the entry) of the entry at `pos`, after its check.

    Raises `EntryError`: `torn` (it runs past the buffer), `length` (an implausible length prefix) or
    `check` (the id does not match its frame). The frame itself (its CRC, offset) is checked by the reader.
    """
    size = len(buf)
    if pos + HEAD_SIZE + PREFIX_SIZE > size:
        raise EntryError("torn")
    topic_id, check = ENTRY_HEAD.unpack_from(buf, pos)
    body_length, frame_crc = PREFIX.unpack_from(buf, pos + HEAD_SIZE)
    if body_length > max_body or (topic_id & MARKER_BIT and body_length != MARKER_BODY_SIZE):
        raise EntryError("length")
    end = pos + HEAD_SIZE + PREFIX_SIZE + body_length
    if end > size:
        raise EntryError("torn")
    if check != record.crc32c(TOPIC_ID.pack(topic_id), frame_crc):
        raise EntryError("check")
    return topic_id, end


def encode_marker(topic_id: int, kind: int, offset: int, dropped: int = 0) -> bytes:
    """The entry of a marker of `topic_id` (see the module docstring)."""
    body = _MARKER_BODY.pack(kind, offset, dropped)
    frame_crc = record.crc32c(body)
    marked = topic_id | MARKER_BIT
    return ENTRY_HEAD.pack(marked, check_of(marked, frame_crc)) + PREFIX.pack(len(body), frame_crc) + body


def parse_marker(buf: bytes | memoryview, pos: int) -> Marker:
    """The marker whose (checked) entry starts at `pos`; raises `EntryError("checksum")` or ("kind")."""
    marked, _check = ENTRY_HEAD.unpack_from(buf, pos)
    body_start = pos + HEAD_SIZE + PREFIX_SIZE
    _length, frame_crc = PREFIX.unpack_from(buf, pos + HEAD_SIZE)
    if record.crc32c(memoryview(buf)[body_start : body_start + _MARKER_BODY.size]) != frame_crc:
        raise EntryError("checksum")
    kind, offset, dropped = _MARKER_BODY.unpack_from(buf, body_start)
    if kind not in (TRUNCATE, RESTART):
        raise EntryError("kind")
    return Marker(marked & ~MARKER_BIT, kind, offset, dropped)
