"""Codec rules of MQTT 3.1.1 and 5.0 not covered by the violation table: UTF-8 fields, what the encoder writes
for an empty property set or a QoS 0 PUBLISH, and topic matching without normalization."""

import pytest

from broker_edge.engine.message import Message
from broker_edge.protocol import MQTT_5, MalformedPacket, Publish, encode
from broker_edge.protocol.topics import topic_matches
from tests.unit.broker_edge.protocol.frames import decode_all, decode_error, frame, string

V3, V5 = 4, MQTT_5
INVALID_UTF8 = b"\xc3\x28"


def props(*encoded: bytes) -> bytes:
    body = b"".join(encoded)
    return bytes((len(body),)) + body


def v3_connect(flags: int, payload: bytes) -> bytes:
    return frame(0x10, string("MQTT"), bytes((V3, flags)), b"\x00\x3c", payload)


@pytest.mark.mqtt5("MQTT-1.5.4-3")
@pytest.mark.mqtt311("MQTT-1.5.3-3")
def test_a_byte_order_mark_in_a_topic_is_kept_and_matched_as_a_character():
    [publish] = decode_all(frame(0x30, string("\ufeffa/b".encode())), V3)

    assert publish.topic == "\ufeffa/b"
    assert topic_matches("\ufeffa/+", publish.topic)
    assert not topic_matches("a/+", publish.topic)


@pytest.mark.mqtt5("MQTT-4.7.3-4")
@pytest.mark.mqtt311("MQTT-4.7.3-4")
def test_matching_does_not_normalize_topics():
    composed, decomposed = "caf\u00e9/x", "cafe\u0301/x"

    assert topic_matches("caf\u00e9/+", composed)
    assert not topic_matches("caf\u00e9/+", decomposed)
    assert not topic_matches("CAF\u00c9/+", composed)


@pytest.mark.mqtt5("MQTT-2.2.2-1")
def test_an_empty_property_set_is_written_as_property_length_zero():
    assert encode(Publish("a", b"", 0), V5) == b"\x30\x04\x00\x01a\x00"


@pytest.mark.mqtt5("MQTT-2.2.1-2")
@pytest.mark.mqtt311("MQTT-2.3.1-5")
def test_a_qos0_publish_carries_no_packet_identifier():
    expected = b"\x30\x04\x00\x01ax"

    assert encode(Publish("a", b"x", 0), V3) == expected
    assert Message("a", b"x").template(False, 0, False).head == expected  # what subscribers are sent


@pytest.mark.mqtt5("MQTT-3.1.2-9")
@pytest.mark.mqtt311("MQTT-3.1.2-9")
def test_a_connect_whose_will_flag_announces_missing_fields_is_malformed():
    assert isinstance(decode_error(v3_connect(0x06, string("cid")), None), MalformedPacket)


@pytest.mark.parametrize(
    ("what", "data", "version"),
    [
        ("will topic", v3_connect(0x06, string("cid") + string(INVALID_UTF8) + string("msg")), None),
        ("user name", v3_connect(0x82, string("cid") + string(INVALID_UTF8)), None),
        ("UNSUBSCRIBE filter", frame(0xA2, b"\x00\x01", string(INVALID_UTF8)), V3),
        ("response topic", frame(0x30, string("a"), props(b"\x08" + string(INVALID_UTF8))), V5),
        ("content type", frame(0x30, string("a"), props(b"\x03" + string(INVALID_UTF8))), V5),
    ],
)
@pytest.mark.mqtt5("MQTT-3.1.3-11", "MQTT-3.1.3-12", "MQTT-3.10.3-1", "MQTT-3.3.2-13", "MQTT-3.3.2-19")
@pytest.mark.mqtt311("MQTT-3.1.3-10", "MQTT-3.1.3-11", "MQTT-3.10.3-1")
def test_string_fields_must_be_utf8(what, data, version):
    assert isinstance(decode_error(data, version), MalformedPacket), what


@pytest.mark.mqtt5("MQTT-3.15.1-1")
def test_auth_with_reserved_bits_set_is_malformed():
    assert isinstance(decode_error(b"\xf1\x00", V5), MalformedPacket)
