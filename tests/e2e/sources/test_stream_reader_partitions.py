"""The timestone stream reader reading standalone brokers by storage partition, called the way Spark calls it:
a position per partition in the offsets whatever the number of topics, every matching record read once,
retention losses detected as with topic offsets, and checkpoints by topic still read by topic."""

from __future__ import annotations

import itertools
import json
import pickle
from pathlib import Path
from typing import cast

import pytest

from broker_edge.storage import StorageConfig
from broker_edge.storage.config import PersistRule
from sources.offsets_planner import DataLossError
from sources.options import parse_options
from sources.stream_api import ReadAllAvailable, ReadMaxRows
from sources.timestone_source import TimestonePartition, TimestoneStreamReader
from tests.e2e.sources.conftest import BASE_TIME_MS, EdgeBroker, plain, telemetry

READ = {"#tplant/+/temp": 0}  # the filter the positions are read with


def reader(*brokers: EdgeBroker, **options: str) -> TimestoneStreamReader:
    urls = ",".join(f"e{number}={broker.url}" for number, broker in enumerate(brokers, 1))
    base = {"brokers": urls, "topics": "plant/+/temp", "fetchRetries": "1", "retryBackoffMs": "20"}
    return TimestoneStreamReader(parse_options({**base, **options}))


def roundtrip(offsets: dict) -> dict:
    return json.loads(json.dumps(offsets))


def read_batch(source: TimestoneStreamReader, start: dict, end: dict) -> list[tuple[str, int]]:
    """(topic, offset) of every row the batch's tasks read, the way executors read them (unpickled)."""
    rows: list[tuple[str, int]] = []
    for partition in source.partitions(start, end):
        task = pickle.loads(pickle.dumps(partition))
        for batch in pickle.loads(pickle.dumps(source)).read(task):
            rows += zip(batch.column("topic").to_pylist(), batch.column("offset").to_pylist(), strict=True)
    return rows


def test_offsets_are_a_position_per_partition_whatever_the_number_of_topics(edge: EdgeBroker) -> None:
    for number in range(2000):
        edge.fill(f"plant/{number}/temp", 1)
    edge.fill("other/topic", 5)
    source = reader(edge, startingOffsets="earliest")

    start = roundtrip(source.initialOffset())
    end = roundtrip(source.latestOffset(start, ReadAllAvailable()))

    assert plain(start) == {"e1": {"#e0": 2005, "#p0": 0, **READ}}  # the partition's end when the query began
    assert plain(end) == {"e1": {"#p0": 2005, **READ}}  # the mark is dropped once read past
    assert len(json.dumps(end)) < 30 + len(json.dumps(READ)) + len(
        f'"#s{edge.store.store_id}": 0, '
    )  # and the store
    rows = read_batch(source, start, end)
    assert sorted(rows) == sorted((f"plant/{n}/temp", 0) for n in range(2000))
    assert json.dumps(source.latestOffset(end, ReadAllAvailable())) == json.dumps(end)  # idle: same JSON


def test_starting_offsets_latest_and_time(edge: EdgeBroker) -> None:
    edge.append("plant/1/temp", [telemetry(n, timestamp_ms=BASE_TIME_MS + n * 1000) for n in range(10)])

    assert plain(reader(edge).initialOffset()) == {"e1": {"#p0": 10, **READ}}
    at_four_and_a_half_s = reader(edge, startingOffsets=f"time:{BASE_TIME_MS + 4500}").initialOffset()
    assert plain(at_four_and_a_half_s) == {"e1": {"#e0": 10, "#p0": 5, **READ}}


def test_max_records_per_trigger_counts_entries_and_batches_follow_each_other(edge: EdgeBroker) -> None:
    edge.fill("plant/1/temp", 30)
    edge.fill("plant/2/humidity", 10)  # not matched: its entries count, its records are not read
    edge.fill("plant/2/temp", 10)
    source = reader(edge, startingOffsets="earliest", maxRecordsPerTrigger="20")
    assert source.getDefaultReadLimit() == ReadMaxRows(20)

    offsets = [roundtrip(source.initialOffset())]
    while True:
        end = roundtrip(source.latestOffset(offsets[-1], source.getDefaultReadLimit()))
        if end == offsets[-1]:
            break
        offsets.append(end)
    rows = [row for start, end in itertools.pairwise(offsets) for row in read_batch(source, start, end)]

    assert [end["e1"]["#p0"] for end in offsets[1:]] == [20, 40, 50]
    assert sorted(rows) == sorted(
        [("plant/1/temp", n) for n in range(30)] + [("plant/2/temp", n) for n in range(10)]
    )


