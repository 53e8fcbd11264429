"""Resent readings told from new ones with Spark's state store, on the executors: rows flagged, none dropped.

A device message can reach the brokers twice: resent after a reconnect, or received by two brokers, each
time with the same bytes. Two rows are the same message when they have the same device, the same message
id (``dedup.message_id_fields``, e.g. ``seq``), the same payload bytes and event times at most
``dedup.window_seconds`` apart: a device whose counter restarts after a reboot sends other readings under
its old ids, which are told from its previous life by their payloads, however soon it is back. The first,
by event time and then broker time, broker, topic and offset, is silver's; the others are duplicates.

Bronze keeps every record, so the operator must not drop rows, as ``dropDuplicatesWithinWatermark`` does:
the streaming query groups its rows by device (``applyInPandasWithState``) and this module's function
adds the boolean column ``duplicate`` to every row. What it keeps per device in the state store is the
message ids it has let through to silver, each with its event time, as long as they may still be matched:
ids more than the window older than the device's newest event time are dropped, and a device silent for
``dedup.state_timeout_seconds`` (processing time) forgets them. The state lives in the streaming query's
checkpoint: a restarted query knows what the last one let through. A message id and its payload are
compared by one 64-bit hash of both (``xxhash64``), computed by Spark: two different messages of one device
within one window would have to collide for a reading to be lost.

Rows that are not candidates (other topics, quarantined rows, rows without a complete message id) pass
through with ``duplicate`` false and leave nothing in the state. A batch query (a backfill, a test) has no
state: its rows are flagged against each other only, by the same function. What this operator costs: the
rows' shuffle by device, a Python call per device with rows in the batch, and per row the few columns the
rule reads plus one packed document of the row's other values (written and read by Spark as JSON, carried
by pandas as one object) across to a Python worker and back (:func:`flag_duplicates`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    IntegerType,
    IntegralType,
    LongType,
    MapType,
    NumericType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .config import DedupConfig

# pyspark concatenates the frames this module's function returns, some with all-null columns (the parsed
# fields of rows on other topics), and pandas warns that it will type such columns otherwise one day: the
# declared output schema types them, so the Python workers need not print it.
warnings.filterwarnings(
    "ignore", "The behavior of DataFrame concatenation with empty or all-NA entries", FutureWarning
)

#: The column every row gets: true for a telemetry row that repeats a message silver has or is getting.
DUPLICATE = "duplicate"

_GROUP = "_dedup_device"
_CANDIDATE = "_dedup_candidate"
_MESSAGE = "_dedup_message"
_EVENT_US = "_dedup_event_us"
_BROKER_US = "_dedup_broker_us"
_BROKER = "_dedup_broker"
_TOPIC = "_dedup_topic"
_OFFSET = "_dedup_offset"
#: The row's columns that may be null, as one JSON document (:func:`packed`).
_PACKED = "_dedup_packed"
_STATE_SCHEMA = "ids binary"
#: Within a batch, which copy of a message comes first (the one silver gets).
_ORDER = [_EVENT_US, _BROKER_US, _BROKER, _TOPIC, _OFFSET]
#: How the packed columns are written and read: nested times to the microsecond, nulls left out.
_JSON_OPTIONS = {
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "ignoreNullFields": "true",
}


def flag_duplicates(rows: DataFrame, dedup: DedupConfig, candidate: Column) -> DataFrame:
    """``rows`` (a streaming DataFrame of parsed records) with :data:`DUPLICATE`; ``candidate`` says which
    rows may be duplicates (passed telemetry rows). Without message id fields nothing is a duplicate and
    there is no state (nor a shuffle).

    The rule needs only the device, the hash of the message id and payload, the event and broker times and
    the order of a message's copies: those cross to the Python workers as columns of their own. The row's
    other columns cross too, since the operator's output is the rows, but not one by one: those that cannot
    be null as they are, the others packed into one binary column (:func:`packed`) that pandas holds as one
    object a row and Spark reads back after (:func:`unpacked`). pandas could not carry them as themselves
    anyway: it cannot tell NaN from null nor hold a 64-bit integer beside a null.
    """
    if not dedup.message_id_fields:
        return rows.withColumn(DUPLICATE, F.lit(False))
    ids = [F.col(name) for name in dedup.message_id_fields]
    complete = candidate
    for column in ids:
        complete = complete & column.isNotNull()
    complete = F.coalesce(complete, F.lit(False))
    kept = [f.name for f in rows.schema.fields if _as_itself(f)]
    keyed = rows.select(
        *[F.col(f"`{name}`") for name in kept],
        packed([f for f in rows.schema.fields if not _as_itself(f)]).alias(_PACKED),
        F.coalesce(F.col("device_id"), F.col("topic")).alias(_GROUP),
        complete.alias(_CANDIDATE),
        F.when(complete, F.xxhash64(*ids, F.col("payload"))).otherwise(F.lit(0)).alias(_MESSAGE),
        F.coalesce(F.unix_micros("event_time"), F.lit(0)).alias(_EVENT_US),
        F.coalesce(F.unix_micros("timestamp"), F.lit(0)).alias(_BROKER_US),
        # the order of a message's copies, on candidates only (the others are not ordered)
        F.coalesce(F.when(complete, F.col("broker")), F.lit("")).alias(_BROKER),
        F.coalesce(F.when(complete, F.col("topic")), F.lit("")).alias(_TOPIC),
        F.coalesce(F.when(complete, F.col("offset")), F.lit(0)).cast("bigint").alias(_OFFSET),
    )
    passed = [*kept, _PACKED]
    output = StructType(
        [*[keyed.schema[name] for name in passed], StructField(DUPLICATE, BooleanType(), False)]
    )
    flags = MessageFlags(dedup.window_seconds * 1_000_000, dedup.state_timeout_seconds * 1000, passed)
    grouped = keyed.groupBy(_GROUP)
    if rows.isStreaming:
        flagged = grouped.applyInPandasWithState(
            flags, output, _STATE_SCHEMA, "append", GroupStateTimeout.ProcessingTimeTimeout
        )
    else:  # a batch query (a backfill, a test): duplicates within its rows, nothing before them

        def without_state(key: tuple[Any, ...], device_rows: pd.DataFrame) -> pd.DataFrame:
            return flags.without_state(device_rows)

        flagged = grouped.applyInPandas(without_state, output)
    return unpacked(flagged, rows.schema, [DUPLICATE])


def _as_itself(field: StructField) -> bool:
    """Whether a column crosses pandas as itself: an integer or a boolean that cannot be null, which pandas
    holds in a NumPy array as it is. Anything else would be an object a row (a string, a date, an array),
    or lose what it is beside a null (a 64-bit integer to a float, a null to NaN): packed."""
    return not field.nullable and isinstance(field.dataType, IntegralType | BooleanType)


def _carried(field: StructField) -> DataType:
    """The type a column is packed as: times as microseconds and dates as days (a year past 9999 has no
    text form to read back), the others as themselves."""
    if isinstance(field.dataType, TimestampType):
        return LongType()
    if isinstance(field.dataType, DateType):
        return IntegerType()
    return field.dataType


def packed(fields: Sequence[StructField]) -> Column:
    """``fields`` of a row as one JSON document, UTF-8 bytes: every value exact (numbers in full, NaN and
    the infinities by name, binary in base64, a null left out)."""
    values = []
    for f in fields:
        column = F.col(f"`{f.name}`")
        if isinstance(f.dataType, TimestampType):
            column = F.unix_micros(column)
        elif isinstance(f.dataType, DateType):
            column = F.unix_date(column)
        values.append(column.alias(f.name))
    return F.to_json(F.struct(*values), _JSON_OPTIONS).cast("binary")


def unpacked(frame: DataFrame, schema: StructType, extra: Sequence[str]) -> DataFrame:
    """``frame``'s rows with ``schema``'s columns (those not :func:`_as_itself` read from :data:`_PACKED`,
    as nullable as they were), then ``extra``."""
    carried = StructType([StructField(f.name, _carried(f)) for f in schema.fields if not _as_itself(f)])
    document = "_dedup_document"
    # the document is read once per row: a projection of its own, which Spark does not fold into the next
    read = frame.select(
        *[F.col(f"`{f.name}`") for f in schema.fields if _as_itself(f)],
        F.from_json(F.col(_PACKED).cast("string"), carried, _JSON_OPTIONS).alias(document),
        *extra,
    )

    def value(f: StructField) -> Column:
        if _as_itself(f):
            return F.col(f"`{f.name}`")
        column = F.col(document).getField(f.name)
        if isinstance(f.dataType, TimestampType):
            column = F.timestamp_micros(column)
        elif isinstance(f.dataType, DateType):
            column = F.date_from_unix_date(column)
        if not f.nullable:
            column = _never_null(column, f.dataType)
        return column.alias(f.name)

    return read.select(*[value(f) for f in schema.fields], *extra)


def _never_null(column: Column, data_type: DataType) -> Column:
    """``column`` (of a column that was never null) as Spark's not-nullable: a fallback value that is never
    taken tells it so. A type without one here stays nullable."""
    fallback: Column | None = None
    if isinstance(data_type, ArrayType):
        fallback = F.array().cast(data_type)
    elif isinstance(data_type, MapType):
        fallback = F.create_map().cast(data_type)
    elif isinstance(data_type, StringType):
        fallback = F.lit("")
    elif isinstance(data_type, BinaryType):
        fallback = F.lit(bytearray())
    elif isinstance(data_type, DateType):
        fallback = F.date_from_unix_date(F.lit(0))
    elif isinstance(data_type, TimestampType):
        fallback = F.timestamp_micros(F.lit(0))
    elif isinstance(data_type, NumericType | BooleanType):
        fallback = F.lit(0).cast(data_type)
    return column if fallback is None else F.coalesce(column, fallback)


class MessageFlags:
    """The function ``applyInPandasWithState`` calls for one device's rows of a batch (pickled to the
    executors). Its state is the device's recent message ids and event times (:func:`encode`); it returns
    the rows' ``columns`` with :data:`DUPLICATE`."""

    def __init__(self, window_us: int, timeout_ms: int, columns: Sequence[str]) -> None:
        self.window_us = window_us
        self.timeout_ms = timeout_ms
        self.columns = list(columns)

    def __call__(
        self, key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        if state.hasTimedOut:
            state.remove()
            return
        chunks = list(frames)
        rows = chunks[0].reset_index(drop=True) if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
        stored = decode(state.get[0]) if state.exists else (_EMPTY, _EMPTY)
        flagged, (ids, event_us) = self.flag(rows, *stored)
        if len(ids):
            state.update((encode(ids, event_us),))
        if state.exists:
            state.setTimeoutDuration(self.timeout_ms)
        yield flagged

    def without_state(self, rows: pd.DataFrame) -> pd.DataFrame:
        """One device's rows of a batch query, flagged against each other only."""
        return self.flag(rows.reset_index(drop=True), _EMPTY, _EMPTY)[0]

    def flag(
        self, rows: pd.DataFrame, stored_ids: np.ndarray, stored_us: np.ndarray
    ) -> tuple[pd.DataFrame, tuple[np.ndarray, np.ndarray]]:
        """``rows`` with :data:`DUPLICATE`, and the ids to keep: the stored ones and those let through now,
        less what can no longer match (:func:`recent`)."""
        duplicate = np.zeros(len(rows), dtype=bool)
        candidates = np.flatnonzero(rows[_CANDIDATE].to_numpy(dtype=bool))
        if len(candidates):
            # NumPy, not pandas: a call per device, whose fixed cost pandas would multiply
            keys = [rows[name].to_numpy()[candidates] for name in reversed(_ORDER)]
            ordered = candidates[np.lexsort(keys)]  # stable: the last key sorts first
            ids = rows[_MESSAGE].to_numpy(np.int64)[ordered]
            event_us = rows[_EVENT_US].to_numpy(np.int64)[ordered]
            flags = duplicates(ids, event_us, stored_ids, stored_us, self.window_us)
            duplicate[ordered] = flags
            stored_ids, stored_us = recent(
                np.concatenate([stored_ids, ids[~flags]]),
                np.concatenate([stored_us, event_us[~flags]]),
                self.window_us,
            )
        return rows[self.columns].assign(**{DUPLICATE: duplicate}), (stored_ids, stored_us)


_EMPTY = np.zeros(0, dtype=np.int64)


def duplicates(
    ids: np.ndarray, event_us: np.ndarray, stored_ids: np.ndarray, stored_us: np.ndarray, window_us: int
) -> np.ndarray:
    """Which of a device's candidate rows (``ids`` and ``event_us`` in the batch's order) are duplicates.

    A row is one when an earlier row of the batch with its id is at most ``window_us`` older (each row is
    compared with the one just before it: a chain of copies is all duplicates), or when a stored id equal
    to its own lies within ``window_us`` of it either way (a late row may precede what silver has).
    """
    flags = np.zeros(len(ids), dtype=bool)
    by_id = np.argsort(ids, kind="stable")  # each id's rows together, in the batch's order
    same_id, id_us = ids[by_id], event_us[by_id]
    flags[by_id[1:]] = (same_id[1:] == same_id[:-1]) & (id_us[1:] - id_us[:-1] <= window_us)
    if len(stored_ids):
        order = np.lexsort((stored_us, stored_ids))
        known, known_us = stored_ids[order], stored_us[order]
        first, end = np.searchsorted(known, ids, "left"), np.searchsorted(known, ids, "right")
        for row in np.flatnonzero(end > first):  # rows whose id is stored: resent ones, a few
            if (np.abs(known_us[first[row] : end[row]] - event_us[row]) <= window_us).any():
                flags[row] = True
    return flags


def recent(ids: np.ndarray, event_us: np.ndarray, window_us: int) -> tuple[np.ndarray, np.ndarray]:
    """The ids that may still match a new row: those at most ``window_us`` older than the newest."""
    if not len(ids):
        return ids, event_us
    keep = event_us >= event_us.max() - window_us
    return ids[keep], event_us[keep]


def encode(ids: np.ndarray, event_us: np.ndarray) -> bytes:
    """A device's state as bytes: its ids, then their event times (little-endian int64 each)."""
    return np.concatenate([ids, event_us]).astype("<i8").tobytes()


def decode(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    values = np.frombuffer(data, dtype="<i8").astype(np.int64)
    half = len(values) // 2
    return values[:half], values[half:]
