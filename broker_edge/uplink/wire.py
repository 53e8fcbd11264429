"""The uplink's messages, sans-IO: one WebSocket binary message each, bytes in and out, no socket or clock.

A message is ``kind`` (1 byte), the length of a JSON header (4 bytes, big endian), the header, then a body.
Only a batch has a body: the stored frames of its records (``storage.record``'s format, which carries each
record's offset, time and CRC), topic after topic, compressed as a whole. The hub appends those frames
verbatim, so its copy holds the site's bytes at the site's offsets.

The conversation (docs/uplink.md):

- site → hub ``HELLO`` {version, site, source}; hub → site ``ENDS`` {ends: {topic: end},
  max_message_bytes}: where each of the site's topics ends on the hub, durable, and the largest message it
  takes. The site sends every record from there: nothing twice, nothing skipped; its batches fit the hub's
  largest message. ``source`` is the site broker's store identity: a hub refuses a site already connected
  from another one (``ERROR`` with ``refusal`` ``site_connected``). A ``HELLO``'s ``max_message_bytes`` is
  the largest message the site takes: the hub then sends ``ENDS`` in pages that fit it, each but the last
  with ``more`` (a site of any number of topics).
- site → hub ``BATCH`` {seq, codec, topics: [[topic, first, count, size]], site_ends}; hub → site ``ACK``
  {seq, ends} once the batch is durable on the hub (or ``ERROR`` {message}, then the hub closes).
- site → hub ``STATE`` {site_ends} when idle: the site's log ends, so the hub knows its lag.
- The downlink: ``HELLO`` also carries {downlink: {filters, ends}}, the hub's topics the site mirrors and
  where the site's copies end; the hub sends them from there as ``DOWN`` (a batch's layout, never
  acknowledged: the next ``HELLO`` says where to resume).

``site_ends`` is ``{topic: [end, last_append_ms]}`` of the site's logs (the ones changed since the last
report), which the hub turns into lag in records and seconds; ``site_oldest`` (``{topic: time_ms}``, in a
``BATCH`` or ``STATE`` beside it) gives, of those the hub holds nothing of, the time of each one's oldest
record: how old the hub's lag on them is.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker_edge import bounds

__all__ = [
    "ACK",
    "BATCH",
    "CODECS",
    "DOWN",
    "ENDS",
    "ERROR",
    "HELLO",
    "REFUSAL_HEADER",
    "SITE_CONNECTED",
    "STATE",
    "VERSION",
    "Batch",
    "BatchTopic",
    "Message",
    "WireError",
    "compress",
    "decode",
    "decode_batch",
    "decompress",
    "encode",
    "encode_batch",
    "ends_of",
    "ends_pages",
    "join_frames",
    "message_limit_of",
    "seq_of",
    "site_ends_of",
    "site_oldest_of",
    "too_large",
]

VERSION = 1
HELLO, ENDS, BATCH, ACK, STATE, ERROR, DOWN = 1, 2, 3, 4, 5, 6, 7
_KINDS = {HELLO, ENDS, BATCH, ACK, STATE, ERROR, DOWN}
_PREFIX = struct.Struct(">BI")
CODECS = ("zstd", "zlib", "none")
REFUSAL_HEADER = "X-Timestone-Refusal"
"""The HTTP header of a hub's 403 that says why it refused a site's connection (a WebSocket client sees no
body)."""
SITE_CONNECTED = "site_connected"
"""An ``ERROR``'s ``refusal`` when the site is already connected from another broker (its ``HELLO``'s
``source``, the broker's store identity, differs): two brokers use the site's certificate."""
MAX_SEQ = bounds.MAX_COUNT
"""A batch's sequence number, at most (a sender numbers its batches from 0 on each connection)."""


class WireError(ValueError):
    """A message that does not decode: the connection is closed, nothing of it is applied."""


@dataclass(slots=True)
class Message:
    kind: int
    header: dict[str, Any]
    body: bytes = b""


@dataclass(slots=True)
class BatchTopic:
    """One topic's part of a batch: ``count`` records from offset ``first``, ``size`` bytes of frames."""

    topic: str
    first: int
    count: int
    size: int


@dataclass(slots=True)
class Batch:
    seq: int
    topics: list[BatchTopic]
    frames: bytes
    site_ends: dict[str, list[int]] = field(default_factory=dict)
    site_oldest: dict[str, int] = field(default_factory=dict)
    """Of the logs in ``site_ends`` the hub holds nothing of: the time of each one's oldest record."""


