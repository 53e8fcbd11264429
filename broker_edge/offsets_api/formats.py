"""What travels over the offsets API: JSON lines, raw frames and the header names (Arrow: `arrow_format`).

Shared by the server and the client so both sides agree on one definition.
"""

from __future__ import annotations

import base64
import contextlib
import json
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from broker_edge.storage.record import Record

ARROW_CONTENT_TYPE = "application/vnd.apache.arrow.stream"
JSONL_CONTENT_TYPE = "application/x-ndjson"
FRAMES_CONTENT_TYPE = "application/x-timestone-frames"
"""The stored record frames back to back (see `broker_edge.storage.record`): lossless, for peer brokers."""

FORMATS = {"arrow": ARROW_CONTENT_TYPE, "jsonl": JSONL_CONTENT_TYPE, "frames": FRAMES_CONTENT_TYPE}

NEXT_OFFSET_HEADER = "Timestone-Next-Offset"
START_OFFSET_HEADER = "Timestone-Start-Offset"
END_OFFSET_HEADER = "Timestone-End-Offset"
RECORD_COUNT_HEADER = "Timestone-Record-Count"
STORE_HEADER = "Timestone-Store"
"""On every answer: the identity of the broker's store (``broker_edge.storage.store_identity``). Offsets
taken under one identity mean nothing under another (the data directory was wiped or replaced)."""
RESULTS_METADATA_KEY = b"timestone.results"
"""Arrow schema metadata of a batch fetch: JSON of the per-topic results."""
POSITION_METADATA_KEYS = {
    "next_offset": b"timestone.next_offset",
    "start_offset": b"timestone.start_offset",
    "end_offset": b"timestone.end_offset",
}
"""Arrow schema metadata of a single-topic fetch (the same values as the response headers)."""
PARTITION_METADATA_KEYS = {
    "next_position": b"timestone.next_position",
    "start_position": b"timestone.start_position",
    "end_position": b"timestone.end_position",
    "lost": b"timestone.lost",
    "damaged": b"timestone.damaged",
    "removed": b"timestone.removed",
}
"""Arrow schema metadata of a partition read: positions, then the JSON of records lost per topic (below
their topic's start), the count of entries passed over as damaged and of positions of segments retention
deleted."""

CONTENT_TYPE_PROPERTY = "content_type"


class HeaderLookup(Protocol):
    """Response headers by name (``http.client``'s and aiohttp's both)."""

    def __getitem__(self, name: str, /) -> Any: ...


def topic_path_segment(topic: str) -> str:
    """`topic` as one URL path segment (`/` becomes %2F; `.` and `..` escaped so nothing normalises them)."""
    segment = urllib.parse.quote(topic, safe="")
    return segment.replace(".", "%2E") if segment in (".", "..") else segment


def frames_records(data: bytes, headers: HeaderLookup, max_body: int) -> tuple[list[Record], str | None]:
    """The records of a `format=frames` answer, from the first offset its headers give (checksums verified
    again), and why the rest of it was refused (None: every frame valid, as many as the headers count)."""
    from broker_edge.storage.record import decode_frames  # the frame format is the log's: only here

    count = int(headers[RECORD_COUNT_HEADER])
    records, error = decode_frames(data, int(headers[NEXT_OFFSET_HEADER]) - count, max_body)
    if error is not None:
        return records, str(error)
    if len(records) != count:
        return records, f"{len(records)} frames for {count} records"
    return records, None


def record_properties(record: Record) -> Sequence[tuple[str, str]]:
    """The `properties` map entries of a record: user properties, then `content_type` when present."""
    if record.content_type is None:
        return record.user_properties
    return [*record.user_properties, (CONTENT_TYPE_PROPERTY, record.content_type)]


def jsonl_record(topic: str, record: Record) -> dict:
    """The JSON-lines object of a record: lossless fields, the payload in base64 and as text when UTF-8."""
    line = {
        "topic": topic,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "client_id": record.client_id,
        "qos": record.qos,
        "retain": record.retain,
        "user_properties": [list(pair) for pair in record.user_properties],
        "content_type": record.content_type,
        "payload_format_indicator": record.payload_format_indicator,
        "payload": base64.b64encode(record.payload).decode("ascii"),
    }
    with contextlib.suppress(UnicodeDecodeError):
        line["payload_text"] = record.payload.decode("utf-8")
    return line


def jsonl_body(lines: Iterable[dict]) -> bytes:
    """Newline-terminated compact JSON objects."""
    return b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)


def frames_body(records: Sequence[Record]) -> bytes:
    """The stored frames of `records` back to back, exactly as on disk."""
    return b"".join(record.frame for record in records)
