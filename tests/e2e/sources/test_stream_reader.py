"""The timestone stream reader's offset calls against real brokers read by topic, called the way Spark calls
them.

Spark runs these in a planner process; here they are called directly, which keeps each case fast. The
end-to-end behaviour under Spark is in test_timestone_source_spark.py.
"""

from __future__ import annotations

import json
import logging
import pickle
import time

import pytest

from sources.options import parse_options
from sources.slice_reader import BrokerUnreachableError
from sources.stream_api import ReadAllAvailable, ReadMaxRows
from sources.timestone_source import TimestonePartition, TimestoneStreamReader
from tests.e2e.sources.conftest import BASE_TIME_MS, EdgeBroker, plain


def reader(*brokers: EdgeBroker, **options: str) -> TimestoneStreamReader:
    urls = ",".join(f"e{number}={broker.url}" for number, broker in enumerate(brokers, 1))
    base = {
        "brokers": urls,
        "topics": "plant/+/temp",
        "fetchRetries": "1",
        "retryBackoffMs": "20",
        "readBy": "topics",  # (reads by partition: test_stream_reader_partitions.py)
    }
    return TimestoneStreamReader(parse_options({**base, **options}))


def roundtrip(offsets: dict) -> dict:
    """What Spark hands back: the offsets as JSON, parsed again."""
    return json.loads(json.dumps(offsets))


def test_starting_offsets_resolve_against_the_brokers(edge: EdgeBroker) -> None:
    edge.append("plant/1/temp", [_at(BASE_TIME_MS + n * 1000, n) for n in range(10)])
    edge.fill("plant/2/temp", 4)
    edge.fill("other/topic", 4)
    assert plain(reader(edge, startingOffsets="earliest").initialOffset()) == {
        "e1": {"plant/1/temp": 0, "plant/2/temp": 0}
    }
    assert plain(reader(edge).initialOffset()) == {"e1": {"plant/1/temp": 10, "plant/2/temp": 4}}
    at_five_s = reader(edge, startingOffsets=f"time:{BASE_TIME_MS + 4500}").initialOffset()
    assert plain(at_five_s) == {"e1": {"plant/1/temp": 5, "plant/2/temp": 4}}


def test_latest_offset_advances_respects_limits_and_is_stable_when_idle(edge: EdgeBroker) -> None:
    edge.fill("plant/1/temp", 30)
    edge.fill("plant/2/temp", 10)
    source = reader(edge, startingOffsets="earliest", maxRecordsPerTrigger="20")
    start = roundtrip(source.initialOffset())
    assert source.getDefaultReadLimit() == ReadMaxRows(20)
    end = source.latestOffset(start, source.getDefaultReadLimit())
    assert plain(end) == {"e1": {"plant/1/temp": 15, "plant/2/temp": 5}}
    everything = source.latestOffset(roundtrip(end), ReadAllAvailable())
    assert plain(everything) == {"e1": {"plant/1/temp": 30, "plant/2/temp": 10}}
    again = roundtrip(everything)
    assert json.dumps(source.latestOffset(again, ReadAllAvailable())) == json.dumps(again)


def test_the_latest_offsets_reported_name_only_the_logs_a_batch_leaves_behind(edge: EdgeBroker) -> None:
    """The query's progress shows them: every log of a topic per device, idle or read to its end, in every
    progress report made them megabytes; the logs with records past the batch's end are what it tells."""
    edge.fill("plant/1/temp", 30)
    edge.fill("plant/2/temp", 10)
    source = reader(edge, startingOffsets="earliest", maxRecordsPerTrigger="20")
    assert source.reportLatestOffset() is None, "nothing listed yet"
    limited = source.latestOffset(roundtrip(source.initialOffset()), source.getDefaultReadLimit())
    assert source.reportLatestOffset() == {"e1": {"plant/1/temp": 30, "plant/2/temp": 10}}
    everything = source.latestOffset(roundtrip(limited), ReadAllAvailable())
    assert source.reportLatestOffset() == {}
    edge.fill("plant/2/temp", 30, first=10)
    source.latestOffset(roundtrip(everything), source.getDefaultReadLimit())
    assert source.reportLatestOffset() == {"e1": {"plant/2/temp": 40}}, "plant/1/temp was read to its end"


def test_a_batch_of_the_offset_log_is_replayed_from_the_topics_it_moves(edge: EdgeBroker) -> None:
    """A restarted query plans the batch it replays from two lines of its offset log, written as the source
    has always written them (every topic, idle or not, with the store and the filters listed), before it lists
    anything: the records between them and no other, and the query goes on from there."""
    for number in range(1, 6):
        edge.fill(f"plant/{number}/temp", 3)
    edge.fill("plant/2/temp", 4, first=3)
    edge.fill("plant/9/temp", 2)
    own = {"#fplant/+/temp": 0, f"#s{edge.store.store_id}": 0}
    start = {"e1": own | {f"plant/{number}/temp": 3 for number in range(1, 6)}}
    end = {"e1": start["e1"] | {"plant/2/temp": 7, "plant/9/temp": 2}}
    source = reader(edge)
    assert _records(source, roundtrip(start), roundtrip(end)) == [
        *[("plant/2/temp", offset) for offset in range(3, 7)],
        *[("plant/9/temp", offset) for offset in range(2)],
    ]
    assert json.dumps(source.latestOffset(roundtrip(end), ReadAllAvailable())) == json.dumps(end)


