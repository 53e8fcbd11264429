"""A default broker serving MQTT loads no numpy, pandas, pyarrow or aiohttp; the first use of each loads it.

The broker runs as the real command (`python -m pipelines.cli broker --config FILE`, defaults but free ports
and a temporary data directory) with `PYTHONPROFILEIMPORTTIME=1`: the interpreter writes a line to its log
for every module as it is imported, so the log says what the process had loaded at each moment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess, wait_for_port
from tests.e2e.broker_clients import PahoClient

HEAVY = {"numpy", "pandas", "pyarrow", "pyspark", "deltalake", "great_expectations"}
_IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)\s*$")


def imported_modules(log_path: Path) -> set[str]:
    """Top-level names of the modules the broker's importtime lines show as imported so far."""
    names = set()
    for line in log_path.read_text(errors="replace").splitlines():
        match = _IMPORT_LINE.match(line)
        if match:
            names.add(match.group(1).partition(".")[0])
    return names


@pytest.fixture
def profiled_broker(tmp_path):
    """The broker, started without touching its HTTP ports (a TCP probe there would load the HTTP stack)."""
    broker = BrokerProcess(tmp_path / "broker")
    with open(broker.log_path, "ab") as log:
        broker.process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(broker.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPROFILEIMPORTTIME="1"),
        )
    try:
        wait_for_port(broker.port)
        yield broker
    finally:
        broker.stop()


def test_default_broker_serves_mqtt_without_heavy_modules_and_loads_arrow_on_first_fetch(profiled_broker):
    broker = profiled_broker
    publisher = PahoClient(broker.port, "meter-1")
    for number in range(3):
        publisher.publish("plant/meter-1", f"reading {number}".encode(), 1)
    publisher.disconnect()
    mqtt_only = imported_modules(broker.log_path)
    with urllib.request.urlopen(
        f"{broker.offsets_url}/v1/logs/plant%2Fmeter-1/records?offset=0&format=jsonl"
    ) as answer:
        lines = [json.loads(line) for line in answer.read().splitlines()]
    before_arrow = imported_modules(broker.log_path)

    with OffsetsClient(broker.offsets_url) as client:
        table = client.fetch_arrow("plant/meter-1", 0)
    after_arrow = imported_modules(broker.log_path)

    assert "broker_edge" in mqtt_only and "uvloop" in mqtt_only  # the profile covers the broker
    assert mqtt_only & (HEAVY | {"aiohttp"}) == set()  # HTTP too is loaded by its first request
    assert "aiohttp" in before_arrow
    assert before_arrow & HEAVY == set()
    assert [line["payload_text"] for line in lines] == ["reading 0", "reading 1", "reading 2"]
    assert {"pyarrow", "numpy"} <= after_arrow
    # (pyarrow itself imports pandas when it is installed: it looks for pandas objects in what it converts)
    assert after_arrow & {"pyspark", "deltalake", "great_expectations"} == set()
    assert table.column("payload").to_pylist() == [b"reading 0", b"reading 1", b"reading 2"]
    assert table.column("offset").to_pylist() == [0, 1, 2]
