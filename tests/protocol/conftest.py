"""Helpers shared by the protocol tests: decoders already past the handshake, one-shot decoding."""

import pytest

from broker_edge.protocol import MQTTError, Packet, PacketDecoder


def decode_all(data: bytes, protocol_version: int | None, role: str = "server") -> list[Packet]:
    """Decode a byte string with a fresh decoder (after the handshake when a version is given)."""
    return PacketDecoder(role=role, protocol_version=protocol_version).feed(data)


def decode_error(data: bytes, protocol_version: int | None, role: str = "server") -> MQTTError:
    """The error a fresh decoder raises on ``data``; fails the test if it raises none."""
    with pytest.raises(MQTTError) as caught:
        decode_all(data, protocol_version, role)
    return caught.value
