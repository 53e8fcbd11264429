"""``timestone tables maintain`` prints one line per table and operation, a failed one included: a delta-rs
error carrying a Rust backtrace (``RUST_BACKTRACE=1``) is cut to its first line, where each FAILED line
went on for fifteen lines of ``<unknown>`` frames."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sinks.delta_rs import DeltaRsTableStore
from tests.e2e.sinks.conftest import arrow_rows, bronze_row


def test_a_table_whose_log_is_broken_fails_in_one_line_per_operation(tmp_path: Path) -> None:
    root = tmp_path / "tables"
    store = DeltaRsTableStore(None, str(root))
    for batch in range(2):
        data = arrow_rows("bronze_telemetry", [bronze_row(batch)])
        assert store.append("bronze_telemetry", data, "q", batch)
    (root / "bronze_telemetry" / "_delta_log" / "00000000000000000003.json").write_text('{"add": {trunc')
    command = [sys.executable, "-m", "pipelines.cli", "tables", "maintain", "telemetry"]
    command += ["--set", f"telemetry.tables.root={root}"]
    env = {**os.environ, "RUST_BACKTRACE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["bronze_telemetry", operation] for operation in ("retention", "compact", "vacuum", "tidy_log")
    ]
    assert all("FAILED" in line and str(root / "bronze_telemetry") in line for line in lines)
