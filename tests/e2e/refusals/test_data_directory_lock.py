"""One broker per data directory: a second broker on the same ``storage.directory`` refuses to start, naming
the directory and the holder, and nothing the first one acknowledged is lost; the kernel's lock goes with the
process, so a broker killed by SIGKILL never blocks the next start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from broker_edge.config import ConfigError
from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess, free_port
from tests.e2e.broker_clients import PahoClient
from tests.e2e.commitlog.e2e_helpers import read_log


def publish_acknowledged(port: int, first: int, count: int) -> None:
    publisher = PahoClient(port, f"meter-{first}")
    for number in range(first, first + count):
        publisher.publish("plant/meter/7", str(number), 1)  # returns once PUBACKed
    publisher.disconnect()


def second_broker_on(data: Path, config_path: Path) -> subprocess.CompletedProcess[str]:
    """``timestone broker`` with its own ports over ``data``: a second one started by mistake."""
    config = {
        "listeners": [{"name": "mqtt", "host": "127.0.0.1", "port": free_port()}],
        "storage": {"directory": str(data)},
        "offsets_api": {"host": "127.0.0.1", "port": free_port()},
        "admin_http": {"host": "127.0.0.1", "port": free_port()},
    }
    config_path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config_path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_second_broker_on_the_same_directory_refuses_and_nothing_acknowledged_is_lost(tmp_path):
    first = BrokerProcess(tmp_path / "first").start()
    data = first.directory / "data"
    try:
        publish_acknowledged(first.port, 0, 20)
        second = second_broker_on(data, tmp_path / "second.yaml")
        assert second.returncode == 2, second.stderr
        assert "storage.directory" in second.stderr
        assert str(data) in second.stderr
        assert f"pid {first.process.pid} on host" in second.stderr  # the holder, from the lock file
        publish_acknowledged(first.port, 20, 20)  # the first broker never noticed
        first.kill()  # a crash: the kernel releases the lock with the process, the file stays
        assert (data / ".lock").exists()
    finally:
        first.stop()
    restarted = BrokerProcess(tmp_path / "first").start()  # starts: a lock file alone holds nothing
    try:
        with OffsetsClient(restarted.offsets_url) as client:
            payloads = [row["payload"] for row in read_log(client, "plant/meter/7")]
        assert payloads == [str(n).encode() for n in range(40)]
    finally:
        restarted.stop()


def test_brokers_of_one_process_take_turns_on_a_directory(brokers):
    first = brokers("shared")
    with pytest.raises(ConfigError, match=r"storage\.directory: the data directory .*shared is in use"):
        brokers("shared")
    first.stop()
    again = brokers("shared")  # released at stop
    assert again.broker.data_lock.held
