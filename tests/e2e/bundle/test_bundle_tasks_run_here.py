"""databricks.yml's tasks run here as a cluster runs them (``timestone <parameters>``, a process of its own),
on local paths: each names ``backend: native``, Spark's own Delta, which a Databricks runtime has and this
machine (no delta-spark) has not. Each says so in one line naming the key, status 2, before Spark starts."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.bundle.test_databricks_bundle import job

TASKS = [
    ("telemetry", 0, "timestone pipeline telemetry", "telemetry.tables.backend"),
    ("actions", 0, "timestone pipeline actions", "backend"),
    ("maintenance", 0, "timestone tables maintain telemetry", "telemetry.tables.backend"),
    ("maintenance", 1, "timestone tables maintain actions", "backend"),
]


@pytest.mark.skipif(
    importlib.util.find_spec("delta") is not None, reason="delta-spark installed: native runs"
)
@pytest.mark.parametrize(("name", "task", "prefix", "key"), TASKS, ids=[t[2] for t in TASKS])
def test_a_bundle_task_run_without_spark_delta_says_so_in_one_line(tmp_path: Path, name, task, prefix, key):
    parameters = job(name, "prod")["tasks"][task]["python_wheel_task"]["parameters"]
    section = "telemetry." if key.startswith("telemetry.") else ""
    local = [
        f"{section}{'tables.root' if section else 'tables_root'}={tmp_path / 'lake'}",
        f"{section}{'stream.checkpoint' if section else 'checkpoint_root'}={tmp_path / 'checkpoint'}",
    ]
    env = {k: v for k, v in os.environ.items() if k != "DATABRICKS_RUNTIME_VERSION"}
    env |= {
        f"TIMESTONE_{n}": "from-the-secret-scope"
        for n in ("OFFSETS_API_TOKEN", "MQTT_USERNAME", "MQTT_PASSWORD")
    }
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *parameters, *(a for s in local for a in ("--set", s))],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip() == (
        f"{prefix}: {key}: native needs Spark's own Delta (a Databricks runtime, or the delta-spark package, "
        f"which is not installed here); auto or delta-rs write the tables with delta-rs (from --set {key})"
    )  # the bundle's own --set chose native
    assert not (tmp_path / "lake").exists()
