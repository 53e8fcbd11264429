"""The on-disk record: a length-prefixed, CRC32C-checked frame per MQTT publish.

Frame layout (little endian)::

    u32 body_length | u32 crc32c(body) | body
    body = u8 version | u64 offset | i64 timestamp_ms | u8 qos | u8 flags | u16 client_id_len | client_id
           [u16 packet_id]                                            if version == 2
           [u16 content_type_len | content_type]                       if flags & FLAG_CONTENT_TYPE
           [u16 count | (u16 key_len | key | u16 value_len | value)*]  if flags & FLAG_USER_PROPERTIES
           [u16 response_topic_len | response_topic]                  if flags & FLAG_RESPONSE_TOPIC
           [u16 correlation_data_len | correlation_data]              if flags & FLAG_CORRELATION_DATA
           [u32 message_expiry_interval]                              if flags & FLAG_MESSAGE_EXPIRY
           payload (the rest of the body)

Version 2 is a QoS 2 publish that keeps its client's packet id (with the client id, what tells a resend of it
after a crash from a new message, see docs/broker.md); every other record is version 1, as every record of
brokers before it was. Both are read.

The MQTT 5 Message Expiry Interval counts from the record's timestamp: a reader holding the record later
(a replay, a session resumed after a restart) knows whether it has expired and what remains of it.

The length prefix makes a torn tail detectable (the frame runs past the end of the file) and the checksum
catches flipped bits; the offset inside the frame catches an index that points at the wrong record.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field


def _load_crc32c(data: bytes | memoryview, value: int = 0) -> int:
    """The first checksum: imports the `crc32c` package (which reads its own version through
    importlib.metadata, not worth paying to open an empty data directory) and binds its function."""
    global crc32c
    from crc32c import crc32c as function

    crc32c = function
    return function(data, value)


crc32c: Callable[..., int] = _load_crc32c
"""CRC32C of a buffer, continued from ``value`` (the `crc32c` package's function once the first checksum has
loaded it). Other modules call it as ``record.crc32c`` so that they see the bound function."""

FORMAT_VERSION = 1
PACKET_ID_VERSION = 2
"""The version of a record whose client id is followed by its publisher's packet id (a QoS 2 publish)."""
VERSIONS = (FORMAT_VERSION, PACKET_ID_VERSION)
PREFIX = struct.Struct("<II")
BODY_HEAD = struct.Struct("<BQqBBH")
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
PREFIX_SIZE = PREFIX.size
MIN_BODY_SIZE = BODY_HEAD.size
FRAME_OVERHEAD = PREFIX_SIZE + MIN_BODY_SIZE
QOS_AT = PREFIX_SIZE + 17
"""Frame position of the qos byte (after version, offset and time); the flags byte follows it."""

FLAG_RETAIN = 0x01
FLAG_PAYLOAD_FORMAT = 0x02
FLAG_PAYLOAD_UTF8 = 0x04
FLAG_CONTENT_TYPE = 0x08
FLAG_USER_PROPERTIES = 0x10
FLAG_MESSAGE_EXPIRY = 0x20
FLAG_RESPONSE_TOPIC = 0x40
FLAG_CORRELATION_DATA = 0x80
_U16_MAX = 0xFFFF


EntryHead = tuple[int, bytes, Callable[[int, int, int, int], bytes]]
"""How a partition log heads each frame of one topic (see `entry.head_of`): the topic id, the bytes its
entries' check starts from, and the pack of (topic id, check, body length, frame CRC) into the entry's
header followed by the frame's length prefix."""

_NO_HEAD: EntryHead = (0, b"", PREFIX.pack)
"""`encode_framed`'s locals when it heads no frame (never called then)."""

RecordFields = tuple[
    bytes,
    int,
    bool,
    str,
    Sequence[tuple[str, str]],
    str | None,
    int | None,
    int | None,
    str | None,
    bytes | None,
]
"""(payload, qos, retain, client_id, user_properties, content_type, payload_format_indicator,
message_expiry_interval, response_topic, correlation_data): one record of `CommitLog.append_batch`. A QoS 2
publish that keeps its packet id has it in the bits of `qos` above the first byte (`qos_with_packet_id`)."""


def qos_with_packet_id(qos: int, packet_id: int) -> int:
    """The `qos` field of `RecordFields` for a publish whose record keeps its client's `packet_id`."""
    return qos | packet_id << 8