def test_a_batch_is_cut_into_position_ranges_by_min_partitions(edge: EdgeBroker) -> None:
    for number in range(8):
        edge.fill(f"plant/{number}/temp", 1000)
    source = reader(edge, startingOffsets="earliest", minPartitions="4")
    start = roundtrip(source.initialOffset())
    end = roundtrip(source.latestOffset(start, ReadAllAvailable()))

    partitions = [cast(TimestonePartition, p) for p in source.partitions(start, end)]

    assert [[(s.start, s.end) for s in p.plan.slices] for p in partitions] == [
        [(0, 2000)], [(2000, 4000)], [(4000, 6000)], [(6000, 8000)]
    ]  # fmt: skip
    assert len(read_batch(source, start, end)) == 8000


@pytest.fixture
def rolling_edge(tmp_path: Path):
    broker = EdgeBroker(tmp_path / "rolling", StorageConfig(group_commit_ms=1, segment_bytes=2048))
    yield broker
    broker.close()


def test_retention_past_the_checkpoint_is_data_loss_unless_told_otherwise(rolling_edge: EdgeBroker) -> None:
    rolling_edge.fill("plant/1/temp", 100)
    source = reader(rolling_edge, startingOffsets="earliest")
    start = roundtrip(source.initialOffset())
    checkpoint = roundtrip(source.latestOffset(start, ReadAllAvailable()))
    rolling_edge.fill("plant/1/temp", 200, first=100)
    rolling_edge.store.config.retention_bytes = 3000
    rolling_edge.apply_retention(BASE_TIME_MS)
    partition_start = rolling_edge.store.partitions()[0].start
    assert 100 < partition_start < 300

    with pytest.raises(DataLossError, match=r"partition 0 \(positions\).*next position to read 100"):
        source.latestOffset(checkpoint, ReadAllAvailable())
    lenient = reader(rolling_edge, failOnDataLoss="false")
    end = roundtrip(lenient.latestOffset(checkpoint, ReadAllAvailable()))
    assert sorted(read_batch(lenient, checkpoint, end)) == [
        ("plant/1/temp", n) for n in range(partition_start, 300)
    ]


def test_records_retention_removed_before_the_query_began_are_not_loss_later_ones_are(
    rolling_edge: EdgeBroker,
) -> None:
    """One topic's records age out while another topic keeps their segments: gone before the query began,
    they are simply not there; gone while the query had not read them yet, they are data loss."""
    store = rolling_edge.store
    rolling_edge.append("plant/old/temp", [telemetry(n, timestamp_ms=BASE_TIME_MS) for n in range(5)])
    rolling_edge.append(
        "plant/young/temp", [telemetry(n, timestamp_ms=BASE_TIME_MS + 10**6) for n in range(60)]
    )
    store.config.retention_ms = 1000
    store._log_configs.clear()
    rolling_edge.apply_retention(BASE_TIME_MS + 10**6)
    assert store.start_offset("plant/old/temp") == 5 and store.partitions()[0].start == 0

    source = reader(rolling_edge, startingOffsets="earliest")
    start = roundtrip(source.initialOffset())
    end = roundtrip(source.latestOffset(start, ReadAllAvailable()))
    assert sorted(read_batch(source, start, end)) == [("plant/young/temp", n) for n in range(60)]

    rolling_edge.append("plant/old/temp", [telemetry(n, timestamp_ms=BASE_TIME_MS) for n in range(5, 10)])
    rolling_edge.append(
        "plant/young/temp", [telemetry(n, timestamp_ms=BASE_TIME_MS + 10**6) for n in range(60, 120)]
    )
    later = roundtrip(source.latestOffset(end, ReadAllAvailable()))
    rolling_edge.apply_retention(BASE_TIME_MS + 10**6)
    assert store.start_offset("plant/old/temp") == 10
    with pytest.raises(DataLossError, match="retention removed 5 records of topic 'plant/old/temp'"):
        read_batch(source, end, later)
    lenient = reader(rolling_edge, failOnDataLoss="false")
    assert sorted(read_batch(lenient, end, later)) == [("plant/young/temp", n) for n in range(60, 120)]


