"""The notebooks on sparse tables written with delta-rs (``write_deltalake``, not the pipelines): tables with
no rows yet, and a fleet whose busiest device sends no reading of the metric the notebook plots."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from pipelines.views.location import table_catalog
from sinks import open_table_store
from tests.e2e.notebooks.notebook_harness import NotebookRun, run_notebook

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
CATALOG = table_catalog({}, start=Path(__file__))


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    for name in ("TIMESTONE_DEVICE_ID", "TIMESTONE_ACTION_ID", "TIMESTONE_NEW_ACTION_GROUP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TIMESTONE_PIPELINE_CONFIG", raising=False)
    monkeypatch.setenv("TIMESTONE_TABLES", str(tmp_path / "lake"))
    return tmp_path / "lake"


def write(root: Path, name: str, rows: list[dict[str, Any]]) -> None:
    spec = CATALOG.spec(name)
    schema = spec.arrow_schema
    table = pa.Table.from_pylist([{f.name: row.get(f.name) for f in schema} for row in rows], schema=schema)
    write_deltalake(str(root / name), table, partition_by=list(spec.partition_by) or None)


def warnings_shown(run: NotebookRun) -> list[str]:
    """What the cells wrote to stderr: in Jupyter, a red box under the cell."""
    return [
        output["text"]
        for cell in run.notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream" and output.name == "stderr"
    ]


@pytest.mark.parametrize("notebook", ["telemetry.ipynb", "ota_rollout.ipynb"])
def test_tables_with_no_rows_yet_show_empty_charts_and_no_warning(root, tmp_path, notebook):
    store = open_table_store(None, str(root), backend="delta-rs", catalog=CATALOG)
    for name in CATALOG:
        store.ensure(name)
    run = run_notebook(notebook, tmp_path, tmp_path)
    assert warnings_shown(run) == []
    assert all(chart.drawn == 0 for chart in run.charts.values())
    assert "No readings in these tables yet." in run.printed or "No action in these tables yet" in run.printed


def test_the_device_plotted_by_default_is_the_one_with_the_most_readings_of_the_metric(root, tmp_path):
    """dev-chatty sends humidity alone, more often than dev-warm sends its temperature: the temperature chart
    plots dev-warm, not a device with nothing to draw."""

    def reading(device: str, seconds: int, **values: float) -> dict[str, Any]:
        at = NOW + timedelta(seconds=seconds)
        row = {"device_id": device, "event_time": at, "event_date": at.date(), "topic": f"devices/{device}"}
        return row | {"broker": "edge1", "offset": seconds, "ingested_at": at, **values}

    readings = [reading("dev-chatty", s, humidity=40.0) for s in range(0, 50, 10)]
    readings += [reading("dev-warm", s, temperature=21.0 + s / 10) for s in (5, 25)]
    write(root, "silver_telemetry", readings)
    minute = {"minute": NOW, "event_date": NOW.date()}
    write(
        root,
        "device_minute",
        [
            minute | {"device_id": "dev-chatty", "count": 5, "humidity_avg": 40.0, "humidity_count": 5},
            minute
            | {"device_id": "dev-warm", "count": 2, "temperature_count": 2}
            | {"temperature_min": 21.5, "temperature_max": 23.5, "temperature_avg": 22.5},
        ],
    )
    run = run_notebook("telemetry.ipynb", tmp_path, tmp_path)
    device = run.charts["device_chart"]
    assert device.title == "dev-warm: temperature, 2 readings in 1 minute"
    assert (device.points, device.bars, device.segments) == (2, 1, 1)


@pytest.mark.parametrize(
    ("notebook", "setting", "chart", "said"),
    [
        (
            "telemetry.ipynb",
            "TIMESTONE_DEVICE_ID",
            "device_chart",
            "No readings of device 'dev-mistyped' in silver_telemetry (TIMESTONE_DEVICE_ID).",
        ),
        (
            "ota_rollout.ipynb",
            "TIMESTONE_ACTION_ID",
            "rollout_chart",
            "No action 'dev-mistyped' in the actions table (TIMESTONE_ACTION_ID).",
        ),
    ],
)
def test_a_mistyped_device_or_action_is_said_not_drawn_as_an_empty_chart(
    root, tmp_path, monkeypatch, notebook, setting, chart, said
):
    """A TIMESTONE_DEVICE_ID or TIMESTONE_ACTION_ID naming nothing in the tables drew an empty chart
    ('dev-x: temperature, 0 readings in 0 minutes'; 'Rollout of act-x: no summary yet, 0 devices', as if the
    action were still to start)."""
    store = open_table_store(None, str(root), backend="delta-rs", catalog=CATALOG)
    for name in CATALOG:
        store.ensure(name)
    monkeypatch.setenv(setting, "dev-mistyped")
    run = run_notebook(notebook, tmp_path, tmp_path)
    assert said in run.printed
    assert chart not in run.charts
