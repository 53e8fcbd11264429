"""``timestone demo``, the README's main command, runs end to end and reports a finished rollout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from pipelines.demo import first_phase_size
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
    assert outcome.group(1) in store.read_arrow("actions")["id"].to_pylist()


def test_demo_stops_a_phased_bad_build_on_its_abort_rule_and_rolls_back_the_devices_that_installed_it(
    demo_run,
):
    store = open_table_store(None, str(demo_run.repository / DEMO_TABLES), backend="delta-rs")
    phased = demo_run.phased_action_id
    summary = next(r for r in store.read_arrow("action_summary").to_pylist() if r["action_id"] == phased)
    assert (summary["action_state"], summary["aborted_by"]) == ("ABORTED", "abort_rules[0]")
    assert summary["reason"].startswith("abort_rules[0] (failed) 10 % reached: ")
    executions = [r for r in store.read_arrow("action_executions").to_pylist() if r["action_id"] == phased]
    assert len(executions) == 10  # group fleet
    sent = [r for r in executions if r["published_at"] is not None]
    # the README's outcome: stopped by its rule in its first phase, no device beyond that phase sent the build
    assert summary["phase"] == 1 and f"Outcome of {phased}: ABORTED in phase 1" in demo_run.stdout
    assert all(r["phase"] == 1 for r in sent) and len(sent) <= first_phase_size(len(executions))
    assert all(r["state"] == "CANCELED" for r in executions if r["published_at"] is None)
    installed = sorted(r["device_id"] for r in executions if r["state"] == "SUCCEEDED")
    rows = {r["id"]: r for r in store.read_arrow("actions").to_pylist()}
    assert set(rows) == {demo_run.action_id, phased} | ({f"{phased}-rollback"} if installed else set())
    if installed:  # the rollback targets exactly the devices that had installed the bad build
        assert summary["rollback_action_id"] == f"{phased}-rollback"
        assert rows[f"{phased}-rollback"]["target"]["device_ids"] == installed
        # every device it targets ends; the demo's devices fail or reject any install at their --failure-rate
        # and --reject-rate, a rollback's too: the line shows what the summary counted
        rollback_id = f"{phased}-rollback"
        summaries = store.read_arrow("action_summary").to_pylist()
        rollback = next(r for r in summaries if r["action_id"] == rollback_id)
        assert (rollback["action_state"], rollback["total_count"]) == ("COMPLETED", len(installed))
        ended = sum(rollback[f"{state}_count"] for state in ("succeeded", "failed", "rejected", "timed_out"))
        assert ended == len(installed)
        succeeded = rollback["succeeded_count"]
        shown = f"Outcome of the rollback: COMPLETED, {succeeded} of {len(installed)} devices back on 1.0.0"
        assert shown in demo_run.stdout, demo_run.stdout[-2000:]
    else:
        assert summary["reason"].endswith("no device had installed it: nothing to roll back")


def test_the_follow_up_the_demo_prints_shows_its_rollout(demo_run):
    """The line is run as printed, copied into a shell in the directory the demo ran from, whose PATH is a
    user's: not this virtual environment's bin/ (``make demo`` runs ``.venv/bin/timestone`` without it)."""
    out = demo_run.stdout
    follow_up = re.search(r"^Follow-up:\s+(\S*timestone ota status .+)$", out, re.MULTILINE)
    assert follow_up, out[-2000:]
    action_id = re.search(r"Outcome of (\S+):", out).group(1)
    bin_dir = str(Path(sys.executable).parent)
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if d != bin_dir)
    result = subprocess.run(
        follow_up.group(1),
        shell=True,
        cwd=demo_run.repository,
        env=dict(os.environ, PATH=path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (follow_up.group(1), result.stderr[-2000:])
    row = next(line for line in result.stdout.splitlines() if line.startswith(action_id))
    assert row.split()[1:3] == ["ota", "COMPLETED"]
    assert "group canary" in row and "actions job: stopped on " in result.stdout


def test_the_demo_logs_no_librarys_chatter(demo_run):
    """The demo's log is its warnings: Great Expectations' INFO records (its ephemeral docs site, a temporary
    directory per validation) stay out, though it sets its own loggers to INFO when first imported."""
    chatter = [line for line in demo_run.stderr.splitlines() if re.match(r"(DEBUG|INFO) \S+: ", line)]
    assert chatter == []
