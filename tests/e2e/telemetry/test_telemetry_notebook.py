"""notebooks/telemetry.ipynb runs top to bottom (nbclient, the venv's python3 kernel) against tables this
test writes, and plots the device's readings."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from pipelines.telemetry.config import load_telemetry_config_file
from pipelines.telemetry.job import TelemetryBatch, open_store
from sinks import exactly_once
from tests.e2e.telemetry.telemetry_harness import at, record, records, telemetry

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[3]
NOTEBOOK = REPO / "notebooks" / "telemetry.ipynb"


def kernel_path(tmp_path: Path) -> Path:
    """A kernelspec ``python3`` running this interpreter, in a directory of its own (no user dirs touched)."""
    from ipykernel.kernelspec import install

    prefix = tmp_path / "jupyter"
    install(kernel_name="python3", prefix=str(prefix))
    spec = prefix / "share" / "jupyter" / "kernels" / "python3" / "kernel.json"
    assert sys.executable in spec.read_text()
    return prefix / "share" / "jupyter"


def test_notebook_queries_the_tables_and_plots_a_device(spark, tmp_path, monkeypatch):
    config = load_telemetry_config_file(REPO / "conf" / "pipeline.yaml")
    config.tables.root = str(tmp_path / "tables")
    store = open_store(spark, config)
    batch = TelemetryBatch(config, store, clock=lambda: at(3600))
    batch.ensure_tables()
    readings = [telemetry("dev-7", offset, seq=offset, seconds=offset * 20) for offset in range(9)]
    readings += [telemetry("dev-8", 0, seq=1, seconds=5), record("devices/dev-9/telemetry", 0, b"?")]
    exactly_once(store, batch, app_id="notebook-test")(records(spark, readings), 0)

    monkeypatch.setenv("TIMESTONE_TABLE_ROOT", config.tables.root)
    monkeypatch.setenv("TIMESTONE_PIPELINE_CONFIG", str(REPO / "conf" / "pipeline.yaml"))
    monkeypatch.delenv("TIMESTONE_DEVICE_ID", raising=False)
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_path(tmp_path)))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(REPO)}}
    ).execute()

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "dev-7: 9 readings, 3 minutes of temperature" in text
    assert any("image/png" in o.get("data", {}) for o in outputs if o.output_type == "display_data")
    tables = next(
        o for o in outputs if o.output_type == "execute_result" and "silver_telemetry" in str(o.data)
    )
    assert "10" in tables.data["text/plain"]  # silver rows: dev-7's nine and dev-8's one
