"""Packets to bytes for MQTT 3.1, 3.1.1 and 5.0, and the shared-bytes PUBLISH template for fanout.

``encode(packet, protocol_version)`` drops what a version cannot carry: properties and reason codes are
left out below v5 (except the v3 CONNACK return code and SUBACK return codes, which v3 has). Acks, DISCONNECT
and AUTH use the short v5 forms when the reason code is 0 and there are no properties. Encoding refuses
values the receiver would reject as malformed (ValueError), but does not re-check protocol rules.
"""

import struct
from collections.abc import Sequence
from typing import Final

from .packets import (
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
)
from .properties import Properties, encode_properties
from .wire import encode_binary, encode_u16, encode_utf8, encode_varint

_T = PacketType
_PINGREQ_FRAME = b"\xc0\x00"
_PINGRESP_FRAME = b"\xd0\x00"


def encode(packet: Packet, protocol_version: int) -> bytes:
    """The complete frame of ``packet`` as ``protocol_version`` (3, 4 or 5) puts it on the wire.

    A CONNECT is encoded with its own ``protocol_name`` / ``protocol_version``.
    """
    return _ENCODERS[type(packet)](packet, protocol_version == MQTT_5)


def _frame(first_byte: int, body: bytes) -> bytes:
    return bytes((first_byte,)) + encode_varint(len(body)) + body


def _packet_id(packet_id: int | None) -> bytes:
    if packet_id is None or not 0 < packet_id <= 0xFFFF:
        raise ValueError(f"packet identifier must be 1..65535, got {packet_id}")
    return encode_u16(packet_id)


def _publish_header(
    topic: str, payload: bytes, qos: int, retain: bool, dup: bool, properties: Properties | None, v5: bool
) -> tuple[bytes, bytes]:
    """(fixed header + topic name, v5 properties): a PUBLISH frame is these, the packet id, the payload.

    Runs once per message routed (fan-in encodes every message for its subscriber), so it makes no call to
    the general helpers in the common case (a topic under 64 KiB without U+0000, a remaining length under
    128): one ``bytes`` of four values and one concatenation.
    """
    if not 0 <= qos <= 2:
        raise ValueError(f"QoS must be 0, 1 or 2, got {qos}")
    topic_bytes = topic.encode()
    size = len(topic_bytes)
    if size > 0xFFFF or "\x00" in topic:
        encode_utf8(topic)  # raises ValueError saying why
    if not v5:
        props = b""
    elif properties is None:
        props = b"\x00"  # property length 0
    else:
        props = encode_properties(properties)
    length = size + 2 + len(props) + len(payload) + (2 if qos else 0)
    first = 0x30 | ((dup and qos > 0) << 3) | (qos << 1) | retain
    if length < 0x80:
        return bytes((first, length, size >> 8, size & 0xFF)) + topic_bytes, props
    return bytes((first,)) + encode_varint(length) + bytes((size >> 8, size & 0xFF)) + topic_bytes, props


def _encode_publish(packet: Publish, v5: bool) -> bytes:
    head, props = _publish_header(
        packet.topic, packet.payload, packet.qos, packet.retain, packet.dup, packet.properties, v5
    )
    if packet.qos:
        return b"".join((head, _packet_id(packet.packet_id), props, packet.payload))
    return b"".join((head, props, packet.payload))


class PublishTemplate:
    """One PUBLISH encoded once for many subscribers of the same protocol version.

    For QoS 0, ``head`` is the whole frame and every subscriber gets that same ``bytes`` object. For QoS 1
    and 2 a subscriber's frame is ``head + packet_id (2 bytes) + tail``; ``parts(packet_id)`` gives the
    three pieces for ``transport.writelines`` so the payload is never copied per subscriber. v5 properties
    (subscription identifiers, topic alias) belong to the template: subscribers that need different ones
    need their own template.

    Shared by every subscriber of its variant, so never changed once made (``Final``). A plain class with
    slots rather than a frozen dataclass: one is made per message routed, and a frozen dataclass sets each
    field through ``object.__setattr__``, a call per field.
    """

    __slots__ = ("head", "qos", "tail")

    def __init__(self, qos: int, head: bytes, tail: bytes = b"") -> None:
        self.qos: Final = qos
        self.head: Final = head
        self.tail: Final = tail

    def __repr__(self) -> str:
        return f"PublishTemplate(qos={self.qos}, head={self.head!r}, tail={self.tail!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PublishTemplate):
            return NotImplemented
        return (self.qos, self.head, self.tail) == (other.qos, other.head, other.tail)

    def __hash__(self) -> int:
        return hash((self.qos, self.head, self.tail))

    @property
    def first_byte(self) -> int:
        return self.head[0]

    def frame(self, packet_id: int | None = None) -> bytes:
        if not self.qos:
            return self.head
        return b"".join((self.head, _packet_id(packet_id), self.tail))

    def parts(self, packet_id: int | None = None) -> tuple[bytes, ...]:
        if not self.qos:
            return (self.head,)
        return (self.head, _packet_id(packet_id), self.tail)

    def with_flags(self, *, dup: bool | None = None, retain: bool | None = None) -> "PublishTemplate":
        """The same message with other DUP / RETAIN bits (e.g. a DUP redelivery); shares ``tail``."""
        first = self.head[0]
        if dup is not None:
            first = first | 0x08 if dup and self.qos else first & ~0x08
        if retain is not None:
            first = first | 0x01 if retain else first & ~0x01
        if first == self.head[0]:
            return self
        return PublishTemplate(self.qos, bytes((first,)) + self.head[1:], self.tail)


