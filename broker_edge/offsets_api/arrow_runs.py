"""Arrow batches straight from runs of stored frames: columns over the frames' buffer, no object per record.

`arrow_format.arrow_batch` walks `Record` objects; a fetch of stored records skips them altogether: the fixed
header fields come as numpy arrays (`storage.frame_runs`), and the client ids and payloads, which sit
inside the frames, are copied out of the one buffer read from the segment by a numpy gather (short
values) or through Arrow binary views cast to the plain `string` / `binary` columns of `ARROW_SCHEMA`
(long ones). Only records carrying a content type or user properties are parsed one by one, for the
`properties` map.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from broker_edge.storage.frame_runs import FrameColumns, FrameRun, frame_columns, gather_rows

from .arrow_format import ARROW_SCHEMA
from .formats import CONTENT_TYPE_PROPERTY

_PROPERTIES_TYPE = ARROW_SCHEMA.field("properties").type
_TIMESTAMP_TYPE = ARROW_SCHEMA.field("timestamp").type
_NO_STRINGS = pa.array([], pa.string())
_INLINE = 12
"""Bytes a binary view holds inline (longer values point into the data buffer)."""
_INLINE_BYTES = np.arange(_INLINE)
_GATHER_MAX_BYTES = 4 * 1024 * 1024
_GATHER_MEAN_BYTES = 256
"""Values are gathered byte by byte when they total at most 4 MiB and average at most 256 bytes."""


def arrow_batch_of_runs(topic_runs: Sequence[tuple[str, Sequence[FrameRun]]]) -> pa.RecordBatch:
    """One record batch of the records of several topics' runs, in the order given (`ARROW_SCHEMA`)."""
    runs = [run for _, chunk in topic_runs for run in chunk]
    if not runs:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    counts = [sum(len(run) for run in chunk) for _, chunk in topic_runs]
    topic_rows = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
    return _batch(frame_columns(runs), [topic for topic, _ in topic_runs], topic_rows)


def arrow_batch_of_rows(topics: Sequence[str], run: FrameRun) -> pa.RecordBatch:
    """One record batch of a run of frames of many topics (`topics`: each frame's), in log order."""
    if not len(run):
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    names: dict[str, int] = {}
    topic_rows = np.fromiter((names.setdefault(topic, len(names)) for topic in topics), np.int32, len(topics))
    return _batch(frame_columns([run]), list(names), topic_rows)


def _batch(columns: FrameColumns, names: list[str], topic_rows: np.ndarray) -> pa.RecordBatch:
    data = pa.py_buffer(columns.data)
    buffer = np.frombuffer(columns.data, np.uint8)
    rows = len(columns)
    topic_column = (
        pa.repeat(pa.scalar(names[0], pa.string()), rows)
        if len(names) == 1
        else pa.DictionaryArray.from_arrays(topic_rows, pa.array(names, pa.string())).cast(pa.string())
    )
    return pa.RecordBatch.from_arrays(
        [
            topic_column,
            pa.array(columns.offsets, pa.int64()),
            pa.Array.from_buffers(_TIMESTAMP_TYPE, rows, [None, pa.py_buffer(columns.timestamps_ms)]),
            _values(pa.string(), data, buffer, columns.client_id_starts, columns.client_id_lengths),
            pa.array(columns.qos, pa.int8()),
            pa.array(columns.retain, pa.bool_()),
            _properties(columns),
            _values(pa.binary(), data, buffer, columns.payload_starts, columns.payload_lengths),
        ],
        schema=ARROW_SCHEMA,
    )


def _values(
    value_type: pa.DataType, data: pa.Buffer, buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> pa.Array:
    """A string or binary array of the `lengths[i]` bytes from `starts[i]` of `buffer` (held by `data`).

    Short values, up to `_GATHER_MAX_BYTES` in all, are copied with one numpy gather (an index per
    byte: cheap for telemetry-sized values, and no cast). Otherwise each value becomes a 16-byte binary
    view (its length, then the value itself when it fits in 12 bytes, else its first 4 bytes, the data
    buffer's number 0 and its position) and one cast copies them, whatever their size.
    """
    rows = len(starts)
    total = int(lengths.sum())
    if total <= _GATHER_MAX_BYTES and total <= _GATHER_MEAN_BYTES * rows:
        offsets = np.zeros(rows + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        index = np.repeat(starts - offsets[:-1], lengths)
        index += np.arange(total)
        return pa.Array.from_buffers(
            value_type, rows, [None, pa.py_buffer(offsets), pa.py_buffer(buffer[index])]
        )
    views = np.zeros((rows, 4), np.int32)
    views[:, 0] = lengths
    inline = gather_rows(buffer, starts, _INLINE)
    inline[lengths[:, None] <= _INLINE_BYTES] = 0
    views.view(np.uint8).reshape(rows, 16)[:, 4:] = inline
    long = lengths > _INLINE
    views[long, 2] = 0
    views[long, 3] = starts[long]
    view_type = pa.string_view() if value_type == pa.string() else pa.binary_view()
    return pa.Array.from_buffers(view_type, rows, [None, pa.py_buffer(views), data]).cast(value_type)


def _properties(columns: FrameColumns) -> pa.Array:
    """The `properties` map: user properties then `content_type`, for the rows that have fields."""
    rows = len(columns)
    counts = np.zeros(rows + 1, np.int32)
    if not columns.fields:
        return pa.MapArray.from_arrays(pa.array(counts), _NO_STRINGS, _NO_STRINGS, type=_PROPERTIES_TYPE)
    keys: list[str] = []
    values: list[str] = []
    for row, content_type, user_properties in columns.fields:
        for key, value in user_properties:
            keys.append(key)
            values.append(value)
        if content_type is not None:
            keys.append(CONTENT_TYPE_PROPERTY)
            values.append(content_type)
        counts[row + 1] = len(user_properties) + (content_type is not None)
    return pa.MapArray.from_arrays(
        pa.array(np.cumsum(counts, dtype=np.int32)),
        pa.array(keys, pa.string()),
        pa.array(values, pa.string()),
        type=_PROPERTIES_TYPE,
    )
