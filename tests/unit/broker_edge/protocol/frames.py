"""Hand-built MQTT frames and one-shot decoding, for feeding the decoder bytes no encoder writes."""

from typing import Literal

import pytest

from broker_edge.protocol import MQTTError, Packet, PacketDecoder, PubAck, PubAckRun


def frame(first_byte: int, *parts: bytes) -> bytes:
    """Fixed header + body for bodies under 128 bytes (one remaining-length byte, computed here)."""
    body = b"".join(parts)
    assert len(body) < 128, "frame() builds single-byte remaining lengths only"
    return bytes((first_byte, len(body))) + body


def string(text: str | bytes) -> bytes:
    """A length-prefixed string; bytes are taken as they are, so they may be invalid UTF-8."""
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def decode_all(
    data: bytes, protocol_version: int | None, role: Literal["server", "client"] = "server"
) -> list[Packet]:
    """Decode bytes with a fresh decoder (already past the handshake when a version is given)."""
    return PacketDecoder(role=role, protocol_version=protocol_version).feed(data)


def decode_error(
    data: bytes, protocol_version: int | None, role: Literal["server", "client"] = "server"
) -> MQTTError:
    """The error a fresh decoder raises on ``data``; fails the test when there is none."""
    with pytest.raises(MQTTError) as caught:
        decode_all(data, protocol_version, role)
    return caught.value


def one_by_one(packets: list[Packet]) -> list[Packet]:
    """``packets`` with each ``PubAckRun`` (a read of PUBACKs, decoded together) as the PUBACKs it stands
    for."""
    return [
        single
        for packet in packets
        for single in (
            [PubAck(packet_id) for packet_id in packet.packet_ids] if type(packet) is PubAckRun else [packet]
        )
    ]
