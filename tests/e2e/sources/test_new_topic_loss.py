"""Which new topics of a broker read by topic must start at offset 0, called the way Spark calls the reader.

A real broker (a LogStore with 1 KiB segments and its offsets API on 127.0.0.1) whose retention trims a
topic's first segments; the offsets make the JSON round trip Spark's offset log does. Under Spark:
test_new_topic_loss_spark.py."""

from __future__ import annotations

import logging

import pytest

from sources.offsets_planner import DataLossError, Slice
from sources.stream_api import ReadAllAvailable, ReadMaxRows
from sources.timestone_source import TimestonePartition
from tests.e2e.sources.conftest import EdgeBroker, plain
from tests.e2e.sources.test_new_topic_loss_spark import trimmed
from tests.e2e.sources.test_stream_reader import reader, roundtrip
from tests.e2e.sources.test_timestone_source_spark import FAR_FUTURE_MS


def slices(partitions: list) -> list[Slice]:
    assert all(isinstance(partition, TimestonePartition) for partition in partitions)
    return [piece for partition in partitions for piece in partition.plan.slices]


def test_the_offsets_name_the_filters_each_listed_broker_answered_for(
    small_segments_edge: EdgeBroker,
) -> None:
    edge = small_segments_edge
    edge.fill("plant/1/temp", 3)
    source = reader(edge, topics="plant/+/temp,plant/+/alarm", startingOffsets="earliest")
    initial = roundtrip(source.initialOffset())
    assert {key for key in initial["e1"] if key.startswith("#f")} == {"#fplant/+/temp", "#fplant/+/alarm"}
    partitioned = reader(edge, readBy="partitions", startingOffsets="earliest").initialOffset()
    assert not [key for key in partitioned["e1"] if key.startswith("#f")]  # positions: #t<filter>


def test_a_broker_down_at_the_first_start_reads_its_trimmed_topics_from_their_start_without_a_report(
    small_segments_edge: EdgeBroker, edge: EdgeBroker
) -> None:
    edge.fill("plant/1/temp", 3)
    start = trimmed(small_segments_edge, "plant/2/temp")
    small_segments_edge.stop_server()
    source = reader(edge, small_segments_edge, startingOffsets="earliest")
    initial = roundtrip(source.initialOffset())
    assert "e2" not in initial
    small_segments_edge.start_server(small_segments_edge.port)
    end = roundtrip(source.latestOffset(initial, ReadAllAvailable()))
    assert plain(end)["e2"] == {"plant/2/temp": 300}
    assert [piece.start for piece in slices(source.partitions(initial, end))] == [
        0,
        start,
    ]


