"""The peer link's first format of forwards and answers, spoken with members of earlier versions.

During a rolling upgrade a member of an earlier version reads only this format: a forward is a record
frame per publish, an answer an entry per publish. A link sends it until its peer has said it speaks a
later format (``peer_link.PeerLink.learn_format``); every member reads it, whatever it sends.

- ``FORWARD_1``: ``u32 batch | u16 topic length | topic | record frames`` (``storage/record.py``).
- ``ANSWER_1``: ``u32 batch | u16 count | count x (u8 reason code | i64 offset or -1 | u16 length |
  reason)``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from broker_edge.cluster.links.link_wire import (
    decode_publish,
    decode_text,
    encode_part,
    encode_text,
    frame_end,
)
from broker_edge.engine.message import Message
from broker_edge.engine.ports import ForwardAck
from broker_edge.engine.records import record_fields
from broker_edge.storage.record import encode_frame

FORWARD_1, ANSWER_1 = 1, 3
"""Part kinds of this format (the later format's forward and answer have kinds of their own)."""
MAX_ANSWERED = 0xFFFF
"""The most publishes one answer of this format can carry (its count is a u16)."""

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_ACK = struct.Struct("<BqH")


def encode_forward_1(batch: int, topic: str, messages: Sequence[Message]) -> bytes:
    """The ``FORWARD_1`` part of ``messages`` (all on ``topic``) as batch ``batch``."""
    frames = [encode_frame(index, 0, *record_fields(message)) for index, message in enumerate(messages)]
    return encode_part(FORWARD_1, b"".join([_U32.pack(batch), encode_text(topic), *frames]))


def decode_forward_1(body: memoryview, now: float, max_record: int) -> tuple[int, list[Message]]:
    """``(batch, messages)`` of a ``FORWARD_1`` body; expiry deadlines count from ``now`` (the loop's
    clock). Raises ``ValueError`` on a malformed body or a bad record frame."""
    (batch,) = _U32.unpack_from(body, 0)
    topic, pos = decode_text(body, _U32.size)
    messages: list[Message] = []
    while pos < len(body):
        end = frame_end(body, pos)
        messages.append(decode_publish(topic, body[pos:end], len(messages), now, max_record))
        pos = end
    return batch, messages


def encode_answer_1(batch: int, acks: Sequence[ForwardAck]) -> bytes:
    """The ``ANSWER_1`` part for batch ``batch`` (at most ``MAX_ANSWERED`` publishes)."""
    if len(acks) > MAX_ANSWERED:
        raise ValueError(f"an answer of the first format carries at most {MAX_ANSWERED} publishes")
    parts = [_U32.pack(batch), _U16.pack(len(acks))]
    for ack in acks:
        reason = (ack.reason_string or "").encode()[:0xFFFF]
        parts.append(_ACK.pack(ack.reason_code, -1 if ack.offset is None else ack.offset, len(reason)))
        parts.append(reason)
    return encode_part(ANSWER_1, b"".join(parts))


def decode_answer_1(body: memoryview) -> tuple[int, list[ForwardAck]]:
    """``(batch, answers)`` of an ``ANSWER_1`` body (``ValueError`` if it is cut short)."""
    (batch,) = _U32.unpack_from(body, 0)
    (count,) = _U16.unpack_from(body, _U32.size)
    pos = _U32.size + _U16.size
    acks: list[ForwardAck] = []
    for _ in range(count):
        code, offset, length = _ACK.unpack_from(body, pos)
        pos += _ACK.size + length
        if pos > len(body):
            raise ValueError("truncated answer")
        reason = str(body[pos - length : pos], "utf-8") if length else None
        acks.append(ForwardAck(code, None if offset < 0 else offset, reason))
    if pos != len(body):
        raise ValueError("trailing bytes after the answers")
    return batch, acks
