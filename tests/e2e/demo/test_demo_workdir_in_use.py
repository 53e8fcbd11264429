"""A second ``timestone demo`` in the working directory of one still running is refused: it would delete the
running demo's broker log, checkpoints and tables under it and share what it made again with it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def test_a_demo_refuses_the_working_directory_of_a_running_one(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    command = [sys.executable, "-m", "pipelines.cli", "demo", "--devices", "5", "--workdir", str(workdir)]
    first = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        text=True,
    )
    try:
        assert first.stdout is not None
        for line in first.stdout:
            if re.search(r"broker\s+MQTT 127\.0\.0\.1:\d+", line):
                break
        else:
            pytest.fail("the demo printed no broker line")
        held = sorted(path.name for path in workdir.iterdir())
        second = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
        assert second.stderr.strip().splitlines()[-1] == (
            f"timestone demo: error: --workdir {workdir} is in use by a demo still running "
            f"(pid {first.pid}): stop it, or give this one another --workdir"
        )
        assert sorted(path.name for path in workdir.iterdir()) == held
        assert (workdir / "broker" / "broker.yaml").is_file()
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