def _records(source: TimestoneStreamReader, start: dict, end: dict) -> list[tuple[str, int]]:
    """The (topic, offset) of every record the batch ``[start, end)`` reads."""
    batches = [batch for part in source.partitions(start, end) for batch in source.read(part)]
    pairs = (zip(b.column("topic").to_pylist(), b.column("offset").to_pylist(), strict=True) for b in batches)
    return sorted(pair for pairs_of_one in pairs for pair in pairs_of_one)


def test_available_now_stops_at_what_existed_when_the_query_started(edge: EdgeBroker) -> None:
    edge.fill("plant/1/temp", 10)
    source = reader(edge, startingOffsets="earliest")
    start = roundtrip(source.initialOffset())
    source.prepareForTriggerAvailableNow()
    edge.fill("plant/1/temp", 5, first=10)
    edge.fill("plant/9/temp", 5)
    end = source.latestOffset(start, ReadAllAvailable())
    assert plain(end) == {"e1": {"plant/1/temp": 10}}
    assert source.latestOffset(roundtrip(end), ReadAllAvailable()) == end


def test_without_a_start_from_spark_the_reader_goes_on_from_where_its_last_batch_ended(
    edge: EdgeBroker,
) -> None:
    """Spark 4.0 and 4.1 call latestOffset() with neither start nor limit, before initialOffset() on a new
    query; a restarted query first plans the batch it replays, or its last one (start == end)."""
    edge.fill("plant/1/temp", 30)
    edge.fill("plant/2/temp", 10)
    source = reader(edge, startingOffsets="earliest", maxRecordsPerTrigger="20")
    first = source.latestOffset()
    assert plain(first) == {"e1": {"plant/1/temp": 15, "plant/2/temp": 5}}
    assert plain(source.initialOffset()) == {"e1": {"plant/1/temp": 0, "plant/2/temp": 0}}
    assert source.partitions(roundtrip(source.initialOffset()), roundtrip(first))
    second = source.latestOffset()
    assert plain(second) == {"e1": {"plant/1/temp": 30, "plant/2/temp": 10}}
    assert source.latestOffset() == second, "nothing new: no batch"

    restarted = reader(edge, startingOffsets="earliest", maxRecordsPerTrigger="20")
    assert restarted.partitions(roundtrip(first), roundtrip(first)) == []
    assert restarted.latestOffset() == second


def test_the_starting_offsets_are_computed_once(edge: EdgeBroker) -> None:
    """Spark asks a new query for them more than once; "latest" must not move in between."""
    edge.fill("plant/1/temp", 10)
    source = reader(edge)
    initial = source.initialOffset()
    edge.fill("plant/1/temp", 5, first=10)
    assert source.initialOffset() == initial
    assert plain(initial) == {"e1": {"plant/1/temp": 10}}


