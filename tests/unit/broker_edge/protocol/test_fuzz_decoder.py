"""Structured fuzzing of the server decoder: valid packets, then broken in one known way (or at random).

Every break either decodes or raises an ``MQTTError`` whose reason code is the one the specification gives
for it (0x81 malformed, 0x82 protocol error, 0x94 topic alias invalid, 0x95 packet too large); nothing else
escapes. Hypothesis runs derandomized with bounded examples: the same cases every run, a few seconds.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_edge.protocol import MQTT_5, Connect, MQTTError, Packet, PacketDecoder, ReasonCode, encode
from broker_edge.protocol.errors import InvalidTopic
from broker_edge.protocol.properties import WILL, PropertySpec
from broker_edge.protocol.topics import parse_shared
from broker_edge.protocol.wire import MAX_VARINT, encode_varint
from tests.unit.broker_edge.protocol.mqtt_mutations import (
    MISPLACED_PROPERTIES,
    SINGLE_PROPERTIES,
    block,
    client_frames,
    frame,
    mutated,
    packet_frame,
    string,
    valid_property,
)
from tests.unit.broker_edge.protocol.mqtt_strategies import VERSIONS, server_packets

MALFORMED, PROTOCOL = ReasonCode.MALFORMED_PACKET, ReasonCode.PROTOCOL_ERROR
CONNECT = encode(Connect(protocol_version=MQTT_5, client_id="fuzz"), MQTT_5)
FUZZ = settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))


def outcome(data: bytes, after_connect: bool = True, max_packet_size: int = 1 << 20) -> int | None:
    """The reason code the decoder raises on ``data`` (None: it decodes, or waits for more bytes)."""
    decoder = PacketDecoder(max_packet_size)
    if after_connect:
        decoder.feed(CONNECT)
    try:
        decoder.feed(data)
    except MQTTError as error:
        return error.reason_code
    return None


def for_type(packet_type: int, props: bytes) -> tuple[bytes, bool]:
    """The frame and whether it follows a CONNECT (a CONNECT or will property block is the first packet)."""
    return packet_frame(packet_type, props), packet_type not in (1, WILL)


@FUZZ
@given(client_frames().flatmap(mutated))
def test_a_mutated_packet_decodes_or_raises_a_protocol_error_and_nothing_else(data: bytes) -> None:
    decoder = PacketDecoder()
    decoder.feed(CONNECT)
    try:
        packets = decoder.feed(data)
    except MQTTError as error:
        assert error.reason_code >= 0x80
        return
    for packet in packets:
        encode(packet, MQTT_5)  # what decodes can be written again (the broker forwards properties)


@given(client_frames())
@FUZZ
def test_every_generated_frame_is_valid(data: bytes) -> None:
    assert outcome(data) is None


def _name(item: tuple[int, PropertySpec]) -> str:
    return f"{item[0]}-{item[1].name}"


@pytest.mark.parametrize(("packet_type", "spec"), SINGLE_PROPERTIES, ids=map(_name, SINGLE_PROPERTIES))
def test_a_property_allowed_once_given_twice_is_a_protocol_error(
    packet_type: int, spec: PropertySpec
) -> None:
    once = valid_property(spec)
    needs_method = packet_type == 15 or spec.name == "authentication_data"
    method = b"\x15" + string("m") if needs_method and spec.name != "authentication_method" else b""
    data, after = for_type(packet_type, block(method, once))
    assert outcome(data, after) is None, "the packet with it once is valid"
    data, after = for_type(packet_type, block(method, once, once))
    assert outcome(data, after) == PROTOCOL


@pytest.mark.parametrize(("packet_type", "spec"), MISPLACED_PROPERTIES, ids=map(_name, MISPLACED_PROPERTIES))
def test_a_property_not_allowed_on_a_packet_type_is_malformed(packet_type: int, spec: PropertySpec) -> None:
    data, after = for_type(packet_type, block(valid_property(spec)))
    assert outcome(data, after) == MALFORMED


@given(st.sampled_from([3, 4, 8, 10, 14]), st.integers(1, 3), st.booleans())
@FUZZ
def test_a_property_length_past_the_packet_or_cutting_a_value_is_malformed(
    packet_type: int, by: int, longer: bool
) -> None:
    props = b"\x1f" + string("why") if packet_type in (4, 14) else b"\x26" + string("k") + string("v")
    if packet_type == 8:
        props = b"\x0b\x01"
    length = len(props) + by if longer else max(len(props) - by, 0)
    data = packet_frame(packet_type, encode_varint(length) + props)
    if packet_type in (8, 10) and longer:  # what follows the block (a filter) is read as properties
        assert outcome(data) in (MALFORMED, PROTOCOL)
    else:
        assert outcome(data) == MALFORMED


@pytest.mark.mqtt5("MQTT-1.5.5-1")
@pytest.mark.parametrize("where", ["remaining length", "property length", "subscription identifier"])
def test_a_variable_byte_integer_of_five_bytes_is_malformed(where: str) -> None:
    five = b"\xff\xff\xff\xff\x01"
    data = {
        "remaining length": b"\x30" + five,
        "property length": frame(0x30, string("t") + five),
        "subscription identifier": frame(0x82, b"\x00\x01\x06\x0b" + five + string("t") + b"\x00"),
    }[where]
    assert outcome(data) == MALFORMED


@pytest.mark.mqtt5("MQTT-1.5.5-1")
@given(st.sampled_from([0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, MAX_VARINT]), st.integers(1, 3))
@FUZZ
def test_remaining_lengths_at_every_varint_edge(length: int, padding: int) -> None:
    """Up to the maximum a packet waits for its body; past it, 0x95 before the body; a longer form than the
    shortest is malformed, however many bytes it pads with."""
    shortest = encode_varint(length)
    limit = 2_097_152
    expected = ReasonCode.PACKET_TOO_LARGE if 1 + len(shortest) + length > limit else None
    if length:  # (a PUBLISH of no bytes is complete, and malformed)
        assert outcome(b"\x30" + shortest, max_packet_size=limit) == expected
    if len(shortest) + padding <= 4:
        padded = bytes(b | 0x80 for b in shortest) + b"\x80" * (padding - 1) + b"\x00"
        assert outcome(b"\x30" + padded, max_packet_size=limit) == MALFORMED


BAD_TEXT = [b"\x00", b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]
"""U+0000, a byte no UTF-8 has, an overlong "/", a surrogate (U+D800), past U+10FFFF."""

STRING_FIELDS = {
    "publish topic": lambda text: frame(0x30, string(text) + b"\x00"),
    "subscribe filter": lambda text: frame(0x82, b"\x00\x01\x00" + string(text) + b"\x00"),
    "unsubscribe filter": lambda text: frame(0xA2, b"\x00\x01\x00" + string(text)),
    "user property key": lambda text: frame(0x30, string("t") + block(b"\x26" + string(text) + string("v"))),
    "user property value": lambda text: frame(
        0x40, b"\x00\x01\x00" + block(b"\x26" + string("k") + string(text))
    ),
    "content type": lambda text: frame(0x30, string("t") + block(b"\x03" + string(text))),
    "response topic": lambda text: frame(0x30, string("t") + block(b"\x08" + string(text))),
    "reason string": lambda text: frame(0xE0, b"\x00" + block(b"\x1f" + string(text))),
    "authentication method": lambda text: frame(0xF0, b"\x18" + block(b"\x15" + string(text))),
    "client id": lambda text: packet_frame(1, b"\x00")[:-4] + string(text),
    "will topic": lambda text: frame(
        0x10, b"\x00\x04MQTT\x05\x06\x00\x3c\x00" + string("c") + b"\x00" + string(text) + string("")
    ),
    "user name": lambda text: frame(0x10, b"\x00\x04MQTT\x05\x82\x00\x3c\x00" + string("c") + string(text)),
}


@pytest.mark.mqtt5("MQTT-1.5.4-1", "MQTT-1.5.4-2")
@pytest.mark.parametrize("field", STRING_FIELDS)
@pytest.mark.parametrize("bad", BAD_TEXT, ids=["U+0000", "0xFF", "overlong", "surrogate", "past-U+10FFFF"])
def test_invalid_utf8_or_u0000_in_any_string_field_is_malformed(field: str, bad: bytes) -> None:
    build = STRING_FIELDS[field]
    after = field not in ("client id", "will topic", "user name")
    assert outcome(build(b"a" + bad + b"b"), after) == MALFORMED
    assert outcome(build(b"a"), after) in (None, PROTOCOL)  # valid text (an AUTH is refused later: 0x82)


@pytest.mark.parametrize(
    ("topic", "alias", "code"),
    [
        ("", None, PROTOCOL),  # no topic and nothing to take it from
        ("", 1, None),  # the topic comes from the alias (known or not: the session decides)
        ("t", 0, ReasonCode.TOPIC_ALIAS_INVALID),
        ("", 0, ReasonCode.TOPIC_ALIAS_INVALID),
        ("t", 0xFFFF, None),  # above the broker's maximum: the session answers 0x94
    ],
)
def test_zero_length_topics_with_and_without_an_alias(
    topic: str, alias: int | None, code: int | None
) -> None:
    props = block() if alias is None else block(b"\x23" + alias.to_bytes(2, "big"))
    assert outcome(frame(0x30, string(topic) + props)) == code


@pytest.mark.parametrize(("identifier", "code"), [(0, PROTOCOL), (1, None), (MAX_VARINT, None)])
def test_subscription_identifier_bounds(identifier: int, code: int | None) -> None:
    data = frame(0x82, b"\x00\x01" + block(b"\x0b" + encode_varint(identifier)) + string("t") + b"\x00")
    assert outcome(data) == code


@pytest.mark.mqtt5("MQTT-2.1.3-1", "MQTT-3.3.1-4")
@given(st.integers(0, 15), st.sampled_from([0x40, 0x50, 0x60, 0x70, 0x80, 0xA0, 0xC0, 0xE0, 0xF0, 0x30]))
@FUZZ
def test_reserved_flag_bits_and_qos_3(flags: int, type_byte: int) -> None:
    """Wrong fixed-header flags are malformed, before the body is looked at (a body of zeros here)."""
    valid = {0x60: 2, 0x80: 2, 0xA0: 2}.get(type_byte, 0)
    if type_byte == 0x30:
        qos, dup = (flags >> 1) & 3, flags & 8
        bad = qos == 3 or (dup and not qos)
    else:
        bad = flags != valid
    if bad:
        assert outcome(bytes((type_byte | flags, 2, 0, 0))) == MALFORMED


@pytest.mark.parametrize(
    "data",
    [
        frame(0x32, string("t") + b"\x00\x00\x00"),
        frame(0x34, string("t") + b"\x00\x00\x00"),
        b"\x40\x02\x00\x00",
        b"\x50\x02\x00\x00",
        b"\x62\x02\x00\x00",
        b"\x70\x02\x00\x00",
        frame(0x82, b"\x00\x00\x00" + string("t") + b"\x00"),
        frame(0xA2, b"\x00\x00\x00" + string("t")),
    ],
    ids=["publish-qos1", "publish-qos2", "puback", "pubrec", "pubrel", "pubcomp", "subscribe", "unsubscribe"],
)
def test_packet_identifier_0_is_a_protocol_error(data: bytes) -> None:
    assert outcome(data) == PROTOCOL


@pytest.mark.mqtt5("MQTT-4.8.2-1", "MQTT-4.8.2-2")
@given(st.text(st.sampled_from("ab+#"), max_size=4), st.sampled_from(["x", "x/+", "#", "", "/x"]))
@FUZZ
def test_a_share_name_with_a_wildcard_or_empty_is_an_invalid_filter(name: str, inner: str) -> None:
    """The share name ends at the first "/"; the filter after it must be a valid filter."""
    topic_filter = f"$share/{name}/{inner}"
    assert outcome(frame(0x82, b"\x00\x01\x00" + string(topic_filter) + b"\x01")) is None  # SUBACK says
    if not name or "+" in name or "#" in name or not inner:
        with pytest.raises(InvalidTopic) as caught:
            parse_shared(topic_filter)
        assert caught.value.reason_code == ReasonCode.TOPIC_FILTER_INVALID
    else:
        assert parse_shared(topic_filter) == (name, inner)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\xf0\x00", None),  # no reason code, no properties: well-formed; the session refuses it: 0x82
        (b"\xf0\x01\x18", PROTOCOL),
        (frame(0xF0, b"\x18" + block(b"\x16" + string("data"))), PROTOCOL),
        (frame(0xF0, b"\x05" + block(b"\x15" + string("m"))), PROTOCOL),  # not an AUTH reason code
        (frame(0xF0, b"\x18" + block(b"\x15" + string("m"))), None),  # the session refuses it: 0x82
    ],
)
def test_auth_packets_without_enhanced_authentication(data: bytes, code: int | None) -> None:
    assert outcome(data) == code


@FUZZ
@given(st.sampled_from(VERSIONS).flatmap(lambda v: st.tuples(st.just(v), server_packets(v))), st.data())
def test_a_mutated_server_packet_decodes_or_raises_a_protocol_error_in_a_client(
    versioned: tuple[int, Packet], data: st.DataObject
) -> None:
    """The client side (``pipelines.fleet.client``) reads what a server sends the same way."""
    version, packet = versioned
    broken = data.draw(mutated(encode(packet, version)))
    decoder = PacketDecoder(role="client", protocol_version=version)
    try:
        packets = decoder.feed(broken)
    except MQTTError as error:
        assert error.reason_code >= 0x80
        return
    for decoded in packets:
        encode(decoded, version)


@pytest.mark.mqtt5("MQTT-2.2.1-6")
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("first", [0x90, 0xB0], ids=["suback", "unsuback"])
def test_a_suback_or_unsuback_with_packet_identifier_0_is_a_protocol_error(version: int, first: int) -> None:
    """No SUBSCRIBE or UNSUBSCRIBE has packet identifier 0, so no answer to one does [MQTT-2.2.1-6]: a client
    took one in (and could not write it again, its packet identifier out of range)."""
    body = b"\x00\x00" + (b"\x00\x00" if version == MQTT_5 else b"\x00" if first == 0x90 else b"")
    decoder = PacketDecoder(role="client", protocol_version=version)
    with pytest.raises(MQTTError) as caught:
        decoder.feed(frame(first, body))
    assert caught.value.reason_code == PROTOCOL
