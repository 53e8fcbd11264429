"""Each normative violation raises the error class and reason code the connection must answer with."""

import pytest

from broker_edge.protocol import (
    MQTT_3_1,
    MQTT_5,
    Connect,
    InvalidTopic,
    MalformedPacket,
    PacketDecoder,
    PacketTooLarge,
    PingReq,
    ProtocolError,
    Publish,
    ReasonCode,
    UnsupportedProtocolVersion,
    encode,
)
from tests.unit.broker_edge.protocol.frames import decode_all, decode_error, frame, string

V3, V5 = 4, MQTT_5
MALFORMED, PROTOCOL = ReasonCode.MALFORMED_PACKET, ReasonCode.PROTOCOL_ERROR
NO_PROPS = b"\x00"


def props(*encoded: bytes) -> bytes:
    body = b"".join(encoded)
    return bytes((len(body),)) + body


def connect_frame(name: str = "MQTT", level: int = V3, flags: int = 0x02, payload: bytes = b"") -> bytes:
    properties = NO_PROPS if level == V5 else b""
    return frame(0x10, string(name), bytes((level, flags)), b"\x00\x3c", properties, payload or string("cid"))


# (id, bytes, protocol version of the decoder (None: expects CONNECT), role, error class, reason code)
CASES = [
    # framing
    ("truncated PUBACK", frame(0x40, b"\x00"), V3, "server", MalformedPacket, MALFORMED),
    ("topic length past end", frame(0x30, b"\x00\x0aab"), V3, "server", MalformedPacket, MALFORMED),
    ("truncated packet id", frame(0x32, string("a"), b"\x01"), V3, "server", MalformedPacket, MALFORMED),
    ("truncated CONNECT", frame(0x10, string("MQTT"), b"\x04"), None, "server", MalformedPacket, MALFORMED),
    ("trailing byte on PINGREQ", frame(0xC0, b"\x00"), V3, "server", MalformedPacket, MALFORMED),
    ("trailing byte on v3 PUBACK", frame(0x40, b"\x00\x01\x00"), V3, "server", MalformedPacket, MALFORMED),
    (
        "trailing after v5 PUBACK props",
        frame(0x40, b"\x00\x01\x00\x00\xff"),
        V5,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "trailing byte on CONNECT",
        connect_frame(payload=string("cid") + b"x"),
        None,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    ("trailing byte on v3 UNSUBACK", frame(0xB0, b"\x00\x01\x00"), V3, "client", MalformedPacket, MALFORMED),
    ("v3 DISCONNECT with a body", frame(0xE0, b"\x00"), V3, "server", MalformedPacket, MALFORMED),
    ("5-byte remaining length", b"\x30\xff\xff\xff\xff", V3, "server", MalformedPacket, MALFORMED),
    ("non-minimal remaining length", b"\xc0\x80\x00", V3, "server", MalformedPacket, MALFORMED),
    ("property length past end", frame(0x40, b"\x00\x01\x00\x05"), V5, "server", MalformedPacket, MALFORMED),
    ("reserved packet type 0", b"\x00\x00", V3, "server", MalformedPacket, MALFORMED),
    ("AUTH before MQTT 5", b"\xf0\x00", V3, "server", MalformedPacket, MALFORMED),
    # fixed header flags
    ("PUBACK flags", frame(0x41, b"\x00\x01"), V3, "server", MalformedPacket, MALFORMED),
    ("PUBREC flags", frame(0x52, b"\x00\x01"), V3, "server", MalformedPacket, MALFORMED),
    ("PUBREL without 0b0010", frame(0x60, b"\x00\x01"), V3, "server", MalformedPacket, MALFORMED),
    ("PUBCOMP flags", frame(0x78, b"\x00\x01"), V3, "server", MalformedPacket, MALFORMED),
    (
        "SUBSCRIBE without 0b0010",
        frame(0x80, b"\x00\x01", string("a"), b"\x00"),
        V3,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "UNSUBSCRIBE flags 0b0011",
        frame(0xA3, b"\x00\x01", string("a")),
        V3,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    ("PINGREQ flags", b"\xc8\x00", V3, "server", MalformedPacket, MALFORMED),
    ("DISCONNECT flags", b"\xe1\x00", V3, "server", MalformedPacket, MALFORMED),
    ("CONNECT flags", b"\x12" + connect_frame()[1:], None, "server", MalformedPacket, MALFORMED),
    ("SUBACK flags", frame(0x91, b"\x00\x01\x00"), V3, "client", MalformedPacket, MALFORMED),
    ("PUBLISH QoS 3", frame(0x36, string("a"), b"\x00\x01"), V3, "server", MalformedPacket, MALFORMED),
    ("PUBLISH DUP on QoS 0", frame(0x38, string("a")), V5, "server", MalformedPacket, MALFORMED),
    # packet order and direction
    ("PINGREQ before CONNECT", b"\xc0\x00", None, "server", ProtocolError, PROTOCOL),
    ("PUBLISH before CONNECT", frame(0x30, string("a")), None, "server", ProtocolError, PROTOCOL),
    ("second CONNECT", connect_frame(), V3, "server", ProtocolError, PROTOCOL),
    ("CONNACK sent by a client", b"\x20\x02\x00\x00", V3, "server", ProtocolError, PROTOCOL),
    ("SUBACK sent by a client", frame(0x90, b"\x00\x01\x00"), V5, "server", ProtocolError, PROTOCOL),
    (
        "SUBSCRIBE sent by a server",
        frame(0x82, b"\x00\x01", string("a"), b"\x00"),
        V3,
        "client",
        ProtocolError,
        PROTOCOL,
    ),
    ("PINGREQ sent by a server", b"\xc0\x00", V3, "client", ProtocolError, PROTOCOL),
    ("v3 server DISCONNECT", b"\xe0\x00", V3, "client", ProtocolError, PROTOCOL),
    # UTF-8 strings and topics
    ("invalid UTF-8 topic", frame(0x30, string(b"\xc3\x28")), V3, "server", MalformedPacket, MALFORMED),
    (
        "UTF-16 surrogate in topic",
        frame(0x30, string(b"a\xed\xa0\x80")),
        V3,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    ("overlong UTF-8 in topic", frame(0x30, string(b"\xc0\xaf")), V3, "server", MalformedPacket, MALFORMED),
    ("U+0000 in topic", frame(0x30, string(b"a\x00b")), V3, "server", MalformedPacket, MALFORMED),
    (
        "U+0000 in client id",
        connect_frame(payload=string(b"c\x00d")),
        None,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "invalid UTF-8 filter",
        frame(0x82, b"\x00\x01", string(b"\xff"), b"\x00"),
        V3,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "invalid UTF-8 user property",
        frame(0x30, string("a"), props(b"\x26", string("k"), string(b"\xfe"))),
        V5,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "'+' in PUBLISH topic",
        frame(0x30, string("a/+/c")),
        V3,
        "server",
        InvalidTopic,
        ReasonCode.TOPIC_NAME_INVALID,
    ),
    (
        "'#' in PUBLISH topic",
        frame(0x30, string("a/#"), NO_PROPS),
        V5,
        "server",
        InvalidTopic,
        ReasonCode.TOPIC_NAME_INVALID,
    ),
    (
        "empty v3 PUBLISH topic",
        frame(0x30, string("")),
        V3,
        "server",
        InvalidTopic,
        ReasonCode.TOPIC_NAME_INVALID,
    ),
    (
        "empty v5 topic without alias",
        frame(0x30, string(""), NO_PROPS),
        V5,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    (
        "wildcard will topic",
        connect_frame(flags=0x06, payload=string("cid") + string("w/+") + string("bye")),
        None,
        "server",
        InvalidTopic,
        ReasonCode.TOPIC_NAME_INVALID,
    ),
    # packet identifiers
    ("PUBLISH packet id 0", frame(0x32, string("a"), b"\x00\x00"), V3, "server", ProtocolError, PROTOCOL),
    ("PUBACK packet id 0", frame(0x40, b"\x00\x00"), V3, "server", ProtocolError, PROTOCOL),
    ("PUBREL packet id 0", frame(0x62, b"\x00\x00"), V5, "server", ProtocolError, PROTOCOL),
    (
        "SUBSCRIBE packet id 0",
        frame(0x82, b"\x00\x00", string("a"), b"\x00"),
        V3,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    ("UNSUBSCRIBE packet id 0", frame(0xA2, b"\x00\x00", string("a")), V3, "server", ProtocolError, PROTOCOL),
    # SUBSCRIBE / UNSUBSCRIBE payload
    ("empty v3 SUBSCRIBE", frame(0x82, b"\x00\x01"), V3, "server", ProtocolError, PROTOCOL),
    ("empty v5 SUBSCRIBE", frame(0x82, b"\x00\x01", NO_PROPS), V5, "server", ProtocolError, PROTOCOL),
    ("empty UNSUBSCRIBE", frame(0xA2, b"\x00\x01"), V3, "server", ProtocolError, PROTOCOL),
    (
        "v5 option bit 6",
        frame(0x82, b"\x00\x01", NO_PROPS, string("a"), b"\x40"),
        V5,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "v5 option bit 7",
        frame(0x82, b"\x00\x01", NO_PROPS, string("a"), b"\x80"),
        V5,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "v5 requested QoS 3",
        frame(0x82, b"\x00\x01", NO_PROPS, string("a"), b"\x03"),
        V5,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "retain handling 3",
        frame(0x82, b"\x00\x01", NO_PROPS, string("a"), b"\x30"),
        V5,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    (
        "no local on a shared subscription",
        frame(0x82, b"\x00\x01", NO_PROPS, string("$share/g/a"), b"\x04"),
        V5,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    (
        "v3 option bits above QoS",
        frame(0x82, b"\x00\x01", string("a"), b"\x04"),
        V3,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "v3 requested QoS 3",
        frame(0x82, b"\x00\x01", string("a"), b"\x03"),
        V3,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    # CONNECT
    ("CONNECT reserved flag", connect_frame(flags=0x03), None, "server", MalformedPacket, MALFORMED),
    (
        "will QoS 3",
        connect_frame(flags=0x1E, payload=string("cid") + string("w") + string("x")),
        None,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    ("will QoS without will", connect_frame(flags=0x0A), None, "server", MalformedPacket, MALFORMED),
    ("will retain without will", connect_frame(flags=0x22), None, "server", MalformedPacket, MALFORMED),
    (
        "v3.1.1 password without user name",
        connect_frame(flags=0x42, payload=string("cid") + string("pw")),
        None,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "authentication data without method",
        frame(0x10, string("MQTT"), b"\x05\x02\x00\x3c", props(b"\x16", string("x")), string("cid")),
        None,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    # properties
    (
        "duplicated message expiry",
        frame(0x30, string("a"), props(b"\x02\x00\x00\x00\x01", b"\x02\x00\x00\x00\x02")),
        V5,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    (
        "duplicated subscription identifier in SUBSCRIBE",
        frame(0x82, b"\x00\x01", props(b"\x0b\x01", b"\x0b\x02"), string("a"), b"\x00"),
        V5,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    (
        "duplicated reason string",
        frame(0x40, b"\x00\x01\x00", props(b"\x1f", string("a"), b"\x1f", string("b"))),
        V5,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    (
        "session expiry on PUBLISH",
        frame(0x30, string("a"), props(b"\x11\x00\x00\x00\x01")),
        V5,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "will delay among CONNECT properties",
        frame(0x10, string("MQTT"), b"\x05\x02\x00\x3c", props(b"\x18\x00\x00\x00\x01"), string("cid")),
        None,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "unknown property 0x7F",
        frame(0x30, string("a"), props(b"\x7f\x00")),
        V5,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "receive maximum 0",
        frame(0x10, string("MQTT"), b"\x05\x02\x00\x3c", props(b"\x21\x00\x00"), string("cid")),
        None,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    (
        "maximum packet size 0",
        frame(0x10, string("MQTT"), b"\x05\x02\x00\x3c", props(b"\x27\x00\x00\x00\x00"), string("cid")),
        None,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    (
        "request problem information 2",
        frame(0x10, string("MQTT"), b"\x05\x02\x00\x3c", props(b"\x17\x02"), string("cid")),
        None,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    (
        "subscription identifier 0",
        frame(0x82, b"\x00\x01", props(b"\x0b\x00"), string("a"), b"\x00"),
        V5,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    (
        "non-minimal subscription identifier",
        frame(0x82, b"\x00\x01", props(b"\x0b\x81\x00"), string("a"), b"\x00"),
        V5,
        "server",
        MalformedPacket,
        MALFORMED,
    ),
    (
        "wildcard in response topic",
        frame(0x30, string("a"), props(b"\x08", string("reply/#"))),
        V5,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    ("payload format 2", frame(0x30, string("a"), props(b"\x01\x02")), V5, "server", ProtocolError, PROTOCOL),
    (
        "topic alias 0",
        frame(0x30, string("a"), props(b"\x23\x00\x00")),
        V5,
        "server",
        ProtocolError,
        ReasonCode.TOPIC_ALIAS_INVALID,
    ),
    (
        "subscription identifier on a client PUBLISH",
        frame(0x30, string("a"), props(b"\x0b\x05")),
        V5,
        "server",
        ProtocolError,
        PROTOCOL,
    ),
    # reason codes
    ("PUBACK reason 0x8F", frame(0x40, b"\x00\x01\x8f"), V5, "server", ProtocolError, PROTOCOL),
    ("DISCONNECT reason 0x05", frame(0xE0, b"\x05"), V5, "server", ProtocolError, PROTOCOL),
    ("AUTH without method", frame(0xF0, b"\x18", NO_PROPS), V5, "server", ProtocolError, PROTOCOL),
    ("v3 SUBACK code 0x03", frame(0x90, b"\x00\x01\x03"), V3, "client", ProtocolError, PROTOCOL),
    ("v5 UNSUBACK without codes", frame(0xB0, b"\x00\x01", NO_PROPS), V5, "client", ProtocolError, PROTOCOL),
    ("v3 CONNACK code 6", b"\x20\x02\x00\x06", V3, "client", ProtocolError, PROTOCOL),
    ("CONNACK reserved flag", b"\x20\x02\x02\x00", V3, "client", MalformedPacket, MALFORMED),
    ("session present on refusal", b"\x20\x02\x01\x05", V3, "client", ProtocolError, PROTOCOL),
]


@pytest.mark.mqtt311(
    "MQTT-1.5.3-1",
    "MQTT-1.5.3-2",
    "MQTT-2.2.2-1",
    "MQTT-2.2.2-2",
    "MQTT-2.3.1-1",
    "MQTT-3.1.0-1",
    "MQTT-3.1.0-2",
    "MQTT-3.1.2-3",
    "MQTT-3.1.2-11",
    "MQTT-3.1.2-13",
    "MQTT-3.1.2-14",
    "MQTT-3.1.2-15",
    "MQTT-3.1.2-22",
    "MQTT-3.1.4-1",
    "MQTT-3.3.1-4",
    "MQTT-3.3.2-1",
    "MQTT-3.3.2-2",
    "MQTT-3.6.1-1",
    "MQTT-3.8.1-1",
    "MQTT-3.8.3-1",
    "MQTT-3.8.3-3",
    "MQTT-3.8.3-4",
    "MQTT-3.10.1-1",
    "MQTT-3.10.3-2",
    "MQTT-3.14.1-1",
    "MQTT-4.7.1-1",
    "MQTT-4.7.3-1",
    "MQTT-4.7.3-2",
    "MQTT-4.8.0-1",
)
@pytest.mark.mqtt5(
    "MQTT-1.5.4-1",
    "MQTT-1.5.4-2",
    "MQTT-1.5.5-1",
    "MQTT-1.5.7-1",
    "MQTT-2.1.3-1",
    "MQTT-3.1.0-1",
    "MQTT-3.1.0-2",
    "MQTT-3.1.2-3",
    "MQTT-3.1.2-11",
    "MQTT-3.1.2-12",
    "MQTT-3.1.2-13",
    "MQTT-3.1.4-1",
    "MQTT-3.3.1-4",
    "MQTT-3.3.2-1",
    "MQTT-3.3.2-2",
    "MQTT-3.3.2-14",
    "MQTT-3.6.1-1",
    "MQTT-3.8.1-1",
    "MQTT-3.8.3-1",
    "MQTT-3.8.3-2",
    "MQTT-3.8.3-4",
    "MQTT-3.8.3-5",
    "MQTT-3.10.1-1",
    "MQTT-3.10.3-2",
    "MQTT-3.14.1-1",
    "MQTT-4.7.0-1",
    "MQTT-4.7.3-1",
    "MQTT-4.7.3-2",
)
@pytest.mark.parametrize(
    ("data", "version", "role", "error_class", "reason_code"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_violation_raises_exact_reason_code(data, version, role, error_class, reason_code):
    error = decode_error(data, version, role)

    assert type(error) is error_class, repr(error)
    assert error.reason_code == reason_code, repr(error)


@pytest.mark.mqtt311("MQTT-3.1.2-1", "MQTT-3.1.2-2")
@pytest.mark.mqtt5("MQTT-3.1.2-1", "MQTT-3.1.2-2")
@pytest.mark.parametrize(
    ("name", "level"), [("MQTT", 6), ("MQTT", 3), ("MQIsdp", 4), ("HTTP", 4), ("MQTT", 0)]
)
def test_unknown_protocol_gets_its_own_error_with_both_connack_codes(name, level):
    error = decode_error(connect_frame(name, level), None)

    assert isinstance(error, UnsupportedProtocolVersion)
    assert (error.protocol_name, error.protocol_version) == (name, level)
    assert error.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
    assert error.return_code == 0x01


def test_too_large_is_raised_from_the_fixed_header_alone():
    decoder = PacketDecoder(max_packet_size=100, protocol_version=V3)

    with pytest.raises(PacketTooLarge) as caught:
        decoder.feed(b"\x30\xe8\x07")  # announces 1000 bytes, none of them sent

    assert caught.value.reason_code == ReasonCode.PACKET_TOO_LARGE


def test_packet_of_exactly_the_maximum_size_is_accepted():
    publish = Publish("t", bytes(100 - 2 - 3), 0)
    frame_bytes = encode(publish, V3)
    assert len(frame_bytes) == 100

    assert PacketDecoder(max_packet_size=100, protocol_version=V3).feed(frame_bytes) == [publish]
    with pytest.raises(PacketTooLarge):
        PacketDecoder(max_packet_size=99, protocol_version=V3).feed(frame_bytes)


def test_four_continuation_bytes_fail_before_a_fifth_arrives():
    decoder = PacketDecoder(protocol_version=V3)
    assert decoder.feed(b"\x30\xff\xff\xff") == []

    with pytest.raises(MalformedPacket):
        decoder.feed(b"\xff")


def test_error_is_sticky_and_keeps_packets_decoded_before_it():
    decoder = PacketDecoder(protocol_version=V3)

    with pytest.raises(ProtocolError) as caught:
        decoder.feed(b"\xc0\x00" + frame(0x40, b"\x00\x00") + b"\xc0\x00")
    assert caught.value.packets_before == [PingReq()]

    with pytest.raises(ProtocolError) as again:
        decoder.feed(b"\xc0\x00")
    assert again.value is caught.value


def test_what_v5_and_v3_1_allow_is_accepted():
    assert decode_all(connect_frame(level=V5, flags=0x42, payload=string("cid") + string("pw")), None) == [
        Connect("MQTT", V5, True, 60, "cid", password=b"pw")
    ]
    assert decode_all(connect_frame("MQIsdp", MQTT_3_1, 0x42, string("cid") + string("pw")), None) == [
        Connect("MQIsdp", MQTT_3_1, True, 60, "cid", password=b"pw")
    ]


def test_repeatable_properties_and_alias_only_topic_are_accepted():
    two_user_properties = props(b"\x26", string("k"), string("1"), b"\x26", string("k"), string("2"))
    [publish] = decode_all(frame(0x30, string(""), props(b"\x23\x00\x07"), b"x"), V5)
    [multi] = decode_all(frame(0x30, string("a"), two_user_properties), V5)
    [delivered] = decode_all(frame(0x30, string("a"), props(b"\x0b\x01", b"\x0b\x85\x02")), V5, "client")

    assert (publish.topic, publish.properties.topic_alias, publish.payload) == ("", 7, b"x")
    assert multi.properties.user_properties == [("k", "1"), ("k", "2")]
    assert delivered.properties.subscription_identifiers == [1, 0x105]
