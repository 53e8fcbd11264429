"""The peer-link parts and the request of cluster-wide shared subscriptions, and their body formats.

Strings are ``u16 length | UTF-8``, integers little endian; a delivery key is
``topic | i64 offset | group | filter``; a message travels as the peer link's own ``UNLOGGED`` part
(payload, QoS, retain, publisher, v5 properties, what remains of the expiry).

- ``ASSIGN`` (leader → the chosen broker): ``key | message``: deliver to a member of the group here.
- ``NOTE`` (leader → every other broker): ``key | node``: the key went to ``node``.
- ``DONE`` (the chosen broker → every other broker): ``key | u8 declined``: delivered (acknowledged by the
  member, or dropped as a broker alone drops it), or declined (no member of the group here any more).
- ``DIRECT`` (the broker an unlogged publish arrived at → the chosen broker): ``group | filter | message``.
- Request ``ONWARD`` (a broker none of whose members of the group can take an unlogged message → another
  broker of the group): ``u16 count | node* | group | filter | message``, the nodes that could not; the
  reply is empty. A request, not a part: a member of an earlier version answers it with an error (no such
  service), where an unknown part would close the link.
- Request ``ASSIGNED`` (a new leader → its peers): ``u16 count | u32 partition*``; the reply
  ``u32 count | (key | node)*``: the assignments they know of in those partitions.
"""

from __future__ import annotations

import struct

from broker_edge.cluster.features.shared_directory import DeliveryKey
from broker_edge.cluster.links.link_wire import decode_parts
from broker_edge.cluster.links.peer_link import decode_unlogged, encode_unlogged
from broker_edge.engine.message import Message

__all__ = [
    "ASSIGN",
    "ASSIGNED",
    "DECLINED_TOO_LARGE",
    "DIRECT",
    "DONE",
    "NOTE",
    "ONWARD",
    "decode_assign",
    "decode_assigned",
    "decode_direct",
    "decode_done",
    "decode_moved",
    "decode_note",
    "decode_onward",
    "decode_partitions",
    "encode_assign",
    "encode_assigned",
    "encode_direct",
    "encode_done",
    "encode_moved",
    "encode_note",
    "encode_onward",
    "encode_partitions",
]

ASSIGN, NOTE, DONE, DIRECT = 32, 33, 34, 35
"""Peer-link part kinds (this feature owns 32-47)."""
ASSIGNED, ONWARD = 21, 22
"""Peer services (this feature owns 21-29; 20 is the retained set's snapshot, ``retained_sync``)."""

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")


def _text(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 0xFFFF:
        raise ValueError(f"string of {len(raw)} bytes does not fit a part")
    return _U16.pack(len(raw)) + raw


class _Reader:
    """Reads fields off a body in order (``struct.error`` / ``ValueError`` when it is short)."""

    def __init__(self, body: bytes | memoryview) -> None:
        self.body = memoryview(body)
        self.pos = 0

    def text(self) -> str:
        (length,) = _U16.unpack_from(self.body, self.pos)
        start = self.pos + _U16.size
        if start + length > len(self.body):
            raise ValueError("truncated string")
        self.pos = start + length
        return str(self.body[start : self.pos], "utf-8")

    def number(self, form: struct.Struct) -> int:
        (value,) = form.unpack_from(self.body, self.pos)
        self.pos += form.size
        return int(value)

    def key(self) -> DeliveryKey:
        topic = self.text()
        offset = self.number(_I64)
        return DeliveryKey(topic, offset, self.text(), self.text())

    def message(self, now: float) -> Message:
        parts = decode_parts(bytes(self.body[self.pos :]))
        if len(parts) != 1:
            raise ValueError("expected one message")
        message = decode_unlogged(parts[0][1], now)
        self.pos = len(self.body)
        return message


def _key(key: DeliveryKey) -> bytes:
    return _text(key.topic) + _I64.pack(key.offset) + _text(key.group) + _text(key.topic_filter)


def encode_assign(key: DeliveryKey, message: Message) -> bytes:
    return _key(key) + encode_unlogged(message)


def decode_assign(body: bytes | memoryview, now: float) -> tuple[DeliveryKey, Message]:
    """The key and the message (its offset set, its expiry counted from ``now``)."""
    reader = _Reader(body)
    key = reader.key()
    message = reader.message(now)
    message.offset = key.offset
    return key, message


def encode_note(key: DeliveryKey, node: str) -> bytes:
    return _key(key) + _text(node)


def decode_note(body: bytes | memoryview) -> tuple[DeliveryKey, str]:
    reader = _Reader(body)
    return reader.key(), reader.text()


DECLINED_TOO_LARGE = 3
"""``DONE``'s code of a delivery declined because no member there can take a message that large (its
Maximum Packet Size); 1 is declined for want of members, 0 finished. Its low bit set: a broker that knows
only 0 and 1 reads it as declined."""


def encode_done(key: DeliveryKey, declined: int) -> bytes:
    """``declined``: 0 (False) finished, 1 (True) declined, ``DECLINED_TOO_LARGE``."""
    return _key(key) + _U8.pack(declined)


def decode_done(body: bytes | memoryview) -> tuple[DeliveryKey, int]:
    """The key and ``encode_done``'s code (true when declined)."""
    reader = _Reader(body)
    key = reader.key()
    return key, int(reader.number(_U8))


def encode_direct(group: str, topic_filter: str, message: Message) -> bytes:
    return _text(group) + _text(topic_filter) + encode_unlogged(message)


def decode_direct(body: bytes | memoryview, now: float) -> tuple[str, str, Message]:
    reader = _Reader(body)
    group = reader.text()
    topic_filter = reader.text()
    return group, topic_filter, reader.message(now)


def encode_moved(message: Message) -> bytes:
    """A shared delivery in flight that a member's session takes to another broker
    (``SharedGroups.hand_over``): the message as the link's ``UNLOGGED`` part."""
    return encode_unlogged(message)


def decode_moved(body: bytes | memoryview, now: float) -> Message:
    """``encode_moved``'s message (its expiry counted from ``now``, no offset)."""
    return _Reader(body).message(now)


def encode_onward(tried: set[str], group: str, topic_filter: str, message: Message) -> bytes:
    """``ONWARD``'s body: ``tried``, the brokers whose members could not take ``message``."""
    nodes = b"".join(_text(node) for node in sorted(tried))
    return _U16.pack(len(tried)) + nodes + encode_direct(group, topic_filter, message)


def decode_onward(body: bytes | memoryview, now: float) -> tuple[set[str], str, str, Message]:
    reader = _Reader(body)
    tried = {reader.text() for _ in range(reader.number(_U16))}
    group = reader.text()
    topic_filter = reader.text()
    return tried, group, topic_filter, reader.message(now)


def encode_partitions(partitions: set[int]) -> bytes:
    return _U16.pack(len(partitions)) + b"".join(_U32.pack(p) for p in sorted(partitions))


def decode_partitions(body: bytes | memoryview) -> set[int]:
    reader = _Reader(body)
    return {reader.number(_U32) for _ in range(reader.number(_U16))}


def encode_assigned(entries: list[tuple[DeliveryKey, str]]) -> bytes:
    return _U32.pack(len(entries)) + b"".join(_key(key) + _text(node) for key, node in entries)


def decode_assigned(body: bytes | memoryview) -> list[tuple[DeliveryKey, str]]:
    reader = _Reader(body)
    return [(reader.key(), reader.text()) for _ in range(reader.number(_U32))]
