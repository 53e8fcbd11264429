"""A query read by storage partition (the default) restarted with other ``topics``: records of a filter the
checkpoint did not read, below its positions, cannot be read by partition; the query says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from tests.e2e.sources.conftest import EdgeBroker
from tests.e2e.sources.test_timestone_source_spark import BatchCollector, expected, run_available_now

pytestmark = pytest.mark.spark


def stream(spark: SparkSession, edge: EdgeBroker, topics: str, **options: str) -> DataFrame:
    return (
        spark.readStream.format("timestone")
        .option("brokers", f"e1={edge.url}")
        .option("topics", topics)
        .option("startingOffsets", "earliest")
        .options(**options)
        .load()
    )


def test_a_filter_added_to_a_checkpoint_read_by_partition_fails_the_query_naming_it(
    timestone_spark: SparkSession, edge: EdgeBroker, tmp_path: Path
) -> None:
    """Its records below the checkpoint's positions were skipped silently, where a query read by topic
    reads a filter's new topics from their log start."""
    edge.fill("plant/1/temp", 10)
    edge.fill("plant/1/alarm", 4)
    checkpoint = tmp_path / "checkpoint"
    first = BatchCollector()
    run_available_now(stream(timestone_spark, edge, "plant/+/temp"), checkpoint, first)
    assert first.keys() == expected("e1", "plant/1/temp", range(10))

    widened = stream(timestone_spark, edge, "plant/+/temp,plant/+/alarm")
    with pytest.raises(StreamingQueryException, match=r"'topics'.*plant/\+/alarm.*failOnDataLoss"):
        run_available_now(widened, checkpoint, BatchCollector())

    narrower = BatchCollector()  # a filter the checkpoint's filters cover reads on from its positions
    run_available_now(stream(timestone_spark, edge, "plant/1/temp"), checkpoint, narrower)
    assert narrower.keys() == []

    edge.fill("plant/1/alarm", 2, first=4)
    told = BatchCollector()
    run_available_now(
        stream(timestone_spark, edge, "plant/+/temp,plant/+/alarm", failOnDataLoss="false"), checkpoint, told
    )
    assert told.keys() == expected("e1", "plant/1/alarm", range(4, 6))
    edge.fill("plant/1/alarm", 1, first=6)
    again = BatchCollector()  # the checkpoint now reads both: no warning, no failure
    run_available_now(stream(timestone_spark, edge, "plant/+/temp,plant/+/alarm"), checkpoint, again)
    assert again.keys() == expected("e1", "plant/1/alarm", range(6, 7))
