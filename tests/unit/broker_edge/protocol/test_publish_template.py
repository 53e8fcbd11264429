"""The fanout template: one encoding per message, a packet id per subscriber, same bytes as encode(); and
the PUBACK of an accepted publish."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_edge.protocol import (
    MQTT_5,
    PacketDecoder,
    Properties,
    PubAck,
    Publish,
    encode,
    encode_publish_template,
)
from broker_edge.protocol.codec import encode_puback_coded, encode_puback_success, qos0_frame_of
from tests.unit.broker_edge.protocol.mqtt_strategies import properties, topic_names

VERSIONS = [4, MQTT_5]


@pytest.mark.parametrize("version", VERSIONS)
def test_qos0_frame_is_one_shared_bytes_object(version):
    template = encode_publish_template("ota/all", b"firmware-chunk", version, retain=True)

    first, second = template.frame(), template.frame()

    assert first is second
    assert isinstance(first, bytes)
    assert first == encode(Publish("ota/all", b"firmware-chunk", 0, retain=True), version)
    assert template.parts() == (first,)


@given(
    version=st.sampled_from(VERSIONS),
    topic=topic_names,
    payload=st.binary(max_size=300),
    qos=st.integers(1, 2),
    packet_id=st.integers(1, 0xFFFF),
    retain=st.booleans(),
    props=properties(3),
)
def test_qos1_and_2_frame_equals_encode_with_that_packet_id(
    version, topic, payload, qos, packet_id, retain, props
):
    props = props if version == MQTT_5 else None
    template = encode_publish_template(topic, payload, version, qos=qos, retain=retain, properties=props)
    expected = Publish(topic, payload, qos, retain, False, packet_id, props)

    frame = template.frame(packet_id)

    assert frame == encode(expected, version)
    assert b"".join(template.parts(packet_id)) == frame
    assert template.head + packet_id.to_bytes(2, "big") + template.tail == frame
    assert PacketDecoder(role="client", protocol_version=version).feed(frame) == [expected]


@given(
    version=st.sampled_from(VERSIONS),
    topic=topic_names,
    payload=st.binary(max_size=300) | st.sampled_from([b"x" * 200, b"y" * 20_000]),
    qos=st.integers(1, 2),
    packet_id=st.integers(1, 0xFFFF),
)
def test_the_qos0_frame_of_a_received_qos1_or_2_frame_equals_encode_at_qos0(
    version, topic, payload, qos, packet_id
):
    """The frame the decoder keeps of a plain QoS 1/2 PUBLISH, less its packet id, is the QoS 0 PUBLISH of the
    same topic and payload: what a QoS 0 subscriber of the publisher's family is sent (lengths across the
    remaining length's one-, two- and three-byte forms)."""
    [received] = PacketDecoder(role="server", protocol_version=version).feed(
        encode(Publish(topic, payload, qos, packet_id=packet_id), version)
    )
    assert received.frame is not None

    frame = qos0_frame_of(received.frame, received.payload, version == MQTT_5)

    assert frame == encode(Publish(topic, payload, 0), version)
    assert PacketDecoder(role="client", protocol_version=version).feed(frame) == [Publish(topic, payload, 0)]


def test_v5_properties_follow_the_packet_id():
    props = Properties(subscription_identifiers=[3])
    template = encode_publish_template("a", b"p", MQTT_5, qos=1, properties=props)

    assert template.head == b"\x32\x09\x00\x01a"  # 3 (topic) + 2 (id) + 3 (properties) + 1
    assert template.tail == b"\x02\x0b\x03p"


def test_dup_redelivery_changes_only_the_first_byte_and_shares_the_tail():
    template = encode_publish_template("a/b", b"x" * 1000, 4, qos=1)

    redelivery = template.with_flags(dup=True)

    assert redelivery.tail is template.tail
    assert redelivery.frame(9) == encode(Publish("a/b", b"x" * 1000, 1, dup=True, packet_id=9), 4)
    assert redelivery.with_flags(dup=False) == template
    assert template.with_flags(dup=False) is template


def test_retain_flag_variant():
    template = encode_publish_template("a", b"v", 4, retain=True)

    assert template.with_flags(retain=False).frame() == encode(Publish("a", b"v", 0, retain=False), 4)
    assert template.first_byte == 0x31


@pytest.mark.mqtt311("MQTT-3.3.1-2", "MQTT-4.3.1-1")
@pytest.mark.mqtt5("MQTT-3.3.1-2", "MQTT-4.3.1-1")
def test_dup_is_never_set_on_qos0():
    template = encode_publish_template("a", b"v", 4, dup=True)

    assert template.first_byte == 0x30
    assert template.with_flags(dup=True).first_byte == 0x30


@pytest.mark.parametrize("packet_id", [None, 0, 0x10000])
def test_invalid_packet_id_is_refused(packet_id):
    template = encode_publish_template("a", b"v", 4, qos=1)

    with pytest.raises(ValueError):
        template.frame(packet_id)


@given(
    version=st.sampled_from(VERSIONS),
    topic=topic_names,
    payload=st.binary(max_size=300),
    retain=st.booleans(),
    props=properties(3),
)
def test_qos0_frame_equals_encode(version, topic, payload, retain, props):
    props = props if version == MQTT_5 else None
    expected = Publish(topic, payload, 0, retain, False, None, props)

    frame = encode_publish_template(topic, payload, version, retain=retain, properties=props).frame()

    assert frame == encode(expected, version)
    assert PacketDecoder(role="client", protocol_version=version).feed(frame) == [expected]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("qos", [0, 1])
def test_remaining_length_either_side_of_one_byte(version, qos):
    for payload_size in range(100, 140):  # remaining lengths 127 and 128 both among them
        payload = bytes(payload_size)
        template = encode_publish_template("a/b", payload, version, qos=qos)
        expected = Publish("a/b", payload, qos, packet_id=9 if qos else None)

        assert template.frame(9 if qos else None) == encode(expected, version)


@pytest.mark.parametrize("topic", ["a\x00b", "t" * 0x10000])
def test_a_topic_name_a_receiver_would_refuse_is_not_encoded(topic):
    with pytest.raises(ValueError):
        encode_publish_template(topic, b"v", 4)


def test_qos_above_2_is_not_encoded():
    with pytest.raises(ValueError):
        encode_publish_template("a", b"v", 4, qos=3)


@pytest.mark.parametrize("version", [3, 4, MQTT_5])
@pytest.mark.parametrize("packet_id", [1, 255, 256, 0xFFFF])
def test_a_successful_puback_is_the_same_as_encode(version, packet_id):
    assert encode_puback_success(packet_id) == encode(PubAck(packet_id, 0), version)


@pytest.mark.parametrize("packet_id", [0, 0x10000])
def test_a_puback_with_an_invalid_packet_id_is_refused(packet_id):
    with pytest.raises(ValueError):
        encode_puback_success(packet_id)
    with pytest.raises(ValueError):
        encode_puback_coded(packet_id, 0x10)


@pytest.mark.parametrize("reason_code", [0x10, 0x80, 0x87, 0x91, 0x97, 0x99])
@pytest.mark.parametrize("packet_id", [1, 256, 0xFFFF])
def test_a_coded_mqtt_5_puback_is_the_same_as_encode(reason_code, packet_id):
    """The short form: the reason code, no property length."""
    assert encode_puback_coded(packet_id, reason_code) == encode(PubAck(packet_id, reason_code), MQTT_5)
