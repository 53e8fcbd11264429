"""Sans-IO MQTT decoder: bytes in, packets out, one decoder per connection (h11 style).

A server connection past CONNECT with no packet half-read needs no decoder of its own: it uses the
``SharedDecoder`` of its protocol version and packet size (``shared_decoder``) and ``detach``es a decoder of
its own when a read ends inside a packet.

The decoder owns the CONNECT handshake as far as framing goes: on the server side the first packet must be
CONNECT (anything else is a ``ProtocolError`` raised from the fixed header alone), the protocol level of that
CONNECT decides how every later packet is decoded, and a second CONNECT is a ``ProtocolError``. Everything
the specs make normative about a single packet is checked here; what needs session state (topic alias
maximum, receive maximum, packet ids in flight, topic filter syntax so SUBACK can answer 0x8F per filter)
is left to the session layer.

One packet comes out for each packet in, with two exceptions: a server decoder given a read that holds
nothing but PUBACKs without a reason code gives one ``PubAckRun`` for them all, and a broker's decoder
(``hands_runs``) gives PUBLISHes read together that begin alike as one ``PublishesAlike``.
"""

import sys
from typing import ClassVar, Literal, TypeVar

from . import reason_codes as rc
from .errors import (
    InvalidTopic,
    MalformedPacket,
    MQTTError,
    PacketTooLarge,
    ProtocolError,
    TooManyElements,
    UnsupportedProtocolVersion,
)
from .packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    PROTOCOL_NAMES,
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
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from .properties import WILL, Properties, decode_properties
from .read_together import pubacks_read_together, read_alike
from .wire import MAX_VARINT, read_binary, read_u8, read_u16, read_utf8

Role = Literal["server", "client"]
MAX_PACKET_SIZE = MAX_VARINT + 5
"""The largest packet MQTT can frame: 1 type byte, 4 length bytes, 268435455 bytes of body."""

_T = PacketType
_FROM_CLIENT = frozenset(
    {_T.CONNECT, _T.PUBLISH, _T.PUBACK, _T.PUBREC, _T.PUBREL, _T.PUBCOMP, _T.SUBSCRIBE, _T.UNSUBSCRIBE}
    | {_T.PINGREQ, _T.DISCONNECT, _T.AUTH}
)
_FROM_SERVER = frozenset(
    {_T.CONNACK, _T.PUBLISH, _T.PUBACK, _T.PUBREC, _T.PUBREL, _T.PUBCOMP, _T.SUBACK, _T.UNSUBACK}
    | {_T.PINGRESP, _T.DISCONNECT, _T.AUTH}
)
_FIXED_FLAGS: dict[int, int] = {_T.PUBREL: 0b0010, _T.SUBSCRIBE: 0b0010, _T.UNSUBSCRIBE: 0b0010}
_SUPPORTED_VERSIONS = (MQTT_3_1, MQTT_3_1_1, MQTT_5)
_SHARE_PREFIX = "$share/"
_Own = TypeVar("_Own", bound="PacketDecoder")


def _valid_first_bytes(packet_types: frozenset[int]) -> frozenset[int]:
    """Every first byte (type and flags) that is well-formed for these packet types."""
    valid = set()
    for packet_type in packet_types:
        if packet_type == _T.PUBLISH:
            for flags in range(16):
                qos = (flags >> 1) & 3
                if qos != 3 and (qos or not flags & 0b1000):
                    valid.add(0x30 | flags)
        else:
            valid.add(packet_type << 4 | _FIXED_FLAGS.get(packet_type, 0))
    return frozenset(valid)


_BEFORE_CONNECT = frozenset({0x10})
_ACCEPTED_FIRST_BYTES: dict[tuple[str, int], frozenset[int]] = {
    ("server", MQTT_3_1): _valid_first_bytes(_FROM_CLIENT - {_T.CONNECT, _T.AUTH}),
    ("server", MQTT_3_1_1): _valid_first_bytes(_FROM_CLIENT - {_T.CONNECT, _T.AUTH}),
    ("server", MQTT_5): _valid_first_bytes(_FROM_CLIENT - {_T.CONNECT}),
    ("client", MQTT_3_1): _valid_first_bytes(_FROM_SERVER - {_T.AUTH, _T.DISCONNECT}),
    ("client", MQTT_3_1_1): _valid_first_bytes(_FROM_SERVER - {_T.AUTH, _T.DISCONNECT}),
    ("client", MQTT_5): _valid_first_bytes(_FROM_SERVER),
}


