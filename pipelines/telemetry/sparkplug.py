"""The telemetry job's Sparkplug B query: edge nodes' messages into sparkplug_metrics, quarantine, devices.

When ``payload.formats`` has a ``sparkplug_b`` entry, the job runs this streaming query beside the telemetry
one. It reads the entries' Sparkplug B groups, keeps each edge node's session in its state store
(:func:`pipelines.payloads.spark_sparkplug.sparkplug_rows`: births, aliases, sequence, who is online) and
writes each micro-batch's rows: every metric into ``sparkplug_metrics``, every message that cannot be used
into ``telemetry_quarantine`` with its reason and detail (an alias no birth defined, a payload that does not
parse), every online-state change and sighting into ``devices`` (``online``, ``last_birth``,
``last_seen``); a message delivered again (the sessions' duplicate rows) into none, counted in the
report. A query of its own because Spark runs at most one ``applyInPandasWithState`` in a streaming query,
and the telemetry query's flags duplicates. Its checkpoint is the telemetry one's with
``-sparkplug`` appended; both queries write through one store, whose commits retry a race lost to the
other, each table exactly once per (query, batch). Bronze gets the Sparkplug records from the telemetry
query, which reads the namespace too (:attr:`.config.TelemetryConfig.topic_filters`). Each micro-batch reads
every topic to its end, whatever ``source.max_records_per_trigger`` says (:data:`UNLIMITED`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import available_now as available_now_run
from pipelines.metrics import PipelineMetrics
from pipelines.payloads.spark_sparkplug import sparkplug_rows, with_times
from pipelines.payloads.sparkplug.session import (
    DUPLICATE,
    METRIC,
    PRESENCE,
    REASON_MALFORMED,
    REASON_UNKNOWN_ALIAS,
    REJECTED,
)
from pipelines.payloads.sparkplug_tables import SPARKPLUG_METRICS, metric_rows
from pipelines.supervisor import Supervisor
from sinks import BatchWriter, TableStore, exactly_once

from .config import TelemetryConfig
from .transforms import device_update_set

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

#: The tables the Sparkplug B query writes.
TABLES = (SPARKPLUG_METRICS, "telemetry_quarantine", "devices")
#: Why its messages go to quarantine (the session's reasons).
REASONS = (REASON_UNKNOWN_ALIAS, REASON_MALFORMED)
#: The source option this query goes without: the limit shares a batch's records among the logs it reads in
#: proportion to their backlog, and a broker of several storage partitions keeps an edge node's topics in
#: several logs, so its quiet ones (its births, its death) would be read ahead of its busy ones, and a birth
#: put in force before the data sent under the birth before it were read.
UNLIMITED = "maxRecordsPerTrigger"


def query_name(config: TelemetryConfig) -> str:
    return f"{config.stream.query_name}_sparkplug"


def checkpoint(config: TelemetryConfig) -> str:
    return config.stream.checkpoint.rstrip("/") + "-sparkplug"


@dataclass
class SparkplugReport:
    """What one micro-batch of the Sparkplug B query did (logged, and kept for tests)."""

    batch_id: int
    metrics: int = 0
    quarantined: dict[str, int] = field(default_factory=dict)
    seq_gaps: int = 0
    """Messages whose sequence number did not follow the edge node's previous one."""
    duplicates: int = 0
    """Messages delivered again (a copy of one the sessions took already): in no table but bronze."""
    written: dict[str, bool] = field(default_factory=dict)


