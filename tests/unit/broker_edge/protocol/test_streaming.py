"""A packet split at any byte boundary decodes, and many packets in one chunk decode in order."""

from hypothesis import given, settings
from hypothesis import strategies as st

from broker_edge.protocol import (
    MQTT_5,
    Connect,
    Disconnect,
    Packet,
    PacketDecoder,
    PingReq,
    Properties,
    PubAck,
    Publish,
    PubRel,
    Subscribe,
    Subscription,
    Unsubscribe,
    encode,
)
from broker_edge.protocol.errors import MQTTError
from tests.unit.broker_edge.protocol.frames import one_by_one
from tests.unit.broker_edge.protocol.mqtt_strategies import client_packets, connects

SESSION: list[Packet] = [
    Connect(protocol_version=MQTT_5, client_id="dev-1", properties=Properties(session_expiry_interval=60)),
    Publish("plant/1/temp", b"21.5", 1, packet_id=1, properties=Properties(user_properties=[("unit", "C")])),
    Publish("plant/1/big", bytes(300), 0),
    PubRel(7),
    Subscribe(2, [Subscription("ota/+/cmd", 1, no_local=True)]),
    Unsubscribe(3, ["ota/+/cmd"]),
    PubAck(4, 0x10, Properties(reason_string="nobody listens")),
    PingReq(),
    Disconnect(),
]
STREAM = b"".join(encode(packet, MQTT_5) for packet in SESSION)


def test_whole_session_in_one_chunk():
    assert PacketDecoder().feed(STREAM) == SESSION


def test_split_in_two_at_every_byte():
    for cut in range(len(STREAM) + 1):
        decoder = PacketDecoder()
        packets = decoder.feed(STREAM[:cut]) + decoder.feed(STREAM[cut:])
        assert packets == SESSION, f"cut at {cut}"
        assert decoder.buffered == 0


def test_one_byte_at_a_time():
    decoder = PacketDecoder()
    packets = []
    for index in range(len(STREAM)):
        packets += decoder.feed(STREAM[index : index + 1])
    assert packets == SESSION


def test_partial_packet_is_held_back_until_complete():
    frame = encode(Publish("a", b"payload", 0), 4)
    decoder = PacketDecoder(protocol_version=4)

    assert decoder.feed(frame[:-1]) == []
    assert decoder.buffered == len(frame) - 1
    assert decoder.feed(frame[-1:]) == [Publish("a", b"payload", 0)]
    assert decoder.buffered == 0


def test_memoryview_chunks_are_copied_out():
    buffer = bytearray(encode(Publish("a", b"xyz", 0), 4))
    decoder = PacketDecoder(protocol_version=4)

    packets = decoder.feed(memoryview(buffer))
    buffer[-3:] = b"000"

    assert packets == [Publish("a", b"xyz", 0)]


@settings(max_examples=200)
@given(st.data())
def test_random_chunking_of_random_packets(data):
    connect = data.draw(connects(MQTT_5))
    packets = [connect, *data.draw(st.lists(client_packets(MQTT_5), max_size=8))]
    stream = b"".join(encode(packet, MQTT_5) for packet in packets)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))

    decoder = PacketDecoder()
    decoded = []
    for start, stop in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoded += decoder.feed(stream[start:stop])

    assert one_by_one(decoded) == packets  # a read of short PUBACKs alone comes as one ``PubAckRun``


def test_a_topic_named_again_is_the_same_string_and_a_bad_one_is_refused_every_time():
    """Topic names decoded once are remembered by their bytes (each message of a topic carries the same
    ``str``); one that is not a valid topic name is never remembered, so it is refused every time."""
    decoder = PacketDecoder(protocol_version=4)
    frame = encode(Publish("plant/meter-7/telemetry", b"1"), 4)
    first, second = decoder.feed(frame + frame)
    assert first.topic == "plant/meter-7/telemetry" and first.topic is second.topic
    wildcard = encode(Publish("plant/x", b"1"), 4).replace(b"plant/x", b"plant/#")
    for _ in range(2):
        fresh = PacketDecoder(protocol_version=4)
        try:
            fresh.feed(wildcard)
        except MQTTError as error:
            assert "wildcard" in error.message
        else:
            raise AssertionError("a wildcard in a PUBLISH topic was accepted")


def test_feed_some_decodes_at_most_so_many_packets_and_hands_back_the_bytes_past_them():
    """A read of more packets than the turn has left is decoded up to there: the bytes past them (whole
    packets, the start of one) are handed back to be fed again, not kept; fed again they decode the rest."""
    decoder = PacketDecoder()
    packets = decoder.feed(STREAM[:40])  # CONNECT, and the start of the first PUBLISH held back
    assert packets == SESSION[:1] and decoder.buffered
    rest = STREAM[40:]
    some, unread = decoder.feed_some(rest, 3)
    assert some == SESSION[1:4] and decoder.buffered == 0 and unread
    packets += some
    while unread:
        rest = rest[-unread:]
        more, unread = decoder.feed_some(rest, 2)
        assert 1 <= len(more) <= 2
        packets += more
    assert packets == SESSION
    assert decoder.feed_some(encode(PingReq(), MQTT_5)[:1], 1) == ([], 0) and decoder.buffered == 1


def test_feed_some_of_pubacks_read_together_gives_one_run():
    decoder = PacketDecoder(protocol_version=MQTT_5)
    pubacks = b"".join(encode(PubAck(n), MQTT_5) for n in range(1, 101))
    packets, unread = decoder.feed_some(pubacks, 1)
    assert unread == 0 and len(packets) == 1 and packets[0].packet_ids == list(range(1, 101))