_TOPIC_NAMES: dict[bytes, str] = {}
"""Topic names decoded and found valid (non-empty, no wildcard, no U+0000), by their bytes: a device names
the same topic in every PUBLISH, so it is decoded and checked once, and every message of it carries the same
``str`` (its hash computed once for every lookup after). Bounded: emptied when full."""
_TOPIC_NAMES_MAX = 65_536
_NO_LIMIT = sys.maxsize
"""``feed``'s count of packets: all of them."""


class PacketDecoder:
    """Turns the byte stream of one connection into packets.

    ``role="server"`` decodes what clients send (the broker); ``role="client"`` decodes what servers send
    (test clients, benchmarks) and needs ``protocol_version`` up front. A server-role decoder given a
    ``protocol_version`` starts after the handshake (a connection whose CONNECT was decoded elsewhere).
    After a ``MQTTError`` the connection must close; further ``feed`` calls raise the same error.
    """

    shared: ClassVar[bool] = False
    """True for a ``SharedDecoder`` (see ``shared_decoder``)."""

    hands_runs: ClassVar[bool] = False
    """PUBLISHes read together that begin alike come out as one ``PublishesAlike`` (a broker's decoders),
    else as a ``Publish`` each."""

    __slots__ = (
        "_accepted",
        "_error",
        "_needed",
        "_pending",
        "decoded",
        "max_connect_size",
        "max_packet_size",
        "max_subscribe_filters",
        "max_user_properties",
        "protocol_version",
        "role",
    )

    def __init__(
        self,
        max_packet_size: int = MAX_PACKET_SIZE,
        role: Role = "server",
        protocol_version: int | None = None,
        max_connect_size: int | None = None,
        max_subscribe_filters: int = _NO_LIMIT,
        max_user_properties: int = _NO_LIMIT,
    ) -> None:
        if role not in ("server", "client"):
            raise ValueError(f"role must be 'server' or 'client', not {role!r}")
        if protocol_version is not None and protocol_version not in _SUPPORTED_VERSIONS:
            raise ValueError(f"unsupported protocol version {protocol_version}")
        if role == "client" and protocol_version is None:
            raise ValueError("a client-role decoder needs the protocol_version it connected with")
        self.max_packet_size = max_packet_size
        """Largest accepted packet, fixed header included (the v5 Maximum Packet Size); may be changed."""
        self.max_connect_size = max_packet_size if max_connect_size is None else max_connect_size
        """Largest first packet (CONNECT): what an unauthenticated client may make the decoder hold."""
        self.max_subscribe_filters = max_subscribe_filters
        """Topic filters one SUBSCRIBE or UNSUBSCRIBE may hold: the one past it raises ``TooManyElements``
        before it is decoded (a packet's cost grows with its elements, not its bytes)."""
        self.max_user_properties = max_user_properties
        """User properties one property list may hold (a packet's; a will's apart), the same way."""
        self.role: Role = role
        self.protocol_version: int | None = protocol_version
        """3, 4 or 5 once CONNECT is decoded (or given); None before."""
        self._accepted = (
            _BEFORE_CONNECT if protocol_version is None else _ACCEPTED_FIRST_BYTES[role, protocol_version]
        )
        self._pending: bytes | bytearray = b""
        """The start of a packet that has not fully arrived (a bytearray only then: idle costs nothing)."""
        self._needed = 0
        self._error: MQTTError | None = None
        self.decoded = 0
        """The packets the last ``feed`` decoded, a ``PublishesAlike`` counted as each of its PUBLISHes."""

    @property
    def buffered(self) -> int:
        """Bytes held back as the start of a packet that has not fully arrived."""
        return len(self._pending)

    def take_pending(self) -> bytes:
        """The start of a packet that has not fully arrived, taken out: the decoder holds nothing then (a
        connection moving elsewhere takes them along)."""
        pending, self._pending, self._needed = bytes(self._pending), b"", 0
        return pending

    @property
    def failed(self) -> bool:
        """A packet was malformed: every further ``feed`` raises."""
        return self._error is not None

    def feed(self, data: bytes) -> list[Packet]:
        """Decode every complete packet in the bytes received so far; keep the partial rest for later."""
        return self.feed_some(data, _NO_LIMIT)[0]

    def feed_some(self, data: bytes, most: int) -> tuple[list[Packet], int]:
        """Decode at most ``most`` (1 or more) complete packets of the bytes received so far (``decoded``
        says how many: a ``PublishesAlike`` counts as each of its PUBLISHes), and the number of bytes at the
        end of ``data`` left undecoded past them (0: none, the partial rest is kept for later, as ``feed``
        keeps it). Bytes left are not kept: the caller feeds them again."""
        if self._error is not None:
            raise self._error
        if self._pending:
            self._pending += data
            if len(self._pending) < self._needed:
                self.decoded = 0
                return [], 0
            buf = bytes(self._pending)  # packets are sliced out of bytes: faster than a memoryview's slices
            self._pending = b""
        elif not data:
            self.decoded = 0
            return [], 0
        else:
            buf = data if type(data) is bytes else bytes(data)
        packets: list[Packet] = []
        try:
            pos = self._decode_all(buf, packets, most)
        except MQTTError as error:
            error.packets_before = packets
            self._error = error
            raise
        size = len(buf)
        if pos < size:
            if self.decoded >= most:  # cut at a packet's end (inside ``data``: a packet was completed)
                return packets, size - pos
            self._pending = bytearray(memoryview(buf)[pos:])
        return packets, 0

    def _decode_all(self, buf, packets: list[Packet], most: int = _NO_LIMIT) -> int:
        """Decode complete packets from ``buf`` into ``packets``, at most ``most``; return where the rest
        (incomplete, or past ``most`` packets) starts."""
        view: memoryview | None = None  # made for the first packet whose decoder reads through it
        size = len(buf)
        pos = 0
        max_packet_size = self.max_packet_size if self.protocol_version is not None else self.max_connect_size
        accepted = self._accepted
        count = 0  # packets decoded, a PublishesAlike counted as each of its PUBLISHes
        if (
            buf[0] == 0x40
            and size > 4
            and not size & 3
            and 0x40 in accepted
            and self.role == "server"
            and max_packet_size >= 4
        ):
            # checked before the loop, once a read: a QoS 1 subscriber's reads are PUBACKs and nothing else
            run = pubacks_read_together(buf)
            if run is not None:
                packets.append(run)
                self.decoded = 1
                return size
        while pos < size:
            first = buf[pos]
            if first not in accepted:
                raise self._first_byte_error(first)
            # Remaining length: checked as each byte arrives, so a bad or huge length fails before the body.
            body = pos + 1
            length = 0
            shift = 0
            while True:
                if body >= size:
                    self._needed = size - pos + 1
                    self.decoded = count
                    return pos
                byte = buf[body]
                body += 1
                length |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
                if shift == 28:
                    raise MalformedPacket("remaining length longer than 4 bytes")
            if byte == 0 and shift:
                raise MalformedPacket("remaining length not in its shortest form")
            end = body + length
            if end - pos > max_packet_size:
                raise self._too_large(buf, body, end - pos, max_packet_size)
            if end > size:
                self._needed = end - pos
                self.decoded = count
                return pos
            count += 1
            if first >> 4 == 3:  # (a device's read is often one PUBLISH: it makes no memoryview)
                publish = self._decode_publish(first, buf, body, end)
                if end < size and buf[end] == first and publish.properties is None and count < most:
                    end, alike = read_alike(
                        buf, pos, body, end, publish, self.protocol_version == MQTT_5, most - count
                    )
                    if alike is None:
                        packets.append(publish)
                    else:
                        count += len(alike.payloads) - 1
                        if self.hands_runs:
                            packets.append(alike)
                        else:
                            packets += alike.publishes()
                else:
                    packets.append(publish)
            else:
                if view is None:
                    view = memoryview(buf)
                packets.append(_BODY_DECODERS[first >> 4](self, first, buf, view, body, end))
                accepted = self._accepted  # CONNECT switches to the packets of its protocol version
                max_packet_size = self.max_packet_size
            pos = end
            if count >= most:
                break
        self.decoded = count
        return pos

    def _too_large(self, buf, body: int, size: int, most: int) -> PacketTooLarge:
        """The error for a packet of ``size`` bytes, its body starting at ``body``; before CONNECT with the
        protocol level, when the protocol name and level came along."""
        error = PacketTooLarge(f"packet of {size} bytes exceeds the maximum of {most}")
        if self.protocol_version is None and buf[body : body + 6] == b"\x00\x04MQTT" and len(buf) > body + 6:
            error.protocol_level = buf[body + 6]
        return error

    def _first_byte_error(self, first: int) -> MQTTError:
        """Say precisely why a first byte is not accepted here (the slow path of the accepted-set test)."""
        packet_type, flags = first >> 4, first & 0x0F
        if packet_type == 0:
            return MalformedPacket("packet type 0 is reserved")
        name = _T(packet_type).name
        if self.protocol_version is None and packet_type != _T.CONNECT:
            return ProtocolError(f"first packet must be CONNECT, got {name}")
        if packet_type == _T.CONNECT and self.protocol_version is not None and self.role == "server":
            return ProtocolError("second CONNECT on one connection")
        if packet_type == _T.AUTH and self.protocol_version != MQTT_5:
            return MalformedPacket("packet type 15 is reserved before MQTT 5")
        receivable = _FROM_CLIENT if self.role == "server" else _FROM_SERVER
        if packet_type not in receivable:
            return ProtocolError(f"{name} is not sent by a {'client' if self.role == 'server' else 'server'}")
        if packet_type == _T.DISCONNECT and self.role == "client":
            return ProtocolError("a server does not send DISCONNECT before MQTT 5")
        if packet_type == _T.PUBLISH:
            if (flags >> 1) & 3 == 3:
                return MalformedPacket("PUBLISH with QoS 3")
            return MalformedPacket("PUBLISH with DUP set on QoS 0")
        return MalformedPacket(f"reserved flags 0b{flags:04b} on {name}")

    # -- one method per packet type; each gets the body as buf[pos:end] -------------------------------------

    def _properties(self, buf, view: memoryview, pos: int, end: int, packet_type: int):
        if self.protocol_version != MQTT_5:
            return None, pos
        return decode_properties(buf, view, pos, end, packet_type, self.max_user_properties)

    def _decode_connect(self, first: int, buf, view: memoryview, pos: int, end: int) -> Connect:
        protocol_name, pos = read_utf8(buf, view, pos, end)
        version, pos = read_u8(buf, pos, end)
        if PROTOCOL_NAMES.get(version) != protocol_name:
            raise UnsupportedProtocolVersion(
                f"unsupported protocol {protocol_name!r} level {version}", protocol_name, version
            )
        try:
            connect = self._connect_after_level(protocol_name, version, buf, view, pos, end)
        except MQTTError as error:  # the level is known: an MQTT 5 client is told why in a CONNACK
            error.protocol_level = version
            raise
        self.protocol_version = version
        self._accepted = _ACCEPTED_FIRST_BYTES[self.role, version]
        return connect

    def _connect_after_level(
        self, protocol_name: str, version: int, buf, view: memoryview, pos: int, end: int
    ) -> Connect:
        """The rest of a CONNECT whose protocol name and level were read and match, from its flags."""
        flags, pos = read_u8(buf, pos, end)
        keep_alive, pos = read_u16(buf, pos, end)
        if flags & 0x01:
            raise MalformedPacket("CONNECT reserved flag is set")
        has_will, will_qos, will_retain = flags & 0x04, (flags >> 3) & 3, bool(flags & 0x20)
        has_password, has_username = flags & 0x40, flags & 0x80
        if will_qos == 3:
            raise MalformedPacket("will QoS 3")
        if not has_will and (will_qos or will_retain):
            raise MalformedPacket("will QoS or will retain set without a will")
        if has_password and not has_username and version == MQTT_3_1_1:
            raise MalformedPacket("password without user name")
        properties = None
        limit = self.max_user_properties
        if version == MQTT_5:
            properties, pos = decode_properties(buf, view, pos, end, _T.CONNECT, limit)
            _check_authentication(properties)
        client_id, pos = read_utf8(buf, view, pos, end)
        will = None
        if has_will:
            will_properties = None
            if version == MQTT_5:
                will_properties, pos = decode_properties(buf, view, pos, end, WILL, limit)
            will_topic, pos = read_utf8(buf, view, pos, end)
            if not will_topic or "+" in will_topic or "#" in will_topic:
                raise InvalidTopic(f"invalid will topic {will_topic!r}")
            will_payload, pos = read_binary(buf, view, pos, end)
            will = Will(will_topic, will_payload, will_qos, will_retain, will_properties)
        username = password = None
        if has_username:
            username, pos = read_utf8(buf, view, pos, end)
        if has_password:
            password, pos = read_binary(buf, view, pos, end)
        _check_consumed(pos, end, "CONNECT")
        return Connect(
            protocol_name,
            version,
            bool(flags & 0x02),
            keep_alive,
            client_id,
            will,
            username,
            password,
            properties,
        )

    def _decode_connack(self, first: int, buf, view: memoryview, pos: int, end: int) -> ConnAck:
        flags, pos = read_u8(buf, pos, end)
        code, pos = read_u8(buf, pos, end)
        if flags & 0xFE:
            raise MalformedPacket("CONNACK reserved flags are set")
        properties, pos = self._properties(buf, view, pos, end, _T.CONNACK)
        _check_consumed(pos, end, "CONNACK")
        if self.protocol_version == MQTT_5:
            _check_reason_code(code, rc.CONNACK_REASON_CODES, "CONNACK")
            _check_authentication(properties)
        elif code > rc.ConnectReturnCode.NOT_AUTHORIZED:
            raise ProtocolError(f"CONNACK return code 0x{code:02X} is reserved")
        if flags and code:
            raise ProtocolError("session present on a refused connection")
        return ConnAck(bool(flags), code, properties)

    def _decode_publish(self, first: int, buf, pos: int, end: int) -> Publish:
        """A PUBLISH's body, ``buf[pos:end]`` (called by ``_decode_all`` alone, without the memoryview the
        other decoders read through: only MQTT 5 properties need one)."""
        body = pos
        if pos + 2 > end:
            raise MalformedPacket("PUBLISH ends inside the topic length")
        stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
        if stop > end:
            raise MalformedPacket("PUBLISH topic runs past the end of the packet")
        raw = buf[pos + 2 : stop]
        known = _TOPIC_NAMES.get(raw)
        valid = True  # only valid topic names are remembered: one found is not checked again
        if known is None:
            try:
                topic = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise MalformedPacket(f"invalid UTF-8 topic name: {exc.reason}") from None
            if topic and "+" not in topic and "#" not in topic and "\x00" not in topic:
                if len(_TOPIC_NAMES) >= _TOPIC_NAMES_MAX:
                    _TOPIC_NAMES.clear()
                _TOPIC_NAMES[raw] = topic
            else:
                valid = False
        else:
            topic = known
        pos = stop
        qos = (first >> 1) & 3
        packet_id = None
        if qos:
            if pos + 2 > end:
                raise MalformedPacket("PUBLISH ends inside the packet identifier")
            packet_id = (buf[pos] << 8) | buf[pos + 1]
            pos += 2
            if not packet_id:
                raise ProtocolError("packet identifier 0")
        properties = None
        if self.protocol_version == MQTT_5:
            if pos < end and buf[pos] == 0:  # no properties: the common case, skip the table walk
                pos += 1
            else:
                properties, pos = decode_properties(
                    buf, memoryview(buf), pos, end, _T.PUBLISH, self.max_user_properties
                )
                if properties is not None and properties.subscription_identifiers and self.role == "server":
                    raise ProtocolError("a client PUBLISH must not carry a subscription identifier")
        if not valid:
            self._reject_topic_name(topic, properties)
        frame = None
        if not first & 0x09 and properties is None:  # as a subscriber of its version and QoS gets it
            length = end - body
            start = body - (2 if length < 0x80 else 3 if length < 0x4000 else 4 if length < 0x200000 else 5)
            frame = buf[start:end]
        return Publish(topic, buf[pos:end], qos, first & 1 == 1, first & 8 == 8, packet_id, properties, frame)

    def _reject_topic_name(self, topic: str, properties: Properties | None) -> None:
        if "\x00" in topic:
            raise MalformedPacket("topic name contains U+0000")
        if topic:
            raise InvalidTopic(f"wildcard in PUBLISH topic name {topic!r}")
        if self.protocol_version != MQTT_5:
            raise InvalidTopic("empty PUBLISH topic name")
        if properties is None or properties.topic_alias is None:
            raise ProtocolError("empty PUBLISH topic name without a topic alias")

    def _decode_publish_ack(self, first: int, buf, view: memoryview, pos: int, end: int):
        """PUBACK, PUBREC, PUBREL, PUBCOMP: packet id, then (v5, optional) reason code and properties."""
        packet_type = first >> 4
        if pos + 2 > end:  # ``read_u16`` inlined: a subscriber's PUBACK per QoS 1 delivery comes here
            raise MalformedPacket("packet ends inside a two-byte integer")
        packet_id = (buf[pos] << 8) | buf[pos + 1]
        pos += 2
        if not packet_id:
            raise ProtocolError("packet identifier 0")
        code = 0
        properties = None
        if pos < end:
            if self.protocol_version != MQTT_5:
                raise MalformedPacket(f"{_T(packet_type).name} longer than 2 bytes")
            code = buf[pos]
            _check_reason_code(code, _ACK_REASON_CODES[packet_type], _T(packet_type).name)
            if pos + 1 < end:
                properties, pos = decode_properties(
                    buf, view, pos + 1, end, packet_type, self.max_user_properties
                )
                _check_consumed(pos, end, _T(packet_type).name)
        return _ACK_CLASSES[packet_type](packet_id, code, properties)

    def _decode_subscribe(self, first: int, buf, view: memoryview, pos: int, end: int) -> Subscribe:
        packet_id, pos = read_u16(buf, pos, end)
        if not packet_id:
            raise ProtocolError("packet identifier 0")
        v5 = self.protocol_version == MQTT_5
        properties, pos = self._properties(buf, view, pos, end, _T.SUBSCRIBE)
        subscriptions: list[Subscription] = []
        most = self.max_subscribe_filters
        while pos < end:
            if len(subscriptions) >= most:
                raise TooManyElements("subscribe_filters", most)
            topic_filter, pos = read_utf8(buf, view, pos, end)
            options, pos = read_u8(buf, pos, end)
            qos = options & 0x03
            if qos == 3:
                raise MalformedPacket(f"QoS 3 requested for {topic_filter!r}")
            if not v5:
                if options & 0xFC:
                    raise MalformedPacket(f"reserved bits set in the requested QoS of {topic_filter!r}")
                subscriptions.append(Subscription(topic_filter, qos))
                continue
            if options & 0xC0:
                raise MalformedPacket(f"reserved subscription option bits set for {topic_filter!r}")
            retain_handling = (options >> 4) & 0x03
            if retain_handling == 3:
                raise ProtocolError(f"retain handling 3 for {topic_filter!r}")
            no_local = bool(options & 0x04)
            if no_local and topic_filter.startswith(_SHARE_PREFIX):
                raise ProtocolError(f"no local on shared subscription {topic_filter!r}")
            subscriptions.append(
                Subscription(topic_filter, qos, no_local, bool(options & 0x08), retain_handling)
            )
        if not subscriptions:
            raise ProtocolError("SUBSCRIBE without topic filters")
        return Subscribe(packet_id, subscriptions, properties)

    def _decode_suback(self, first: int, buf, view: memoryview, pos: int, end: int) -> SubAck:
        packet_id, pos = read_u16(buf, pos, end)
        if not packet_id:  # the SUBSCRIBE's, which is never 0
            raise ProtocolError("packet identifier 0")
        properties, pos = self._properties(buf, view, pos, end, _T.SUBACK)
        allowed = rc.SUBACK_REASON_CODES if self.protocol_version == MQTT_5 else rc.SUBACK_RETURN_CODES_V3
        codes = list(view[pos:end])
        for code in codes:
            _check_reason_code(code, allowed, "SUBACK")
        if not codes:
            raise ProtocolError("SUBACK without reason codes")
        return SubAck(packet_id, codes, properties)

    def _decode_unsubscribe(self, first: int, buf, view: memoryview, pos: int, end: int) -> Unsubscribe:
        packet_id, pos = read_u16(buf, pos, end)
        if not packet_id:
            raise ProtocolError("packet identifier 0")
        properties, pos = self._properties(buf, view, pos, end, _T.UNSUBSCRIBE)
        topic_filters: list[str] = []
        most = self.max_subscribe_filters
        while pos < end:
            if len(topic_filters) >= most:
                raise TooManyElements("subscribe_filters", most)
            topic_filter, pos = read_utf8(buf, view, pos, end)
            topic_filters.append(topic_filter)
        if not topic_filters:
            raise ProtocolError("UNSUBSCRIBE without topic filters")
        return Unsubscribe(packet_id, topic_filters, properties)

    def _decode_unsuback(self, first: int, buf, view: memoryview, pos: int, end: int) -> UnsubAck:
        packet_id, pos = read_u16(buf, pos, end)
        if not packet_id:  # the UNSUBSCRIBE's, which is never 0
            raise ProtocolError("packet identifier 0")
        if self.protocol_version != MQTT_5:
            _check_consumed(pos, end, "UNSUBACK")
            return UnsubAck(packet_id)
        properties, pos = self._properties(buf, view, pos, end, _T.UNSUBACK)
        codes = list(view[pos:end])
        for code in codes:
            _check_reason_code(code, rc.UNSUBACK_REASON_CODES, "UNSUBACK")
        if not codes:
            raise ProtocolError("UNSUBACK without reason codes")
        return UnsubAck(packet_id, codes, properties)

    def _decode_ping(self, first: int, buf, view: memoryview, pos: int, end: int) -> PingReq | PingResp:
        _check_consumed(pos, end, "PINGREQ/PINGRESP")
        return PingReq() if first >> 4 == _T.PINGREQ else PingResp()

    def _decode_disconnect(self, first: int, buf, view: memoryview, pos: int, end: int) -> Disconnect:
        code, properties = self._reason_and_properties(buf, view, pos, end, _T.DISCONNECT)
        _check_reason_code(code, rc.DISCONNECT_REASON_CODES, "DISCONNECT")
        return Disconnect(code, properties)

    def _decode_auth(self, first: int, buf, view: memoryview, pos: int, end: int) -> Auth:
        code, properties = self._reason_and_properties(buf, view, pos, end, _T.AUTH)
        _check_reason_code(code, rc.AUTH_REASON_CODES, "AUTH")
        if pos < end and (properties is None or properties.authentication_method is None):
            raise ProtocolError("AUTH without an authentication method")
        return Auth(code, properties)

    def _reason_and_properties(self, buf, view: memoryview, pos: int, end: int, packet_type: int):
        """Optional reason code then optional properties (DISCONNECT, AUTH); both absent means success."""
        if pos == end:
            return 0, None
        if self.protocol_version != MQTT_5:
            raise MalformedPacket(f"{_T(packet_type).name} with a body before MQTT 5")
        code = buf[pos]
        properties = None
        if pos + 1 < end:
            properties, pos = decode_properties(
                buf, view, pos + 1, end, packet_type, self.max_user_properties
            )
            _check_consumed(pos, end, _T(packet_type).name)
        return code, properties


