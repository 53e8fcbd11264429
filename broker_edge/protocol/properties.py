"""MQTT 5 properties: one attribute per property, decoded and encoded through one id table."""

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any

from .errors import MalformedPacket, ProtocolError, TooManyElements
from .reason_codes import ReasonCode
from .wire import (
    encode_binary,
    encode_u16,
    encode_utf8,
    encode_varint,
    read_binary,
    read_u8,
    read_u16,
    read_u32,
    read_utf8,
    read_varint,
)


@dataclass(slots=True, repr=False)
class Properties:
    """The MQTT 5 properties of one packet or will; an attribute is None when the property is absent."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: list[int] = field(default_factory=list)
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def is_empty(self) -> bool:
        """True when no property is set: such a Properties encodes like ``None``."""
        return not self._present()

    def _present(self) -> list[str]:
        return [
            f"{f.name}={value!r}"
            for f in fields(self)
            if (value := getattr(self, f.name)) is not None and value != []
        ]

    def __repr__(self) -> str:
        return f"Properties({', '.join(self._present())})"


class PropertyType(IntEnum):
    """Wire data type of a property value (spec 1.5)."""

    BYTE = 1
    TWO_BYTE_INT = 2
    FOUR_BYTE_INT = 3
    VARINT = 4
    UTF8 = 5
    BINARY = 6
    UTF8_PAIR = 7


WILL = 0
"""Pseudo packet type for the will properties inside CONNECT."""

_CONNECT, _CONNACK, _PUBLISH, _PUBACK, _PUBREC, _PUBREL, _PUBCOMP = 1, 2, 3, 4, 5, 6, 7
_SUBSCRIBE, _SUBACK, _UNSUBSCRIBE, _UNSUBACK, _DISCONNECT, _AUTH = 8, 9, 10, 11, 14, 15
_ACKS = (_PUBACK, _PUBREC, _PUBREL, _PUBCOMP, _SUBACK, _UNSUBACK)
_ALL_WITH_PROPERTIES = (
    WILL,
    _CONNECT,
    _CONNACK,
    _PUBLISH,
    *_ACKS,
    _SUBSCRIBE,
    _UNSUBSCRIBE,
    _DISCONNECT,
    _AUTH,
)


@dataclass(frozen=True, slots=True)
class PropertySpec:
    """One row of the property table (spec 2.2.2.2)."""

    identifier: int
    name: str
    type: PropertyType
    packet_types: frozenset[int]
    topic_name: bool = False
    """The value is a topic name: non-empty, no wildcards (a protocol error otherwise)."""
    boolean: bool = False
    """Only 0 or 1 is allowed."""
    nonzero: bool = False
    """0 is a protocol error, reported with ``zero_reason_code``."""
    zero_reason_code: int = ReasonCode.PROTOCOL_ERROR
    repeatable_in: frozenset[int] = frozenset()
    """Packet types where it may appear more than once; such a property is a list attribute."""


def payload_format_holds(props: Properties | None, payload: bytes | memoryview) -> bool:
    """Whether ``payload`` is what its Payload Format Indicator says: with 1, UTF-8 (MQTT 3.3.2.3.2 and
    3.1.3.2.3), which a receiver may check and answer 0x99 for (Payload format invalid); anything without."""
    if props is None or props.payload_format_indicator != 1:
        return True
    try:
        str(payload, "utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _spec(
    identifier: int,
    name: str,
    kind: PropertyType,
    packets: tuple[int, ...],
    repeatable_in: tuple[int, ...] = (),
    *,
    topic_name: bool = False,
    boolean: bool = False,
    nonzero: bool = False,
    zero_reason_code: int = ReasonCode.PROTOCOL_ERROR,
) -> PropertySpec:
    return PropertySpec(
        identifier,
        name,
        kind,
        frozenset(packets),
        topic_name,
        boolean,
        nonzero,
        zero_reason_code,
        repeatable_in=frozenset(repeatable_in),
    )


_T = PropertyType
PROPERTY_SPECS: tuple[PropertySpec, ...] = (
    _spec(0x01, "payload_format_indicator", _T.BYTE, (_PUBLISH, WILL), boolean=True),
    _spec(0x02, "message_expiry_interval", _T.FOUR_BYTE_INT, (_PUBLISH, WILL)),
    _spec(0x03, "content_type", _T.UTF8, (_PUBLISH, WILL)),
    _spec(0x08, "response_topic", _T.UTF8, (_PUBLISH, WILL), topic_name=True),
    _spec(0x09, "correlation_data", _T.BINARY, (_PUBLISH, WILL)),
    _spec(0x0B, "subscription_identifiers", _T.VARINT, (_PUBLISH, _SUBSCRIBE), (_PUBLISH,), nonzero=True),
    _spec(0x11, "session_expiry_interval", _T.FOUR_BYTE_INT, (_CONNECT, _CONNACK, _DISCONNECT)),
    _spec(0x12, "assigned_client_identifier", _T.UTF8, (_CONNACK,)),
    _spec(0x13, "server_keep_alive", _T.TWO_BYTE_INT, (_CONNACK,)),
    _spec(0x15, "authentication_method", _T.UTF8, (_CONNECT, _CONNACK, _AUTH)),
    _spec(0x16, "authentication_data", _T.BINARY, (_CONNECT, _CONNACK, _AUTH)),
    _spec(0x17, "request_problem_information", _T.BYTE, (_CONNECT,), boolean=True),
    _spec(0x18, "will_delay_interval", _T.FOUR_BYTE_INT, (WILL,)),
    _spec(0x19, "request_response_information", _T.BYTE, (_CONNECT,), boolean=True),
    _spec(0x1A, "response_information", _T.UTF8, (_CONNACK,)),
    _spec(0x1C, "server_reference", _T.UTF8, (_CONNACK, _DISCONNECT)),
    _spec(0x1F, "reason_string", _T.UTF8, (_CONNACK, *_ACKS, _DISCONNECT, _AUTH)),
    _spec(0x21, "receive_maximum", _T.TWO_BYTE_INT, (_CONNECT, _CONNACK), nonzero=True),
    _spec(0x22, "topic_alias_maximum", _T.TWO_BYTE_INT, (_CONNECT, _CONNACK)),
    _spec(
        0x23,
        "topic_alias",
        _T.TWO_BYTE_INT,
        (_PUBLISH,),
        nonzero=True,
        zero_reason_code=ReasonCode.TOPIC_ALIAS_INVALID,
    ),
    _spec(0x24, "maximum_qos", _T.BYTE, (_CONNACK,), boolean=True),
    _spec(0x25, "retain_available", _T.BYTE, (_CONNACK,), boolean=True),
    _spec(0x26, "user_properties", _T.UTF8_PAIR, _ALL_WITH_PROPERTIES, _ALL_WITH_PROPERTIES),
    _spec(0x27, "maximum_packet_size", _T.FOUR_BYTE_INT, (_CONNECT, _CONNACK), nonzero=True),
    _spec(0x28, "wildcard_subscription_available", _T.BYTE, (_CONNACK,), boolean=True),
    _spec(0x29, "subscription_identifier_available", _T.BYTE, (_CONNACK,), boolean=True),
    _spec(0x2A, "shared_subscription_available", _T.BYTE, (_CONNACK,), boolean=True),
)
PROPERTIES_BY_ID: dict[int, PropertySpec] = {spec.identifier: spec for spec in PROPERTY_SPECS}
PROPERTIES_BY_NAME: dict[str, PropertySpec] = {spec.name: spec for spec in PROPERTY_SPECS}


def _read_byte(buf, view: memoryview, pos: int, end: int) -> tuple[int, int]:
    return read_u8(buf, pos, end)


def _read_two(buf, view: memoryview, pos: int, end: int) -> tuple[int, int]:
    return read_u16(buf, pos, end)


def _read_four(buf, view: memoryview, pos: int, end: int) -> tuple[int, int]:
    return read_u32(buf, pos, end)


def _read_varint(buf, view: memoryview, pos: int, end: int) -> tuple[int, int]:
    return read_varint(buf, pos, end)


def _read_pair(buf, view: memoryview, pos: int, end: int) -> tuple[tuple[str, str], int]:
    key, pos = read_utf8(buf, view, pos, end)
    value, pos = read_utf8(buf, view, pos, end)
    return (key, value), pos


def _encode_pair(pair: tuple[str, str]) -> bytes:
    return encode_utf8(pair[0]) + encode_utf8(pair[1])


_READERS: dict[PropertyType, Callable[..., tuple[Any, int]]] = {
    _T.BYTE: _read_byte,
    _T.TWO_BYTE_INT: _read_two,
    _T.FOUR_BYTE_INT: _read_four,
    _T.VARINT: _read_varint,
    _T.UTF8: read_utf8,
    _T.BINARY: read_binary,
    _T.UTF8_PAIR: _read_pair,
}
_WRITERS: dict[PropertyType, Callable[[Any], bytes]] = {
    _T.BYTE: lambda value: bytes((value,)),
    _T.TWO_BYTE_INT: encode_u16,
    _T.FOUR_BYTE_INT: lambda value: value.to_bytes(4, "big"),
    _T.VARINT: encode_varint,
    _T.UTF8: encode_utf8,
    _T.BINARY: encode_binary,
    _T.UTF8_PAIR: _encode_pair,
}
_DECODE_TABLE = {spec.identifier: (spec, spec.name, _READERS[spec.type]) for spec in PROPERTY_SPECS}
_ENCODE_TABLE = tuple(
    (spec.name, bytes((spec.identifier,)), _WRITERS[spec.type], bool(spec.repeatable_in))
    for spec in PROPERTY_SPECS
)


def decode_properties(
    buf, view: memoryview, pos: int, end: int, packet_type: int, most_repeated: int = sys.maxsize
) -> tuple[Properties | None, int]:
    """Read a property length and the properties after it; None when the length is 0.

    ``packet_type`` is the control packet type, or ``WILL`` for will properties. An unknown property or
    one not allowed on ``packet_type`` is malformed; a duplicate or an out-of-range value is a protocol
    error (spec 2.2.2.2, 3.x.2.x). More than ``most_repeated`` values of one repeatable property (user
    properties) raise ``TooManyElements`` as the one past it is read.
    """
    length, pos = read_varint(buf, pos, end)
    if length == 0:
        return None, pos
    stop = pos + length
    if stop > end:
        raise MalformedPacket("property length runs past the end of the packet")
    props = Properties()
    while pos < stop:
        entry = _DECODE_TABLE.get(buf[pos])
        if entry is None:
            raise MalformedPacket(f"unknown property identifier 0x{buf[pos]:02X}")
        spec, name, reader = entry
        if packet_type not in spec.packet_types:
            raise MalformedPacket(f"property {name} is not allowed on this packet")
        value, pos = reader(buf, view, pos + 1, stop)
        if (spec.boolean and value > 1) or (spec.nonzero and value == 0):
            _raise_out_of_range(spec, value)
        if spec.topic_name and (not value or "+" in value or "#" in value):
            raise ProtocolError(f"property {name} is not a valid topic name: {value!r}")
        if spec.repeatable_in:
            values = getattr(props, name)
            if values and packet_type not in spec.repeatable_in:
                raise ProtocolError(f"property {name} appears more than once")
            if len(values) >= most_repeated:
                raise TooManyElements(name, most_repeated)
            values.append(value)
        elif getattr(props, name) is not None:
            raise ProtocolError(f"property {name} appears more than once")
        else:
            setattr(props, name, value)
    return props, stop


def _raise_out_of_range(spec: PropertySpec, value: int) -> None:
    if spec.boolean:
        raise ProtocolError(f"property {spec.name} must be 0 or 1, got {value}")
    raise ProtocolError(f"property {spec.name} must not be 0", spec.zero_reason_code)


def encode_properties(props: Properties | None) -> bytes:
    """Property length followed by the properties, in identifier order; ``None`` encodes as length 0."""
    if props is None:
        return b"\x00"
    parts: list[bytes] = []
    for name, identifier, writer, is_list in _ENCODE_TABLE:
        value = getattr(props, name)
        if is_list:
            parts.extend(identifier + writer(item) for item in value)
        elif value is not None:
            parts.append(identifier + writer(value))
    body = b"".join(parts)
    return encode_varint(len(body)) + body