class SparkplugBatch:
    """Writes one micro-batch of :func:`sparkplug_rows` into its tables; counts what it quarantined in
    ``timestone_pipeline_quarantined_total`` and the sequence gaps in
    ``timestone_pipeline_sparkplug_seq_gaps_total`` (once, when its quarantine or metrics are written)."""

    def __init__(
        self,
        store: TableStore,
        metrics: PipelineMetrics | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.metrics = metrics or PipelineMetrics()
        self.clock = clock
        self.reports: list[SparkplugReport] = []

    def __call__(self, batch: DataFrame, out: BatchWriter) -> None:
        now = self.clock()
        report = SparkplugReport(out.batch_id)
        rows = with_times(batch).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            counts = _one_row(rows.agg(*_profile()))
            report.metrics, report.seq_gaps = counts["metrics"], counts["seq_gaps"]
            report.duplicates = counts["duplicates"]
            report.quarantined = {reason: counts[reason] for reason in REASONS if counts[reason]}
            if report.metrics and out.append(SPARKPLUG_METRICS, metric_rows(rows, now)):
                self.metrics.sparkplug_seq_gaps.labels("telemetry").inc(report.seq_gaps)
            if report.quarantined:
                rejected = quarantine_rows(rows, out.app_id, out.batch_id, now)
                if out.append("telemetry_quarantine", rejected):
                    for reason, count in report.quarantined.items():
                        self.metrics.quarantined.labels("telemetry", reason).inc(count)
            if report.metrics or counts["presence"]:
                updates = device_updates(rows, now)
                out.merge(
                    "devices",
                    updates,
                    update_when="s.last_seen >= t.last_seen",
                    update_set=device_update_set(updates.columns),
                )
        finally:
            rows.unpersist()
        report.written = dict(out.results)
        self.reports.append(report)
        log.info("sparkplug batch %d: %s", out.batch_id, report)


def _profile() -> list[Column]:
    kind = F.col("kind")
    message = F.struct("broker", "topic", "offset")
    return [
        F.count(F.when(kind == METRIC, 1)).alias("metrics"),
        F.count(F.when(kind == PRESENCE, 1)).alias("presence"),
        F.count(F.when(kind == DUPLICATE, 1)).alias("duplicates"),
        F.count_distinct(F.when((kind == METRIC) & F.col("seq_gap"), message)).alias("seq_gaps"),
        *[F.count(F.when((kind == REJECTED) & (F.col("reason") == r), 1)).alias(r) for r in REASONS],
    ]


def device_path(device: Column) -> Column:
    """The ``devices`` id of a Sparkplug row: ``group/edge_node`` for the node, ``group/edge_node/device``."""
    node = F.concat_ws("/", "group_id", "edge_node_id")
    return F.when(device.isNull(), node).otherwise(F.concat_ws("/", node, device))


def quarantine_rows(rows: DataFrame, run_id: str, batch_id: int, quarantined_at: datetime) -> DataFrame:
    """The messages the sessions rejected as ``telemetry_quarantine`` rows: raw payload, reason, detail."""
    stamp = F.lit(quarantined_at).cast("timestamp")
    return rows.where(F.col("kind") == REJECTED).select(
        "broker",
        "topic",
        "offset",
        "timestamp",
        F.lit(None).cast("string").alias("client_id"),
        F.lit(None).cast("map<string,string>").alias("properties"),
        "payload",
        F.when(F.col("group_id").isNotNull(), device_path(F.col("device_id"))).alias("device_id"),
        F.lit(None).cast("array<string>").alias("failed_expectations"),
        "reason",
        "detail",
        F.lit(run_id).alias("run_id"),
        F.lit(batch_id).cast("bigint").alias("batch_id"),
        F.to_date(stamp).alias("quarantine_date"),
        stamp.alias("quarantined_at"),
    )


def device_updates(rows: DataFrame, updated_at: datetime) -> DataFrame:
    """One ``devices`` row per edge node and device with metrics or an online-state change in the batch:
    its latest broker time, whether it is online after the batch (null: no change) and its latest birth."""
    seen = rows.where(F.col("kind").isin(METRIC, PRESENCE) & F.col("timestamp").isNotNull())
    order = F.struct("timestamp", "ordinal")
    presence = F.col("kind") == PRESENCE
    return (
        seen.withColumn("device_id", device_path(F.col("device_id")))
        .groupBy("device_id")
        .agg(
            F.max("timestamp").alias("last_seen"),
            F.max_by("broker", order).alias("broker"),
            F.max_by("online", F.when(presence, order)).alias("online"),
            F.max(F.when(presence & F.col("online"), F.col("birth_time"))).alias("last_birth"),
        )
        .select(
            "device_id",
            "last_seen",
            "broker",
            F.lit(None).cast("string").alias("firmware_version"),
            F.lit(None).cast("map<string,string>").alias("tags"),
            F.lit(None).cast("string").alias("group"),
            F.lit(updated_at).cast("timestamp").alias("updated_at"),
            "online",
            "last_birth",
        )
    )


def start_query(
    records: DataFrame, config: TelemetryConfig, batch: SparkplugBatch, available_now: bool = False
) -> StreamingQuery:
    """Start the query on a streaming DataFrame of the ``timestone`` source's records (the caller gives it
    the Sparkplug B filters, :attr:`.config.PayloadConfig.sparkplug_filters`)."""
    writer = (
        sparkplug_rows(records)
        .writeStream.queryName(query_name(config))
        .option("checkpointLocation", checkpoint(config))
        .foreachBatch(exactly_once(batch.store, batch, persist=False))  # the batch caches its rows itself
    )
    if available_now:
        return available_now_run.start(writer, records.sparkSession)
    return writer.trigger(processingTime=config.stream.trigger_interval).start()


def supervise_query(
    spark: SparkSession,
    config: TelemetryConfig,
    store: TableStore,
    supervisor: Supervisor,
    available_now: bool = False,
) -> None:
    """Start the Sparkplug B query under ``supervisor`` (restarted from its checkpoint when it fails) if
    ``payload.formats`` has a ``sparkplug_b`` entry; each start gets a new :class:`SparkplugBatch`."""
    topics = config.payload.sparkplug_filters
    if not topics:
        return
    for name in TABLES:
        store.ensure(name)

    def start() -> StreamingQuery:
        from sources import register_sources

        register_sources(spark)
        options = config.source_options(topics)
        options.pop(UNLIMITED, None)
        if available_now:
            options.update(available_now_run.source_options(spark))
        records = spark.readStream.format("timestone").options(**options).load()
        batch = SparkplugBatch(store, supervisor.metrics)
        query = start_query(records, config, batch, available_now)
        log.info("sparkplug query %s started: %s", query.id, ",".join(topics))
        return query

    supervisor.add(query_name(config), start)


def _one_row(frame: DataFrame) -> dict[str, int]:
    row = frame.first()
    assert row is not None, "an aggregate without grouping has one row"
    return {key: int(value) for key, value in row.asDict().items()}
