"""Valid client packets built field by field, and the mutations that break them in one known way each.

Each builder writes the body of one client packet type around a property block it is given (MQTT 5), so a
test can put any property, twice, or with a wrong length into any packet. ``client_frames`` gives whole
valid frames for the fuzzers; ``mutated`` breaks a frame at random (hypothesis draws how).
"""

from collections.abc import Callable

from hypothesis import strategies as st

from broker_edge.protocol.properties import PROPERTY_SPECS, WILL, PropertySpec, PropertyType
from broker_edge.protocol.wire import encode_varint

Body = Callable[[bytes], tuple[int, bytes]]
"""A property block (its length included) → the first byte and body of a packet carrying it."""

CONNECT_HEAD = b"\x00\x04MQTT\x05\x02\x00\x3c"
"""Protocol name, level 5, clean start, keep alive 60."""
WILL_HEAD = b"\x00\x04MQTT\x05\x06\x00\x3c"
"""The same with a will (QoS 0, not retained)."""


def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def frame(first: int, body: bytes) -> bytes:
    """Fixed header (remaining length in its shortest form) + body."""
    return bytes((first,)) + encode_varint(len(body)) + body


def block(*properties: bytes) -> bytes:
    """A property block: its length, then the properties."""
    body = b"".join(properties)
    return encode_varint(len(body)) + body


BODIES: dict[int, Body] = {
    1: lambda props: (0x10, CONNECT_HEAD + props + string("fuzz")),
    3: lambda props: (0x32, string("t") + b"\x00\x01" + props),
    4: lambda props: (0x40, b"\x00\x01\x00" + props),
    5: lambda props: (0x50, b"\x00\x01\x00" + props),
    6: lambda props: (0x62, b"\x00\x01\x00" + props),
    7: lambda props: (0x70, b"\x00\x01\x00" + props),
    8: lambda props: (0x82, b"\x00\x01" + props + string("t") + b"\x01"),
    10: lambda props: (0xA2, b"\x00\x01" + props + string("t")),
    14: lambda props: (0xE0, b"\x00" + props),
    15: lambda props: (0xF0, b"\x18" + props),
    WILL: lambda props: (0x10, WILL_HEAD + b"\x00" + string("fuzz") + props + string("w") + string("")),
}
"""Packet type (``WILL``: the will properties of a CONNECT) → its builder. A CONNECT's body is what a
decoder before the handshake gets; every other one follows a CONNECT."""

_VALUES = {
    PropertyType.BYTE: b"\x01",
    PropertyType.TWO_BYTE_INT: b"\x00\x01",
    PropertyType.FOUR_BYTE_INT: b"\x00\x00\x00\x01",
    PropertyType.VARINT: b"\x01",
    PropertyType.UTF8: string("x"),
    PropertyType.BINARY: string("x"),
    PropertyType.UTF8_PAIR: string("k") + string("v"),
}


def valid_property(spec: PropertySpec) -> bytes:
    """The property with a value valid wherever it is allowed (1, ``x``, a pair ``k`` ``v``)."""
    return bytes((spec.identifier,)) + _VALUES[spec.type]


def packet_frame(packet_type: int, props: bytes) -> bytes:
    """The frame of ``packet_type`` (or ``WILL``) carrying the property block ``props``."""
    return frame(*BODIES[packet_type](props))


SINGLE_PROPERTIES = [
    (packet_type, spec)
    for packet_type in BODIES
    for spec in PROPERTY_SPECS
    if packet_type in spec.packet_types and packet_type not in spec.repeatable_in
]
"""Every (packet type, property) where the property is allowed at most once."""

MISPLACED_PROPERTIES = [
    (packet_type, spec)
    for packet_type in BODIES
    for spec in PROPERTY_SPECS
    if packet_type not in spec.packet_types
]
"""Every (packet type, property) where the property is not allowed at all."""


def client_frames() -> st.SearchStrategy[bytes]:
    """A valid v5 frame a client sends after CONNECT, with a valid property of its type or none."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        packet_type = draw(st.sampled_from([t for t in BODIES if t not in (1, WILL, 15)]))
        allowed = [spec for spec in PROPERTY_SPECS if packet_type in spec.packet_types]
        chosen = draw(st.lists(st.sampled_from(allowed), max_size=3, unique_by=lambda spec: spec.identifier))
        chosen = [spec for spec in chosen if spec.name != "subscription_identifiers" or packet_type != 3]
        return packet_frame(packet_type, block(*(valid_property(spec) for spec in chosen)))

    return build()


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with one to three random edits: a bit flipped, a byte set, inserted or deleted, a cut."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "cut"]))
        at = draw(st.integers(0, max(len(out) - 1, 0)))
        if kind == "flip" and out:
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and out:
            out[at] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF, 0x0B, 0x23, 0x26]))
        elif kind == "insert":
            out.insert(at, draw(st.integers(0, 255)))
        elif kind == "delete" and len(out) > 1:
            del out[at]
        elif kind == "cut":
            del out[at:]
    return bytes(out)