@dataclass(slots=True)
class AppendRecord:
    """A publish as the broker hands it to the log; the log assigns the offset (and the time when None)."""

    payload: bytes
    qos: int = 1
    retain: bool = False
    client_id: str = ""
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    content_type: str | None = None
    payload_format_indicator: int | None = None
    timestamp_ms: int | None = None
    message_expiry_interval: int | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None

    def fields(self) -> tuple:
        """(payload, qos, retain, client_id, user_properties, content_type, payload_format_indicator,
        timestamp_ms, message_expiry_interval, response_topic, correlation_data): the arguments of
        `append_message`."""
        return (
            self.payload, self.qos, self.retain, self.client_id, self.user_properties, self.content_type,
            self.payload_format_indicator, self.timestamp_ms, self.message_expiry_interval,
            self.response_topic, self.correlation_data
        )  # fmt: skip

    def batch_fields(self) -> RecordFields:
        """The record as one entry of `CommitLog.append_batch` (every field but the time)."""
        return (
            self.payload, self.qos, self.retain, self.client_id, self.user_properties, self.content_type,
            self.payload_format_indicator, self.message_expiry_interval, self.response_topic,
            self.correlation_data
        )  # fmt: skip


@dataclass(slots=True)
class Record:
    """A stored publish as readers get it.

    Records served from a log's tail cache are shared between readers: treat them as immutable.
    `frame` is the encoded record exactly as stored (a memoryview into the read buffer for records read
    from disk), so links that forward raw records never re-encode.
    """

    offset: int
    timestamp_ms: int
    client_id: str
    qos: int
    retain: bool
    payload: bytes
    user_properties: Sequence[tuple[str, str]]
    content_type: str | None
    payload_format_indicator: int | None
    frame: bytes | memoryview = field(repr=False)
    message_expiry_interval: int | None = None
    """MQTT 5 Message Expiry Interval in seconds from `timestamp_ms` (None: never expires)."""
    response_topic: str | None = None
    correlation_data: bytes | None = None
    packet_id: int | None = None
    """The publisher's packet id of a QoS 2 record that keeps it (version 2), else None."""

    @property
    def size(self) -> int:
        """Encoded size in bytes (what byte limits on reads count)."""
        return len(self.frame)


