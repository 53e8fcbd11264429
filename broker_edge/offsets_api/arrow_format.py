"""The Arrow side of the offsets API: its schema, a batch of `Record`s, IPC streams written and read.

Apart from `formats` so that a broker loads pyarrow only with its first Arrow fetch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from .formats import record_properties

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
