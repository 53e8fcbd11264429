"""Resent readings told apart in the streaming query's state store: across batches and across a restart
from the checkpoint, silver gets each message once while bronze keeps every copy.

The records come from Parquet files of the ``timestone`` source's schema, one micro-batch per file, so each
batch holds exactly the rows a test wrote; the rest of the query is the job's own.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.telemetry.config import TelemetryConfig, load_telemetry_config
from pipelines.telemetry.job import TelemetryBatch, open_store, start_query_on
from tests.e2e.telemetry.telemetry_harness import SOURCE_DDL, records, telemetry

pytestmark = pytest.mark.spark


def config_for(tmp_path: Path, **dedup) -> TelemetryConfig:
    return load_telemetry_config(
        {
            "tables": {"root": str(tmp_path / "tables")},
            "stream": {"checkpoint": str(tmp_path / "checkpoint")},
            "dedup": dedup,
            "quality": {"gx": {"schedule": "never"}},
        }
    )


def arrive(spark: SparkSession, directory: Path, rows: list[tuple]) -> None:
    """One more file of records: the next micro-batch."""
    records(spark, rows).coalesce(1).write.mode("append").parquet(str(directory))


def run(spark: SparkSession, config: TelemetryConfig, directory: Path) -> tuple[TelemetryBatch, dict]:
    """The query over every file not read yet (availableNow), as a restart from the checkpoint runs it;
    the batch and the last progress with data."""
    batch = TelemetryBatch(config, open_store(spark, config))
    batch.ensure_tables()
    stream = spark.readStream.schema(SOURCE_DDL).option("maxFilesPerTrigger", 1).parquet(str(directory))
    query = start_query_on(stream, config, batch, available_now=True)
    try:
        assert query.awaitTermination(600), "the query did not finish"
        assert query.exception() is None
    finally:
        batch.close()
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    return batch, progress[-1]


def offsets(store, name: str) -> list[tuple[str, int]]:
    return sorted((r["broker"], r["offset"]) for r in store.read(name).select("broker", "offset").collect())


def test_resent_readings_are_dropped_from_silver_across_batches_and_a_restart(spark, tmp_path):
    config = config_for(tmp_path)
    source = tmp_path / "records"
    arrive(
        spark,
        source,
        [telemetry("d", n, seq=n + 1, seconds=n) for n in range(3)] + [telemetry("e", 0, seq=1)],
    )
    arrive(
        spark,
        source,
        [
            telemetry("d", 0, seq=2, seconds=1, broker="edge2"),  # resent through another broker
            telemetry("d", 3, seq=4, seconds=3),
            telemetry("d", 4, seq=4, seconds=3),  # and again, in the same batch
        ],
    )
    first, progress = run(spark, config, source)
    store = first.store
    assert [(r.batch_id, r.passed, r.duplicates) for r in first.reports] == [(0, 4, 0), (1, 3, 2)]
    assert offsets(store, "silver_telemetry") == sorted([("edge1", n) for n in range(4)] + [("edge1", 0)])

    arrive(
        spark,
        source,
        [
            telemetry("d", 5, seq=3, seconds=2),  # resent after the restart
            telemetry("e", 1, seq=1, seconds=0),  # and e's first reading
            telemetry("d", 6, seq=1, seconds=1200),  # seq 1 again, 20 minutes on: the counter restarted
        ],
    )
    second, progress = run(spark, config, source)  # a new query instance on the same checkpoint
    assert [(r.batch_id, r.passed, r.duplicates) for r in second.reports] == [(2, 3, 2)]
    assert len(offsets(store, "bronze_telemetry")) == 10, "bronze keeps every copy"
    silver = store.read("silver_telemetry").select("device_id", "seq", "broker", "offset").collect()
    assert sorted((r["device_id"], r["seq"], r["offset"]) for r in silver) == [
        ("d", 1, 0),
        ("d", 1, 6),
        ("d", 2, 1),
        ("d", 3, 2),
        ("d", 4, 3),
        ("e", 1, 0),
    ]
    assert {r["broker"] for r in silver} == {"edge1"}
    minutes = store.read("device_minute").groupBy().sum("count").first()
    assert minutes is not None and minutes[0] == 6, "gold counts silver's rows, not the copies"

    (state,) = progress["stateOperators"]
    assert state["numRowsTotal"] == 2, "one state row per device"
    changelogs = list((tmp_path / "checkpoint" / "state").rglob("*.changelog"))
    assert changelogs, "the state store is RocksDB's, its changes checkpointed each batch"


def test_a_device_back_from_a_reboot_within_the_window_is_told_from_its_copies_by_their_payloads(
    spark, tmp_path
):
    """A device back two minutes after a reboot, its counter restarted: its new readings reuse the ids of its
    last ones, within the window. The id alone flagged them duplicates (kept out of silver and gold without
    a word); their payloads differ from what silver has, where a copy's are the same bytes."""
    config = config_for(tmp_path)
    source = tmp_path / "records"
    arrive(spark, source, [telemetry("d", n, seq=n, seconds=n) for n in range(3)])
    arrive(
        spark,
        source,
        [
            telemetry("d", 3, seq=0, seconds=120, temperature=30.0),  # back: the counter restarted
            telemetry("d", 4, seq=1, seconds=121, temperature=31.0),
            telemetry("d", 5, seq=1, seconds=121, temperature=31.0),  # that reading resent, the same bytes
            telemetry("d", 0, seq=2, seconds=2, broker="edge2"),  # one of before, through another broker
        ],
    )
    batch, _ = run(spark, config, source)
    assert [(r.batch_id, r.passed, r.duplicates) for r in batch.reports] == [(0, 3, 0), (1, 4, 2)]
    silver = batch.store.read("silver_telemetry").select("seq", "temperature", "offset", "broker").collect()
    assert sorted((r["seq"], r["temperature"], r["offset"]) for r in silver) == [
        (0, 21.5, 0),
        (0, 30.0, 3),
        (1, 21.5, 1),
        (1, 31.0, 4),
        (2, 21.5, 2),
    ]
    assert {r["broker"] for r in silver} == {"edge1"}


def test_a_device_silent_past_the_state_timeout_forgets_its_ids(spark, tmp_path):
    config = config_for(tmp_path, state_timeout_seconds=1)
    source = tmp_path / "records"
    arrive(spark, source, [telemetry("d", 0, seq=1), telemetry("e", 0, seq=1)])
    _, progress = run(spark, config, source)
    assert progress["stateOperators"][0]["numRowsTotal"] == 2
    time.sleep(1.5)
    arrive(spark, source, [telemetry("d", 1, seq=1)])  # d's resend keeps d's state; e has timed out
    batch, progress = run(spark, config, source)
    assert [(r.passed, r.duplicates) for r in batch.reports] == [(1, 1)]
    assert progress["stateOperators"][0]["numRowsTotal"] == 1
    assert progress["stateOperators"][0]["numRowsRemoved"] == 1
