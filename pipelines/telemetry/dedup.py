"""Resent readings told from new ones with Spark's state store, on the executors: rows flagged, none dropped.

A device message can reach the brokers twice: resent after a reconnect, or received by two brokers. Two
rows are the same message when they have the same device, the same message id (``dedup.message_id_fields``,
e.g. ``seq``) and event times at most ``dedup.window_seconds`` apart (a device whose counter restarts
after a reboot is therefore not deduplicated against its previous life). The first, by event time and
then broker time, broker, topic and offset, is silver's; the others are duplicates.

Bronze keeps every record, so the operator must not drop rows, as ``dropDuplicatesWithinWatermark`` does:
the streaming query groups its rows by device (``applyInPandasWithState``) and this module's function
adds the boolean column ``duplicate`` to every row. What it keeps per device in the state store is the
message ids it has let through to silver, each with its event time, as long as they may still be matched:
ids more than the window older than the device's newest event time are dropped, and a device silent for
``dedup.state_timeout_seconds`` (processing time) forgets them. The state lives in the streaming query's
checkpoint: a restarted query knows what the last one let through. A message id is compared by its
64-bit hash (``xxhash64``), computed by Spark: two different ids of one device within one window would
have to collide for a reading to be lost.

Rows that are not candidates (other topics, quarantined rows, rows without a complete message id) pass
through with ``duplicate`` false and leave nothing in the state. A batch query (a backfill, a test) has no
state: its rows are flagged against each other only, by the same function. A Python call per device with
rows in the batch is this operator's cost, so its share of a batch grows with the devices a batch touches.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import BooleanType, NumericType, StructField, StructType

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
_HELPERS = (_GROUP, _CANDIDATE, _MESSAGE, _EVENT_US, _BROKER_US)
_STATE_SCHEMA = "ids binary"
#: Within a batch, which copy of a message comes first (the one silver gets).
_ORDER = [_EVENT_US, _BROKER_US, "broker", "topic", "offset"]


def flag_duplicates(rows: DataFrame, dedup: DedupConfig, candidate: Column) -> DataFrame:
    """``rows`` (a streaming DataFrame of parsed records) with :data:`DUPLICATE`; ``candidate`` says which
    rows may be duplicates (passed telemetry rows). Without message id fields nothing is a duplicate and
    there is no state (nor a shuffle)."""
    if not dedup.message_id_fields:
        return rows.withColumn(DUPLICATE, F.lit(False))
    ids = [F.col(name) for name in dedup.message_id_fields]
    complete = candidate
    for column in ids:
        complete = complete & column.isNotNull()
    numeric = {f.name: f.dataType for f in rows.schema.fields if isinstance(f.dataType, NumericType)}
    keyed = rows.select(
        # pandas, which the rows cross, cannot tell NaN from null nor hold a 64-bit integer beside a null:
        # numbers cross as text, exact, and are read back in their own type
        *[
            F.col(name).cast("string").alias(name) if name in numeric else F.col(name)
            for name in rows.columns
        ],
        F.coalesce(F.col("device_id"), F.col("topic")).alias(_GROUP),
        F.coalesce(complete, F.lit(False)).alias(_CANDIDATE),
        F.when(complete, F.xxhash64(*ids)).otherwise(F.lit(0)).alias(_MESSAGE),
        F.coalesce(F.unix_micros("event_time"), F.lit(0)).alias(_EVENT_US),
        F.coalesce(F.unix_micros("timestamp"), F.lit(0)).alias(_BROKER_US),
    )
    output = StructType([*keyed.schema.fields, StructField(DUPLICATE, BooleanType(), False)])
    flags = MessageFlags(dedup.window_seconds * 1_000_000, dedup.state_timeout_seconds * 1000)
    grouped = keyed.groupBy(_GROUP)
    if rows.isStreaming:
        flagged = grouped.applyInPandasWithState(
            flags, output, _STATE_SCHEMA, "append", GroupStateTimeout.ProcessingTimeTimeout
        )
    else:  # a batch query (a backfill, a test): duplicates within its rows, nothing before them

        def without_state(key: tuple[Any, ...], device_rows: pd.DataFrame) -> pd.DataFrame:
            return flags.without_state(device_rows)

        flagged = grouped.applyInPandas(without_state, output)
    restored = [F.col(n).cast(numeric[n]).alias(n) if n in numeric else F.col(n) for n in rows.columns]
    return flagged.select(*restored, DUPLICATE)


class MessageFlags:
    """The function ``applyInPandasWithState`` calls for one device's rows of a batch (pickled to the
    executors). Its state is the device's recent message ids and event times (:func:`encode`)."""

    def __init__(self, window_us: int, timeout_ms: int) -> None:
        self.window_us = window_us
        self.timeout_ms = timeout_ms

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
        candidates = rows.index[rows[_CANDIDATE].to_numpy(dtype=bool)]
        if len(candidates):
            ordered = rows.loc[candidates].sort_values(_ORDER, kind="stable")
            ids, event_us = ordered[_MESSAGE].to_numpy(np.int64), ordered[_EVENT_US].to_numpy(np.int64)
            flags = duplicates(ids, event_us, stored_ids, stored_us, self.window_us)
            duplicate[ordered.index.to_numpy()] = flags
            stored_ids, stored_us = recent(
                np.concatenate([stored_ids, ids[~flags]]),
                np.concatenate([stored_us, event_us[~flags]]),
                self.window_us,
            )
        return rows.assign(**{DUPLICATE: duplicate}), (stored_ids, stored_us)


_EMPTY = np.zeros(0, dtype=np.int64)


def duplicates(
    ids: np.ndarray, event_us: np.ndarray, stored_ids: np.ndarray, stored_us: np.ndarray, window_us: int
) -> np.ndarray:
    """Which of a device's candidate rows (``ids`` and ``event_us`` in the batch's order) are duplicates.

    A row is one when an earlier row of the batch with its id is at most ``window_us`` older (each row is
    compared with the one just before it: a chain of copies is all duplicates), or when a stored id equal
    to its own lies within ``window_us`` of it either way (a late row may precede what silver has).
    """
    frame = pd.DataFrame({"id": ids, "us": event_us})
    gap = frame.groupby("id", sort=False)["us"].diff().to_numpy()
    flags = ~np.isnan(gap) & (gap <= window_us)
    if len(stored_ids):
        stored = pd.DataFrame({"id": stored_ids, "stored_us": stored_us})
        pairs = frame.reset_index().merge(stored, on="id")
        near = (pairs["us"] - pairs["stored_us"]).abs() <= window_us
        flags[pairs.loc[near, "index"].to_numpy()] = True
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
