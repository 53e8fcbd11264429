"""What travels over the offsets API: the Arrow schema, JSON lines, raw frames and the header names.

Shared by the server and the client so both sides agree on one definition.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from broker_edge.storage.record import Record

ARROW_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("client_id", pa.string(), nullable=False),
        pa.field("qos", pa.int8(), nullable=False),
        pa.field("retain", pa.bool_(), nullable=False),
        pa.field("properties", pa.map_(pa.string(), pa.string()), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
    ]
)
"""One row per record. `properties` holds the MQTT user properties plus `content_type` when present."""

ARROW_CONTENT_TYPE = "application/vnd.apache.arrow.stream"
JSONL_CONTENT_TYPE = "application/x-ndjson"
FRAMES_CONTENT_TYPE = "application/x-timestone-frames"
"""The stored record frames back to back (see `broker_edge.storage.record`): lossless, for peer brokers."""

FORMATS = {"arrow": ARROW_CONTENT_TYPE, "jsonl": JSONL_CONTENT_TYPE, "frames": FRAMES_CONTENT_TYPE}

NEXT_OFFSET_HEADER = "Timestone-Next-Offset"
START_OFFSET_HEADER = "Timestone-Start-Offset"
END_OFFSET_HEADER = "Timestone-End-Offset"
RECORD_COUNT_HEADER = "Timestone-Record-Count"
RESULTS_METADATA_KEY = b"timestone.results"
"""Arrow schema metadata of a batch fetch: JSON of the per-topic results."""
POSITION_METADATA_KEYS = {
    "next_offset": b"timestone.next_offset",
    "start_offset": b"timestone.start_offset",
    "end_offset": b"timestone.end_offset",
}
"""Arrow schema metadata of a single-topic fetch (the same values as the response headers)."""

CONTENT_TYPE_PROPERTY = "content_type"


def record_properties(record: Record) -> Sequence[tuple[str, str]]:
    """The `properties` map entries of a record: user properties, then `content_type` when present."""
    if record.content_type is None:
        return record.user_properties
    return [*record.user_properties, (CONTENT_TYPE_PROPERTY, record.content_type)]


def arrow_batch(topic_records: Iterable[tuple[str, Sequence[Record]]]) -> pa.RecordBatch:
    """One record batch holding the records of several topics, in the order given."""
    topics: list[str] = []
    records: list[Record] = []
    for topic, chunk in topic_records:
        topics += [topic] * len(chunk)
        records += chunk
    return pa.RecordBatch.from_arrays(
        [
            pa.array(topics, pa.string()),
            pa.array([record.offset for record in records], pa.int64()),
            pa.array([record.timestamp_ms for record in records], pa.timestamp("ms", tz="UTC")),
            pa.array([record.client_id for record in records], pa.string()),
            pa.array([record.qos for record in records], pa.int8()),
            pa.array([record.retain for record in records], pa.bool_()),
            pa.array(
                [record_properties(record) for record in records], ARROW_SCHEMA.field("properties").type
            ),
            pa.array([record.payload for record in records], pa.binary()),
        ],
        schema=ARROW_SCHEMA,
    )


def arrow_stream(batch: pa.RecordBatch, metadata: Mapping[bytes, bytes]) -> pa.Buffer:
    """An Arrow IPC stream of `batch` (no batch when it is empty) whose schema carries `metadata`."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, ARROW_SCHEMA.with_metadata(dict(metadata))) as writer:
        if batch.num_rows:
            writer.write_batch(batch)
    return sink.getvalue()


def read_arrow_stream(data: bytes) -> pa.Table:
    """The table of an Arrow IPC stream (schema metadata included)."""
    return pa.ipc.open_stream(data).read_all()


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
