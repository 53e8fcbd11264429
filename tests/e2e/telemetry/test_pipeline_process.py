"""``timestone pipeline telemetry`` as an operator runs it, in its own process: JSON log lines without
py4j's or Great Expectations' chatter, and Ctrl-C (SIGINT to the whole process group, as a terminal sends
it) stopping it between batches with one line, no traceback, exit status 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from broker_edge.runtime.launcher import free_port
from pipelines.supervisor import NOT_RESTARTABLE
from tests.e2e.sources.conftest import EdgeBroker
from tests.e2e.telemetry.telemetry_harness import Fleet, LogAppendPublisher

REPO = Path(__file__).resolve().parents[3]
JVM_START = (
    "WARNING: Using incubator modules",
    "Using Spark's default log4j profile",
    'Setting default log level to "WARN"',
    "To adjust logging level use sc.setLogLevel",
    "WARN NativeCodeLoader",
)
"""What the JVM prints as it starts, before any setting of ours applies."""


def test_json_logs_without_library_noise_and_ctrl_c_stops_between_batches(tmp_path):
    broker = EdgeBroker(tmp_path / "edge")
    try:
        Fleet([LogAppendPublisher("edge1", broker)], devices=3).send(rounds=4)
        argv = [sys.executable, "-m", "pipelines.cli", "pipeline", "telemetry", "--log-format", "json"]
        for override in (
            f"telemetry.source.brokers=[edge1={broker.url}]",
            f"telemetry.tables.root={tmp_path / 'tables'}",
            f"telemetry.stream.checkpoint={tmp_path / 'checkpoint'}",
            "telemetry.quality.gx.schedule=every_batch",
        ):
            argv += ["--set", override]
        process = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        lines: list[str] = []
        first_batch = threading.Event()

        def read() -> None:
            assert process.stderr is not None
            for line in process.stderr:
                lines.append(line.rstrip("\n"))
                if '"msg": "telemetry batch 0' in line:
                    first_batch.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert first_batch.wait(240), "\n".join(lines)
            time.sleep(1.0)  # the next trigger is under way
            os.killpg(process.pid, signal.SIGINT)
            assert process.wait(120) == 0, "\n".join(lines)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        reader.join(10)
    finally:
        broker.close()

    text = "\n".join(lines)
    assert "Traceback" not in text, text
    ours = [json.loads(line) for line in lines if line.startswith("{")]
    assert ours and all({"ts", "level", "logger", "msg"} <= set(entry) for entry in ours)
    assert not [e for e in ours if e["logger"].startswith(("py4j", "great_expectations"))], text
    assert any(e["logger"] == "pipelines.telemetry.job" and "started" in e["msg"] for e in ours)
    others = [line for line in lines if not line.startswith("{")]
    assert others[-2:] == [
        "timestone pipeline telemetry: SIGINT: stopping after the running batch (again to stop now)",
        "timestone pipeline telemetry: stopped",
    ], text
    assert all(line.startswith(JVM_START) or "WARN NativeCodeLoader" in line for line in others[:-2]), text


@pytest.mark.parametrize("run_flags", [(), ("--available-now",)], ids=["continuous", "available-now"])
def test_a_failure_no_restart_fixes_ends_the_job_with_a_status_its_service_does_not_restart(
    tmp_path, run_flags
):
    """A token the broker refuses fails the running query, and no restart changes that: the job stopped
    with exit status 1, which systemd's ``Restart=on-failure`` restarted every 10 s for ever, failing the
    same way. It stops with its own status, one the unit lists in ``RestartPreventExitStatus``. A run with
    ``--available-now`` asks the brokers before Spark starts, and took the refusal for a broker not
    answering (exit status 4, network trouble); it ends the same way as the continuous run."""
    broker = EdgeBroker(tmp_path / "edge", token="the-right-token")
    try:
        done = run_telemetry(
            tmp_path, broker.url, "telemetry.source.options={authToken: a-wrong-token}", flags=run_flags
        )
    finally:
        broker.close()
    assert done.returncode == NOT_RESTARTABLE, done.stderr[-3000:]
    assert "failed, not restarted: broker refused the token" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_a_table_that_does_not_match_its_declaration_ends_the_job_as_no_restart_fixes(tmp_path):
    """A table the job refuses as it starts its query (here partitioned otherwise than the job declares it)
    fails every start the same way; raised before the query ran, it ended the job with exit status 1, which
    systemd restarted every 10 s for ever. It ends it as a running query's failure of that kind does."""
    write_deltalake(str(tmp_path / "tables" / "bronze_telemetry"), pa.table({"x": pa.array([1], pa.int64())}))
    done = run_telemetry(tmp_path, f"http://127.0.0.1:{free_port()}")
    assert done.returncode == NOT_RESTARTABLE, done.stderr[-3000:]
    assert "failed: SchemaMismatch: bronze_telemetry: table is partitioned by []" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def run_telemetry(
    tmp_path: Path, broker_url: str, *overrides: str, flags: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """``timestone pipeline telemetry`` (with ``flags``) run to its end, reading ``broker_url``, its tables
    and checkpoint under ``tmp_path``."""
    argv = [sys.executable, "-m", "pipelines.cli", "pipeline", "telemetry", *flags]
    for override in (
        f"telemetry.source.brokers=[edge1={broker_url}]",
        f"telemetry.tables.root={tmp_path / 'tables'}",
        f"telemetry.stream.checkpoint={tmp_path / 'checkpoint'}",
        *overrides,
    ):
        argv += ["--set", override]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
