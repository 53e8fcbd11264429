"""encode → decode gives back the same packet, for every packet type, version and direction."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_edge.protocol import MQTT_5, Connect, PacketDecoder, Properties, PubAck, Publish, encode
from broker_edge.protocol.codec import encode_pubacks
from tests.unit.broker_edge.protocol.mqtt_strategies import (
    VERSIONS,
    client_packets,
    connects,
    publishes,
    server_packets,
)

versions = st.sampled_from(VERSIONS)


@settings(max_examples=300)
@given(st.data(), versions)
def test_connect_round_trip(data, version):
    connect = data.draw(connects(version))
    frame = encode(connect, version)
    decoder = PacketDecoder()

    assert decoder.feed(frame) == [connect]
    assert decoder.protocol_version == version


@settings(max_examples=500)
@given(st.data(), versions)
def test_client_packets_round_trip(data, version):
    packet = data.draw(client_packets(version))
    frame = encode(packet, version)

    decoded = PacketDecoder(role="server", protocol_version=version).feed(frame)

    assert decoded == [packet]
    assert encode(decoded[0], version) == frame


@pytest.mark.mqtt5("MQTT-3.2.2-1")
@settings(max_examples=500)
@given(st.data(), versions)
def test_server_packets_round_trip(data, version):
    packet = data.draw(server_packets(version))
    frame = encode(packet, version)

    decoded = PacketDecoder(role="client", protocol_version=version).feed(frame)

    assert decoded == [packet]
    assert encode(decoded[0], version) == frame


def test_v3_encoding_drops_what_v3_cannot_carry():
    publish = Publish("a/b", b"x", 1, packet_id=9, properties=Properties(message_expiry_interval=5))

    decoded = PacketDecoder(protocol_version=4).feed(encode(publish, 4))

    assert decoded == [Publish("a/b", b"x", 1, packet_id=9)]


def test_connect_is_encoded_with_its_own_protocol_version():
    connect = Connect(protocol_version=MQTT_5, client_id="c", properties=Properties(receive_maximum=10))

    assert encode(connect, 4) == encode(connect, MQTT_5)
    assert PacketDecoder().feed(encode(connect, 4)) == [connect]


@pytest.mark.mqtt5("MQTT-1.5.5-1")
def test_large_payload_uses_multi_byte_remaining_length():
    publish = Publish("t", bytes(range(256)) * 1000, 2, packet_id=1)
    frame = encode(publish, 4)

    # 256000 + 3 (topic) + 2 (packet id) = 256005 = 5 + 80 * 128 + 15 * 128**2
    assert frame[1:4] == bytes((0x80 | 5, 0x80 | 80, 15))
    assert PacketDecoder(protocol_version=4).feed(frame) == [publish]


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(VERSIONS),
    st.lists(st.integers(1, 0xFFFF), min_size=1, max_size=40),
    st.sampled_from([0x00, 0x10]),
)
def test_a_run_of_pubacks_reads_as_the_pubacks_one_by_one(version, packet_ids, reason_code):
    """``encode_pubacks``: one buffer for an accepted run, decoded as the PUBACKs ``encode`` makes (0x10
    only in MQTT 5; older versions have no reason code)."""
    run = encode_pubacks(packet_ids, reason_code, version == MQTT_5)
    one_by_one = b"".join(encode(PubAck(packet_id, reason_code), version) for packet_id in packet_ids)
    assert run == one_by_one
    assert PacketDecoder(role="client", protocol_version=version).feed(run) == [
        PubAck(packet_id, reason_code if version == MQTT_5 else 0) for packet_id in packet_ids
    ]


@pytest.mark.parametrize("packet_id", [0, 0x10000])
def test_a_run_of_pubacks_refuses_an_identifier_out_of_range(packet_id):
    with pytest.raises(ValueError, match=r"1\.\.65535"):
        encode_pubacks([5, packet_id], 0, False)


@settings(max_examples=300)
@given(st.data(), versions)
def test_a_decoded_publish_keeps_its_frame_only_without_properties_retain_or_dup(data, version):
    """``Publish.frame`` is the whole frame as received (sent again to subscribers of its version and QoS),
    kept only when it has no properties and neither RETAIN nor DUP; packets around it do not leak into it."""
    packet = data.draw(publishes(version, from_server=False))
    frame = encode(packet, version)
    around = encode(PubAck(1), version)

    decoded = PacketDecoder(role="server", protocol_version=version).feed(around + frame + around)[1]

    assert isinstance(decoded, Publish)
    plain = packet.properties is None and not packet.retain and not packet.dup
    assert decoded.frame == (frame if plain else None)


@pytest.mark.parametrize("size", [0, 100, 127 - 7, 128, 16_383 - 7, 16_384, 2_097_152])
def test_the_frame_of_a_publish_spans_every_remaining_length_size(size):
    """The frame's start is found from its remaining length, 1 to 4 bytes long."""
    for version in (4, MQTT_5):
        frame = encode(Publish("t/frame", b"p" * size, 1, packet_id=9), version)
        decoded = PacketDecoder(role="server", protocol_version=version).feed(b"\xc0\x00" + frame)
        assert [p.frame for p in decoded if isinstance(p, Publish)] == [frame]
