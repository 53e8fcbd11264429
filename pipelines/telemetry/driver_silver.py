"""A batch's silver rows computed in the driver with Arrow, from its parsed rows already collected there.

The same rows as ``drop_duplicates_in_batch``, ``drop_already_stored`` and ``to_silver`` of
:mod:`pipelines.telemetry.transforms` (tests hold the two to it): one sort and one hash join over a
catch-up batch take tens of milliseconds here, where the Spark query (a window over a shuffle, a scan of
stored silver, a join, a collect) was a Spark job of its own per batch. Event-time differences are compared
in seconds as doubles, as Spark's ``cast(timestamp as double)`` makes them, so a pair exactly at the
window's edge is decided alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

RECORD = ("broker", "topic", "offset")
_ORDER = ("event_time", "timestamp", "broker", "topic", "offset")


def silver_rows(
    passed: pa.Table,
    stored: pa.Table,
    id_fields: Sequence[str],
    window_seconds: int,
    silver_fields: Sequence[str],
) -> pa.Table:
    """Silver's rows of a batch: ``passed`` without duplicates within it or of ``stored`` (silver before
    the batch, at least the batch's event times widened by the window), in silver's columns."""
    rows = drop_duplicates_in_batch(passed, id_fields, window_seconds)
    rows = drop_already_stored(rows, stored, id_fields, window_seconds)
    return to_silver(rows, silver_fields)


def drop_duplicates_in_batch(rows: pa.Table, id_fields: Sequence[str], window_seconds: int) -> pa.Table:
    """One row per record, and per complete device message id within ``window_seconds`` of the row before
    it (ordered by event time, broker time, broker, topic, offset); the rows kept stay in their order."""
    if rows.num_rows < 2:
        return rows
    key = [rows.column(name) for name in RECORD]
    if id_fields:
        message_id = [rows.column(name) for name in ("device_id", *id_fields)]
        complete = _all_valid(message_id)
        key = [pc.if_else(complete, c, _nulls(c)) for c in message_id] + [
            pc.if_else(complete, _nulls(c), c) for c in key
        ]
    names = [f"k{i}" for i in range(len(key))] + [f"o{i}" for i in range(len(_ORDER))]
    keyed = pa.table([*key, *[rows.column(name) for name in _ORDER]], names=names)
    order = pc.sort_indices(keyed, [(n, "ascending", "at_start") for n in names])  # Spark's nulls first
    ordered = keyed.take(order)
    same_key = np.ones(rows.num_rows - 1, dtype=bool)
    for i in range(len(key)):
        column = ordered.column(f"k{i}")
        same_key &= _equal_or_both_null(column.slice(1), column.slice(0, rows.num_rows - 1))
    seconds = _seconds(ordered.column("o0"))
    duplicate = np.concatenate([[False], same_key & (seconds[1:] - seconds[:-1] <= window_seconds)])
    kept = np.sort(order.to_numpy()[~duplicate])
    return rows if len(kept) == rows.num_rows else rows.take(pa.array(kept))


def drop_already_stored(
    rows: pa.Table, stored: pa.Table, id_fields: Sequence[str], window_seconds: int
) -> pa.Table:
    """``rows`` without those whose complete device message id is in ``stored`` within ``window_seconds``."""
    if not id_fields or rows.num_rows == 0 or stored.num_rows == 0:
        return rows
    names = ["device_id", *id_fields]
    new = rows.select([*names, "event_time"]).append_column("_row", pa.array(np.arange(rows.num_rows)))
    new = new.filter(_all_valid([new.column(n) for n in names]))
    old = pa.table(
        [*[stored.column(n).cast(new.schema.field(n).type) for n in names], stored.column("event_time")],
        names=[*names, "_stored_time"],
    )
    old = old.filter(_all_valid([old.column(n) for n in names]))
    matches = new.join(old, keys=names, join_type="inner", use_threads=False)
    if matches.num_rows == 0:
        return rows
    elapsed = np.abs(_seconds(matches.column("event_time")) - _seconds(matches.column("_stored_time")))
    stored_already = np.unique(matches.column("_row").to_numpy()[elapsed <= window_seconds])
    keep = np.ones(rows.num_rows, dtype=bool)
    keep[stored_already] = False
    return rows.filter(pa.array(keep))


def to_silver(rows: pa.Table, silver_fields: Sequence[str]) -> pa.Table:
    """Silver's columns: identity, device, event time and its (UTC) date, and the payload fields."""
    event_time = rows.column("event_time")
    columns = {
        "device_id": rows.column("device_id"),
        "event_time": event_time,
        "event_date": pc.cast(event_time.cast(pa.timestamp("us", "UTC")), pa.date32()),
        "topic": rows.column("topic"),
        "broker": rows.column("broker"),
        "offset": rows.column("offset"),
        "ingested_at": rows.column("ingested_at"),
        **{name: rows.column(name) for name in silver_fields},
    }
    return pa.table(columns)


def _seconds(times: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Epoch seconds as doubles (Spark's ``cast(timestamp as double)``: microseconds / 1e6)."""
    micros = pc.cast(times.cast(pa.timestamp("us", "UTC")), pa.int64()).to_numpy(zero_copy_only=False)
    return micros.astype(np.float64) / 1e6


def _all_valid(columns: Sequence[pa.ChunkedArray | pa.Array]) -> pa.ChunkedArray | pa.Array:
    valid = pc.is_valid(columns[0])
    for column in columns[1:]:
        valid = pc.and_(valid, pc.is_valid(column))
    return valid


def _nulls(column: pa.ChunkedArray | pa.Array) -> pa.Scalar:
    return pa.scalar(None, column.type)


def _equal_or_both_null(a: pa.ChunkedArray | pa.Array, b: pa.ChunkedArray | pa.Array) -> np.ndarray:
    equal = pc.fill_null(pc.equal(a, b), False)
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return pc.or_(equal, both_null).to_numpy(zero_copy_only=False)
