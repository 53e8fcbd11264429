"""What a pipeline's /metrics says of its queries' micro-batches: rows read, batches, their seconds, and when
the last one ended, counted by the supervisor from a real query's progress reports, idle triggers left out."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipelines.metrics import PipelineMetrics
from pipelines.supervisor import Supervisor

pytestmark = pytest.mark.spark

IDLE_REPORT_MS = "100"
"""Spark reports an idle trigger every 10 s by default: here every 100 ms, so several come between batches."""


@pytest.fixture
def frequent_idle_reports(spark) -> Iterator[None]:
    key = "spark.sql.streaming.noDataProgressEventInterval"
    before = spark.conf.get(key, None)
    spark.conf.set(key, IDLE_REPORT_MS)
    yield
    if before is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, before)


def scraped(metrics: PipelineMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("query") == "probe" and "le" not in sample.labels
    }


def watch_until(supervisor: Supervisor, metrics: PipelineMetrics, rows: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while scraped(metrics).get("timestone_pipeline_input_rows_total", 0) < rows:
        assert time.monotonic() < deadline, f"the query did not read {rows} rows: {scraped(metrics)}"
        supervisor.check()
        time.sleep(0.05)


def _idle_after_a_batch(last: dict | None) -> bool:
    """Whether the query's last report is an idle trigger's that came after a batch ran (it names the next
    batch, 1 or more)."""
    return last is not None and "addBatch" not in last["durationMs"] and last["batchId"] >= 1


def write_rows(directory: Path, name: str, count: int) -> None:
    (directory / name).write_text("".join(json.dumps({"n": n}) + "\n" for n in range(count)))


def test_a_querys_batches_rows_and_freshness_are_counted_once_and_idle_triggers_are_not(
    spark, tmp_path, frequent_idle_reports
):
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    write_rows(incoming, "first.json", 3)
    metrics = PipelineMetrics()
    supervisor = Supervisor("probe-pipeline", metrics=metrics)
    started = time.time()
    watched = supervisor.add(
        "probe",
        lambda: (
            spark.readStream.schema("n INT")
            .json(str(incoming))
            .writeStream.format("noop")
            .trigger(processingTime="100 milliseconds")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        ),
    )
    try:
        supervisor.check()  # starts the query
        assert watched.query is not None
        deadline = time.monotonic() + 60
        while not _idle_after_a_batch(watched.query.lastProgress):  # the supervisor does not look meanwhile
            assert time.monotonic() < deadline, "no idle report after the first batch"
            time.sleep(0.05)
        supervisor.check()  # the batch is counted though an idle trigger's report came after it
        assert scraped(metrics)["timestone_pipeline_batches_total"] == 1
        watch_until(supervisor, metrics, 3)
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 1.0:  # idle triggers, reported every 100 ms
            supervisor.check()
            time.sleep(0.05)
        assert watched.query is not None
        assert any("addBatch" not in p["durationMs"] for p in watched.query.recentProgress), "no idle report"
        write_rows(incoming, "second.json", 4)
        watch_until(supervisor, metrics, 7)
        supervisor.check()
    finally:
        for query in supervisor.running():
            query.stop()

    figures = scraped(metrics)
    assert figures["timestone_pipeline_input_rows_total"] == 7
    assert figures["timestone_pipeline_batches_total"] == 2
    assert figures["timestone_pipeline_batch_seconds_count"] == 2
    assert 0 < figures["timestone_pipeline_batch_seconds_sum"] < time.time() - started
    assert started < figures["timestone_pipeline_last_batch_end_seconds"] <= time.time()
