"""The telemetry pipeline as a streaming query over real broker logs (LogStore + offsets API in-process).

Devices publish through a ``Publisher`` (today: appends to the broker's log; an MQTT publisher can take
its place), the query runs with ``availableNow`` from a checkpoint, and the tables are read back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame

from pipelines.maintenance.config import MaintenanceConfig
from pipelines.telemetry.config import TelemetryConfig, load_telemetry_config
from pipelines.telemetry.job import TelemetryBatch, open_store, start_query
from tests.e2e.sources.conftest import EdgeBroker
from tests.e2e.telemetry.telemetry_harness import (
    Fleet,
    LogAppendPublisher,
    MqttPublisher,
    checkpoint_query_id,
)

pytestmark = pytest.mark.spark

FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01


def pipeline_config(tmp_path: Path, brokers: dict[str, EdgeBroker], **source) -> TelemetryConfig:
    return load_telemetry_config(
        {
            "source": {
                "brokers": [f"{name}={broker.url}" for name, broker in brokers.items()],
                "max_records_per_trigger": 40,
                "options": {"fetchRetries": "1", "retryBackoffMs": "50"},
                **source,
            },
            "tables": {"root": str(tmp_path / "tables")},
            "stream": {"checkpoint": str(tmp_path / "checkpoint")},
            "quality": {"gx": {"schedule": "every_n_batches", "every_n_batches": 2}},
        }
    )


def run_available_now(
    spark,
    config: TelemetryConfig,
    fail_after: str | None = None,
    fail_batch: int | None = None,
) -> TelemetryBatch:
    """One run of the query until it has read everything available (what a restart does, each time)."""
    batch = TelemetryBatch(config, open_store(spark, config))
    batch.ensure_tables()
    if fail_after is not None:

        def explode(step: str, batch_id: int) -> None:
            if step == fail_after and fail_batch in (None, batch_id):
                raise RuntimeError(f"injected failure after {step} in batch {batch_id}")

        batch.after_step = explode
    query = start_query(spark, config, batch, available_now=True)
    try:
        query.awaitTermination(180)
        assert not query.isActive
    finally:
        batch.close()
    return batch


def keys(store, name: str) -> list[tuple]:
    rows = store.read(name).select("broker", "topic", "offset").collect()
    return [tuple(row) for row in rows]


def total_of(frame: DataFrame, column: str) -> int:
    """The sum of ``column`` over ``frame``."""
    row = frame.groupBy().sum(column).first()
    assert row is not None
    return row[0]


def test_messages_on_many_topics_of_two_brokers_land_once_in_bronze_and_silver(spark, tmp_path, brokers):
    fleet = Fleet([LogAppendPublisher(name, broker) for name, broker in brokers.items()], devices=12)
    sent = fleet.send(rounds=5)  # 60 messages on 12 topics, over 2 brokers
    config = pipeline_config(tmp_path, brokers)
    batch = run_available_now(spark, config)
    store = batch.store

    bronze, silver = keys(store, "bronze_telemetry"), keys(store, "silver_telemetry")
    assert len(bronze) == len(set(bronze)) == sent
    assert sorted(silver) == sorted(bronze)
    assert len(batch.reports) >= 2  # max_records_per_trigger split the backlog
    assert {b for b, _, _ in bronze} == {"edge1", "edge2"}
    assert store.read("devices").count() == 12
    assert store.read("telemetry_quarantine").count() == 0
    minutes = total_of(store.read("device_minute"), "count")
    assert minutes == sent
    assert store.read("dq_results").select("run_id").distinct().count() == 1  # the streaming query id

    more = fleet.send(rounds=2, temperature=999.0)  # out of range: quarantined, not in silver
    run_available_now(spark, config)
    assert store.read("bronze_telemetry").count() == sent + more
    assert store.read("silver_telemetry").count() == sent
    assert store.read("telemetry_quarantine").count() == more


def test_failure_after_bronze_then_restart_from_checkpoint_loses_and_duplicates_nothing(
    spark, tmp_path, brokers
):
    fleet = Fleet([LogAppendPublisher(name, broker) for name, broker in brokers.items()], devices=6)
    sent = fleet.send(rounds=10)  # 60 messages: batch 0 reads 40 of them
    config = pipeline_config(tmp_path, brokers)
    with pytest.raises(StreamingQueryException, match="injected failure after bronze_telemetry"):
        run_available_now(spark, config, fail_after="bronze_telemetry")
    store = open_store(spark, config)
    assert store.read("bronze_telemetry").count() == 40  # batch 0 wrote bronze, then failed
    assert store.read("silver_telemetry").count() in (0, 40), "silver, written beside bronze, in or not"

    batch = run_available_now(spark, config)  # the restart: batch 0 is replayed, then the rest
    assert batch.reports[0].batch_id == 0 and batch.reports[0].written["bronze_telemetry"] is False
    bronze, silver = keys(store, "bronze_telemetry"), keys(store, "silver_telemetry")
    assert len(bronze) == len(set(bronze)) == sent
    assert sorted(silver) == sorted(bronze)


def test_a_batch_failing_after_its_merges_is_replayed_and_writes_each_table_once(spark, tmp_path, brokers):
    """Batch 1 fails once its devices merge is in (bronze, silver and the other tables concurrently in or
    not); the restart from the checkpoint replays it with the same duplicate flags and writes every
    table exactly once."""
    fleet = Fleet([LogAppendPublisher(name, broker) for name, broker in brokers.items()], devices=6)
    sent = fleet.send(rounds=10)  # 60 messages in batches of 20
    config = pipeline_config(tmp_path, brokers, max_records_per_trigger=20)
    with pytest.raises(StreamingQueryException, match="injected failure after devices in batch 1"):
        run_available_now(spark, config, fail_after="devices", fail_batch=1)
    store = open_store(spark, config)
    assert store.committed_batch("devices", checkpoint_query_id(config.stream.checkpoint)) == 1

    batch = run_available_now(spark, config)
    replayed = [report for report in batch.reports if report.batch_id == 1]
    assert replayed and replayed[0].written["devices"] is False
    bronze, silver = keys(store, "bronze_telemetry"), keys(store, "silver_telemetry")
    assert len(bronze) == len(set(bronze)) == sent
    assert sorted(silver) == sorted(bronze)
    assert total_of(store.read("device_minute"), "count") == sent
    assert store.read("devices").count() == 6
    parse_check = store.read("dq_results").where("expectation = 'payload_is_json_of_declared_types'")
    batch_ids = [r["batch_id"] for r in parse_check.collect()]
    assert len(batch_ids) == len(set(batch_ids)) == 3
    assert total_of(parse_check, "element_count") == sent


def test_retention_gap_fails_the_query_or_is_skipped_without_fail_on_data_loss(spark, tmp_path, brokers):
    edge2 = {"edge2": brokers["edge2"]}  # 2 KiB segments: retention deletes old records at once
    fleet = Fleet([LogAppendPublisher("edge2", brokers["edge2"])], devices=1)
    first = fleet.send(rounds=10)
    config = pipeline_config(tmp_path, edge2)
    run_available_now(spark, config)
    store = open_store(spark, config)
    assert store.read("bronze_telemetry").count() == first

    fleet.send(rounds=60)
    brokers["edge2"].apply_retention(FAR_FUTURE_MS)
    log_start = brokers["edge2"].store.log_info("devices/dev-000/telemetry").start_offset
    assert first < log_start < first + 60

    with pytest.raises(StreamingQueryException, match="data loss"):
        run_available_now(spark, config)
    assert store.read("bronze_telemetry").count() == first

    skipping = pipeline_config(tmp_path, edge2, fail_on_data_loss=False)
    run_available_now(spark, skipping)
    offsets = sorted(offset for _, _, offset in keys(store, "bronze_telemetry"))
    assert offsets == list(range(first)) + list(range(log_start, first + 60))
    assert store.read("silver_telemetry").count() == len(offsets)


def test_devices_publishing_over_mqtt_to_a_real_broker_land_once(spark, tmp_path):
    """The same path as production: MQTT publish → broker commitlog → offsets API → the pipeline."""
    from tests.e2e.conftest import RunningBroker, broker_config

    config = broker_config(tmp_path, storage={"durability": "group"}, offsets_api={"port": 0})
    running = RunningBroker(config).start()
    publisher = MqttPublisher("edge1", running.port)
    try:
        sent = Fleet([publisher], devices=5).send(rounds=6)
        api = f"http://127.0.0.1:{running.broker.offsets_port}"
        pipeline = load_telemetry_config(
            {
                "source": {"brokers": [f"edge1={api}"], "options": {"fetchRetries": "1"}},
                "tables": {"root": str(tmp_path / "tables")},
                "stream": {"checkpoint": str(tmp_path / "checkpoint")},
                "quality": {"gx": {"schedule": "never"}},
            }
        )
        store = run_available_now(spark, pipeline).store
    finally:
        publisher.close()
        running.stop()
    bronze = keys(store, "bronze_telemetry")
    assert len(bronze) == len(set(bronze)) == sent
    assert sorted(keys(store, "silver_telemetry")) == sorted(bronze)
    assert store.read("devices").count() == 5


def test_tables_compacted_while_the_query_runs_keep_every_row_once(spark, tmp_path, brokers):
    """Compaction after every batch, in the background of the query: the tables' files are rewritten
    under the running batches (which append and merge), and every table still holds each reading once."""
    fleet = Fleet([LogAppendPublisher(name, broker) for name, broker in brokers.items()], devices=6)
    sent = fleet.send(rounds=10)
    config = pipeline_config(tmp_path, brokers, max_records_per_trigger=10)
    config.tables.maintenance = MaintenanceConfig(compact_interval_s=0.001, min_files=2)
    batch = run_available_now(spark, config)
    store = batch.store
    assert len(batch.reports) >= 6

    bronze, silver = keys(store, "bronze_telemetry"), keys(store, "silver_telemetry")
    assert len(bronze) == len(set(bronze)) == sent
    assert sorted(silver) == sorted(bronze)
    assert total_of(store.read("device_minute"), "count") == sent
    compacted = {u.table for u in batch.maintenance.upkeep if u.operation == "compact" and u.count}
    assert {"bronze_telemetry", "silver_telemetry", "dq_results"} <= compacted
    for name in ("bronze_telemetry", "silver_telemetry"):
        location = store.location(name)
        assert "OPTIMIZE" in [commit["operation"] for commit in DeltaTable(location).history()]
        live = DeltaTable(location).get_add_actions().column("path").to_pylist()
        assert len(live) < len(batch.reports), f"{name} holds fewer files than the batches that wrote it"