class FrameError(ValueError):
    """A frame failed framing, checksum or offset validation; `reason` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _encode_str(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > _U16_MAX:
        raise ValueError(f"string of {len(raw)} bytes does not fit a record field (max {_U16_MAX})")
    return raw


_pack_head = BODY_HEAD.pack
_pack_prefix = PREFIX.pack


def encode_frame(
    offset: int,
    timestamp_ms: int,
    payload: bytes,
    qos: int,
    retain: bool,
    client_id: str,
    user_properties: Sequence[tuple[str, str]],
    content_type: str | None,
    payload_format_indicator: int | None,
    message_expiry_interval: int | None = None,
    response_topic: str | None = None,
    correlation_data: bytes | None = None,
) -> bytes:
    """Encode one publish as the frame stored at `offset` (raises ValueError if a field does not fit the
    format: a string over 64 KiB, too many properties; struct.error for a QoS or offset out of range).

    The common publish (no MQTT 5 properties) takes one struct pack, two concatenations and one CRC over
    the body: this runs for every append.
    """
    raw_id = client_id.encode()
    if len(raw_id) > _U16_MAX:
        raise ValueError(f"client id of {len(raw_id)} bytes does not fit a record (max {_U16_MAX})")
    version, cid_length = FORMAT_VERSION, len(raw_id)
    if qos > 0xFF:  # a QoS 2 publish keeping its packet id (`qos_with_packet_id`): after the client id
        version = PACKET_ID_VERSION
        raw_id += U16.pack(qos >> 8)
        qos &= 0xFF
    if (
        content_type is None
        and payload_format_indicator is None
        and not user_properties
        and message_expiry_interval is None
        and response_topic is None
        and correlation_data is None
    ):
        flags = FLAG_RETAIN if retain else 0
        body = _pack_head(version, offset, timestamp_ms, qos, flags, cid_length) + raw_id + payload
        return _pack_prefix(len(body), crc32c(body)) + body
    flags = FLAG_RETAIN if retain else 0
    parts: list[bytes] = [b"", raw_id]
    if payload_format_indicator is not None:
        flags |= FLAG_PAYLOAD_FORMAT | (FLAG_PAYLOAD_UTF8 if payload_format_indicator else 0)
    if content_type is not None:
        flags |= FLAG_CONTENT_TYPE
        raw = _encode_str(content_type)
        parts += (U16.pack(len(raw)), raw)
    if user_properties:
        flags |= FLAG_USER_PROPERTIES
        if len(user_properties) > _U16_MAX:
            raise ValueError(f"{len(user_properties)} user properties do not fit a record")
        parts.append(U16.pack(len(user_properties)))
        for key, value in user_properties:
            raw_key, raw_value = _encode_str(key), _encode_str(value)
            parts += (U16.pack(len(raw_key)), raw_key, U16.pack(len(raw_value)), raw_value)
    if response_topic is not None:
        flags |= FLAG_RESPONSE_TOPIC
        raw = _encode_str(response_topic)
        parts += (U16.pack(len(raw)), raw)
    if correlation_data is not None:
        flags |= FLAG_CORRELATION_DATA
        if len(correlation_data) > _U16_MAX:
            raise ValueError(f"correlation data of {len(correlation_data)} bytes does not fit a record")
        parts += (U16.pack(len(correlation_data)), correlation_data)
    if message_expiry_interval is not None:
        flags |= FLAG_MESSAGE_EXPIRY
        parts.append(U32.pack(message_expiry_interval))
    parts[0] = _pack_head(version, offset, timestamp_ms, qos, flags, cid_length)
    parts.append(payload)
    body = b"".join(parts)
    return _pack_prefix(len(body), crc32c(body)) + body


def encode_frames(first_offset: int, timestamp_ms: int, records: Iterable[RecordFields]) -> list[bytes]:
    """The frames of `records` stored from `first_offset` on, all at `timestamp_ms`.

    Same format and errors as `encode_frame`; a record without MQTT 5 fields costs one struct pack, two
    concatenations and one CRC, without a call per record.
    """
    return encode_framed(first_offset, timestamp_ms, records, None)


def encode_framed(
    first_offset: int, timestamp_ms: int, records: Iterable[RecordFields], head: EntryHead | None
) -> list[bytes]:
    """`encode_frames`, each frame behind a partition log's entry header when `head` is given (see
    `entry.head_of`): one loop and one buffer per record either way; the header and the frame's length
    prefix are packed in one call."""
    frames: list[bytes] = []
    append = frames.append
    pack_head, pack_prefix, checksum = _pack_head, _pack_prefix, crc32c
    topic_id, check_start, pack_headed = head if head is not None else _NO_HEAD
    last_id, raw_id = None, b""
    for offset, fields in enumerate(records, first_offset):
        (payload, qos, retain, client_id, properties, content_type,
         indicator, expiry, response, correlation) = fields  # fmt: skip
        if (
            properties
            or content_type is not None
            or indicator is not None
            or expiry is not None
            or response is not None
            or correlation is not None
        ):
            frame = encode_frame(offset, timestamp_ms, *fields)
            if head is not None:
                length, crc = PREFIX.unpack_from(frame)
                frame = pack_headed(topic_id, checksum(check_start, crc), length, crc) + frame[PREFIX_SIZE:]
            append(frame)
            continue
        if client_id is not last_id:
            last_id, raw_id = client_id, client_id.encode()
            if len(raw_id) > _U16_MAX:
                raise ValueError(f"client id of {len(raw_id)} bytes does not fit a record (max {_U16_MAX})")
        flags = FLAG_RETAIN if retain else 0
        if qos > 0xFF:  # a QoS 2 publish keeping its packet id (`qos_with_packet_id`)
            body = pack_head(PACKET_ID_VERSION, offset, timestamp_ms, qos & 0xFF, flags, len(raw_id))
            body += raw_id + U16.pack(qos >> 8) + payload
        else:
            body = pack_head(FORMAT_VERSION, offset, timestamp_ms, qos, flags, len(raw_id)) + raw_id + payload
        crc = checksum(body)
        if head is None:
            append(pack_prefix(len(body), crc) + body)
        else:
            append(pack_headed(topic_id, checksum(check_start, crc), len(body), crc) + body)
    return frames


def encode_record(offset: int, timestamp_ms: int, record: AppendRecord) -> bytes:
    """Encode `record` as the frame stored at `offset`."""
    return encode_frame(offset, timestamp_ms, *record.batch_fields())


def check_frame(buf: bytes | memoryview, pos: int, expected_offset: int, max_body: int) -> tuple[int, int]:
    """Validate the frame at `pos`: framing, checksum and offset. Returns (end position, timestamp_ms).

    Raises `FrameError` with reason `torn` (runs past the buffer), `length`, `checksum`, `version` or
    `offset`. Used by recovery, which needs no decoded record.
    """
    size = len(buf)
    if pos + PREFIX_SIZE > size:
        raise FrameError("torn")
    body_length, checksum = PREFIX.unpack_from(buf, pos)
    if body_length < MIN_BODY_SIZE or body_length > max_body:
        raise FrameError("length")
    end = pos + PREFIX_SIZE + body_length
    if end > size:
        raise FrameError("torn")
    view = memoryview(buf)
    if crc32c(view[pos + PREFIX_SIZE : end]) != checksum:
        raise FrameError("checksum")
    version, offset, timestamp_ms, _qos, _flags, _cid = BODY_HEAD.unpack_from(buf, pos + PREFIX_SIZE)
    if version != FORMAT_VERSION and version != PACKET_ID_VERSION:
        raise FrameError("version")
    if offset != expected_offset:
        raise FrameError("offset")
    return end, timestamp_ms


@dataclass(slots=True)
class CheckedFrames:
    """What `check_frames` found in a buffer: the good frames before the first bad one, each one's timestamp
    and CRC field, and that bad frame's error (None when all were good)."""

    frames: list[memoryview]
    times: list[int]
    crcs: list[int]
    error: FrameError | None


