"""The peer link's wire format: a forward is a table of its publishes and their data (a publish with MQTT 5
fields as a record frame carrying all of them), answers are runs of codes and offsets, several parts travel in
one WebSocket message; malformed input is refused, never half-read."""

from __future__ import annotations

import time
from typing import Any

import pytest

from broker_edge.cluster.links.link_wire import decode_parts
from broker_edge.cluster.links.peer_link import (
    ANSWER,
    FORWARD,
    UNLOGGED,
    decode_answer,
    decode_forward,
    decode_unlogged,
    encode_answer,
    encode_forward,
    encode_unlogged,
)
from broker_edge.engine.message import Message
from broker_edge.engine.ports import ForwardAck
from broker_edge.protocol.properties import Properties


def _message(payload: bytes, **properties: Any) -> Message:
    props = Properties(**properties) if properties else None
    return Message("site/a/temp", payload, 1, True, props, "device-7", None, time.monotonic() + 60)


def test_a_forward_batch_round_trips_every_field():
    plain = _message(b"21.5")
    rich = _message(
        b"\x00\x01",
        content_type="application/cbor",
        payload_format_indicator=0,
        response_topic="site/a/reply",
        correlation_data=b"\x42",
        user_properties=[("unit", "C"), ("unit", "K")],
    )
    data = encode_forward(77, "site/a/temp", [plain, rich]) + encode_unlogged(_message(b"live"))

    parts = decode_parts(data)
    assert [kind for kind, _ in parts] == [FORWARD, UNLOGGED]
    now = 1000.0
    batch, messages = decode_forward(parts[0][1], now)
    assert batch == 77
    assert [(m.topic, m.payload, m.qos, m.retain, m.origin) for m in messages] == [
        ("site/a/temp", b"21.5", 1, True, "device-7"),
        ("site/a/temp", b"\x00\x01", 1, True, "device-7"),
    ]
    assert messages[0].properties is None
    props = messages[1].properties
    assert props is not None
    assert (
        props.content_type,
        props.payload_format_indicator,
        props.response_topic,
        props.correlation_data,
    ) == (
        "application/cbor",
        0,
        "site/a/reply",
        b"\x42",
    )
    assert list(props.user_properties) == [("unit", "C"), ("unit", "K")]
    assert messages[0].expires_at is not None and 59 <= messages[0].expires_at - now <= 60
    live = decode_unlogged(parts[1][1], now)
    assert live.payload == b"live"


def test_publishes_of_several_publishers_keep_their_order_and_publisher():
    messages = [
        Message("t", bytes([n % 256]) * n, 1 + n % 2, n % 3 == 0, None, f"device-{n % 4}") for n in range(300)
    ]
    messages[150] = _message(b"expires")  # a record frame in the middle of plain publishes
    ((_, body),) = decode_parts(encode_forward(5, "t", messages))
    _, decoded = decode_forward(body, time.monotonic())
    assert [(m.payload, m.qos, m.retain, m.origin) for m in decoded] == [
        (m.payload, m.qos, m.retain, m.origin) for m in messages
    ]
    assert decoded[150].expires_at is not None and decoded[0].expires_at is None


def test_an_answer_round_trips_codes_offsets_and_reasons():
    acks = [
        ForwardAck(0, 41),
        ForwardAck(0x10, 42),
        ForwardAck(0x83, None, "partition 3 has no leader"),
        ForwardAck(0x83, None, "partition 3 has no leader"),
        ForwardAck(0, 50),
        ForwardAck(0, 51),
        ForwardAck(0, 53),
    ]
    ((kind, body),) = decode_parts(encode_answer(9, acks))
    assert kind == ANSWER
    assert decode_answer(body) == (9, acks)


def test_a_batch_appended_in_one_go_is_answered_as_one_run():
    acks = [ForwardAck(0, offset) for offset in range(1000, 71000)]  # more than a u16 count
    ((_, body),) = decode_parts(encode_answer(3, acks))
    assert len(body) < 40
    assert decode_answer(body) == (3, acks)
    with pytest.raises(ValueError, match="carries"):
        decode_answer(memoryview(bytes(body[:4]) + (5).to_bytes(4, "little") + body[8:]))


def test_a_truncated_message_or_a_damaged_frame_is_refused():
    data = encode_forward(1, "t", [_message(b"payload")])
    with pytest.raises(ValueError):
        decode_parts(data[:-3])
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF  # the payload's last byte: the forward's checksum no longer matches
    ((_, body),) = decode_parts(bytes(damaged))
    with pytest.raises(ValueError, match="checksum"):
        decode_forward(body, 0.0)
    damaged_frame = bytearray(encode_unlogged(_message(b"payload")))
    damaged_frame[-1] ^= 0xFF
    ((_, body),) = decode_parts(bytes(damaged_frame))
    with pytest.raises(ValueError, match="bad record frame"):
        decode_unlogged(body, 0.0)
