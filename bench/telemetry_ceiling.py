"""Two ceilings for the telemetry job: its transforms written as plain Spark, Parquet in, Parquet out.

What a data engineer would write by hand, with nothing of the job's machinery: no streaming source, no
Delta log, no exactly-once bookkeeping, no per-batch lookups. Both read a Parquet copy of bronze, parse the
JSON payloads with the job's field types, drop duplicate messages by (device, ``seq``) and write silver
(partitioned by event date), the per-device minutes (count, min/max/avg of each metric) and the per-device
table (last seen, broker, firmware, group) as Parquet, silver cached as anyone deriving several outputs
from it would.

- :func:`run_ceiling`, the *engine ceiling*, does the job's work: it also splits the rows that fail
  parsing or the job's default expectations (``device_id`` not null, ``temperature`` in [-40, 125]) into
  a quarantine, from the parsed rows cached.
- :func:`run_plain`, the *plain transforms*, does only the core of it: no expectations, no quarantine.

``bench/telemetry_bench.py`` runs them in the same Spark session as the job, interleaved with it, and the
engine ceiling once in a fresh Spark process for the cold figure
(``python bench/telemetry_ceiling.py BRONZE_DIR OUT_DIR``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The job's default payload (``pipelines/telemetry/config.py``), spelt out as a hand-written job would.
PAYLOAD_DDL = (
    "ts bigint, seq bigint, temperature double, humidity double, battery double, firmware string, "
    "`group` string, _corrupt string"
)
METRICS = ("temperature", "humidity", "battery")
TOPIC_REGEX = r"^devices/([^/]+)/telemetry$"


@dataclass(frozen=True)
class CeilingRun:
    """One run: rows read, seconds from the first read to the last file written, rows per table."""

    rows: int
    seconds: float
    silver: int
    minutes: int
    devices: int
    quarantined: int

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def _parsed(spark: SparkSession, bronze_files: Sequence[str], keep_payload: bool) -> DataFrame:
    """Bronze's telemetry rows with the device id, the payload's fields and the event time."""
    from pyspark.sql import functions as F

    payload = F.from_json(
        F.col("payload").cast("string"), PAYLOAD_DDL, {"columnNameOfCorruptRecord": "_corrupt"}
    )
    raw = ["payload"] if keep_payload else []
    return (
        spark.read.parquet(*bronze_files)
        .where(F.col("topic").rlike(TOPIC_REGEX))
        .select(
            F.regexp_extract("topic", TOPIC_REGEX, 1).alias("device_id"),
            "broker",
            "topic",
            "offset",
            "timestamp",
            "ingested_at",
            *raw,
            payload.alias("j"),
        )
        .select("*", "j.*")
        .drop("j")
        .withColumn("event_time", F.coalesce(F.timestamp_millis("ts"), F.col("timestamp")))
        .withColumn("event_date", F.to_date("event_time"))
    )


def _write_silver_and_gold(rows: DataFrame, out: str) -> None:
    """Duplicates dropped by (device, ``seq``); silver, device minutes and devices written as Parquet."""
    from pyspark.sql import functions as F

    silver = (
        rows.dropDuplicates(["device_id", "seq"])
        .select(
            "device_id",
            "event_time",
            "event_date",
            "topic",
            "broker",
            "offset",
            "ingested_at",
            "timestamp",
            "seq",
            *METRICS,
            "firmware",
            "group",
        )
        .cache()
    )
    try:
        silver.drop("timestamp").write.mode("overwrite").partitionBy("event_date").parquet(
            os.path.join(out, "silver")
        )
        stats = [
            aggregate(F.col(m)).alias(f"{m}_{name}")
            for m in METRICS
            for name, aggregate in (("min", F.min), ("max", F.max), ("avg", F.avg))
        ]
        minutes = silver.groupBy("device_id", F.date_trunc("minute", "event_time").alias("minute")).agg(
            F.count(F.lit(1)).alias("count"), *stats
        )
        minutes.write.mode("overwrite").parquet(os.path.join(out, "device_minute"))
        devices = silver.groupBy("device_id").agg(
            F.max("timestamp").alias("last_seen"),
            F.max_by("broker", "timestamp").alias("broker"),
            F.max_by("firmware", "timestamp").alias("firmware_version"),
            F.max_by("group", "timestamp").alias("group"),
        )
        devices.write.mode("overwrite").parquet(os.path.join(out, "devices"))
    finally:
        silver.unpersist()


def _counted(spark: SparkSession, bronze_files: Sequence[str], out: str, seconds: float) -> CeilingRun:
    def rows(name: str) -> int:
        path = os.path.join(out, name)
        return spark.read.parquet(path).count() if os.path.isdir(path) else 0

    return CeilingRun(
        spark.read.parquet(*bronze_files).count(),
        seconds,
        rows("silver"),
        rows("device_minute"),
        rows("devices"),
        rows("quarantine"),
    )


def run_ceiling(spark: SparkSession, bronze_files: Sequence[str], out: str) -> CeilingRun:
    """Bronze's Parquet files → silver, quarantine, device minutes and devices as Parquet under ``out``."""
    from pyspark.sql import functions as F

    began = time.perf_counter()
    temperature = F.col("temperature")
    failed = (
        F.col("_corrupt").isNotNull()
        | F.col("device_id").isNull()
        | (temperature.isNotNull() & ~F.isnan(temperature) & ~temperature.between(-40.0, 125.0))
    )
    flagged = _parsed(spark, bronze_files, keep_payload=True).withColumn("failed", failed).cache()
    try:
        flagged.where("failed").select("broker", "topic", "offset", "timestamp", "payload").write.mode(
            "overwrite"
        ).parquet(os.path.join(out, "quarantine"))
        _write_silver_and_gold(flagged.where(~F.col("failed")), out)
        seconds = time.perf_counter() - began
    finally:
        flagged.unpersist()
    return _counted(spark, bronze_files, out, seconds)


def run_plain(spark: SparkSession, bronze_files: Sequence[str], out: str) -> CeilingRun:
    """The plain transforms: bronze's Parquet files → silver, device minutes and devices, nothing else."""
    began = time.perf_counter()
    _write_silver_and_gold(_parsed(spark, bronze_files, keep_payload=False), out)
    return _counted(spark, bronze_files, out, time.perf_counter() - began)


def main(argv: list[str]) -> int:
    """``BRONZE_FILES_JSON OUT_DIR [MASTER]``: one cold run in a fresh Spark session; prints it as JSON."""
    files_json, out, master = (*argv, "local[2]")[:3]
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from pipelines.spark_session import local_spark_session

    spark = local_spark_session("timestone-ceiling-cold", master)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with open(files_json) as handle:
            result = run_ceiling(spark, json.load(handle), out)
    finally:
        spark.stop()
    print(json.dumps(result.__dict__))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
