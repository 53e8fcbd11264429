"""MQTT 5 properties: one attribute per property, decoded and encoded through one id table."""

from dataclasses import dataclass, field, fields
from enum import IntEnum


@dataclass(slots=True)
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
        return all(
            not getattr(self, f.name) if f.name in _LIST_ATTRS else getattr(self, f.name) is None
            for f in fields(self)
        )


_LIST_ATTRS = frozenset({"subscription_identifiers", "user_properties"})


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
    boolean: bool = False
    """Only 0 or 1 is allowed."""
    nonzero: bool = False
    """0 is a protocol error."""
    repeatable: bool = False
    """May appear more than once (user property; subscription identifier in PUBLISH)."""


def _spec(
    identifier: int, name: str, kind: PropertyType, packets: tuple[int, ...], **flags: bool
) -> PropertySpec:
    return PropertySpec(identifier, name, kind, frozenset(packets), **flags)


_T = PropertyType
PROPERTY_SPECS: tuple[PropertySpec, ...] = (
    _spec(0x01, "payload_format_indicator", _T.BYTE, (_PUBLISH, WILL), boolean=True),
    _spec(0x02, "message_expiry_interval", _T.FOUR_BYTE_INT, (_PUBLISH, WILL)),
    _spec(0x03, "content_type", _T.UTF8, (_PUBLISH, WILL)),
    _spec(0x08, "response_topic", _T.UTF8, (_PUBLISH, WILL)),
    _spec(0x09, "correlation_data", _T.BINARY, (_PUBLISH, WILL)),
    _spec(0x0B, "subscription_identifiers", _T.VARINT, (_PUBLISH, _SUBSCRIBE), nonzero=True, repeatable=True),
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
    _spec(0x23, "topic_alias", _T.TWO_BYTE_INT, (_PUBLISH,), nonzero=True),
    _spec(0x24, "maximum_qos", _T.BYTE, (_CONNACK,), boolean=True),
    _spec(0x25, "retain_available", _T.BYTE, (_CONNACK,), boolean=True),
    _spec(0x26, "user_properties", _T.UTF8_PAIR, _ALL_WITH_PROPERTIES, repeatable=True),
    _spec(0x27, "maximum_packet_size", _T.FOUR_BYTE_INT, (_CONNECT, _CONNACK), nonzero=True),
    _spec(0x28, "wildcard_subscription_available", _T.BYTE, (_CONNACK,), boolean=True),
    _spec(0x29, "subscription_identifier_available", _T.BYTE, (_CONNACK,), boolean=True),
    _spec(0x2A, "shared_subscription_available", _T.BYTE, (_CONNACK,), boolean=True),
)
PROPERTIES_BY_ID: dict[int, PropertySpec] = {spec.identifier: spec for spec in PROPERTY_SPECS}
PROPERTIES_BY_NAME: dict[str, PropertySpec] = {spec.name: spec for spec in PROPERTY_SPECS}
