"""Several tables from one micro-batch, exactly once, through a real streaming query and its checkpoint."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sinks.foreach_batch import BatchWriter, exactly_once, streaming_query_id
from sinks.tables import DEFAULT_CATALOG
from tests.e2e.sinks.conftest import arrow_rows, bronze_row


def write_input_files(directory, batches: list[list[dict]]) -> None:
    """One Parquet file per batch, each a second older than the next: the file source reads them in order
    of modification time, and files written in the same instant may come in any order."""
    directory.mkdir()
    for number, rows in enumerate(batches):
        path = directory / f"part-{number}.parquet"
        pq.write_table(arrow_rows("bronze_telemetry", rows), path)
        os.utime(path, (1_700_000_000 + number, 1_700_000_000 + number))


def test_a_batch_replayed_after_a_crash_writes_only_the_missing_tables(spark, lake, tmp_path):
    incoming = tmp_path / "incoming"
    write_input_files(incoming, [[bronze_row(0), bronze_row(1)], [bronze_row(2)]])
    checkpoint = str(tmp_path / "checkpoint")
    crash = {"after_bronze_in_batch": 0}
    outcomes: list[tuple[int, dict[str, bool]]] = []

    def write(batch: DataFrame, out: BatchWriter) -> None:
        out.append("bronze_telemetry", batch)
        if crash.pop("after_bronze_in_batch", None) == out.batch_id:
            raise RuntimeError("driver lost between two table writes")
        devices = batch.groupBy(F.col("client_id").alias("device_id")).agg(
            F.max("timestamp").alias("last_seen"), F.first("broker").alias("broker")
        )
        out.merge("devices", devices, update_when="s.last_seen > t.last_seen")
        outcomes.append((out.batch_id, dict(out.results)))

    def run():
        stream = (
            spark.readStream.schema(DEFAULT_CATALOG["bronze_telemetry"].read_schema)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(incoming))
        )
        query = (
            stream.writeStream.foreachBatch(exactly_once(lake, write))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return query

    with pytest.raises(StreamingQueryException, match="driver lost"):
        run()
    assert lake.read_arrow("bronze_telemetry").num_rows == 2, "bronze was written before the crash"
    assert not lake.exists("devices")

    query = run()
    assert outcomes == [
        (0, {"bronze_telemetry": False, "devices": True}),
        (1, {"bronze_telemetry": True, "devices": True}),
    ]
    offsets = sorted(lake.read_arrow("bronze_telemetry").column("offset").to_pylist())
    assert offsets == [0, 1, 2]
    assert lake.committed_batch("bronze_telemetry", query.id) == 1, "the app id is the query id"
    (device,) = lake.read_arrow("devices").to_pylist()
    assert device["device_id"] == "d1" and device["broker"] == "b1"


def test_one_table_twice_in_a_batch_needs_a_step_per_write(lake):
    out = BatchWriter(lake, "q", 0)
    out.append("bronze_telemetry", arrow_rows("bronze_telemetry", [bronze_row(0)]), step="live")
    with pytest.raises(ValueError, match="written twice in batch 0"):
        out.append("bronze_telemetry", arrow_rows("bronze_telemetry", [bronze_row(1)]), step="live")
    out.append("bronze_telemetry", arrow_rows("bronze_telemetry", [bronze_row(1)]), step="late")
    assert out.results == {"bronze_telemetry/live": True, "bronze_telemetry/late": True}
    assert lake.committed_batch("bronze_telemetry", "q/late") == 0

    replay = BatchWriter(lake, "q", 0)
    assert (
        replay.append("bronze_telemetry", arrow_rows("bronze_telemetry", [bronze_row(0)]), step="live")
        is False
    )
    assert (
        replay.append("bronze_telemetry", arrow_rows("bronze_telemetry", [bronze_row(1)]), step="late")
        is False
    )
    assert lake.read_arrow("bronze_telemetry").num_rows == 2


def test_the_query_id_is_only_known_inside_a_streaming_batch(spark):
    with pytest.raises(RuntimeError, match="pass app_id explicitly"):
        streaming_query_id(spark.range(1))