def check_frames(buf: bytes | memoryview, first_offset: int, max_body: int) -> CheckedFrames:
    """`check_frame` of each consecutive frame filling `buf`, expecting dense offsets from `first_offset`,
    in one loop (a replica checks every frame a leader sends it). The same checks in the same order, inlined
    because a call per frame is much of a follower's append; `test_record_format` holds the two to the same
    answers."""
    view = memoryview(buf)
    size = len(view)
    frames: list[memoryview] = []
    times: list[int] = []
    crcs: list[int] = []
    unpack_prefix, unpack_head, checksum = PREFIX.unpack_from, BODY_HEAD.unpack_from, crc32c
    position, offset = 0, first_offset
    while position < size:
        if position + PREFIX_SIZE > size:
            return CheckedFrames(frames, times, crcs, FrameError("torn"))
        body_length, crc = unpack_prefix(view, position)
        if body_length < MIN_BODY_SIZE or body_length > max_body:
            return CheckedFrames(frames, times, crcs, FrameError("length"))
        body = position + PREFIX_SIZE
        end = body + body_length
        if end > size:
            return CheckedFrames(frames, times, crcs, FrameError("torn"))
        if checksum(view[body:end]) != crc:
            return CheckedFrames(frames, times, crcs, FrameError("checksum"))
        version, stored_offset, timestamp_ms, _qos, _flags, _cid = unpack_head(view, body)
        if version != FORMAT_VERSION and version != PACKET_ID_VERSION:
            return CheckedFrames(frames, times, crcs, FrameError("version"))
        if stored_offset != offset:
            return CheckedFrames(frames, times, crcs, FrameError("offset"))
        frames.append(view[position:end])
        times.append(timestamp_ms)
        crcs.append(crc)
        position = end
        offset += 1
    return CheckedFrames(frames, times, crcs, None)


def decode_frames(buf: bytes, first_offset: int, max_body: int) -> tuple[list[Record], FrameError | None]:
    """Decode consecutive frames filling `buf`, expecting dense offsets from `first_offset`.

    Returns the records before the first bad frame and that frame's error (None when all were valid), so a
    reader gets every good record and never a damaged one.
    """
    records: list[Record] = []
    view = memoryview(buf)
    pos = 0
    offset = first_offset
    size = len(buf)
    try:
        while pos < size:
            end, timestamp_ms = check_frame(view, pos, offset, max_body)
            records.append(_decode_checked(view, pos, end, offset, timestamp_ms))
            pos = end
            offset += 1
    except FrameError as error:
        return records, error
    return records, None


