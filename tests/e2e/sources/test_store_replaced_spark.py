"""A broker whose data directory is wiped while a query is stopped: the checkpoint's offsets were taken from
another store, so the query fails naming both (the default), or reads every record of the new store once
(``failOnDataLoss=false``); it never resumes at the old offsets, skipping the new logs' records below them.
A checkpoint written before store identities keeps working and records the broker's identity.

Real broker processes (MQTT and the offsets API on free loopback ports, restarted on the same ports), devices
publishing at QoS 1 over MQTT, the shared local SparkSession, and a Delta table and checkpoint on disk."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.offsets_api.errors import UnknownTopicError
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, close_all
from tests.e2e.sources.spark_runs import run_to_end

pytestmark = pytest.mark.spark

TOPIC = "plant/1/temp"
OTHER = "plant/2/temp"


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "edge", sys_topics={"enabled": False}).start()
    yield process
    close_all()
    process.stop()


def publish(process: BrokerProcess, topic: str, count: int, first: int = 0) -> None:
    """``count`` QoS 1 publishes over MQTT (payloads ``first`` ...), each acknowledged and in the log."""
    with OffsetsClient(process.offsets_url) as client:
        before = _end(client, topic)
        device = PahoClient(process.port, f"device-{topic.replace('/', '-')}-{first}")
        for number in range(first, first + count):
            device.publish(topic, str(number), 1)
        device.disconnect()
        deadline = time.monotonic() + 10
        while _end(client, topic) < before + count:
            assert time.monotonic() < deadline, "the publishes did not reach the log"
            time.sleep(0.02)


def _end(client: OffsetsClient, topic: str) -> int:
    try:
        return client.log_info(topic).end_offset
    except UnknownTopicError:
        return 0


def wipe(process: BrokerProcess) -> str:
    """Stop the broker, delete its data directory, start it again on the same ports; its new store id."""
    close_all()
    ports = (process.port, process.offsets_port)
    process.stop()
    shutil.rmtree(process.directory / "data")
    process.start()
    assert (process.port, process.offsets_port) == ports
    return store_id(process)


def store_id(process: BrokerProcess) -> str:
    with OffsetsClient(process.offsets_url) as client:
        client.list_logs()
        assert client.store is not None
        return client.store


class DeltaSink:
    """A foreachBatch sink appending (broker, topic, offset, payload) to a Delta table on disk."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        table = frame.select("broker", "topic", "offset", "payload").toArrow()
        if table.num_rows:
            write_deltalake(self.path, table, mode="append")

    def rows(self) -> list[tuple[str, int, str]]:
        """(topic, offset, payload) of every row, sorted; duplicates kept."""
        table = DeltaTable(self.path).to_pyarrow_table()
        return sorted(
            (row["topic"], row["offset"], bytes(row["payload"]).decode()) for row in table.to_pylist()
        )


def run(
    spark: SparkSession, process: BrokerProcess, checkpoint: Path, sink: DeltaSink, **options: str
) -> None:
    frame = (
        spark.readStream.format("timestone")
        .option("brokers", f"edge={process.offsets_url}")
        .option("topics", "plant/+/temp")
        .option("startingOffsets", "earliest")
        .option("fetchRetries", "1")
        .option("retryBackoffMs", "50")
        .options(**options)
        .load()
    )
    run_to_end(frame.writeStream.foreachBatch(sink), checkpoint)


def records(topic: str, numbers: range) -> list[tuple[str, int, str]]:
    return [(topic, offset, str(number)) for offset, number in enumerate(numbers)]


@pytest.mark.parametrize("read_by", ["partitions", "topics"])
def test_a_wiped_broker_fails_the_query_naming_both_stores(
    timestone_spark: SparkSession, edge: BrokerProcess, tmp_path: Path, read_by: str
) -> None:
    sink = DeltaSink(tmp_path / "bronze")
    checkpoint = tmp_path / "checkpoint"
    publish(edge, TOPIC, 5)
    old = store_id(edge)
    run(timestone_spark, edge, checkpoint, sink, readBy=read_by)
    assert sink.rows() == records(TOPIC, range(5))

    new = wipe(edge)
    publish(edge, TOPIC, 12, first=100)
    with pytest.raises(StreamingQueryException) as failure:
        run(timestone_spark, edge, checkpoint, sink, readBy=read_by)
    message = str(failure.value)
    assert f"broker 'edge' now serves store {new}, not store {old}" in message
    assert "failOnDataLoss=false" in message and "new checkpoint" in message
    assert sink.rows() == records(TOPIC, range(5))  # nothing of the new store was taken for the old one's


@pytest.mark.parametrize("read_by", ["partitions", "topics"])
def test_without_fail_on_data_loss_every_record_of_the_new_store_is_read_once(
    timestone_spark: SparkSession,
    edge: BrokerProcess,
    tmp_path: Path,
    read_by: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = DeltaSink(tmp_path / "bronze")
    checkpoint = tmp_path / "checkpoint"
    publish(edge, TOPIC, 5)
    run(timestone_spark, edge, checkpoint, sink, readBy=read_by, failOnDataLoss="false")

    wipe(edge)
    publish(edge, TOPIC, 12, first=100)  # more than the checkpoint's 5
    publish(edge, OTHER, 3, first=200)
    run(timestone_spark, edge, checkpoint, sink, readBy=read_by, failOnDataLoss="false")
    publish(edge, TOPIC, 2, first=112)
    run(timestone_spark, edge, checkpoint, sink, readBy=read_by, failOnDataLoss="false")

    assert sink.rows() == sorted(
        records(TOPIC, range(5)) + records(TOPIC, range(100, 114)) + records(OTHER, range(200, 203))
    )


def strip_store_ids(checkpoint: Path) -> int:
    """Rewrite the checkpoint's offset log as a version before store identities wrote it; keys removed."""
    removed = 0
    for path in sorted((checkpoint / "offsets").iterdir()):
        if not path.name.isdigit():
            continue
        lines = path.read_text().split("\n")
        for number in range(2, len(lines)):
            if not lines[number].startswith("{"):
                continue
            offsets = json.loads(lines[number])
            for broker, keys in offsets.items():
                kept = {key: value for key, value in keys.items() if not key.startswith("#s")}
                removed += len(keys) - len(kept)
                offsets[broker] = kept
            lines[number] = json.dumps(offsets)
        path.write_text("\n".join(lines))
        (path.parent / f".{path.name}.crc").unlink(missing_ok=True)
    return removed


@pytest.mark.parametrize("read_by", ["partitions", "topics"])
def test_a_checkpoint_without_store_ids_goes_on_and_records_the_store(
    timestone_spark: SparkSession, edge: BrokerProcess, tmp_path: Path, read_by: str
) -> None:
    sink = DeltaSink(tmp_path / "bronze")
    checkpoint = tmp_path / "checkpoint"
    publish(edge, TOPIC, 5)
    run(timestone_spark, edge, checkpoint, sink, readBy=read_by)
    assert strip_store_ids(checkpoint) > 0

    publish(edge, TOPIC, 4, first=5)
    run(timestone_spark, edge, checkpoint, sink, readBy=read_by)

    assert sink.rows() == records(TOPIC, range(9))
    latest = max(
        (checkpoint / "offsets").iterdir(), key=lambda path: int(path.name) if path.name.isdigit() else -1
    )
    assert re.search(rf'"#s{store_id(edge)}": 0', latest.read_text())