def test_positions_deleted_between_planning_and_reading_with_only_other_topics_are_not_loss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch planned, then retention deleting segments of a topic kept shorter than the query's (debug/x)
    before its task reads: below the partition's start (416) and between kept segments (removed
    positions). The broker's account of what retention deleted says none of the query's topics lost
    records there: the task reads every record of them, without data loss or a warning."""
    rules = [PersistRule("debug/#", qos=(0, 1, 2), retention_ms=1000), PersistRule("#", qos=(0, 1, 2))]
    config = StorageConfig(group_commit_ms=1, segment_bytes=1024, persist=rules)
    broker = EdgeBroker(tmp_path / "edge", config)
    young = BASE_TIME_MS + 60_000
    try:
        source = reader(broker, startingOffsets="earliest")
        start = roundtrip(source.initialOffset())
        for first in (0, 3):
            broker.append("debug/x", [telemetry(n, timestamp_ms=BASE_TIME_MS) for n in range(100)])
            broker.append("plant/1/temp", [telemetry(n, timestamp_ms=young) for n in range(first, first + 3)])
        end = roundtrip(source.latestOffset(start, ReadAllAvailable()))
        segments = [segment.number for segment in broker.store.partition_logs[0].segments]
        assert broker.apply_retention(young) > 0
        kept = [segment.number for segment in broker.store.partition_logs[0].segments]
        assert kept[0] > segments[0] and kept != list(range(kept[0], kept[-1] + 1))  # below and between

        with caplog.at_level("WARNING", logger="sources"):
            assert sorted(read_batch(source, start, end)) == [("plant/1/temp", n) for n in range(6)]
    finally:
        broker.close()
    assert caplog.text == ""


def test_topic_offsets_stay_topic_offsets(edge: EdgeBroker) -> None:
    """A checkpoint by topic (an older query), a JSON start and readBy=topics all read by topic."""
    edge.fill("plant/1/temp", 5)
    old_checkpoint = {"e1": {"plant/1/temp": 2}}

    assert plain(reader(edge).latestOffset(old_checkpoint, ReadAllAvailable())) == {"e1": {"plant/1/temp": 5}}
    assert plain(reader(edge, startingOffsets='{"e1": {"plant/1/temp": 1}}').initialOffset()) == {
        "e1": {"plant/1/temp": 1}
    }
    assert plain(reader(edge, startingOffsets="earliest", readBy="topics").initialOffset()) == {
        "e1": {"plant/1/temp": 0}
    }


def test_a_broker_without_partition_reads_is_read_by_topic(edge: EdgeBroker) -> None:
    edge.fill("plant/1/temp", 5)

    async def as_a_cluster_member() -> None:
        edge.store.replicated_log.enable()
        edge.store.replicated_log.commit_to("plant/1/temp", 5)

    edge.run(as_a_cluster_member())

    assert plain(reader(edge, startingOffsets="earliest").initialOffset()) == {"e1": {"plant/1/temp": 0}}
    with pytest.raises(RuntimeError, match="no longer serves partition reads"):
        reader(edge).latestOffset({"e1": {"#p0": 3}}, ReadAllAvailable())


def test_available_now_stops_at_the_partitions_ends_when_the_run_began(edge: EdgeBroker) -> None:
    edge.fill("plant/1/temp", 10)
    source = reader(edge, startingOffsets="earliest")
    start = roundtrip(source.initialOffset())
    source.prepareForTriggerAvailableNow()
    edge.fill("plant/1/temp", 5, first=10)

    end = source.latestOffset(start, ReadAllAvailable())

    assert plain(end) == {"e1": {"#p0": 10, **READ}}
    assert source.latestOffset(roundtrip(end), ReadAllAvailable()) == end


def test_available_now_on_a_checkpoint_by_topic_stops_at_the_topics_ends(edge: EdgeBroker) -> None:
    edge.fill("plant/1/temp", 10)
    source = reader(edge)
    source.prepareForTriggerAvailableNow()  # (the checkpoint is not known yet: listed by partition)

    end = source.latestOffset({"e1": {"plant/1/temp": 4}}, ReadAllAvailable())

    assert plain(end) == {"e1": {"plant/1/temp": 10}}
