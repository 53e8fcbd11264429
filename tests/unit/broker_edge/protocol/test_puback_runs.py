"""A read that holds nothing but PUBACKs without a reason code (a QoS 1 subscriber's acknowledgements read
together) decodes as one ``PubAckRun`` on the server side; anything else in the read, a reason code, a
packet id 0 or a partial PUBACK, and it decodes a packet at a time as before."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_edge.protocol import MQTT_3_1_1, MQTT_5, PacketDecoder, PingReq, PubAck, PubAckRun, PubRel, encode
from broker_edge.protocol.errors import MQTTError, ProtocolError
from tests.unit.broker_edge.protocol.frames import one_by_one

VERSIONS = [MQTT_3_1_1, MQTT_5]
PACKET_IDS = st.lists(st.integers(1, 0xFFFF), min_size=2, max_size=300)


def pubacks(packet_ids: list[int], version: int = MQTT_3_1_1) -> bytes:
    return b"".join(encode(PubAck(packet_id), version) for packet_id in packet_ids)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(VERSIONS), PACKET_IDS)
def test_a_read_of_pubacks_is_one_run_of_their_ids_in_order(version, packet_ids):
    read = pubacks(packet_ids, version)
    assert len(read) == 4 * len(packet_ids)  # each the two-byte form: 40 02 and the packet id
    assert PacketDecoder(protocol_version=version).feed(read) == [PubAckRun(packet_ids)]


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_pubacks_cut_into_reads_anywhere_are_the_same_pubacks_in_order(data):
    packet_ids = data.draw(PACKET_IDS)
    stream = pubacks(packet_ids)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    decoder = PacketDecoder(protocol_version=MQTT_3_1_1)
    decoded = []
    for start, stop in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoded += decoder.feed(stream[start:stop])
    assert one_by_one(decoded) == [PubAck(packet_id) for packet_id in packet_ids]
    assert decoder.buffered == 0


def test_one_puback_alone_is_a_puback():
    assert PacketDecoder(protocol_version=MQTT_3_1_1).feed(pubacks([7])) == [PubAck(7)]


@pytest.mark.parametrize(
    ("read", "expected"),
    [
        (pubacks([1, 2]) + encode(PingReq(), MQTT_3_1_1), [PubAck(1), PubAck(2), PingReq()]),
        (encode(PingReq(), MQTT_3_1_1) + pubacks([1, 2, 3]), [PingReq(), PubAck(1), PubAck(2), PubAck(3)]),
        (pubacks([1]) + encode(PubRel(2), MQTT_5), [PubAck(1), PubRel(2)]),
        (
            b"".join(encode(PubAck(n, 0x10), MQTT_5) for n in range(1, 5)),
            [PubAck(n, 0x10) for n in range(1, 5)],
        ),
        (pubacks([1, 2], MQTT_5) + pubacks([9, 10], MQTT_5), [PubAckRun([1, 2, 9, 10])]),
    ],
    ids=[
        "then a PINGREQ",
        "after a PINGREQ",
        "then a PUBREL",
        "with reason codes",
        "two writes read together",
    ],
)
def test_a_read_with_anything_else_decodes_a_packet_at_a_time(read, expected):
    assert PacketDecoder(protocol_version=MQTT_5).feed(read) == expected


def test_a_read_ending_inside_a_puback_keeps_the_rest_for_the_next_read():
    decoder = PacketDecoder(protocol_version=MQTT_3_1_1)
    stream = pubacks([1, 2, 3])
    assert decoder.feed(stream[:10]) == [PubAck(1), PubAck(2)]
    assert decoder.buffered == 2
    assert decoder.feed(stream[10:] + pubacks([4])) == [PubAckRun([3, 4])]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_packet_id_0_among_them_is_refused_as_one_alone_is_after_the_pubacks_before_it(version):
    read = pubacks([5, 6], version) + b"\x40\x02\x00\x00" + pubacks([7], version)
    decoder = PacketDecoder(protocol_version=version)
    with pytest.raises(ProtocolError, match="packet identifier 0") as caught:
        decoder.feed(read)
    assert caught.value.packets_before == [PubAck(5), PubAck(6)]
    assert decoder.failed


def test_before_connect_a_read_of_pubacks_is_refused_as_the_first_packet():
    with pytest.raises(MQTTError, match="first packet must be CONNECT"):
        PacketDecoder().feed(pubacks([1, 2]))


def test_a_client_decoder_gives_each_puback():
    """What a server sends a client is decoded a packet at a time (only the broker reads runs)."""
    decoder = PacketDecoder(role="client", protocol_version=MQTT_3_1_1)
    assert decoder.feed(pubacks([1, 2, 3])) == [PubAck(1), PubAck(2), PubAck(3)]
