"""The timestone source under Spark Structured Streaming, over real brokers (LogStore + offsets API)."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from broker_edge.storage import StorageConfig
from broker_edge.storage.config import PersistRule
from sources.stream_api import ADMISSION_CONTROL
from sources.timestone_source import SCHEMA
from tests.e2e.sources.conftest import BASE_TIME_MS, EdgeBroker, plain, telemetry

pytestmark = pytest.mark.spark

FAR_FUTURE_MS = BASE_TIME_MS + 10 * 365 * 24 * 3_600_000
Key = tuple[str, str, int]  # broker, topic, offset
_names = itertools.count()


class BatchCollector:
    """A foreachBatch sink keeping each batch's (broker, topic, offset) by batch id; a replay overwrites."""

    def __init__(self, fail_on_batch: int | None = None) -> None:
        self.batches: dict[int, list[Key]] = {}
        self.failed: list[Key] | None = None
        self._fail_on_batch = fail_on_batch

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        rows = [
            (row.broker, row.topic, row.offset) for row in frame.select("broker", "topic", "offset").collect()
        ]
        if batch_id == self._fail_on_batch and self.failed is None:
            self.failed = sorted(rows)
            raise RuntimeError("sink failure (simulated)")
        self.batches[batch_id] = rows

    def keys(self) -> list[Key]:
        return sorted(key for rows in self.batches.values() for key in rows)


def stream(spark: SparkSession, brokers: dict[str, EdgeBroker], **options: str) -> DataFrame:
    reader = (
        spark.readStream.format("timestone")
        .option("brokers", ",".join(f"{name}={broker.url}" for name, broker in brokers.items()))
        .option("topics", "plant/+/temp")
        .option("fetchRetries", "1")
        .option("retryBackoffMs", "50")
    )
    return reader.options(**options).load()


def run_available_now(
    frame: DataFrame, checkpoint: Path, sink: Callable[[DataFrame, int], None]
) -> StreamingQuery:
    query = (
        frame.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive
    return query


def run_until_caught_up(
    frame: DataFrame, checkpoint: Path, sink: Callable[[DataFrame, int], None]
) -> StreamingQuery:
    """A processing-time query, stopped once it has read everything there is: its batches are bounded by
    the read limit on every supported Spark (an availableNow run is one batch on Spark 4.0 and 4.1)."""
    query = frame.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)).start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return query


def expected(broker: str, topic: str, offsets: range) -> list[Key]:
    return [(broker, topic, offset) for offset in offsets]


