"""MQTT control packets as plain slots dataclasses, shared by the codec, the handlers and the tests.

One class per control packet type, valid for MQTT 3.1, 3.1.1 and 5.0. Fields that only exist in v5
(reason codes on acks, ``properties``) keep their defaults in v3 traffic. ``properties`` is ``None`` when
the packet carries no MQTT 5 properties, so v3 traffic never allocates a ``Properties`` object.
"""

from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar

from .properties import Properties


class PacketType(IntEnum):
    """Control packet type, the high nibble of the first byte."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


MQTT_3_1 = 3
MQTT_3_1_1 = 4
MQTT_5 = 5
PROTOCOL_NAMES = {MQTT_3_1: "MQIsdp", MQTT_3_1_1: "MQTT", MQTT_5: "MQTT"}
"""The protocol name each supported protocol level must come with."""


@dataclass(slots=True)
class Will:
    """The will message of a CONNECT; ``properties`` are the v5 will properties."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties | None = None


@dataclass(slots=True)
class Connect:
    packet_type: ClassVar[PacketType] = PacketType.CONNECT
    protocol_name: str = "MQTT"
    protocol_version: int = MQTT_3_1_1
    clean_start: bool = True
    keep_alive: int = 60
    client_id: str = ""
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties | None = None


@dataclass(slots=True)
class ConnAck:
    """``reason_code`` is the v5 reason code, or the v3 return code (see ``ConnectReturnCode``)."""

    packet_type: ClassVar[PacketType] = PacketType.CONNACK
    session_present: bool = False
    reason_code: int = 0
    properties: Properties | None = None


@dataclass(slots=True)
class Publish:
    """``packet_id`` is None iff ``qos`` is 0; ``topic`` is "" in v5 when only a topic alias is sent."""

    packet_type: ClassVar[PacketType] = PacketType.PUBLISH
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties | None = None
    frame: bytes | None = field(default=None, compare=False, repr=False)
    """Decoded: the whole frame as received, when it has no properties and neither RETAIN nor DUP: then it
    is what a subscriber of its protocol version at QoS 0 is sent (at its QoS 1 or 2, the same with the
    subscriber's packet id), and the broker need not encode it again."""


@dataclass(slots=True)
class PublishesAlike:
    """Decoded only, by a decoder that hands runs (``PacketDecoder.hands_runs``, a broker's): two or more
    PUBLISHes read back to back that begin with the same bytes up to the end of their topic (``first``'s:
    the same fixed header and topic) and carry no properties, as one packet: for each ``i``,
    ``Publish(first.topic, payloads[i], first.qos, first.retain, first.dup, packet_ids[i], None, frames[i])``
    without an object each (``frames`` is None when ``first.frame`` is). A client streaming on one topic sends
    them."""

    packet_type: ClassVar[PacketType] = PacketType.PUBLISH
    first: Publish
    packet_ids: list[int | None]
    payloads: list[bytes]
    frames: list[bytes] | None
    head: bytes
    """The bytes each of them begins with: its fixed header and topic, up to its packet id (at QoS 0 its
    payload, in MQTT 5 its properties' length)."""

    def __len__(self) -> int:
        return len(self.payloads)

    @property
    def topic(self) -> str:
        return self.first.topic

    @property
    def qos(self) -> int:
        return self.first.qos

    @property
    def frame(self) -> bytes | None:
        """The first one's frame (None: none of them has one)."""
        return self.first.frame

    def publishes(self) -> list[Publish]:
        """Each of them as a ``Publish``, in order."""
        first = self.first
        topic, qos, retain, dup = first.topic, first.qos, first.retain, first.dup
        frames = self.frames if self.frames is not None else [None] * len(self.payloads)
        return [
            Publish(topic, payload, qos, retain, dup, packet_id, None, frame)
            for payload, packet_id, frame in zip(self.payloads, self.packet_ids, frames, strict=True)
        ]


@dataclass(slots=True)
class PubAck:
    packet_type: ClassVar[PacketType] = PacketType.PUBACK
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None


@dataclass(slots=True)
class PubAckRun:
    """Decoded only, by a server decoder: a read made of nothing but two or more PUBACKs without a reason
    code (a QoS 1 subscriber's acknowledgements read together), as one packet: ``PubAck(packet_id)`` for each
    of ``packet_ids``, in order, without an object each."""

    packet_type: ClassVar[PacketType] = PacketType.PUBACK
    packet_ids: list[int]


@dataclass(slots=True)
class PubRec:
    packet_type: ClassVar[PacketType] = PacketType.PUBREC
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None


@dataclass(slots=True)
class PubRel:
    packet_type: ClassVar[PacketType] = PacketType.PUBREL
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None


@dataclass(slots=True)
class PubComp:
    packet_type: ClassVar[PacketType] = PacketType.PUBCOMP
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None


class RetainHandling(IntEnum):
    """v5 subscription option: when retained messages are sent on SUBSCRIBE."""

    SEND_ON_SUBSCRIBE = 0
    SEND_IF_NEW_SUBSCRIPTION = 1
    DO_NOT_SEND = 2


@dataclass(slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE; in v3 only ``qos`` is on the wire, the rest keep their defaults."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = RetainHandling.SEND_ON_SUBSCRIBE


@dataclass(slots=True)
class Subscribe:
    packet_type: ClassVar[PacketType] = PacketType.SUBSCRIBE
    packet_id: int
    subscriptions: list[Subscription] = field(default_factory=list)
    properties: Properties | None = None


@dataclass(slots=True)
class SubAck:
    """One reason code per subscription: the granted QoS, or a failure (0x80 in v3)."""

    packet_type: ClassVar[PacketType] = PacketType.SUBACK
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties | None = None


@dataclass(slots=True)
class Unsubscribe:
    packet_type: ClassVar[PacketType] = PacketType.UNSUBSCRIBE
    packet_id: int
    topic_filters: list[str] = field(default_factory=list)
    properties: Properties | None = None


@dataclass(slots=True)
class UnsubAck:
    """``reason_codes`` is empty in v3, where UNSUBACK carries only the packet id."""

    packet_type: ClassVar[PacketType] = PacketType.UNSUBACK
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties | None = None


@dataclass(slots=True)
class PingReq:
    packet_type: ClassVar[PacketType] = PacketType.PINGREQ


@dataclass(slots=True)
class PingResp:
    packet_type: ClassVar[PacketType] = PacketType.PINGRESP


@dataclass(slots=True)
class Disconnect:
    """In v3 DISCONNECT is client-only and carries nothing: ``reason_code`` stays 0."""

    packet_type: ClassVar[PacketType] = PacketType.DISCONNECT
    reason_code: int = 0
    properties: Properties | None = None


@dataclass(slots=True)
class Auth:
    """v5 only: enhanced authentication exchange."""

    packet_type: ClassVar[PacketType] = PacketType.AUTH
    reason_code: int = 0
    properties: Properties | None = None


Packet = (
    Connect
    | ConnAck
    | Publish
    | PublishesAlike
    | PubAck
    | PubAckRun
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
"""Any control packet."""
