"""Where Sparkplug B metrics land: the ``sparkplug_metrics`` table (silver) and the step that fills it.

One row per metric of every birth and data message (the session's metric rows, :mod:`.spark_sparkplug`),
identified by its record and its place in the payload, partitioned by the UTC date of the metric's time.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
)

from sinks.tables import CHANGE_DATA_FEED, TableSpec, column, struct

from .sparkplug.session import METRIC

SPARKPLUG_METRICS = "sparkplug_metrics"


def sparkplug_metrics() -> TableSpec:
    return TableSpec(
        name=SPARKPLUG_METRICS,
        description="Sparkplug B metrics, one row per metric of every birth and data message, by name.",
        schema=struct(
            column("group_id", StringType(), False),
            column("edge_node_id", StringType(), False),
            column("device_id", StringType(), True, "null for the edge node's own metrics"),
            column("message_type", StringType(), False, "NBIRTH, DBIRTH, NDATA or DDATA"),
            column("metric", StringType(), False, "the name, from the birth when the message sent the alias"),
            column("metric_index", IntegerType(), False, "the metric's place in the payload"),
            column("alias", LongType()),
            column("datatype", StringType(), False, "Sparkplug B datatype, from the birth when not sent"),
            column("value_double", DoubleType(), True, "every number (integers too)"),
            column("value_long", LongType(), True, "integers and DateTime (ms), exactly"),
            column("value_boolean", BooleanType()),
            column("value_string", StringType(), True, "String, Text, UUID; DataSet and Template as JSON"),
            column("value_bytes", BinaryType(), True, "Bytes, File and the packed arrays"),
            column("is_null", BooleanType()),
            column("is_historical", BooleanType()),
            column("metric_time", TimestampType(), False, "the metric's timestamp, else the message's"),
            column("event_date", DateType(), False, "date of metric_time (UTC), the partition"),
            column("seq", LongType(), True, "the message's sequence number (0-255)"),
            column("seq_gap", BooleanType(), True, "the number did not follow the edge node's previous one"),
            column("broker", StringType(), False),
            column("topic", StringType(), False),
            column("offset", LongType(), False),
            column("timestamp", TimestampType(), True, "broker append time"),
            column("ingested_at", TimestampType(), False),
            column("is_transient", BooleanType(), True, "sent as transient: for a host, not for a historian"),
        ),
        partition_by=("event_date",),
        properties=CHANGE_DATA_FEED,
        merge_keys=("broker", "topic", "offset", "metric_index"),
    )


def metric_rows(rows: DataFrame, ingested_at: datetime) -> DataFrame:
    """The metric rows of :func:`.spark_sparkplug.sparkplug_rows` (times made timestamps by ``with_times``)
    as ``sparkplug_metrics`` rows."""
    schema = sparkplug_metrics().schema
    stamp = F.lit(ingested_at).cast("timestamp")
    metrics = rows.where(F.col("kind") == METRIC).withColumn("event_date", F.to_date("metric_time"))
    return metrics.withColumn("ingested_at", stamp).select(
        *[F.col(field.name).cast(field.dataType).alias(field.name) for field in schema.fields]
    )
