"""``timestone demo``, the README's main command, runs end to end and reports a finished rollout."""

from __future__ import annotations

import re
import subprocess
import sys

from sinks import open_table_store


def test_demo_runs_the_whole_platform_and_every_canary_device_finishes(tmp_path):
    workdir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "demo", "--devices", "30", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    outcome = re.search(r"Outcome of (\S+): (\w+)", out)
    assert outcome and outcome.group(2) == "COMPLETED", out[-2000:]
    counts = {name: int(n) for name, n in re.findall(r"^  (\w+)\s+(\d+)$", out, re.MULTILINE)}
    assert counts["queued"] == counts["in_progress"] == 0
    assert counts["succeeded"] + counts["failed"] + counts["rejected"] + counts["timed_out"] == 15
    bronze = int(re.search(r"Telemetry: ([\d,]+) rows in bronze", out).group(1).replace(",", ""))
    assert bronze > 0
    store = open_table_store(None, str(workdir / "tables"), backend="delta-rs")
    assert store.read_arrow("devices").num_rows == 30
    assert store.read_arrow("actions")["id"].to_pylist() == [outcome.group(1)]
