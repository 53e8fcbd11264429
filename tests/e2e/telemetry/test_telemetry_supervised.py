"""The telemetry job restarts its failed query from the checkpoint: nothing lost, nothing twice.

Real failures in the middle of work: a batch that fails once silver is in, the other tables not all, and the
brokers' offsets API going away for a while under a running query. A failure no restart can fix (data lost
to retention with ``fail_on_data_loss``) stops the job, named.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame

from pipelines.metrics import PipelineMetrics
from pipelines.supervisor import NOT_RESTARTABLE, RestartConfig, Supervisor
from pipelines.telemetry.config import TelemetryConfig
from pipelines.telemetry.job import TelemetryBatch, open_store, supervise
from sinks import BatchWriter, TableStore
from tests.e2e.sources.conftest import EdgeBroker
from tests.e2e.telemetry.telemetry_harness import Fleet, LogAppendPublisher
from tests.e2e.telemetry.test_telemetry_stream import FAR_FUTURE_MS, keys, pipeline_config, total_of

pytestmark = pytest.mark.spark

QUICK_RESTARTS = RestartConfig(initial_backoff_s=0.2, max_backoff_s=1.0)


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[EdgeBroker]:
    from broker_edge.storage import StorageConfig

    broker = EdgeBroker(tmp_path / "edge1", StorageConfig(group_commit_ms=1, segment_bytes=2048))
    yield broker
    broker.close()


def supervised_config(tmp_path: Path, edge: EdgeBroker, **source) -> TelemetryConfig:
    config = pipeline_config(tmp_path, {"edge1": edge}, **source)
    config.stream.restart = QUICK_RESTARTS
    return config


def assert_each_reading_once(store: TableStore, sent: int) -> None:
    bronze = keys(store, "bronze_telemetry")
    assert len(bronze) == len(set(bronze)) == sent
    assert sorted(keys(store, "silver_telemetry")) == sorted(bronze)
    assert total_of(store.read("device_minute"), "count") == sent
    parse_check = store.read("dq_results").where("expectation = 'payload_is_json_of_declared_types'")
    assert total_of(parse_check, "element_count") == sent


def test_a_batch_failing_after_silver_is_retried_from_the_checkpoint(spark, tmp_path, edge):
    sent = Fleet([LogAppendPublisher("edge1", edge)], devices=6).send(rounds=10)  # 60: batches of 20
    config = supervised_config(tmp_path, edge, max_records_per_trigger=20)
    failed: list[int] = []
    batches: list[TelemetryBatch] = []

    def failing_once(config: TelemetryConfig, store: TableStore) -> TelemetryBatch:
        batch = TelemetryBatch(config, store)
        batches.append(batch)

        def explode(step: str, batch_id: int) -> None:
            if step == "silver_telemetry" and batch_id == 1 and not failed:
                failed.append(batch_id)
                raise RuntimeError("injected failure after silver in batch 1")

        batch.after_step = explode
        return batch

    metrics = PipelineMetrics()
    assert supervise(spark, config, available_now=True, metrics=metrics, make_batch=failing_once) == 0

    assert failed == [1]
    assert metrics.restarts("telemetry", config.stream.query_name) == 1
    labels = {"pipeline": "telemetry", "query": config.stream.query_name}
    read = metrics.registry.get_sample_value
    assert read("timestone_pipeline_input_rows_total", labels) == sent, (
        "the failed attempt's rows not counted"
    )
    assert (read("timestone_pipeline_batches_total", labels) or 0) >= 3
    first, second = batches
    assert first.maintenance is second.maintenance  # one schedule across restarts
    assert_each_reading_once(open_store(spark, config), sent)


def test_a_broker_lost_while_a_planned_batch_is_read_is_waited_out(spark, tmp_path, edge):
    """The source planned a batch (its offsets are in the checkpoint), then the broker's offsets API goes
    away before the tasks read it: the read fails, so does the query, and restarts replay the same
    offsets until the broker is back (after the second restart, however long the machine takes)."""
    fleet = Fleet([LogAppendPublisher("edge1", edge)], devices=4)
    sent = fleet.send(rounds=5)
    config = supervised_config(tmp_path, edge)
    config.stream.trigger_interval = "0.2 seconds"
    store = open_store(spark, config)
    metrics = PipelineMetrics()
    supervisor = Supervisor("telemetry", QUICK_RESTARTS, metrics)
    lost: list[int] = []

    class LosingTheBrokerOnce(TelemetryBatch):
        def __call__(self, records: DataFrame, out: BatchWriter) -> None:
            if out.batch_id == 1 and not lost:
                lost.append(out.batch_id)
                edge.stop_server()
                threading.Thread(target=back_after_restarts, args=(2,), daemon=True).start()
            super().__call__(records, out)

    def back_after_restarts(restarts: int) -> None:
        deadline = time.monotonic() + 120
        while metrics.restarts("telemetry") < restarts and time.monotonic() < deadline:
            time.sleep(0.05)
        edge.start_server(edge.port)

    outcome: list[int] = []

    def run() -> None:
        outcome.append(supervise(spark, config, make_batch=LosingTheBrokerOnce, supervisor=supervisor))

    running = threading.Thread(target=run)
    running.start()
    try:
        wait_for_rows(store, "silver_telemetry", sent)
        sent += fleet.send(rounds=5)  # batch 1: planned, then its broker goes away
        wait_for_rows(store, "silver_telemetry", sent)
    finally:
        supervisor.stop()
        running.join(timeout=120)
    assert outcome == [0]
    assert lost == [1] and supervisor.gave_up is None
    errors = {s.labels["error"] for m in metrics.query_restarts.collect() for s in m.samples}
    assert metrics.restarts("telemetry") >= 2 and "BrokerUnreachableError" in errors, errors
    assert_each_reading_once(store, sent)


def test_data_lost_to_retention_stops_the_job_naming_it(spark, tmp_path, edge):
    fleet = Fleet([LogAppendPublisher("edge1", edge)], devices=1)
    first = fleet.send(rounds=10)
    config = supervised_config(tmp_path, edge)
    assert supervise(spark, config, available_now=True) == 0
    fleet.send(rounds=60)
    edge.apply_retention(FAR_FUTURE_MS)  # the next offsets the checkpoint expects are gone

    metrics = PipelineMetrics()
    supervisor = Supervisor("telemetry", QUICK_RESTARTS, metrics)
    status = supervise(spark, config, available_now=True, metrics=metrics, supervisor=supervisor)
    assert status == NOT_RESTARTABLE  # a service does not start the job again
    assert supervisor.gave_up is not None
    assert supervisor.gave_up.reason == "data loss (failOnDataLoss)"
    assert "data loss on broker 'edge1'" in supervisor.gave_up.error
    assert metrics.restarts("telemetry") == 0
    assert open_store(spark, config).read("bronze_telemetry").count() == first


def test_a_batch_failing_the_same_way_at_every_replay_stops_a_continuous_job_naming_it(spark, tmp_path, edge):
    """Running continuously (no ``--available-now``), a query whose batch failed the same way at every
    replay was restarted for ever: the job never exited, and nothing that watches it saw a failure. After
    ``max_restarts`` restarts for that one failure within ``restart_window_s`` it exits with status 1,
    the reason said."""
    Fleet([LogAppendPublisher("edge1", edge)], devices=2).send(rounds=2)
    config = supervised_config(tmp_path, edge)
    config.stream.restart = RestartConfig(
        initial_backoff_s=0.2, max_backoff_s=0.2, max_restarts=2, restart_window_s=600.0
    )
    attempts: list[int] = []

    class FailingEveryTime(TelemetryBatch):
        def __call__(self, records: DataFrame, out: BatchWriter) -> None:
            attempts.append(out.batch_id)
            raise ValueError(f"no such firmware in batch {out.batch_id}")

    metrics = PipelineMetrics()
    supervisor = Supervisor("telemetry", config.stream.restart, metrics)
    assert supervise(spark, config, make_batch=FailingEveryTime, supervisor=supervisor) == 1
    assert supervisor.gave_up is not None
    assert supervisor.gave_up.reason.startswith("failed the same way 3 times in ")
    assert supervisor.gave_up.reason.endswith(" (restart.max_restarts: 2)")
    assert "no such firmware in batch 0" in supervisor.gave_up.error
    assert attempts == [0, 0, 0] and metrics.restarts("telemetry", config.stream.query_name) == 2


def wait_for_rows(store: TableStore, name: str, rows: int) -> None:
    wait_until(lambda: store.exists(name) and store.read_arrow(name).num_rows >= rows, f"{rows} in {name}")


def wait_until(condition, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)
