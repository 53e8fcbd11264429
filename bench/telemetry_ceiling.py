"""The engine ceiling for the telemetry job: its transforms written as plain Spark, Parquet in, Parquet out.

What a data engineer would write by hand for the same result, with nothing of the job's machinery: no
streaming source, no Delta log, no exactly-once bookkeeping, no per-batch lookups. It reads a Parquet copy
of bronze, parses the JSON payloads with the job's field types, splits the rows that fail parsing or the
job's default expectations (``device_id`` not null, ``temperature`` in [-40, 125]) into a quarantine, drops
duplicate messages by (device, ``seq``), and writes silver (partitioned by event date), the per-device
minutes (count, min/max/avg of each metric) and the per-device table (last seen, broker, firmware, group),
all as Parquet. The parsed rows and silver are cached, as anyone deriving several outputs from them would.

``bench/telemetry_bench.py`` runs it in the same Spark session as the job, interleaved with it, and once in a
fresh Spark process for the cold figure (``python bench/telemetry_ceiling.py BRONZE_DIR OUT_DIR``).
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
    from pyspark.sql import SparkSession

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


def run_ceiling(spark: SparkSession, bronze_files: Sequence[str], out: str) -> CeilingRun:
    """Bronze's Parquet files → silver, quarantine, device minutes and devices as Parquet under ``out``."""
    from pyspark.sql import functions as F

    began = time.perf_counter()
    bronze = spark.read.parquet(*bronze_files)
    payload = F.from_json(
        F.col("payload").cast("string"), PAYLOAD_DDL, {"columnNameOfCorruptRecord": "_corrupt"}
    )
    parsed = (
        bronze.where(F.col("topic").rlike(TOPIC_REGEX))
        .select(
            F.regexp_extract("topic", TOPIC_REGEX, 1).alias("device_id"),
            "broker",
            "topic",
            "offset",
            "timestamp",
            "ingested_at",
            "payload",
            payload.alias("j"),
        )
        .select("*", "j.*")
        .drop("j")
        .withColumn("event_time", F.coalesce(F.timestamp_millis("ts"), F.col("timestamp")))
        .withColumn("event_date", F.to_date("event_time"))
    )
    temperature = F.col("temperature")
    failed = (
        F.col("_corrupt").isNotNull()
        | F.col("device_id").isNull()
        | (temperature.isNotNull() & ~F.isnan(temperature) & ~temperature.between(-40.0, 125.0))
    )
    flagged = parsed.withColumn("failed", failed).cache()
    try:
        flagged.where("failed").select("broker", "topic", "offset", "timestamp", "payload").write.mode(
            "overwrite"
        ).parquet(os.path.join(out, "quarantine"))
        silver = (
            flagged.where(~F.col("failed"))
            .dropDuplicates(["device_id", "seq"])
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
        seconds = time.perf_counter() - began
    finally:
        flagged.unpersist()
    counted = {
        name: spark.read.parquet(os.path.join(out, name)).count()
        for name in ("silver", "device_minute", "devices", "quarantine")
    }
    rows = spark.read.parquet(*bronze_files).count()
    return CeilingRun(
        rows, seconds, counted["silver"], counted["device_minute"], counted["devices"], counted["quarantine"]
    )


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
