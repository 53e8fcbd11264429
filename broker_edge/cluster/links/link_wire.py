"""What every format of the peer link writes and reads alike: parts, strings, publishes as record frames.

A WebSocket message of a link is a sequence of parts ``u8 kind | u32 length | body`` (little endian); a
string in a body is ``u16 length | UTF-8``; a publish that travels with all its fields (MQTT 5 properties,
what remains of its expiry) is the commitlog's record frame (``storage/record.py``). ``peer_link`` (the
link's current format) and ``link_format_1`` (its first) build and read their parts with these.
"""

from __future__ import annotations

import struct

from broker_edge.engine.message import Message
from broker_edge.engine.records import message_of_frame
from broker_edge.storage.record import PREFIX, PREFIX_SIZE, FrameError, decode_frame

__all__ = [
    "MAX_RECORD_BODY",
    "decode_parts",
    "decode_publish",
    "decode_text",
    "encode_part",
    "encode_text",
    "frame_end",
]

MAX_RECORD_BODY = 64 * 1024 * 1024
"""The largest record frame body a link accepts."""

_PART = struct.Struct("<BI")
_U16 = struct.Struct("<H")


def encode_part(kind: int, body: bytes) -> bytes:
    """One part: ``u8 kind | u32 length | body``."""
    return _PART.pack(kind, len(body)) + body


def decode_parts(data: bytes) -> list[tuple[int, memoryview]]:
    """The ``(kind, body)`` parts of one WebSocket message (``ValueError`` if it is not well formed)."""
    view = memoryview(data)
    parts: list[tuple[int, memoryview]] = []
    pos = 0
    while pos < len(view):
        if pos + _PART.size > len(view):
            raise ValueError("truncated part header")
        kind, length = _PART.unpack_from(view, pos)
        pos += _PART.size
        if pos + length > len(view):
            raise ValueError("truncated part body")
        parts.append((kind, view[pos : pos + length]))
        pos += length
    return parts


def encode_text(text: str) -> bytes:
    """``u16 length | UTF-8`` of ``text`` (a topic, a client id)."""
    raw = text.encode()
    return _U16.pack(len(raw)) + raw


def decode_text(body: memoryview, pos: int) -> tuple[str, int]:
    """The string at ``pos`` and where it ends (``ValueError`` if it runs past the body)."""
    (length,) = _U16.unpack_from(body, pos)
    end = pos + _U16.size + length
    if end > len(body):
        raise ValueError("truncated string")
    return str(body[pos + _U16.size : end], "utf-8"), end


def frame_end(body: memoryview, pos: int) -> int:
    """Where the record frame at ``pos`` ends, by its length prefix (``ValueError`` if past the body)."""
    if pos + PREFIX_SIZE > len(body):
        raise ValueError("truncated record frame")
    (length, _crc) = PREFIX.unpack_from(body, pos)
    end = pos + PREFIX_SIZE + length
    if end > len(body):
        raise ValueError("truncated record frame")
    return end


def decode_publish(
    topic: str, frame: memoryview, index: int, now: float, max_body: int = MAX_RECORD_BODY
) -> Message:
    """The publish on ``topic`` a record frame carries (``index``: the offset its frame was written with);
    its expiry counts from ``now``. ``ValueError`` on a bad frame."""
    try:
        record = decode_frame(frame, index, max_body)
    except FrameError as error:
        raise ValueError(f"bad record frame: {error}") from None
    return message_of_frame(topic, record, now)
