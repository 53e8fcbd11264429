"""A hub's sites read with the ``timestone`` source (``sites=true``) to the end, as sorted rows."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from tests.e2e.sources.test_timestone_source_spark import run_available_now

Row = tuple[str, str, int, bytes]  # broker, topic, offset, payload


def read_sites(spark: SparkSession, checkpoint: Path, options: dict[str, str]) -> list[Row]:
    """Every row of ``plant/+/temp`` on the hub that ``options`` names (``brokers`` or ``bootstrapServers``),
    from the earliest offsets or where ``checkpoint`` left off."""
    rows: list[Row] = []

    def collect(frame: DataFrame, _batch_id: int) -> None:
        rows.extend(
            (row.broker, row.topic, row.offset, bytes(row.payload))
            for row in frame.select("broker", "topic", "offset", "payload").collect()
        )

    frame = (
        spark.readStream.format("timestone")
        .options(**options)
        .option("topics", "plant/+/temp")
        .option("sites", "true")
        .option("startingOffsets", "earliest")
        .load()
    )
    run_available_now(frame, checkpoint, collect)
    return sorted(rows)
