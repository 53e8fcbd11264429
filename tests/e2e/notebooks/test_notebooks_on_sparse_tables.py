"""The notebooks on sparse tables written with delta-rs (not the pipelines): tables with no rows yet."""

from __future__ import annotations

from datetime import UTC, datetime
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
