"""A minimal MQTT 3.1.1 encoder (and MQTT 5 CONNECT) for the few frames the load generator sends.

Every frame is encoded once, before a run, so the hot loops of the load generator only slice and write bytes.
This is deliberately not the project's codec: the benchmark must not share code (or bugs) with the broker it
measures, and it needs nothing but CONNECT, SUBSCRIBE, PUBLISH, PUBACK and DISCONNECT.
"""

from __future__ import annotations

import struct

CONNECT = 0x10
CONNACK = 0x20
PUBLISH = 0x30
PUBACK = 0x40
SUBSCRIBE = 0x82  # the reserved flags of SUBSCRIBE are 0b0010
SUBACK = 0x90
PINGREQ = 0xC0
DISCONNECT = 0xE0

DISCONNECT_FRAME = bytes((DISCONNECT, 0))
PINGREQ_FRAME = bytes((PINGREQ, 0))


def encode_remaining_length(length: int) -> bytes:
    """The variable-length integer of the fixed header (1 to 4 bytes)."""
    if not 0 <= length <= 268_435_455:
        raise ValueError(f"remaining length out of range: {length}")
    out = bytearray()
    while True:
        digit, length = length % 128, length // 128
        out.append(digit | 0x80 if length else digit)
        if not length:
            return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("!H", len(raw)) + raw


def _frame(first_byte: int, body: bytes) -> bytes:
    return bytes((first_byte,)) + encode_remaining_length(len(body)) + body


def connect(client_id: str, keepalive: int = 600, clean_session: bool = True, level: int = 4) -> bytes:
    """CONNECT for protocol ``level`` 4 (MQTT 3.1.1) or 5 (MQTT 5, no properties), no will, no credentials."""
    flags = 0x02 if clean_session else 0x00
    properties = b"\x00" if level == 5 else b""
    header = _string("MQTT") + bytes((level, flags)) + struct.pack("!H", keepalive) + properties
    body = header + _string(client_id)
    return _frame(CONNECT, body)


def subscribe(packet_id: int, topic_filter: str, qos: int) -> bytes:
    """SUBSCRIBE to one topic filter."""
    return _frame(SUBSCRIBE, struct.pack("!H", packet_id) + _string(topic_filter) + bytes((qos,)))


def publish(topic: str, payload: bytes, qos: int = 0, packet_id: int = 0, retain: bool = False) -> bytes:
    """PUBLISH; `packet_id` is only written for QoS 1 and 2."""
    first = PUBLISH | (qos << 1) | (1 if retain else 0)
    body = _string(topic) + (struct.pack("!H", packet_id) if qos else b"") + payload
    return _frame(first, body)


def puback(packet_id: int) -> bytes:
    """PUBACK for one packet id."""
    return bytes((PUBACK, 2)) + struct.pack("!H", packet_id)


def publish_layout(topic: str, payload_size: int, qos: int) -> tuple[bytes, int, int | None]:
    """(fixed header, frame length, offset of the packet id or None) of a PUBLISH with these sizes.

    The subscriber side uses it to recognise runs of identical-length PUBLISH frames at C speed.
    """
    frame = publish(topic, bytes(payload_size), qos, packet_id=1 if qos else 0)
    header_len = 1 + _varint_len(frame)
    header = frame[:header_len]
    pid_offset = header_len + 2 + len(topic.encode()) if qos else None
    return header, len(frame), pid_offset


def _varint_len(frame: bytes) -> int:
    """Number of remaining-length bytes of an encoded frame."""
    n = 1
    while frame[n] & 0x80:
        n += 1
    return n


def publish_run(topic: str, payload: bytes, qos: int, first_packet_id: int, count: int) -> bytes:
    """`count` PUBLISH frames back to back, with packet ids first_packet_id, first_packet_id + 1, ...

    For QoS 0 the frames are identical. Used to pre-build the blobs that publishers slice and write.
    """
    if qos == 0:
        return publish(topic, payload) * count
    return b"".join(publish(topic, payload, qos, first_packet_id + i) for i in range(count))