def test_a_topic_created_while_its_broker_was_down_for_the_query_and_trimmed_is_data_loss(
    small_segments_edge: EdgeBroker, edge: EdgeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker answered the query's earlier listing: a topic it lists later appeared since, from 0."""
    edge.fill("plant/1/temp", 3)
    small_segments_edge.fill("plant/1/temp", 3)
    source = reader(edge, small_segments_edge, startingOffsets="earliest")
    read = roundtrip(source.latestOffset(roundtrip(source.initialOffset()), ReadAllAvailable()))
    small_segments_edge.stop_server()
    down = roundtrip(source.latestOffset(read, ReadAllAvailable()))
    assert down["e2"] == read["e2"]  # its offsets and the filters of its last listing, kept
    start = trimmed(small_segments_edge, "plant/2/temp")
    small_segments_edge.start_server(small_segments_edge.port)
    appeared = rf"'e2' topic 'plant/2/temp': the log appeared .*\[{start}, 300\)"
    with pytest.raises(DataLossError, match=appeared):
        source.latestOffset(down, ReadAllAvailable())

    skipping = reader(edge, small_segments_edge, startingOffsets="earliest", failOnDataLoss="false")
    end = roundtrip(skipping.latestOffset(down, ReadAllAvailable()))
    assert plain(end)["e2"]["plant/2/temp"] == 300
    with caplog.at_level(logging.WARNING, logger="sources.timestone_source"):
        parts = skipping.partitions(down, end)
    assert ("plant/2/temp", start, 300) in [(s.topic, s.start, s.end) for s in slices(parts)]
    assert f"skipping {start} records lost to retention" in caplog.text
    assert f"e2 topic 'plant/2/temp' [0, {start})" in caplog.text


def test_offsets_written_before_the_filters_were_kept_resume_without_a_report(
    small_segments_edge: EdgeBroker,
) -> None:
    edge = small_segments_edge
    edge.fill("plant/1/temp", 3)
    source = reader(edge, startingOffsets="earliest")
    old = plain(roundtrip(source.latestOffset(roundtrip(source.initialOffset()), ReadAllAvailable())))
    trimmed(edge, "plant/2/temp")  # new to the old offsets: nothing tells when it appeared
    end = roundtrip(reader(edge).latestOffset(old, ReadAllAvailable()))
    assert plain(end) == {"e1": {"plant/1/temp": 3, "plant/2/temp": 300}}
    assert "#fplant/+/temp" in end["e1"]  # from now on, new topics are checked
    trimmed(edge, "plant/3/temp")
    with pytest.raises(DataLossError, match="'plant/3/temp'"):
        reader(edge).latestOffset(end, ReadAllAvailable())


def test_a_topic_emptied_by_retention_before_its_broker_first_answered_is_recorded_not_reported_later(
    small_segments_edge: EdgeBroker, edge: EdgeBroker
) -> None:
    """A log with nothing left to read is in the offsets of the batch that first listed it, so the next
    batch does not take it for one that appeared since (and a read limit leaving a topic out does the same:
    test_offsets_planner.py)."""
    edge.fill("plant/1/temp", 3)
    small_segments_edge.fill("plant/2/temp", 5)
    trimmed(small_segments_edge, "plant/9/temp")
    assert small_segments_edge.store.log_info("plant/2/temp").start_offset == 5  # every record gone
    small_segments_edge.stop_server()
    source = reader(edge, small_segments_edge, startingOffsets="earliest", maxRecordsPerTrigger="10")
    initial = roundtrip(source.initialOffset())
    small_segments_edge.start_server(small_segments_edge.port)
    first = roundtrip(source.latestOffset(initial, ReadMaxRows(10)))
    assert plain(first)["e2"]["plant/2/temp"] == 5
    offsets = first
    for _ in range(60):
        offsets = roundtrip(source.latestOffset(offsets, ReadMaxRows(10)))
    assert plain(offsets)["e2"] == {"plant/2/temp": 5, "plant/9/temp": 300}


def test_a_replayed_batch_whose_new_topic_was_trimmed_meanwhile_is_data_loss(
    small_segments_edge: EdgeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """The batch was planned from offset 0 of the new topic; retention ran before a restart replayed it."""
    edge = small_segments_edge
    edge.fill("plant/1/temp", 3)
    source = reader(edge, startingOffsets="earliest")
    start = roundtrip(source.latestOffset(roundtrip(source.initialOffset()), ReadAllAvailable()))
    edge.fill("plant/2/temp", 300)
    end = roundtrip(source.latestOffset(start, ReadAllAvailable()))
    assert plain(end)["e1"]["plant/2/temp"] == 300
    edge.apply_retention(FAR_FUTURE_MS)
    log_start = edge.store.log_info("plant/2/temp").start_offset
    with pytest.raises(DataLossError, match=r"'plant/2/temp': the log appeared"):
        reader(edge).partitions(start, end)  # a restarted query: nothing cached
    with caplog.at_level(logging.WARNING, logger="sources.timestone_source"):
        parts = reader(edge, failOnDataLoss="false").partitions(start, end)
    assert [(s.topic, s.start, s.end) for s in slices(parts)] == [("plant/2/temp", log_start, 300)]
    assert f"e1 topic 'plant/2/temp' [0, {log_start})" in caplog.text
