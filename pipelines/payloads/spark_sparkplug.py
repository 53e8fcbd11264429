"""Sparkplug B records into rows on the executors, each edge node's session kept in Spark's state store.

The records of a micro-batch are grouped by edge node (group id and edge node id, read from the topic) and
each group is handed, with its node's state from the previous micro-batches, to :class:`.session
.EdgeNodeSession` in a Python worker (``applyInPandasWithState``). The state (births, aliases, sequence,
online devices) lives in the state store of the streaming query's checkpoint, on the executors: it is
restored with the checkpoint after a restart, and the driver never holds it. The rows that come out are the
session's (:data:`.session.ROW_COLUMNS`): metrics, quarantined messages, online-state changes and
messages delivered again (one row each, which no table takes), with
times as timestamps, and ``ordinal``, each row's place in its edge node's rows of the micro-batch (the order
the node's messages took effect in: its last online-state change is the one in force).
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

from .sparkplug.session import ROW_COLUMNS, EdgeNodeSession, Record
from .sparkplug.topics import NAMESPACE

# pyspark concatenates the frames :func:`advance_session` returns with frames of all-null rows, and pandas
# warns that it will type all-null columns otherwise one day: the declared schema types them, so the Python
# workers need not print it.
warnings.filterwarnings(
    "ignore", "The behavior of DataFrame concatenation with empty or all-NA entries", FutureWarning
)

#: The rows of :func:`sparkplug_rows` (times in epoch milliseconds; :func:`with_times` makes timestamps).
ROWS_SCHEMA = ", ".join(
    [
        "kind string, broker string, topic string, offset bigint, timestamp_ms bigint",
        "group_id string, edge_node_id string, device_id string, message_type string",
        "seq bigint, seq_gap boolean, metric_index int, metric string, alias bigint, datatype string",
        "metric_time_ms bigint",
        "is_null boolean, is_historical boolean, value_long bigint, value_double double",
        "value_boolean boolean, value_string string, value_bytes binary, reason string, detail string",
        "online boolean, birth_time_ms bigint, payload binary, is_transient boolean, ordinal int",
    ]
)
STATE_SCHEMA = "session binary"
#: The masked (nullable) pandas arrays of ROWS_SCHEMA's numbers and booleans, by type and NumPy type.
_MASKED: dict[str, tuple[type[Any], str]] = {
    "bigint": (pd.arrays.IntegerArray, "int64"),
    "int": (pd.arrays.IntegerArray, "int32"),
    "double": (pd.arrays.FloatingArray, "float64"),
    "boolean": (pd.arrays.BooleanArray, "bool"),
}
_COLUMN_TYPES = dict(column.split() for column in ROWS_SCHEMA.split(", "))


def is_sparkplug(topic: Column) -> Column:
    """Records of an edge node or a device (the host's own ``spBv1.0/STATE/...`` is not one)."""
    return topic.startswith(f"{NAMESPACE}/") & ~topic.startswith(f"{NAMESPACE}/STATE/")


def sparkplug_rows(records: DataFrame) -> DataFrame:
    """The rows of the Sparkplug B records of a streaming DataFrame of broker records.

    ``records`` needs ``broker``, ``topic``, ``offset``, ``timestamp`` and ``payload``. The query that
    consumes the result keeps the state, so it must be a streaming query with a checkpoint.
    """
    levels = F.split(F.col("topic"), "/")
    keyed = records.where(is_sparkplug(F.col("topic"))).select(
        F.coalesce(levels.getItem(1), F.lit("")).alias("group_id"),
        F.coalesce(levels.getItem(3), F.lit("")).alias("edge_node_id"),
        "broker",
        "topic",
        "offset",
        F.unix_millis(F.col("timestamp")).alias("timestamp_ms"),
        "payload",
    )
    return keyed.groupBy("group_id", "edge_node_id").applyInPandasWithState(
        advance_session, ROWS_SCHEMA, STATE_SCHEMA, "append", GroupStateTimeout.NoTimeout
    )


def advance_session(
    key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """One edge node's records of a micro-batch through its session; the session saved back to the state."""
    session = EdgeNodeSession.from_bytes(bytes(state.get[0])) if state.exists else EdgeNodeSession()
    records = [
        Record(row.broker, row.topic, int(row.offset), int(row.timestamp_ms), _bytes(row.payload))
        for frame in frames
        for row in frame.itertuples(index=False)
    ]
    rows = session.process(records)
    state.update((session.to_bytes(),))
    if rows:
        columns = {name: _column([row[name] for row in rows], name) for name in ROW_COLUMNS}
        yield pd.DataFrame(columns).assign(ordinal=range(len(rows)))


def _column(values: list[Any], name: str) -> Any:
    """A column of the rows as Spark gets it exactly: numbers and booleans in masked arrays (a NumPy integer
    column with a null is float64, whose cast back fails past 2**53; a NaN in a NumPy column is null)."""
    masked = _MASKED.get(_COLUMN_TYPES[name])
    if masked is None:
        return pd.Series(values, dtype=object)
    array, dtype = masked
    mask = np.array([value is None for value in values], dtype=bool)
    data = np.array([0 if value is None else value for value in values], dtype=dtype)
    return array(data, mask)


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def with_times(rows: DataFrame) -> DataFrame:
    """The rows with their epoch-millisecond times as timestamps: ``timestamp`` (the broker's),
    ``metric_time`` and ``birth_time``."""
    return (
        rows.withColumn("timestamp", F.timestamp_millis("timestamp_ms"))
        .withColumn("metric_time", F.timestamp_millis("metric_time_ms"))
        .withColumn("birth_time", F.timestamp_millis("birth_time_ms"))
        .drop("timestamp_ms", "metric_time_ms", "birth_time_ms")
    )
