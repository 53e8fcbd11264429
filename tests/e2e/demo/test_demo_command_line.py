"""What ``timestone demo`` refuses on its command line, before it starts anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_one_device_is_refused_the_demos_two_groups_need_one_each(tmp_path: Path) -> None:
    """``timestone demo --devices 1`` ran a minute, its canary rollout completed, then it ended in a
    traceback (``InvalidAction: phases[0].devices: must be from 1 to 10000000, got 0``): its one device was
    in group canary and none in fleet, the bad build's group."""
    workdir = tmp_path / "demo"
    command = [sys.executable, "-m", "pipelines.cli", "demo", "--devices", "1", "--workdir", str(workdir)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "timestone demo: error: argument --devices: expected 2 or more "
        "(a device in each of the demo's groups, canary and fleet), got 1"
    )
    assert not workdir.exists()
