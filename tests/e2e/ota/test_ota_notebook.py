"""notebooks/ota_rollout.ipynb runs top to bottom against a live actions job and plots the rollout."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

from tests.e2e.ota.conftest import actions_stack, summary
from tests.fleet_harness import quiet_devices

NOTEBOOK = Path(__file__).resolve().parents[3] / "notebooks" / "ota_rollout.ipynb"


def test_notebook_creates_an_action_and_plots_its_rollout(spark, tmp_path, monkeypatch):
    with actions_stack(spark, tmp_path, {"count": 30, "groups": ["canary"]}, quiet_devices()) as stack:
        plot = tmp_path / "rollout.png"
        monkeypatch.setenv("TIMESTONE_TABLES", str(tmp_path / "tables"))
        monkeypatch.setenv("TIMESTONE_GROUP", "canary")
        monkeypatch.setenv("TIMESTONE_WAIT_S", "90")
        monkeypatch.setenv("TIMESTONE_PLOT", str(plot))
        notebook = nbformat.read(NOTEBOOK, as_version=4)
        NotebookClient(
            notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()
        printed = "".join(
            output.get("text", "")
            for cell in notebook.cells
            if cell.cell_type == "code"
            for output in cell.outputs
        )
        assert "final state: COMPLETED" in printed
        assert plot.exists() and plot.stat().st_size > 1000
        actions = stack.store.read_arrow("actions").to_pylist()
        assert len(actions) == 1 and actions[0]["created_by"] == "notebook"
        result = summary(stack.store, actions[0]["id"])
        assert result["succeeded_count"] == 30 and result["action_state"] == "COMPLETED"
