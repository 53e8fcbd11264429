"""The production examples of docs/operations.md, started as the doc writes them (``doc_runner``): after
``timestone pki`` issued their files, each serves its clients as the doc says, and nothing of it is mocked."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.e2e.operations.doc_runner import ROOT, commands, run_as_written

DOC = ROOT / "docs" / "operations.md"

pytestmark = [
    pytest.mark.timeout(400),
    pytest.mark.skipif(os.geteuid() != 0, reason="the doc's machine is made of namespaces and mounts: root"),
    pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="mosquitto-clients (.ci/system-deps)"),
]


def test_a_production_broker_starts_as_written_and_serves_devices_and_readers(tmp_path: Path) -> None:
    done = run_as_written(commands(DOC, "broker"), {"edge-7.plant.example": "10.0.0.7"}, tmp_path)
    assert done.returncode == 0, done.output[-4000:]
    lines = done.output.splitlines()
    assert "21.5" in lines  # the device read back what it published, over TLS, with its password
    health = json.loads(next(line for line in lines if line.startswith('{"status"')))
    assert health["status"] == "ok"
    listing = json.loads(next(line for line in lines if line.startswith('{"logs"')))
    assert [log["topic"] for log in listing["logs"]] == ["devices/device-1/temp"]
    (log,) = done.logs.values()
    assert "listening: devices tls on 0.0.0.0:8883 (anonymous refused)" in log
    assert " WARNING " not in log and " ERROR " not in log
