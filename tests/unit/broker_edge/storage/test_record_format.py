"""The record frame: every field survives a round trip; damage of any kind is detected, never decoded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_edge.storage.entry import ENTRY_HEAD, MAX_TOPIC_ID, check_of, head_of, parse_head
from broker_edge.storage.record import (
    PREFIX,
    PREFIX_SIZE,
    AppendRecord,
    FrameError,
    check_frame,
    check_frames,
    decode_frame,
    decode_frames,
    encode_framed,
    encode_frames,
    encode_record,
    qos_with_packet_id,
)

MAX_BODY = 1 << 20
text = st.text(max_size=40)


@given(
    offset=st.integers(0, 2**64 - 1),
    timestamp_ms=st.integers(-(2**63), 2**63 - 1),
    payload=st.binary(max_size=300),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    client_id=text,
    user_properties=st.lists(st.tuples(text, text), max_size=4),
    content_type=st.none() | text,
    indicator=st.none() | st.integers(0, 1),
)
def test_every_field_round_trips(
    offset, timestamp_ms, payload, qos, retain, client_id, user_properties, content_type, indicator
):
    record = AppendRecord(payload, qos, retain, client_id, user_properties, content_type, indicator)
    frame = encode_record(offset, timestamp_ms, record)

    decoded = decode_frame(frame, offset, MAX_BODY)

    assert (decoded.offset, decoded.timestamp_ms) == (offset, timestamp_ms)
    assert decoded.payload == payload
    assert (decoded.qos, decoded.retain, decoded.client_id) == (qos, retain, client_id)
    assert decoded.user_properties == user_properties
    assert decoded.content_type == content_type
    assert decoded.payload_format_indicator == indicator
    assert bytes(decoded.frame) == frame


def _frames(count: int) -> bytes:
    return b"".join(
        encode_record(offset, 1000 + offset, AppendRecord(b"data-%d" % offset, client_id="c"))
        for offset in range(count)
    )


def test_consecutive_frames_decode_in_one_pass():
    records, error = decode_frames(_frames(5), 0, MAX_BODY)

    assert error is None
    assert [record.payload for record in records] == [b"data-%d" % n for n in range(5)]


@pytest.mark.parametrize("position", [0, 4, PREFIX_SIZE, PREFIX_SIZE + 3, -1])
def test_any_flipped_byte_is_caught(position):
    frame = bytearray(_frames(1))
    frame[position] ^= 0x01

    with pytest.raises(FrameError):
        decode_frame(bytes(frame), 0, MAX_BODY)


def test_a_torn_frame_is_reported_as_torn():
    frame = _frames(1)

    with pytest.raises(FrameError) as caught:
        decode_frame(frame[:-3], 0, MAX_BODY)

    assert caught.value.reason == "torn"


def test_a_frame_at_the_wrong_offset_is_rejected():
    with pytest.raises(FrameError) as caught:
        decode_frame(_frames(1), 7, MAX_BODY)

    assert caught.value.reason == "offset"


def test_records_before_a_damaged_frame_are_still_returned():
    data = bytearray(_frames(4))
    second_frame_end = len(_frames(2))
    data[second_frame_end + PREFIX_SIZE + 5] ^= 0xFF

    records, error = decode_frames(bytes(data), 0, MAX_BODY)

    assert [record.offset for record in records] == [0, 1]
    assert error is not None and error.reason == "checksum"


def _checked_one_by_one(data: bytes, first: int, max_body: int) -> tuple[list[bytes], list[int], str | None]:
    """What `check_frame` says of each frame in turn: the good frames, their times, the first error."""
    frames, times, position, offset = [], [], 0, first
    try:
        while position < len(data):
            end, timestamp = check_frame(data, position, offset, max_body)
            frames.append(data[position:end])
            times.append(timestamp)
            position, offset = end, offset + 1
    except FrameError as error:
        return frames, times, error.reason
    return frames, times, None


@given(position=st.integers(0, 10_000), bit=st.integers(0, 7), cut=st.integers(0, 10_000))
def test_frames_checked_in_one_loop_as_one_by_one(position, bit, cut):
    data = bytearray(_frames(4))
    data[position % len(data)] ^= 1 << bit
    damaged = bytes(data[: len(data) - cut % 40])
    for first, max_body in ((0, MAX_BODY), (1, MAX_BODY), (0, 30)):
        checked = check_frames(damaged, first, max_body)
        frames, times, reason = _checked_one_by_one(damaged, first, max_body)
        assert [bytes(frame) for frame in checked.frames] == frames
        assert checked.times == times
        assert (checked.error.reason if checked.error else None) == reason
        assert checked.crcs == [PREFIX.unpack_from(frame)[1] for frame in frames]


def test_oversized_strings_are_refused_at_encode():
    with pytest.raises(ValueError):
        encode_record(0, 0, AppendRecord(b"", client_id="x" * 70_000))


def _append_record(fields: tuple) -> AppendRecord:
    """The ``AppendRecord`` of one ``append_batch`` entry (the same fields, and no time of its own)."""
    payload, qos, retain, client_id, user_properties, content_type, payload_format, expiry, response, data = (
        fields
    )
    return AppendRecord(
        payload,
        qos,
        retain,
        client_id,
        list(user_properties),
        content_type,
        payload_format,
        None,
        expiry,
        response,
        data,
    )


@given(
    first=st.integers(0, 2**40),
    records=st.lists(
        st.tuples(
            st.binary(max_size=50),
            st.integers(0, 2),
            st.booleans(),
            st.sampled_from(["", "device-1", "capteur-é"]),
            st.sampled_from([(), [("k", "v")]]),
            st.sampled_from([None, "text/plain"]),
            st.sampled_from([None, 0, 1]),
            st.sampled_from([None, 0, 3600, 2**32 - 1]),
            st.sampled_from([None, "replies/1", "réponses"]),
            st.sampled_from([None, b"", b"\x00\x01"]),
        ),
        max_size=12,
    ),
)
def test_a_batch_encodes_exactly_as_its_records_one_by_one(first, records):
    frames = encode_frames(first, 1_700_000_000_123, records)

    expected = [
        encode_record(first + n, 1_700_000_000_123, _append_record(fields))
        for n, fields in enumerate(records)
    ]
    assert frames == expected


def test_a_batch_refuses_an_oversized_client_id():
    with pytest.raises(ValueError):
        encode_frames(
            0,
            0,
            [
                (b"ok", 1, False, "d", (), None, None, None, None, None),
                (b"", 1, False, "x" * 70_000, (), None, None, None, None, None),
            ],
        )


@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_a_qos2_record_keeps_its_packet_id_and_a_record_without_one_reads_as_before(content_type):
    """Version 2 keeps the publisher's packet id after the client id; version 1 (every record of brokers
    before it) has none. Both decode with every other field intact, alone and in a run of frames."""
    kept = AppendRecord(b"payload", qos_with_packet_id(2, 65535), False, "dev", [("k", "v")], content_type)
    plain = AppendRecord(b"payload", 2, False, "dev", [("k", "v")], content_type)
    frames = [encode_record(7, 1000, kept), encode_record(8, 1000, plain)]
    assert [frame[PREFIX_SIZE] for frame in frames] == [2, 1]
    records, error = decode_frames(b"".join(frames), 7, MAX_BODY)
    assert error is None and check_frames(b"".join(frames), 7, MAX_BODY).error is None
    assert [(r.packet_id, r.qos, r.client_id, r.payload, r.content_type) for r in records] == [
        (65535, 2, "dev", b"payload", content_type),
        (None, 2, "dev", b"payload", content_type),
    ]
    assert encode_frames(7, 1000, [kept.batch_fields()]) == frames[:1]


@given(
    topic_id=st.integers(0, MAX_TOPIC_ID),
    payload=st.binary(max_size=300),
    qos=st.integers(0, 2),
    user_properties=st.lists(st.tuples(text, text), max_size=2),
    content_type=st.none() | text,
)
def test_a_headed_frame_is_the_frame_behind_its_entry_header(
    topic_id, payload, qos, user_properties, content_type
):
    """A partition log's entries (`encode_framed` with `entry.head_of`): each record's frame as
    `encode_frames` makes it, behind the header of its topic, whether or not it has MQTT 5 fields."""
    records = [
        AppendRecord(payload, qos, client_id="device-1").batch_fields(),
        AppendRecord(payload, qos, False, "device-1", user_properties, content_type).batch_fields(),
        AppendRecord(payload, qos_with_packet_id(2, 7), client_id="device-2").batch_fields(),
    ]
    entries = encode_framed(40, 1_700_000_000_123, records, head_of(topic_id))
    for entry, frame in zip(entries, encode_frames(40, 1_700_000_000_123, records), strict=True):
        crc = int.from_bytes(frame[4:8], "little")
        assert entry == ENTRY_HEAD.pack(topic_id, check_of(topic_id, crc)) + frame
        assert parse_head(entry, 0, MAX_BODY) == (topic_id, len(entry))
