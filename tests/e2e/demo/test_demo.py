"""``timestone demo``, the README's main command, runs end to end and reports a finished rollout."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from pipelines.views.location import DEMO_TABLES
from sinks import open_table_store


def test_demo_runs_the_whole_platform_and_every_canary_device_finishes(demo_run):
    out = demo_run.stdout
    outcome = re.search(r"Outcome of (\S+): (\w+)", out)
    assert outcome and outcome.group(2) == "COMPLETED", out[-2000:]
    counts = {name: int(n) for name, n in re.findall(r"^  (\w+)\s+(\d+)$", out, re.MULTILINE)}
    assert counts["queued"] == counts["in_progress"] == 0
    assert counts["succeeded"] + counts["failed"] + counts["rejected"] + counts["timed_out"] == 10
    bronze = int(re.search(r"Telemetry: ([\d,]+) rows in bronze", out).group(1).replace(",", ""))
    assert bronze > 0
    store = open_table_store(None, str(demo_run.repository / DEMO_TABLES), backend="delta-rs")
    assert store.read_arrow("devices").num_rows == 20
    assert store.read_arrow("actions")["id"].to_pylist() == [outcome.group(1)]


def test_the_follow_up_the_demo_prints_shows_its_rollout(demo_run):
    out = demo_run.stdout
    follow_up = re.search(r"^Follow-up:\s+timestone (.+)$", out, re.MULTILINE)
    assert follow_up, out[-2000:]
    action_id = re.search(r"Outcome of (\S+):", out).group(1)
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *shlex.split(follow_up.group(1))],
        cwd=demo_run.repository,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    row = next(line for line in result.stdout.splitlines() if line.startswith(action_id))
    assert row.split()[1:3] == ["ota", "COMPLETED"]
    assert "group canary" in row and "actions job: stopped on " in result.stdout