class SharedDecoder(PacketDecoder):
    """A server decoder past CONNECT holding nothing, shared by the idle connections of one protocol version
    and maximum packet size (``shared_decoder``): an idle connection then owns no decoder state at all.

    Its ``feed`` decodes like any decoder's, and as long as the bytes end on a packet boundary it stays as it
    was. When they do not (the start of a packet is held back), or a packet was malformed, the caller moves
    that state into a decoder of its own with ``detach`` right away, before anything else is fed to it.
    (A shared decoder never decodes CONNECT: its first bytes refuse it.)
    """

    __slots__ = ()
    shared: ClassVar[bool] = True
    hands_runs: ClassVar[bool] = True

    def detach(self, into: type[_Own]) -> _Own:
        """A decoder of the caller's own (of class ``into``, whose own slots are left unset) with what
        ``feed`` left here (a partial packet, an error); this one holds nothing again."""
        own = into.__new__(into)
        own.max_packet_size = self.max_packet_size
        own.max_connect_size = self.max_connect_size
        own.max_subscribe_filters = self.max_subscribe_filters
        own.max_user_properties = self.max_user_properties
        own.role = self.role
        own.protocol_version = self.protocol_version
        own._accepted = self._accepted
        own._pending, own._needed, own._error = self._pending, self._needed, self._error
        self._pending, self._needed, self._error = b"", 0, None
        return own


