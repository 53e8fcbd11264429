"""encode → decode gives back the same packet, for every packet type, version and direction."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_edge.protocol import MQTT_5, Connect, PacketDecoder, Properties, Publish, encode
from tests.unit.broker_edge.protocol.mqtt_strategies import VERSIONS, client_packets, connects, server_packets

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
