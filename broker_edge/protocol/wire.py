"""MQTT wire primitives (spec 1.5): variable byte integers, two-byte lengths, UTF-8 strings, binary data.

Readers take ``(buf, view, pos, end)``: ``buf`` is indexed for single bytes, ``view`` (a memoryview of the
same bytes) is sliced without copying, and ``end`` is where the packet ends, never read past. Each returns
``(value, new_pos)``.
"""

from .errors import MalformedPacket

MAX_VARINT = 268_435_455
_SMALL_VARINTS = tuple(bytes((n,)) for n in range(0x80))
_U16 = tuple(n.to_bytes(2, "big") for n in range(256))


def encode_varint(value: int) -> bytes:
    """Variable byte integer in the fewest bytes, as the spec requires."""
    if value < 0x80:
        if value < 0:
            raise ValueError(f"variable byte integer out of range: {value}")
        return _SMALL_VARINTS[value]
    if value > MAX_VARINT:
        raise ValueError(f"variable byte integer out of range: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_u16(value: int) -> bytes:
    return _U16[value] if value < 256 else value.to_bytes(2, "big")


def encode_utf8(text: str) -> bytes:
    """Length-prefixed UTF-8 string; refuses what a receiver would call malformed."""
    data = text.encode("utf-8")
    if len(data) > 0xFFFF:
        raise ValueError(f"UTF-8 string longer than 65535 bytes ({len(data)})")
    if b"\x00" in data:
        raise ValueError("UTF-8 string contains U+0000")
    return encode_u16(len(data)) + data


def encode_binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError(f"binary data longer than 65535 bytes ({len(data)})")
    return encode_u16(len(data)) + data


def read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if pos >= end:
            raise MalformedPacket("variable byte integer runs past the end of the packet")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and shift:
                raise MalformedPacket("variable byte integer not in its shortest form")
            return value, pos
        shift += 7
        if shift == 28:
            raise MalformedPacket("variable byte integer longer than 4 bytes")


def read_u8(buf, pos: int, end: int) -> tuple[int, int]:
    if pos >= end:
        raise MalformedPacket("packet ends inside a one-byte field")
    return buf[pos], pos + 1


def read_u16(buf, pos: int, end: int) -> tuple[int, int]:
    if pos + 2 > end:
        raise MalformedPacket("packet ends inside a two-byte integer")
    return (buf[pos] << 8) | buf[pos + 1], pos + 2


def read_u32(buf, pos: int, end: int) -> tuple[int, int]:
    if pos + 4 > end:
        raise MalformedPacket("packet ends inside a four-byte integer")
    return (buf[pos] << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3], pos + 4


def read_binary(buf, view: memoryview, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise MalformedPacket("packet ends inside a length prefix")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise MalformedPacket("length prefix runs past the end of the packet")
    return bytes(view[pos + 2 : stop]), stop


def read_utf8(buf, view: memoryview, pos: int, end: int) -> tuple[str, int]:
    """Well-formed UTF-8 without U+0000 (the codec rejects surrogates and overlong forms)."""
    if pos + 2 > end:
        raise MalformedPacket("packet ends inside a length prefix")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise MalformedPacket("string length runs past the end of the packet")
    try:
        text = str(view[pos + 2 : stop], "utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedPacket(f"invalid UTF-8 string: {exc.reason}") from None
    if "\x00" in text:
        raise MalformedPacket("UTF-8 string contains U+0000")
    return text, stop
