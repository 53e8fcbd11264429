"""PUBLISHes read together that begin alike (the same fixed header and topic, a client streaming on one topic)
are decoded from their packet ids and payloads alone after the first: every one must come out as if it were
decoded on its own, and anything that is not alike after all (a packet id 0, MQTT 5 properties, another
topic or size, a partial packet) goes to the general decoder at the right packet."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_edge.engine.connection.reading import OwnDecoder
from broker_edge.protocol import MQTT_3_1_1, MQTT_5, PacketDecoder, Publish, PublishesAlike, PubRel, encode
from broker_edge.protocol.decoder import MAX_PACKET_SIZE, shared_decoder
from broker_edge.protocol.errors import MQTTError, ProtocolError
from broker_edge.protocol.properties import Properties
from tests.unit.broker_edge.protocol.frames import frame, string

VERSIONS = [MQTT_3_1_1, MQTT_5]


@st.composite
def publishes(draw: st.DrawFn, version: int) -> list[Publish]:
    """PUBLISHes from a few topics, payload sizes and flags, so that many in a row begin alike; in MQTT 5 some
    carry properties that keep the packet's size."""
    count = draw(st.integers(1, 40))
    packets = []
    for _ in range(count):
        qos = draw(st.sampled_from([0, 1, 1, 2]))
        properties = None
        if version == MQTT_5 and draw(st.integers(0, 5)) == 0:
            properties = Properties(content_type="a")
        packets.append(
            Publish(
                draw(st.sampled_from(["t/a", "t/b", "t/a/b"])),
                draw(st.sampled_from([b"", b"12", b"1234", b"x" * 200])),
                qos,
                retain=draw(st.integers(0, 6)) == 0,
                dup=qos > 0 and draw(st.integers(0, 6)) == 0,
                packet_id=draw(st.integers(1, 0xFFFF)) if qos else None,
                properties=properties,
            )
        )
    return packets


def _alone(packets: list[Publish], version: int) -> list[Publish]:
    """Each packet decoded by a decoder of its own, from its own bytes."""
    decoded = []
    for packet in packets:
        (one,) = PacketDecoder(protocol_version=version).feed(encode(packet, version))
        assert isinstance(one, Publish)
        decoded.append(one)
    return decoded


def _frames(packets: list) -> list[bytes | None]:
    return [packet.frame for packet in packets]


def _each(packets: list) -> list:
    """``packets`` with each ``PublishesAlike`` (a broker's decoder's) as its PUBLISHes."""
    return [
        one
        for packet in packets
        for one in (packet.publishes() if isinstance(packet, PublishesAlike) else [packet])
    ]


def _broker_decoder(version: int) -> OwnDecoder:
    """A broker connection's decoder of its own past CONNECT, as a read ending inside a packet leaves it (it
    hands runs, as the shared decoders do)."""
    return shared_decoder(MAX_PACKET_SIZE, version).detach(OwnDecoder)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_publishes_read_together_are_decoded_as_each_alone_wherever_the_reads_are_cut(data):
    version = data.draw(st.sampled_from(VERSIONS))
    packets = data.draw(publishes(version))
    stream = b"".join(encode(packet, version) for packet in packets)
    expected = _alone(packets, version)
    assert PacketDecoder(protocol_version=version).feed(stream) == expected
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = PacketDecoder(protocol_version=version)
    decoded = []
    for start, stop in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoded += decoder.feed(stream[start:stop])
    assert decoded == expected
    assert _frames(decoded) == _frames(expected)  # what a subscriber of the family is sent: the same bytes
    assert decoder.buffered == 0
    whole = shared_decoder(MAX_PACKET_SIZE, version)
    handed = whole.feed(stream)
    assert _each(handed) == expected and _frames(_each(handed)) == _frames(expected)
    assert whole.decoded == len(expected)
    assert all(len(packet) > 1 for packet in handed if isinstance(packet, PublishesAlike))
    broker = _broker_decoder(version)
    decoded = []
    for start, stop in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoded += _each(broker.feed(stream[start:stop]))
    assert decoded == expected and _frames(decoded) == _frames(expected)