def wait_until(condition: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_available_now_reads_every_record_of_many_topics_on_two_brokers_once(
    timestone_spark: SparkSession, edge: EdgeBroker, second_edge: EdgeBroker, tmp_path: Path
) -> None:
    want: list[Key] = []
    for number in range(24):
        edge.fill(f"plant/{number}/temp", 1 + 9 * number)
        want += expected("north", f"plant/{number}/temp", range(1 + 9 * number))
    for number in range(3):
        second_edge.fill(f"plant/{number}/temp", 150)
        want += expected("south", f"plant/{number}/temp", range(150))
    edge.fill("plant/1/humidity", 10)  # not matched by plant/+/temp
    frame = stream(
        timestone_spark,
        {"north": edge, "south": second_edge},
        startingOffsets="earliest",
        maxRecordsPerPartition="400",
    )
    assert frame.schema == SCHEMA
    name = f"every_record_{next(_names)}"
    query = (
        frame.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    rows = timestone_spark.table(name)
    keys = sorted(
        (row.broker, row.topic, row.offset) for row in rows.select("broker", "topic", "offset").collect()
    )
    assert keys == sorted(want)  # 2,974 records: exactly once each
    sample = rows.where("broker = 'south' AND topic = 'plant/2/temp' AND offset = 10").collect()[0]
    assert sample.payload == b'{"n":10}'
    assert sample.properties == {"seq": "10"}
    assert (sample.client_id, sample.qos, sample.retain) == ("device-1", 1, True)
    assert int(sample.timestamp.timestamp() * 1000) == BASE_TIME_MS + 10
    progress = query.lastProgress
    assert progress is not None
    end_offset = json.loads(progress["sources"][0]["endOffset"])
    assert plain(end_offset)["south"] == {
        "#p0": 450,
        "#tplant/+/temp": 0,
    }  # one position, and the filter read


def test_restarts_continue_from_the_checkpoint_and_replay_a_failed_batch_identically(
    timestone_spark: SparkSession, edge: EdgeBroker, tmp_path: Path
) -> None:
    for number in range(3):
        edge.fill(f"plant/{number}/temp", 60)
    checkpoint = tmp_path / "checkpoint"
    options = {"startingOffsets": "earliest", "maxRecordsPerTrigger": "50"}

    failing = BatchCollector(fail_on_batch=1)
    with pytest.raises(StreamingQueryException, match="simulated"):
        run_until_caught_up(stream(timestone_spark, {"e": edge}, **options), checkpoint, failing)
    assert failing.failed is not None and len(failing.failed) == 50

    resumed = BatchCollector()
    run_until_caught_up(stream(timestone_spark, {"e": edge}, **options), checkpoint, resumed)
    assert sorted(resumed.batches[1]) == failing.failed  # the replayed batch has the same records
    assert all(len(rows) <= 50 for rows in resumed.batches.values())
    first_run = failing.keys() + resumed.keys()
    assert sorted(first_run) == sorted(
        key for n in range(3) for key in expected("e", f"plant/{n}/temp", range(60))
    )

    edge.fill("plant/1/temp", 30, first=60)
    edge.fill("plant/7/temp", 10)  # a topic that appears between runs is read from its start
    later = BatchCollector()
    run_until_caught_up(stream(timestone_spark, {"e": edge}, **options), checkpoint, later)
    assert later.keys() == expected("e", "plant/1/temp", range(60, 90)) + expected(
        "e", "plant/7/temp", range(10)
    )


def test_an_available_now_run_with_a_read_limit_on_this_spark(
    timestone_spark: SparkSession, edge: EdgeBroker, tmp_path: Path
) -> None:
    """Spark 4.2+ reads everything there is in batches of at most the limit; Spark 4.0 and 4.1 run
    availableNow as one batch, of at most the limit, and the next run goes on from there."""
    for number in range(3):
        edge.fill(f"plant/{number}/temp", 40)
    options = {"startingOffsets": "earliest", "maxRecordsPerTrigger": "50"}
    runs: list[BatchCollector] = []
    while sum(len(run.keys()) for run in runs) < 120 and len(runs) < 4:
        runs.append(BatchCollector())
        run_available_now(stream(timestone_spark, {"e": edge}, **options), tmp_path / "checkpoint", runs[-1])
    batches = [rows for run in runs for rows in run.batches.values()]
    assert [len(rows) for rows in batches] == [50, 50, 20]
    assert len(runs) == (1 if ADMISSION_CONTROL else 3)
    everything = sorted(key for rows in batches for key in rows)
    assert everything == sorted(key for n in range(3) for key in expected("e", f"plant/{n}/temp", range(40)))


def test_end_at_query_start_reads_what_the_brokers_held_in_bounded_batches_then_nothing(
    timestone_spark: SparkSession, edge: EdgeBroker, tmp_path: Path
) -> None:
    """What a pipeline's --available-now runs on Spark 4.0 and 4.1 (pipelines/available_now.py)."""
    for number in range(3):
        edge.fill(f"plant/{number}/temp", 40)
    options = {"startingOffsets": "earliest", "maxRecordsPerTrigger": "50", "endAtQueryStart": "true"}
    collected = BatchCollector()
    query = (
        stream(timestone_spark, {"e": edge}, **options)
        .writeStream.foreachBatch(collected)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        wait_until(lambda: len(collected.keys()) >= 40)  # the query runs; then more records come
        edge.fill("plant/1/temp", 10, first=40)
        query.processAllAvailable()
    finally:
        query.stop()
    assert [len(rows) for rows in collected.batches.values()] == [50, 50, 20]
    assert collected.keys() == sorted(
        key for n in range(3) for key in expected("e", f"plant/{n}/temp", range(40))
    )


@pytest.mark.parametrize(
    ("starting", "first_run"),
    [
        ("latest", []),
        (f"time:{BASE_TIME_MS + 25}", expected("e", "plant/1/temp", range(25, 40))),
        (
            '{"e": {"plant/1/temp": 35}}',
            expected("e", "plant/1/temp", range(35, 40)) + expected("e", "plant/2/temp", range(5)),
        ),
    ],
    ids=["latest", "time", "json"],
)
def test_starting_offsets(
    timestone_spark: SparkSession, edge: EdgeBroker, tmp_path: Path, starting: str, first_run: list[Key]
) -> None:
    edge.fill("plant/1/temp", 40)
    if starting.startswith("{"):
        edge.fill("plant/2/temp", 5)  # not named in the JSON: read from its start
    checkpoint = tmp_path / "checkpoint"
    first = BatchCollector()
    run_available_now(stream(timestone_spark, {"e": edge}, startingOffsets=starting), checkpoint, first)
    assert first.keys() == sorted(first_run)
    edge.fill("plant/1/temp", 3, first=40)
    second = BatchCollector()
    run_available_now(stream(timestone_spark, {"e": edge}, startingOffsets=starting), checkpoint, second)
    assert second.keys() == expected("e", "plant/1/temp", range(40, 43))


def test_a_broker_down_delays_its_records_while_the_others_flow_then_recovers(
    timestone_spark: SparkSession, edge: EdgeBroker, second_edge: EdgeBroker, tmp_path: Path
) -> None:
    edge.fill("plant/1/temp", 20)
    second_edge.fill("plant/1/temp", 20)
    sink = BatchCollector()
    query = (
        stream(timestone_spark, {"down": edge, "up": second_edge}, startingOffsets="earliest")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: len(sink.keys()) == 40)
        edge.stop_server()
        edge.fill("plant/1/temp", 15, first=20)
        second_edge.fill("plant/1/temp", 5, first=20)
        wait_until(lambda: len(sink.keys()) == 45)  # the broker that is up keeps flowing
        time.sleep(1.0)  # several triggers with one broker down
        assert query.isActive and query.exception() is None
        assert len(sink.keys()) == 45
        edge.start_server(edge.port)
        wait_until(lambda: len(sink.keys()) == 60)
        time.sleep(0.5)
    finally:
        query.stop()
    assert sink.keys() == sorted(
        expected("down", "plant/1/temp", range(35)) + expected("up", "plant/1/temp", range(25))
    )


def test_a_broker_that_restarts_between_batches_delays_the_next_batch_within_the_retries(
    timestone_spark: SparkSession, edge: EdgeBroker, tmp_path: Path
) -> None:
    edge.fill("plant/1/temp", 30)
    collected = BatchCollector()
    restarts: list[threading.Timer] = []

    def sink(frame: DataFrame, batch_id: int) -> None:
        collected(frame, batch_id)
        if batch_id == 0:  # the broker goes away before the next batch is planned, back 3 s later
            edge.stop_server()  # (Spark takes 0.3-0.5 s to plan it, more when loaded: it must meet it away)
            restarts.append(threading.Timer(3.0, edge.start_server, args=(edge.port,)))
            restarts[0].start()

    frame = stream(
        timestone_spark,
        {"e": edge},
        startingOffsets="earliest",
        maxRecordsPerTrigger="10",
        fetchRetries="5",  # tries over 6.2 s
        retryBackoffMs="200",
    )
    query = run_until_caught_up(frame, tmp_path / "checkpoint", sink)
    restarts[0].join()
    assert collected.keys() == expected("e", "plant/1/temp", range(30))
    assert sorted(collected.batches) == [0, 1, 2]
    planning_ms = {
        progress["batchId"]: progress["durationMs"]["latestOffset"] for progress in query.recentProgress
    }
    assert planning_ms[1] >= 400  # the listing of batch 1 waited for the broker, through the retries


@pytest.mark.parametrize(
    ("read_by", "named"),
    [("topics", "topic 'plant/1/temp'"), ("partitions", "partition 0 (positions)")],
)
def test_a_retention_gap_fails_the_query_or_is_skipped_without_fail_on_data_loss(
    timestone_spark: SparkSession, small_segments_edge: EdgeBroker, tmp_path: Path, read_by: str, named: str
) -> None:
    broker = small_segments_edge
    broker.fill("plant/1/temp", 100)
    checkpoint = tmp_path / "checkpoint"
    first = BatchCollector()
    start = stream(timestone_spark, {"e": broker}, startingOffsets="earliest", readBy=read_by)
    run_available_now(start, checkpoint, first)
    assert len(first.keys()) == 100

    broker.fill("plant/1/temp", 200, first=100)
    broker.apply_retention(FAR_FUTURE_MS)
    log_start = broker.store.log_info("plant/1/temp").start_offset
    assert 100 < log_start < 300  # (one topic: its offsets are the partition's positions)

    with pytest.raises(StreamingQueryException) as caught:
        run_available_now(stream(timestone_spark, {"e": broker}), checkpoint, BatchCollector())
    message = str(caught.value)
    assert f"data loss on broker 'e' {named}" in message
    assert "to read 100" in message and f"[{log_start}, 300)" in message

    skipping = BatchCollector()
    run_available_now(stream(timestone_spark, {"e": broker}, failOnDataLoss="false"), checkpoint, skipping)
    assert skipping.keys() == expected("e", "plant/1/temp", range(log_start, 300))


def test_a_query_stopped_while_a_shorter_retention_deleted_segments_loses_only_what_its_topics_lost(
    timestone_spark: SparkSession, tmp_path: Path
) -> None:
    """Read by partition, topics kept 1 s (debug/x, and plant/1/temp) share the partition with plant/2/temp
    kept without an age bound. Between runs of the query, retention deletes segments of debug records and
    of plant/1/temp records the query had read: the next run reads on without a word (it failed as data
    loss, the broker keeping no account of the topics a deleted segment held). Then plant/1/temp records it
    had not read go with debug records' segments (between kept ones, this time): the next run fails naming
    plant/1/temp, and one with failOnDataLoss=false skips them and reads the rest."""
    rules = [
        PersistRule("debug/#", qos=(0, 1, 2), retention_ms=1000),
        PersistRule("plant/1/temp", qos=(0, 1, 2), retention_ms=1000),
        PersistRule("#", qos=(0, 1, 2)),
    ]
    broker = EdgeBroker(
        tmp_path / "edge", StorageConfig(group_commit_ms=1, segment_bytes=1024, persist=rules)
    )
    checkpoint, now = tmp_path / "checkpoint", BASE_TIME_MS + 60_000

    def stopped_then_deleted(plant_1: range, plant_2: range) -> None:
        broker.append("debug/x", [telemetry(n, timestamp_ms=BASE_TIME_MS) for n in range(100)])
        broker.append("plant/1/temp", [telemetry(n, timestamp_ms=BASE_TIME_MS) for n in plant_1])
        broker.append("debug/x", [telemetry(n, timestamp_ms=BASE_TIME_MS) for n in range(100, 200)])
        broker.append("plant/2/temp", [telemetry(n, timestamp_ms=now) for n in plant_2])
        assert broker.apply_retention(now) > 0  # below the partition's start, or between kept segments

    def run(**options: str) -> list[Key]:
        collected = BatchCollector()
        run_available_now(stream(timestone_spark, {"e": broker}, **options), checkpoint, collected)
        return collected.keys()

    try:
        broker.append("plant/1/temp", [telemetry(n, timestamp_ms=BASE_TIME_MS) for n in range(5)])
        assert run(startingOffsets="earliest") == expected("e", "plant/1/temp", range(5))

        stopped_then_deleted(range(0), range(3))  # (plant/1/temp 0-4 read, deleted now)
        assert run() == expected("e", "plant/2/temp", range(3))

        stopped_then_deleted(range(5, 8), range(3, 6))
        with pytest.raises(StreamingQueryException) as caught:
            run_available_now(stream(timestone_spark, {"e": broker}), checkpoint, BatchCollector())
        message = str(caught.value)
        assert "data loss on broker 'e' partition 0 (positions)" in message
        assert "retention removed records not yet read of topics 'plant/1/temp'" in message
        assert run(failOnDataLoss="false") == expected("e", "plant/2/temp", range(3, 6))
    finally:
        broker.close()


def test_bad_options_fail_at_load_naming_the_option(timestone_spark: SparkSession) -> None:
    with pytest.raises(Exception, match="timestone source option 'maxRecordsPerTrigger'"):
        (
            timestone_spark.readStream.format("timestone")
            .option("brokers", "http://127.0.0.1:9")
            .option("topics", "plant/#")
            .option("maxRecordsPerTrigger", "lots")
            .load()
        )


def test_a_user_property_given_twice_comes_out_once_with_its_last_value(
    timestone_spark: SparkSession, edge: EdgeBroker, tmp_path: Path
) -> None:
    """MQTT 5 lets a publish repeat a user property's name; the source's map held the key
    twice, which Spark's readers refuse in a Parquet file (DUPLICATED_MAP_KEY): the telemetry job's bronze,
    once it held one such record, failed every Spark read (its own replay of a batch included). A content
    type beside a user property named content_type is the same case."""
    from broker_edge.storage.record import AppendRecord

    repeated = [("k", "a"), ("other", "x"), ("k", "b")]
    edge.append("plant/1/temp", [AppendRecord(payload=b"{}", user_properties=repeated)])
    named = [("content_type", "mine")]
    edge.append("plant/1/temp", [AppendRecord(payload=b"{}", user_properties=named, content_type="json")])
    edge.append("plant/1/temp", [AppendRecord(payload=b"{}")])
    seen: list[tuple] = []

    def keep(batch: DataFrame, _: int) -> None:
        pairs = batch.select("offset", F.map_keys("properties"), F.map_values("properties"))
        seen.extend(tuple(row) for row in pairs.collect())

    run_available_now(
        stream(timestone_spark, {"north": edge}, startingOffsets="earliest"), tmp_path / "cp", keep
    )
    assert sorted(seen) == [(0, ["k", "other"], ["b", "x"]), (1, ["content_type"], ["json"]), (2, [], [])]


def test_a_batch_read_takes_what_the_brokers_hold_from_the_earliest_unless_told(
    timestone_spark: SparkSession, edge: EdgeBroker, second_edge: EdgeBroker
) -> None:
    """``spark.read.format("timestone")`` failed with Spark's ``[NOT_IMPLEMENTED] reader is not implemented``
    (a stream only): it reads every record of the matched logs, once, from ``earliest`` unless
    ``startingOffsets`` says otherwise; a broker that does not answer fails it rather than leaving its
    records out."""
    for number in range(3):
        edge.fill(f"plant/{number}/temp", 40)
    second_edge.fill("plant/9/temp", 25)
    edge.fill("plant/1/humidity", 10)  # not matched by plant/+/temp
    brokers = {"north": edge, "south": second_edge}

    def batch(**options: str) -> DataFrame:
        reader = (
            timestone_spark.read.format("timestone")
            .option("brokers", ",".join(f"{name}={broker.url}" for name, broker in brokers.items()))
            .option("topics", "plant/+/temp")
            .option("fetchRetries", "0")
        )
        return reader.options(**options).load()

    frame = batch(maxRecordsPerPartition="50")
    assert frame.schema == SCHEMA
    keys = sorted((r.broker, r.topic, r.offset) for r in frame.select("broker", "topic", "offset").collect())
    want = [key for n in range(3) for key in expected("north", f"plant/{n}/temp", range(40))]
    assert keys == sorted(want + expected("south", "plant/9/temp", range(25)))
    assert batch(startingOffsets="latest").count() == 0
    second_edge.stop_server()
    with pytest.raises(Exception, match="a batch read reads every broker, and south did not answer"):
        batch().count()