_SHARED_DECODERS: dict[tuple[int, int, int, int], SharedDecoder] = {}


def shared_decoder(
    max_packet_size: int,
    protocol_version: int,
    max_subscribe_filters: int = _NO_LIMIT,
    max_user_properties: int = _NO_LIMIT,
) -> SharedDecoder:
    """The ``SharedDecoder`` of server connections past a CONNECT of ``protocol_version``, with these
    limits."""
    key = (max_packet_size, protocol_version, max_subscribe_filters, max_user_properties)
    decoder = _SHARED_DECODERS.get(key)
    if decoder is None:
        if len(_SHARED_DECODERS) >= 64:  # more limits than a process runs with (tests): start over
            _SHARED_DECODERS.clear()
        decoder = _SHARED_DECODERS[key] = SharedDecoder(
            max_packet_size,
            "server",
            protocol_version,
            max_subscribe_filters=max_subscribe_filters,
            max_user_properties=max_user_properties,
        )
    return decoder


def shared_like(decoder: PacketDecoder, protocol_version: int) -> SharedDecoder:
    """The ``SharedDecoder`` with ``decoder``'s limits, past a CONNECT of ``protocol_version``."""
    return shared_decoder(
        decoder.max_packet_size,
        protocol_version,
        decoder.max_subscribe_filters,
        decoder.max_user_properties,
    )