def decode_frame(buf: bytes | memoryview, expected_offset: int, max_body: int) -> Record:
    """Decode the single frame that fills `buf` (raises `FrameError`). Given `bytes`, the record keeps them
    as its frame (a memoryview would cost more than a small frame, and keep a larger buffer alive)."""
    view = memoryview(buf)
    end, timestamp_ms = check_frame(view, 0, expected_offset, max_body)
    if end != len(view):
        raise FrameError("length")
    record = _decode_checked(view, 0, end, expected_offset, timestamp_ms)
    if isinstance(buf, bytes):
        record.frame = buf
    return record


V5Extras = tuple[int | None, str | None, bytes | None]
"""(message_expiry_interval, response_topic, correlation_data) of a record that has any of them."""

_EXTRA_FLAGS = FLAG_RESPONSE_TOPIC | FLAG_CORRELATION_DATA | FLAG_MESSAGE_EXPIRY


def decode_fields(
    view: memoryview, pos: int, end: int
) -> tuple[str, str | None, list[tuple[str, str]], int, V5Extras | None]:
    """The variable fields of the checked frame `view[pos:end]`: (client_id, content_type, user_properties,
    position of the payload, the other MQTT 5 fields or None). Raises `FrameError("fields")` when they
    overrun the frame or are not UTF-8."""
    try:
        version, _o, _t, _qos, flags, cid_length = BODY_HEAD.unpack_from(view, pos + PREFIX_SIZE)
        p = pos + FRAME_OVERHEAD
        client_id = str(view[p : p + cid_length], "utf-8")
        p += cid_length
        if version == PACKET_ID_VERSION:
            p += U16.size  # the packet id (`packet_id_of`)
        content_type = None
        if flags & FLAG_CONTENT_TYPE:
            (length,) = U16.unpack_from(view, p)
            content_type = str(view[p + 2 : p + 2 + length], "utf-8")
            p += 2 + length
        user_properties: list[tuple[str, str]] = []
        if flags & FLAG_USER_PROPERTIES:
            (count,) = U16.unpack_from(view, p)
            p += 2
            for _ in range(count):
                (length,) = U16.unpack_from(view, p)
                key = str(view[p + 2 : p + 2 + length], "utf-8")
                p += 2 + length
                (length,) = U16.unpack_from(view, p)
                value = str(view[p + 2 : p + 2 + length], "utf-8")
                p += 2 + length
                user_properties.append((key, value))
        extras = None
        if flags & _EXTRA_FLAGS:
            response_topic = correlation_data = expiry = None
            if flags & FLAG_RESPONSE_TOPIC:
                (length,) = U16.unpack_from(view, p)
                response_topic = str(view[p + 2 : p + 2 + length], "utf-8")
                p += 2 + length
            if flags & FLAG_CORRELATION_DATA:
                (length,) = U16.unpack_from(view, p)
                correlation_data = bytes(view[p + 2 : p + 2 + length])
                p += 2 + length
            if flags & FLAG_MESSAGE_EXPIRY:
                (expiry,) = U32.unpack_from(view, p)
                p += U32.size
            extras = (expiry, response_topic, correlation_data)
        if p > end:
            raise FrameError("fields")
    except (struct.error, UnicodeDecodeError) as error:
        raise FrameError("fields") from error
    return client_id, content_type, user_properties, p, extras


def _decode_checked(view: memoryview, pos: int, end: int, offset: int, timestamp_ms: int) -> Record:
    qos, flags = view[pos + QOS_AT], view[pos + QOS_AT + 1]
    client_id, content_type, user_properties, p, extras = decode_fields(view, pos, end)
    indicator = (1 if flags & FLAG_PAYLOAD_UTF8 else 0) if flags & FLAG_PAYLOAD_FORMAT else None
    record = Record(
        offset,
        timestamp_ms,
        client_id,
        qos,
        bool(flags & FLAG_RETAIN),
        bytes(view[p:end]),
        user_properties,
        content_type,
        indicator,
        view[pos:end],
    )
    if extras is not None:
        record.message_expiry_interval, record.response_topic, record.correlation_data = extras
    if view[pos + PREFIX_SIZE] == PACKET_ID_VERSION:
        record.packet_id = packet_id_of(view, pos)
    return record


def packet_id_of(view: memoryview, pos: int) -> int | None:
    """The packet id the checked frame at `pos` keeps (version 2), else None."""
    if view[pos + PREFIX_SIZE] != PACKET_ID_VERSION:
        return None
    (cid_length,) = U16.unpack_from(view, pos + FRAME_OVERHEAD - U16.size)
    return int(U16.unpack_from(view, pos + FRAME_OVERHEAD + cid_length)[0])
