"""The notebooks, run the way the demo says after a real demo run (broker, simulated fleet, telemetry
pipeline, actions job, Delta on disk), draw the demo's fleet, one of its devices, its data quality and its
rollout."""

from __future__ import annotations

import pandas as pd
import pytest

from pipelines.views.charts import counted
from pipelines.views.location import DEMO_TABLES
from sinks import open_table_store
from tests.e2e.notebooks.notebook_harness import run_notebook

SETTINGS = (
    "TIMESTONE_TABLES",
    "TIMESTONE_DEVICE_ID",
    "TIMESTONE_ACTION_ID",
    "TIMESTONE_NEW_ACTION_GROUP",
    "TIMESTONE_PIPELINE_CONFIG",
)


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """None of the notebooks' settings: a user who set nothing."""
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def demo_tables(demo_run) -> dict[str, pd.DataFrame]:
    store = open_table_store(None, str(demo_run.repository / DEMO_TABLES), backend="delta-rs")
    names = (
        "devices",
        "silver_telemetry",
        "device_minute",
        "dq_results",
        "actions",
        "action_summary",
        "fleet_compliance",
    )
    return {name: store.read_arrow(name).to_pandas() for name in names}


def test_telemetry_notebook_with_no_setting_draws_the_demo_fleet_a_device_and_data_quality(demo_run, scratch):
    run = run_notebook("telemetry.ipynb", demo_run.repository / "notebooks", scratch)
    tables = demo_tables(demo_run)
    assert set(run.charts) == {"fleet_chart", "device_chart", "fleet_metric_chart", "quality_chart"}
    assert len(run.images()) == 4

    devices = tables["devices"]
    fleet = run.charts["fleet_chart"]
    assert fleet.title == f"Fleet: {counted(len(devices), 'device')} by firmware version and group"
    assert fleet.bars == devices.groupby(["firmware_version", "group"]).ngroups > 0

    device = run.charts["device_chart"]
    device_id = device.title.split(":")[0]
    assert device_id in set(devices["device_id"])
    readings = tables["silver_telemetry"].query("device_id == @device_id")
    minutes = tables["device_minute"].query("device_id == @device_id")
    shown = f"{counted(len(readings), 'reading')} in {counted(len(minutes), 'minute')}"
    assert device.title == f"{device_id}: temperature, {shown}"
    assert device.points == len(readings) > 0
    assert device.segments == len(minutes) > 0  # every minute's average, however few minutes there are
    assert device.bars == int((minutes["temperature_max"] > minutes["temperature_min"]).sum()) > 0

    across = run.charts["fleet_metric_chart"]
    minutes_of_fleet = tables["device_minute"].dropna(subset=["temperature_avg"])
    reporting = minutes_of_fleet.groupby("minute").size()
    up_to = f"{counted(reporting.max(), 'device')} over {counted(len(reporting), 'minute')}"
    expected = f"Fleet: temperature of up to {up_to}"
    assert across.title == expected
    assert across.points == 2 * len(reporting) > 0  # the median and the devices reporting, every minute

    quality = run.charts["quality_chart"]
    batches = tables["dq_results"].groupby(["run_id", "batch_id"]).ngroups
    assert quality.title.startswith(f"Data quality: {counted(batches, 'batch')} validated")
    assert quality.points >= 2 * batches > 0  # rows validated and unexpected rows, per batch


def test_ota_notebook_with_no_setting_draws_the_demos_phased_abort_and_compliance_and_writes_nothing(
    demo_run, scratch
):
    run = run_notebook("ota_rollout.ipynb", demo_run.repository / "notebooks", scratch)
    tables = demo_tables(demo_run)
    phased = demo_run.phased_action_id
    summary = tables["action_summary"].query("action_id == @phased").iloc[0]
    assert set(run.charts) == {"rollout_chart", "compliance_chart"}
    assert len(run.images()) == 2
    chart = run.charts["rollout_chart"]
    assert chart.title == f"Rollout of {phased}: ABORTED by abort_rules[0], {summary['total_count']} devices"
    assert chart.axes_titles == ["states over time (action_executions)", "final counts (action_summary)"]
    assert chart.areas > 0
    assert chart.points == 2 * summary["phase"]  # a dashed line where each phase it reached started
    final_states = [
        c
        for c in summary.index
        if c.endswith("_count") and c not in ("total_count", "retries_count") and summary[c] > 0
    ]
    assert chart.bars == len(final_states) > 0
    assert f"ABORTED: {summary['reason']}" in run.printed
    compliance = run.charts["compliance_chart"]
    groups = tables["fleet_compliance"]
    on_desired = int(groups[groups["on_desired"]]["devices"].sum())
    assert compliance.title == f"Compliance: {on_desired} of 20 devices on their group's desired version"
    assert compliance.bars == len(groups) > 0
    assert "No action written" in run.printed
    assert len(tables["actions"]) in (2, 3)  # the demo's two, and the rollback the job wrote for one of them


def test_the_demos_printed_setting_points_the_notebooks_at_its_tables(demo_run, scratch, monkeypatch):
    assert "no setting needed" in demo_run.stdout
    elsewhere = scratch / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("TIMESTONE_TABLES", demo_run.printed_tables)
    run = run_notebook("ota_rollout.ipynb", elsewhere, scratch)
    assert run.charts["rollout_chart"].title.startswith(f"Rollout of {demo_run.phased_action_id}: ABORTED")
    assert f"tables under {demo_run.repository / DEMO_TABLES} (delta-rs)" in run.printed