def encode_publish_template(
    topic: str,
    payload: bytes,
    protocol_version: int,
    *,
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    properties: Properties | None = None,
) -> PublishTemplate:
    """Encode a PUBLISH once so that fanout only adds a packet id per subscriber."""
    head, props = _publish_header(topic, payload, qos, retain, dup, properties, protocol_version == MQTT_5)
    if qos:
        return PublishTemplate(qos, head, props + payload if props else payload)
    return PublishTemplate(0, b"".join((head, props, payload)))


def around_packet_id(frame: bytes, payload: bytes, v5: bool) -> tuple[bytes, bytes]:
    """The bytes of a plain QoS 1/2 PUBLISH ``frame`` as received (``Publish.frame``; ``payload`` its payload,
    ``v5`` its family) before and after its packet id: the same publish to another client is the two around
    that client's packet id. The part after is ``payload`` itself in MQTT 3.1.1 (nothing copied)."""
    cut = len(frame) - len(payload) - v5  # the end of the packet id (v5: the properties' length 0 follows)
    return frame[: cut - 2], frame[cut:] if v5 else payload


def qos0_frame_of(frame: bytes, payload: bytes, v5: bool) -> bytes:
    """The QoS 0 PUBLISH of a plain QoS 1/2 PUBLISH ``frame`` as received (``Publish.frame``: neither RETAIN
    nor DUP, no properties; ``payload`` its payload, ``v5`` its family): the same frame less its packet id.

    A QoS 1 publish routed to a QoS 0 subscriber of its family is this; cutting the received bytes makes no
    topic encode or check.
    """
    header = 2  # the fixed header: its first byte and the remaining length's bytes
    while frame[header - 1] & 0x80:
        header += 1
    cut = len(frame) - len(payload) - v5  # the end of the packet id (v5: the properties' length 0 follows)
    length = len(frame) - header - 2
    head = bytes((0x30, length)) if length < 0x80 else b"\x30" + encode_varint(length)
    return b"".join((head, frame[header : cut - 2], frame[cut:] if v5 else payload))


def _encode_connect(packet: Connect, _: bool) -> bytes:
    v5 = packet.protocol_version == MQTT_5
    will = packet.will
    flags = (
        (packet.clean_start << 1) | (packet.username is not None) << 7 | (packet.password is not None) << 6
    )
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (will.retain << 5)
    parts = [
        encode_utf8(packet.protocol_name),
        bytes((packet.protocol_version, flags)),
        encode_u16(packet.keep_alive),
    ]
    if v5:
        parts.append(encode_properties(packet.properties))
    parts.append(encode_utf8(packet.client_id))
    if will is not None:
        if v5:
            parts.append(encode_properties(will.properties))
        parts += (encode_utf8(will.topic), encode_binary(will.payload))
    if packet.username is not None:
        parts.append(encode_utf8(packet.username))
    if packet.password is not None:
        parts.append(encode_binary(packet.password))
    return _frame(0x10, b"".join(parts))


def _encode_connack(packet: ConnAck, v5: bool) -> bytes:
    body = bytes((packet.session_present, packet.reason_code))
    if v5:
        body += encode_properties(packet.properties)
    return _frame(0x20, body)


def _encode_reason_and_properties(
    first_byte: int, prefix: bytes, reason_code: int, properties: Properties | None, v5: bool
) -> bytes:
    """Acks, DISCONNECT, AUTH: ``prefix``, then in v5 a reason code and properties, left out when empty."""
    if not v5 or (reason_code == 0 and properties is None):
        return _frame(first_byte, prefix)
    if properties is None:
        return _frame(first_byte, prefix + bytes((reason_code,)))
    return _frame(first_byte, prefix + bytes((reason_code,)) + encode_properties(properties))


_PUBACK_SUCCESS = (_T.PUBACK << 28) | (2 << 16)
_PACK_U32 = struct.Struct(">L").pack