@pytest.mark.mqtt311("MQTT-2.3.1-1")
@pytest.mark.parametrize("version", VERSIONS)
def test_a_packet_id_0_inside_publishes_alike_is_refused_there_with_those_before_it(version):
    """[MQTT-2.3.1-1] A QoS 1 PUBLISH carries a non-zero packet identifier: the one with 0, among PUBLISHes
    that begin alike, is refused as a protocol error, and the PUBLISHes before it were decoded."""
    before = [Publish("t/a", b"%02d" % n, 1, packet_id=n + 1) for n in range(5)]
    alike = encode(Publish("t/a", b"99", 1, packet_id=1), version)
    zero = alike[:7] + b"\x00\x00" + alike[9:]  # the fixed header (2), the topic (2 + 3), then the packet id
    read = b"".join(encode(packet, version) for packet in before) + zero
    with pytest.raises(ProtocolError) as caught:
        PacketDecoder(protocol_version=version).feed(read)
    assert caught.value.packets_before == before
    with pytest.raises(ProtocolError) as caught:
        _broker_decoder(version).feed(read)
    assert _each(caught.value.packets_before) == before


def test_an_mqtt5_publish_with_properties_among_ones_alike_keeps_them():
    """A PUBLISH of the same size and topic whose properties take its payload's place is not alike: its
    properties are read, and it has no frame to be sent as it is."""
    plain = Publish("t/a", b"123456", 1, packet_id=1)
    with_properties = Publish("t/a", b"", 1, packet_id=2, properties=Properties(user_properties=[("k", "")]))
    assert len(encode(plain, MQTT_5)) == len(encode(with_properties, MQTT_5))  # same fixed header
    read = encode(plain, MQTT_5) + encode(with_properties, MQTT_5) + encode(plain, MQTT_5)
    decoded = PacketDecoder(protocol_version=MQTT_5).feed(read)
    assert decoded == [plain, with_properties, plain]
    assert [packet.frame is None for packet in decoded] == [False, True, False]


def test_feed_some_stops_inside_publishes_alike_and_hands_back_the_bytes_past_them():
    packets = [Publish("t/a", b"%02d" % n, 1, packet_id=n + 1) for n in range(10)]
    encoded = [encode(packet, MQTT_3_1_1) for packet in packets]
    decoded, left = PacketDecoder(protocol_version=MQTT_3_1_1).feed_some(b"".join(encoded), 4)
    assert decoded == packets[:4]
    assert left == sum(map(len, encoded[4:]))
    broker = shared_decoder(MAX_PACKET_SIZE, MQTT_3_1_1)
    (run,), left = broker.feed_some(b"".join(encoded), 4)
    assert isinstance(run, PublishesAlike) and run.publishes() == packets[:4]
    assert broker.decoded == 4, "a turn counts each PUBLISH of a run off its packets"
    assert left == sum(map(len, encoded[4:]))


def test_another_packet_after_publishes_alike_is_decoded_as_itself():
    """The first byte and size of a PUBREL differ from a PUBLISH's; a PUBLISH of another topic with the same
    fixed header differs in its topic: each ends the PUBLISHes alike and is decoded as itself."""
    alike = [Publish("t/a", b"ab", 1, packet_id=n) for n in (1, 2)]
    other_topic = Publish("t/b", b"ab", 1, packet_id=3)
    read = b"".join(encode(packet, MQTT_3_1_1) for packet in [*alike, other_topic, *alike])
    read += encode(PubRel(9), MQTT_3_1_1) + frame(0x32, string("t/a"), b"\x00\x05ab")
    decoded = PacketDecoder(protocol_version=MQTT_3_1_1).feed(read)
    assert decoded == [*alike, other_topic, *alike, PubRel(9), Publish("t/a", b"ab", 1, packet_id=5)]


def test_a_malformed_packet_after_publishes_alike_is_refused_after_them():
    alike = [Publish("t/a", b"ab", 0) for _ in range(3)]
    read = b"".join(encode(packet, MQTT_3_1_1) for packet in alike) + frame(
        0x30, b"\x00\x05t/a"
    )  # topic short
    with pytest.raises(MQTTError) as caught:
        PacketDecoder(protocol_version=MQTT_3_1_1).feed(read)
    assert caught.value.packets_before == alike


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_only_the_first_of_publishes_alike_goes_through_the_general_decoder(version, qos, monkeypatch):
    """Packet ids whose low byte is 0 included (an MQTT 5 payload starts after one more byte, the properties'
    length 0: taken for the packet id's, these would lose their payload's first byte)."""
    general: list[int] = []
    decode_publish = PacketDecoder._decode_publish

    def counted(self, *args):
        general.append(1)
        return decode_publish(self, *args)

    monkeypatch.setattr(PacketDecoder, "_decode_publish", counted)
    packets = [Publish("t/a", b"%02d" % n, qos, packet_id=256 * (n + 1) if qos else None) for n in range(10)]
    read = b"".join(encode(packet, version) for packet in packets)
    assert PacketDecoder(protocol_version=version).feed(read) == packets
    assert len(general) == 1