_ACK_CLASSES: dict[int, type[PubAck | PubRec | PubRel | PubComp]] = {
    _T.PUBACK: PubAck,
    _T.PUBREC: PubRec,
    _T.PUBREL: PubRel,
    _T.PUBCOMP: PubComp,
}
_ACK_REASON_CODES: dict[int, frozenset[rc.ReasonCode]] = {
    _T.PUBACK: rc.PUBACK_REASON_CODES,
    _T.PUBREC: rc.PUBREC_REASON_CODES,
    _T.PUBREL: rc.PUBREL_REASON_CODES,
    _T.PUBCOMP: rc.PUBCOMP_REASON_CODES,
}
_D = PacketDecoder
_BODY_DECODERS = {  # every packet type's but PUBLISH's, which ``_decode_all`` calls itself
    _T.CONNECT: _D._decode_connect,
    _T.CONNACK: _D._decode_connack,
    _T.PUBACK: _D._decode_publish_ack,
    _T.PUBREC: _D._decode_publish_ack,
    _T.PUBREL: _D._decode_publish_ack,
    _T.PUBCOMP: _D._decode_publish_ack,
    _T.SUBSCRIBE: _D._decode_subscribe,
    _T.SUBACK: _D._decode_suback,
    _T.UNSUBSCRIBE: _D._decode_unsubscribe,
    _T.UNSUBACK: _D._decode_unsuback,
    _T.PINGREQ: _D._decode_ping,
    _T.PINGRESP: _D._decode_ping,
    _T.DISCONNECT: _D._decode_disconnect,
    _T.AUTH: _D._decode_auth,
}


def _check_consumed(pos: int, end: int, name: str) -> None:
    if pos != end:
        raise MalformedPacket(f"{name} has {end - pos} bytes beyond its content")


def _check_reason_code(code: int, allowed: frozenset[int], name: str) -> None:
    if code not in allowed:
        raise ProtocolError(f"reason code 0x{code:02X} is not valid on {name}")


def _check_authentication(properties: Properties | None) -> None:
    if (
        properties is not None
        and properties.authentication_data is not None
        and properties.authentication_method is None
    ):
        raise ProtocolError("authentication data without an authentication method")