def test_a_broker_down_keeps_its_offsets_the_others_move_on_and_only_one_batch_waits_for_retries(
    edge: EdgeBroker, second_edge: EdgeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    edge.fill("plant/1/temp", 3)
    second_edge.fill("plant/1/temp", 4)
    source = reader(edge, second_edge, startingOffsets="earliest", fetchRetries="3", retryBackoffMs="150")
    start = roundtrip(source.initialOffset())
    edge.fill("plant/1/temp", 2, first=3)
    second_edge.stop_server()
    with caplog.at_level(logging.WARNING, logger="sources.timestone_source"):
        began = time.monotonic()
        end = source.latestOffset(start, ReadAllAvailable())
        first_wait = time.monotonic() - began
    assert plain(end) == {"e1": {"plant/1/temp": 5}, "e2": {"plant/1/temp": 0}}
    assert any("'e2' is down" in record.getMessage() for record in caplog.records)
    assert first_wait >= 0.15 + 0.3 + 0.6  # the retries, backing off

    began = time.monotonic()
    assert source.latestOffset(roundtrip(end), ReadAllAvailable()) == end
    assert time.monotonic() - began < first_wait / 2  # known down: one attempt, no retries

    second_edge.fill("plant/1/temp", 1, first=4)
    second_edge.start_server(second_edge.port)
    assert plain(source.latestOffset(roundtrip(end), ReadAllAvailable())) == {
        "e1": {"plant/1/temp": 5},
        "e2": {"plant/1/temp": 5},
    }


def test_a_broker_down_at_start_fails_latest_but_not_earliest(
    edge: EdgeBroker, second_edge: EdgeBroker
) -> None:
    edge.fill("plant/1/temp", 3)
    second_edge.stop_server()
    with pytest.raises(BrokerUnreachableError, match="'e2'") as refused:
        reader(edge, second_edge).initialOffset()
    assert str(refused.value).startswith(
        "timestone source: startingOffsets 'latest' needs every broker's logs at the query's start (start "
        "the broker, leave it out of the option brokers, or start from 'earliest'), but broker 'e2'"
    )
    assert not isinstance(refused.value.__cause__, BrokerUnreachableError)  # its text is not said twice
    with pytest.raises(BrokerUnreachableError, match="startingOffsets at a time needs every broker's logs"):
        reader(edge, second_edge, startingOffsets="time:1000").initialOffset()
    assert plain(reader(edge, second_edge, startingOffsets="earliest").initialOffset()) == {
        "e1": {"plant/1/temp": 0}
    }


def test_partitions_carry_everything_a_task_needs_and_the_reader_pickles_light(edge: EdgeBroker) -> None:
    edge.fill("plant/1/temp", 250)
    edge.fill("plant/2/temp", 20)
    source = reader(edge, startingOffsets="earliest", maxRecordsPerPartition="100", authToken="t0ken")
    start = roundtrip(source.initialOffset())
    end = roundtrip(source.latestOffset(start, ReadAllAvailable()))
    fresh = pickle.loads(pickle.dumps(source))  # a replay after a restart: nothing cached
    partitions = fresh.partitions(start, end)
    assert [partition.plan.records for partition in partitions] == [100, 100, 70]
    task = pickle.loads(pickle.dumps(partitions[2]))
    assert isinstance(task, TimestonePartition)
    assert task.fetch.url == edge.url and task.fetch.auth_token == "t0ken"
    assert "t0ken" not in repr(task)
    assert source._clients and source._listings
    shipped = pickle.loads(pickle.dumps(source))
    assert not shipped._clients and not shipped._listings


def _at(timestamp_ms: int, number: int):
    from tests.e2e.sources.conftest import telemetry

    return telemetry(number, timestamp_ms=timestamp_ms)


def test_min_partitions_defaults_to_the_sessions_parallelism_else_the_planners_cpus(spark) -> None:
    import os

    from pyspark import cloudpickle

    from sources.timestone_source import SCHEMA, TimestoneDataSource, TimestoneStreamReader

    options = {"brokers": "http://127.0.0.1:1", "topics": "plant/+/temp"}
    plain = TimestoneDataSource(options).streamReader(SCHEMA)
    assert isinstance(plain, TimestoneStreamReader) and plain.options.min_partitions == os.cpu_count()
    given = TimestoneDataSource({**options, "minPartitions": "7"}).streamReader(SCHEMA)
    assert isinstance(given, TimestoneStreamReader) and given.options.min_partitions == 7

    spark_source = TimestoneDataSource.for_session(spark)
    shipped = cloudpickle.loads(cloudpickle.dumps(spark_source))  # how Spark sends it to its planner
    assert shipped.name() == "timestone"
    parallelism = spark.sparkContext.defaultParallelism
    assert shipped.default_min_partitions == parallelism  # pickled by value, not as the plain class
    assert shipped(options).streamReader(SCHEMA).options.min_partitions == parallelism


def test_a_quiet_topic_is_not_starved_by_a_hot_topic_that_outpaces_max_records(edge: EdgeBroker) -> None:
    """Behind a hot topic that brings more than maxRecordsPerTrigger every batch, each quiet device topic's
    one record still gets read within a few batches (its proportional share rounds down to 0)."""
    quiet = [f"plant/q{number}/temp" for number in range(10)]
    for topic in quiet:
        edge.fill(topic, 1)
    source = reader(edge, startingOffsets="earliest", maxRecordsPerTrigger="100")
    offsets = roundtrip(source.initialOffset())
    for batch in range(40):
        edge.fill("plant/hot/temp", 150, first=150 * batch)
        offsets = roundtrip(source.latestOffset(offsets, source.getDefaultReadLimit()))
    unread = [topic for topic in quiet if plain(offsets)["e1"][topic] == 0]
    assert unread == []
    assert plain(offsets)["e1"]["plant/hot/temp"] == 40 * 100 - len(quiet)


@pytest.mark.parametrize("read_by", ["topics", "partitions"])
def test_a_topics_filter_matching_none_of_the_logs_a_broker_holds_is_said_once_a_run(
    edge: EdgeBroker, caplog: pytest.LogCaptureFixture, read_by: str
) -> None:
    """A misspelt filter read nothing, batch after batch, without a word. A broker holding no record yet (a
    new deployment) is no reason to say so."""

    def batches(source: TimestoneStreamReader) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sources.timestone_source"):
            start = roundtrip(source.initialOffset())
            for _ in range(3):
                start = roundtrip(source.latestOffset(start, ReadAllAvailable()))
        return [r.getMessage() for r in caplog.records if "matches none of the logs" in r.getMessage()]

    assert batches(reader(edge, topics="plnt/+/temp", readBy=read_by)) == []  # the broker holds nothing
    edge.fill("plant/1/temp", 3)
    assert batches(reader(edge, topics="plnt/+/temp", readBy=read_by)) == [
        "option 'topics' (plnt/+/temp) matches none of the logs e1 holds: nothing is read until one it "
        "matches is created (a filter misspelt?)"
    ]
    assert batches(reader(edge, readBy=read_by)) == []
