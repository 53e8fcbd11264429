"""notebooks/ota_rollout.ipynb's "create an action" step, asked for, writes one row that a live actions job
rolls out, and the notebook draws that rollout."""

from __future__ import annotations

from tests.e2e.notebooks.notebook_harness import run_notebook
from tests.e2e.ota.conftest import actions_stack, summary
from tests.fleet_harness import quiet_devices


def test_notebook_creates_an_action_when_asked_and_plots_its_rollout(spark, tmp_path, monkeypatch):
    with actions_stack(spark, tmp_path, {"count": 30, "groups": ["canary"]}, quiet_devices()) as stack:
        monkeypatch.setenv("TIMESTONE_TABLES", str(tmp_path / "tables"))
        monkeypatch.setenv("TIMESTONE_NEW_ACTION_GROUP", "canary")
        monkeypatch.setenv("TIMESTONE_FOLLOW_S", "90")
        monkeypatch.delenv("TIMESTONE_ACTION_ID", raising=False)
        run = run_notebook("ota_rollout.ipynb", tmp_path, tmp_path)
        assert "final state: COMPLETED" in run.printed
        actions = stack.store.read_arrow("actions").to_pylist()
        assert len(actions) == 1 and actions[0]["created_by"] == "notebook"
        action_id = actions[0]["id"]
        result = summary(stack.store, action_id)
        assert result is not None
        assert result["succeeded_count"] == 30 and result["action_state"] == "COMPLETED"
        chart = run.charts["new_rollout_chart"]
        assert chart.title == f"Rollout of {action_id}: COMPLETED, 30 devices"
        assert chart.areas > 0 and chart.bars == 1  # all 30 succeeded: one bar of final counts
