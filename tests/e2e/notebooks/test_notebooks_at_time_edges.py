"""The notebooks on tables written with delta-rs (``write_deltalake``, not the pipelines) whose times sit at
the edges of what the pipelines accept (years 0001 to 9999): a device whose clock reads 0001-01-01 (Go's zero
time), one in the last minute of 9999, an execution finished then. Every chart is drawn, with all its data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from pipelines.views.location import table_catalog
from tests.e2e.notebooks.notebook_harness import run_notebook

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
ZERO = datetime(1, 1, 1, tzinfo=UTC)
LAST_MINUTE = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)
CATALOG = table_catalog({}, start=Path(__file__))


def write(root: Path, name: str, rows: list[dict[str, Any]]) -> None:
    spec = CATALOG.spec(name)
    schema = spec.arrow_schema
    table = pa.Table.from_pylist([{f.name: row.get(f.name) for f in schema} for row in rows], schema=schema)
    write_deltalake(str(root / name), table, partition_by=list(spec.partition_by) or None)


def reading(device: str, at: datetime, temperature: float) -> dict[str, Any]:
    return {
        "device_id": device,
        "event_time": at,
        "event_date": at.date(),
        "topic": f"devices/{device}/telemetry",
        "broker": "edge1",
        "offset": 0,
        "ingested_at": NOW,
        "temperature": temperature,
    }


def minute(device: str, at: datetime, low: float, high: float, count: int) -> dict[str, Any]:
    return {
        "device_id": device,
        "minute": at,
        "event_date": at.date(),
        "count": count,
        "temperature_min": low,
        "temperature_max": high,
        "temperature_avg": (low + high) / 2,
        "temperature_count": count,
    }


@pytest.fixture
def tables(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "lake"
    write(
        root,
        "silver_telemetry",
        [
            reading("dev-go", ZERO, 20.0),
            reading("dev-end", LAST_MINUTE + timedelta(seconds=10), 21.0),
            reading("dev-end", LAST_MINUTE + timedelta(seconds=50), 23.0),
            reading("dev-ok", NOW, 22.0),
        ],
    )
    write(
        root,
        "device_minute",
        [
            minute("dev-go", ZERO, 20.0, 20.0, 1),
            minute("dev-end", LAST_MINUTE, 21.0, 23.0, 2),
            minute("dev-ok", NOW, 22.0, 22.0, 1),
        ],
    )
    write(
        root,
        "devices",
        [
            {"device_id": d, "firmware_version": "1.0.0", "group": "g"}
            for d in ("dev-go", "dev-end", "dev-ok")
        ],
    )
    quality = {"run_id": "r", "suite": "s", "expectation": "e", "success": True, "element_count": 4}
    write(
        root,
        "dq_results",
        [
            quality | {"batch_id": 0, "observed_at": ZERO},
            quality | {"batch_id": 1, "observed_at": LAST_MINUTE},
        ],
    )
    action = {
        "id": "act-edge",
        "kind": "ota",
        "target": {"group": "g", "all": False},
        "payload": {"version": "2.0.0", "url": "https://fw.example/f", "sha256": "0" * 64},
        "created_at": NOW,
        "cancel": False,
    }
    write(root, "actions", [action])
    execution = {
        "action_id": "act-edge",
        "version": 1,
        "report_seq": 1,
        "queued_at": NOW,
        "published_at": NOW,
    }
    write(
        root,
        "action_executions",
        [
            execution | {"device_id": "dev-ok", "state": "SUCCEEDED", "updated_at": NOW, "finished_at": NOW},
            execution
            | {
                "device_id": "dev-end",
                "state": "FAILED",
                "updated_at": LAST_MINUTE,
                "finished_at": LAST_MINUTE,
            },
        ],
    )
    counts = {f"{s}_count": 0 for s in ("queued", "in_progress", "timed_out", "rejected", "canceled")}
    summary = counts | {"succeeded_count": 1, "failed_count": 1, "total_count": 2}
    write(
        root,
        "action_summary",
        [summary | {"action_id": "act-edge", "action_state": "COMPLETED", "updated_at": LAST_MINUTE}],
    )
    for name in ("TIMESTONE_ACTION_ID", "TIMESTONE_NEW_ACTION_GROUP", "TIMESTONE_PIPELINE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TIMESTONE_TABLES", str(root))
    return root


def test_telemetry_notebook_draws_devices_at_year_0001_and_in_the_last_minute_of_9999(
    tables, tmp_path, monkeypatch
):
    monkeypatch.setenv("TIMESTONE_DEVICE_ID", "dev-end")
    run = run_notebook("telemetry.ipynb", tmp_path, tmp_path)
    device = run.charts["device_chart"]
    assert device.title == "dev-end: temperature, 2 readings in 1 minute"
    assert (device.points, device.bars, device.segments) == (2, 1, 1)
    assert run.charts["fleet_metric_chart"].points == 2 * 3  # the median and the count, in each of 3 minutes
    assert run.charts["quality_chart"].points == 2 * 2
    assert len(run.images()) == 4


def test_ota_notebook_draws_an_execution_finished_in_the_year_9999(tables, tmp_path, monkeypatch):
    monkeypatch.delenv("TIMESTONE_DEVICE_ID", raising=False)
    run = run_notebook("ota_rollout.ipynb", tmp_path, tmp_path)
    chart = run.charts["rollout_chart"]
    assert chart.title == "Rollout of act-edge: COMPLETED, 2 devices"
    assert chart.areas > 0 and chart.bars == 2
    assert len(run.images()) == 2