def encode(kind: int, header: dict[str, Any], body: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return _PREFIX.pack(kind, len(head)) + head + body


def decode(data: bytes) -> Message:
    if len(data) < _PREFIX.size:
        raise WireError(f"a message of {len(data)} bytes is shorter than its prefix")
    kind, length = _PREFIX.unpack_from(data)
    if kind not in _KINDS:
        raise WireError(f"unknown message kind {kind}")
    end = _PREFIX.size + length
    if end > len(data):
        raise WireError(f"header of {length} bytes overruns a message of {len(data)}")
    try:
        header = json.loads(data[_PREFIX.size : end], parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:  # not JSON, not UTF-8, nested too deep, 4,300 digits
        raise WireError(f"header is not JSON: {bounds.shown(str(error))}") from None
    if not isinstance(header, dict):
        raise WireError("header is not a JSON object")
    return Message(kind, header, bytes(data[end:]))


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number here")


def compress(codec: str, data: bytes) -> bytes:
    if codec == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(data)
    if codec == "zlib":
        return zlib.compress(data, 6)
    if codec == "none":
        return data
    raise WireError(f"unknown codec {codec!r}")


def decompress(codec: str, data: bytes, limit: int) -> bytes:
    """``data`` decompressed, refused past ``limit`` bytes (a small message must not unpack into GBs)."""
    if codec == "zstd":
        import zstandard

        try:
            if zstandard.frame_content_size(data) > limit:  # -1: not written, then max_output_size holds
                raise WireError(f"body decompresses past {limit} bytes")
            out = zstandard.ZstdDecompressor().decompress(data, max_output_size=limit)
        except zstandard.ZstdError as error:
            raise WireError(f"zstd body does not decompress within {limit} bytes: {error}") from None
        return out
    try:
        if codec == "zlib":
            inflater = zlib.decompressobj()
            out = inflater.decompress(data, limit + 1)
        elif codec == "none":
            out = data
        else:
            raise WireError(f"unknown codec {codec!r}")
    except zlib.error as error:
        raise WireError(f"{codec} body does not decompress: {error}") from None
    if len(out) > limit:
        raise WireError(f"body decompresses past {limit} bytes")
    return out


def encode_batch(batch: Batch, codec: str, kind: int = BATCH) -> bytes:
    header = {
        "seq": batch.seq,
        "codec": codec,
        "topics": [[part.topic, part.first, part.count, part.size] for part in batch.topics],
        "site_ends": batch.site_ends,
    }
    if batch.site_oldest:
        header["site_oldest"] = batch.site_oldest
    return encode(kind, header, compress(codec, batch.frames))


def decode_batch(message: Message, limit: int) -> Batch:
    """A BATCH or DOWN, every number checked against what a log can hold (``broker_edge.bounds``)."""
    header = message.header
    try:
        seq = bounds.integer(header.get("seq"), "seq", 0, MAX_SEQ)
        codec = header.get("codec")
        if codec not in CODECS:
            raise WireError(f"unknown codec {bounds.shown(codec)}")
        topics = _batch_topics(header.get("topics"), limit)
        site_ends = _site_ends(header.get("site_ends", {}))
        site_oldest = _site_oldest(header.get("site_oldest", {}))
    except bounds.OutOfBounds as error:
        raise WireError(f"bad batch header: {error}") from None
    frames = decompress(codec, message.body, limit)
    if sum(part.size for part in topics) != len(frames):
        raise WireError("the batch's topics do not add up to its frames")
    return Batch(seq, topics, frames, site_ends, site_oldest)


def _batch_topics(value: object, limit: int) -> list[BatchTopic]:
    if not isinstance(value, list):
        raise bounds.OutOfBounds("topics must be a list of [topic, first, count, size]")
    topics = []
    for item in value:
        if not isinstance(item, list) or len(item) != 4 or not isinstance(item[0], str):
            raise bounds.OutOfBounds(
                f"a batch topic must be [topic, first, count, size], got {bounds.shown(item)}"
            )
        topic = item[0]
        first = bounds.offset(item[1], f"{topic!r} first")
        count = bounds.count(item[2], f"{topic!r} count", 1)
        size = bounds.size(item[3], f"{topic!r} size", 1, limit)
        bounds.offset_span(first, count, repr(topic))
        topics.append(BatchTopic(topic, first, count, size))
    return topics


def _site_ends(value: object) -> dict[str, list[int]]:
    if not isinstance(value, dict):
        raise bounds.OutOfBounds("site_ends must be an object")
    ends: dict[str, list[int]] = {}
    for topic, item in value.items():
        if not isinstance(item, list) or len(item) != 2:
            raise bounds.OutOfBounds(f"site_ends of {topic!r} must be [end, last_append_ms]")
        ends[topic] = [
            bounds.offset(item[0], f"site_ends of {topic!r}"),
            bounds.time_ms(item[1], f"last_append_ms of {topic!r}"),
        ]
    return ends


def _site_oldest(value: object) -> dict[str, int]:
    if not isinstance(value, dict):
        raise bounds.OutOfBounds("site_oldest must be an object")
    return {topic: bounds.time_ms(item, f"site_oldest of {topic!r}") for topic, item in value.items()}


def site_oldest_of(value: object) -> dict[str, int]:
    """A STATE's ``site_oldest`` (``{topic: time_ms}``), checked (``WireError`` otherwise)."""
    try:
        return _site_oldest(value)
    except bounds.OutOfBounds as error:
        raise WireError(f"bad site_oldest: {error}") from None


def site_ends_of(value: object) -> dict[str, list[int]]:
    """A STATE's or BATCH's ``site_ends``, checked (``WireError`` otherwise)."""
    try:
        return _site_ends(value)
    except bounds.OutOfBounds as error:
        raise WireError(f"bad site_ends: {error}") from None


def ends_of(value: object, name: str) -> dict[str, int]:
    """An ``ENDS``', an ``ACK``'s or a downlink request's ``{topic: end}``, checked (``WireError``
    otherwise)."""
    if not isinstance(value, dict):
        raise WireError(f"{name} must be an object of {{topic: end}}")
    try:
        return {topic: bounds.offset(end, f"{name} of {topic!r}") for topic, end in value.items()}
    except bounds.OutOfBounds as error:
        raise WireError(str(error)) from None


def seq_of(value: object) -> int:
    """An ``ACK``'s ``seq``, checked (``WireError`` otherwise)."""
    try:
        return bounds.integer(value, "seq", 0, MAX_SEQ)
    except bounds.OutOfBounds as error:
        raise WireError(str(error)) from None


def ends_pages(ends: dict[str, int], limit: int, page_bytes: int | None) -> Iterator[dict[str, Any]]:
    """The ``ENDS`` headers that say ``ends`` (``limit``: the hub's largest message): one, when
    ``page_bytes`` is None (a site that does not say what it takes), else pages of at most about
    ``page_bytes`` of ends each (at least one topic), all but the last with ``more``."""
    if page_bytes is None:
        yield {"ends": ends, "max_message_bytes": limit}
        return
    page: dict[str, int] = {}
    size = 0
    for topic, end in ends.items():
        entry = _json_bytes(topic) + len(str(end)) + 2  # "topic":end,
        if page and size + entry > page_bytes:
            yield {"ends": page, "max_message_bytes": limit, "more": True}
            page, size = {}, 0
        page[topic] = end
        size += entry
    yield {"ends": page, "max_message_bytes": limit}


def _json_bytes(text: str) -> int:
    """Bytes of ``text`` as a JSON string in a header, at most: each character escaped as ``\\uXXXX`` but
    for plain ASCII (a surrogate pair, 12 bytes, for a character past the BMP, which counts as two here)."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return len(text) + 2
    return 6 * len(text.encode("utf-16-le")) // 2 + 2


def message_limit_of(value: object) -> int | None:
    """An ``ENDS``' ``max_message_bytes`` (the hub's ``uplink_hub.max_message_bytes``), checked; None when
    the hub does not say (``WireError`` for what no limit is)."""
    if value is None:
        return None
    try:
        return bounds.size(value, "max_message_bytes", 1)
    except bounds.OutOfBounds as error:
        raise WireError(str(error)) from None


def too_large(batch: Batch, size: int, limit: int) -> str:
    """Why ``batch``, ``size`` bytes as a message, is not sent to a hub that takes ``limit``."""
    first = batch.topics[0]
    return (
        f"a batch of {size} bytes ({first.topic!r} from offset {first.first}, {first.count} records) is more "
        f"than the hub takes in one message (its uplink_hub.max_message_bytes, {limit}): a record of it is "
        "too large for the hub"
    )


def join_frames(parts: Sequence[bytes]) -> bytes:
    return parts[0] if len(parts) == 1 else b"".join(parts)
