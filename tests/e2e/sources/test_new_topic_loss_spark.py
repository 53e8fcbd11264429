"""A topic new to a query read by topic, whose first records retention removed before the query read them.

A log that appears after the query listed its broker starts at offset 0: when the query meets it starting
later, its first records are gone, which is data loss (Kafka's source says the same of an added partition
that does not start at 0). A log the query had no chance to read from 0 is not: the query's first start
(``earliest`` reads from the log start), a filter added to ``topics`` between runs.

The shared local SparkSession, a real broker (a LogStore with 1 KiB segments and its offsets API on
127.0.0.1) whose retention trims the new topic's first segments, and a Delta table on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from tests.e2e.sources.conftest import EdgeBroker
from tests.e2e.sources.test_store_replaced_spark import DeltaSink
from tests.e2e.sources.test_timestone_source_spark import FAR_FUTURE_MS, run_available_now

pytestmark = pytest.mark.spark


def stream(spark: SparkSession, edge: EdgeBroker, topics: str = "plant/+/temp", **options: str) -> DataFrame:
    return (
        spark.readStream.format("timestone")
        .option("brokers", f"e1={edge.url}")
        .option("topics", topics)
        .option("readBy", "topics")
        .option("startingOffsets", "earliest")
        .option("fetchRetries", "1")
        .option("retryBackoffMs", "50")
        .options(**options)
        .load()
    )


def trimmed(edge: EdgeBroker, topic: str) -> int:
    """``topic`` given 300 records, then retention: its log start (its first segments are gone)."""
    edge.fill(topic, 300)
    edge.apply_retention(FAR_FUTURE_MS)
    start = edge.store.log_info(topic).start_offset
    assert 0 < start < 300
    return start


def rows(topic: str, offsets: range) -> list[tuple[str, int, str]]:
    return [(topic, offset, f'{{"n":{offset}}}') for offset in offsets]


def test_a_topic_that_appeared_while_the_query_was_stopped_and_lost_its_first_records_is_data_loss(
    timestone_spark: SparkSession, small_segments_edge: EdgeBroker, tmp_path: Path
) -> None:
    edge = small_segments_edge
    edge.fill("plant/1/temp", 10)
    checkpoint, sink = tmp_path / "checkpoint", DeltaSink(tmp_path / "bronze")
    run_available_now(stream(timestone_spark, edge), checkpoint, sink)
    assert sink.rows() == rows("plant/1/temp", range(10))

    start = trimmed(edge, "plant/2/temp")  # created after the query listed e1, trimmed before it came back
    with pytest.raises(StreamingQueryException) as caught:
        run_available_now(stream(timestone_spark, edge), checkpoint, sink)
    message = str(caught.value)
    assert "data loss on broker 'e1' topic 'plant/2/temp'" in message, message
    assert f"the log now holds [{start}, 300)" in message, message
    assert sink.rows() == rows("plant/1/temp", range(10))

    run_available_now(stream(timestone_spark, edge, failOnDataLoss="false"), checkpoint, sink)
    assert sink.rows() == rows("plant/1/temp", range(10)) + rows("plant/2/temp", range(start, 300))


def test_a_first_start_or_an_added_filter_reads_a_trimmed_topic_from_its_log_start_without_a_report(
    timestone_spark: SparkSession, small_segments_edge: EdgeBroker, tmp_path: Path
) -> None:
    edge = small_segments_edge
    temp_start = trimmed(edge, "plant/1/temp")  # before the query's first start: earliest is the log start
    checkpoint, sink = tmp_path / "checkpoint", DeltaSink(tmp_path / "bronze")
    run_available_now(stream(timestone_spark, edge), checkpoint, sink)
    assert sink.rows() == rows("plant/1/temp", range(temp_start, 300))

    alarm_start = trimmed(edge, "plant/1/alarm")  # a filter the query did not read until now
    both = "plant/+/temp,plant/+/alarm"
    run_available_now(stream(timestone_spark, edge, both), checkpoint, sink)
    assert sink.rows() == sorted(
        rows("plant/1/temp", range(temp_start, 300)) + rows("plant/1/alarm", range(alarm_start, 300))
    )

    trimmed(edge, "plant/2/alarm")  # the widened filter's topics are now known: a new one is checked
    with pytest.raises(StreamingQueryException, match="data loss on broker 'e1' topic 'plant/2/alarm'"):
        run_available_now(stream(timestone_spark, edge, both), checkpoint, sink)