def encode_puback_success(packet_id: int) -> bytes:
    """A PUBACK with reason code 0 and no properties, the acknowledgement of every QoS 1 publish accepted:
    the same four bytes in MQTT 3.1, 3.1.1 and 5 (v5's short form), made without a ``PubAck`` (one pack:
    a device's every publish is answered so)."""
    if not 0 < packet_id <= 0xFFFF:
        raise ValueError(f"packet identifier must be 1..65535, got {packet_id}")
    return _PACK_U32(_PUBACK_SUCCESS | packet_id)


_PUBACK_CODED = bytes((_T.PUBACK << 4, 3))


def encode_puback_coded(packet_id: int, reason_code: int) -> bytes:
    """An MQTT 5 PUBACK with a reason code and no properties (0x10 No matching subscribers: every publish
    of a device nobody subscribes to), made without a ``PubAck``."""
    return _PUBACK_CODED + _packet_id(packet_id) + _REASON_BYTES[reason_code]


_REASON_BYTES = [bytes((code,)) for code in range(256)]


def encode_pubacks(packet_ids: Sequence[int], reason_code: int = 0, v5: bool = False) -> bytes:
    """The PUBACKs of several accepted QoS 1 publishes back to back, made in one call: `reason_code` 0, or
    0x10 (no matching subscribers), which only MQTT 5 sends (older versions get the four-byte success)."""
    count = len(packet_ids)
    if count and (min(packet_ids) < 1 or max(packet_ids) > 0xFFFF):
        raise ValueError(f"packet identifiers must be 1..65535, got {list(packet_ids)}")
    if reason_code and v5:
        return struct.pack(f">{count * 'HHB'}", *_interleave(packet_ids, 0x4003, reason_code))
    return struct.pack(f">{count}L", *[_PUBACK_SUCCESS | packet_id for packet_id in packet_ids])


def _interleave(packet_ids: Sequence[int], head: int, reason_code: int) -> list[int]:
    values: list[int] = []
    for packet_id in packet_ids:
        values += (head, packet_id, reason_code)
    return values


def _publish_ack_encoder(first_byte: int):
    def encode_ack(packet: PubAck | PubRec | PubRel | PubComp, v5: bool) -> bytes:
        return _encode_reason_and_properties(
            first_byte, _packet_id(packet.packet_id), packet.reason_code, packet.properties, v5
        )

    return encode_ack


def _encode_subscribe(packet: Subscribe, v5: bool) -> bytes:
    parts = [_packet_id(packet.packet_id)]
    if v5:
        parts.append(encode_properties(packet.properties))
    for sub in packet.subscriptions:
        options = sub.qos
        if v5:
            options |= (sub.no_local << 2) | (sub.retain_as_published << 3) | (sub.retain_handling << 4)
        parts += (encode_utf8(sub.topic_filter), bytes((options,)))
    return _frame(0x82, b"".join(parts))


def _encode_suback(packet: SubAck, v5: bool) -> bytes:
    props = encode_properties(packet.properties) if v5 else b""
    return _frame(0x90, _packet_id(packet.packet_id) + props + bytes(packet.reason_codes))


def _encode_unsubscribe(packet: Unsubscribe, v5: bool) -> bytes:
    parts = [_packet_id(packet.packet_id)]
    if v5:
        parts.append(encode_properties(packet.properties))
    parts += (encode_utf8(topic_filter) for topic_filter in packet.topic_filters)
    return _frame(0xA2, b"".join(parts))


def _encode_unsuback(packet: UnsubAck, v5: bool) -> bytes:
    if not v5:
        return _frame(0xB0, _packet_id(packet.packet_id))
    body = _packet_id(packet.packet_id) + encode_properties(packet.properties) + bytes(packet.reason_codes)
    return _frame(0xB0, body)


def _encode_disconnect(packet: Disconnect, v5: bool) -> bytes:
    return _encode_reason_and_properties(0xE0, b"", packet.reason_code, packet.properties, v5)


def _encode_auth(packet: Auth, v5: bool) -> bytes:
    if not v5:
        raise ValueError("AUTH exists only in MQTT 5")
    return _encode_reason_and_properties(0xF0, b"", packet.reason_code, packet.properties, v5)


_ENCODERS = {
    Connect: _encode_connect,
    ConnAck: _encode_connack,
    Publish: _encode_publish,
    PubAck: _publish_ack_encoder(_T.PUBACK << 4),
    PubRec: _publish_ack_encoder(_T.PUBREC << 4),
    PubRel: _publish_ack_encoder(_T.PUBREL << 4 | 0b0010),
    PubComp: _publish_ack_encoder(_T.PUBCOMP << 4),
    Subscribe: _encode_subscribe,
    SubAck: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    UnsubAck: _encode_unsuback,
    PingReq: lambda packet, v5: _PINGREQ_FRAME,
    PingResp: lambda packet, v5: _PINGRESP_FRAME,
    Disconnect: _encode_disconnect,
    Auth: _encode_auth,
}
