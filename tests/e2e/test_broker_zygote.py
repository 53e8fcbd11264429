"""The tests' fork server (tests/harness/broker_zygote.py): a forked broker is the broker a spawned one is.

It serves on its ports, writes its log, ends with the exit status a spawned broker's ``Popen`` would give
(0 after SIGTERM, -9 after SIGKILL, 2 for a configuration error), sees the environment it was started with,
and a start the server cannot make as ``python -m`` would is left to ``subprocess.Popen``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from tests.harness.broker_zygote import ForkedProcess, ForkServer


@pytest.fixture
def server() -> Iterator[ForkServer]:
    server = ForkServer().start(dict(os.environ, PYTHONUNBUFFERED="1"))
    yield server
    server.stop()


def forked(server: ForkServer, directory: Path, **sections: Any) -> BrokerProcess:
    broker = BrokerProcess(directory, **sections)
    with open(broker.log_path, "ab") as log:
        command = [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(broker.config_path)]
        process = server.spawn(command, log, dict(os.environ, PYTHONUNBUFFERED="1"))
    assert isinstance(process, ForkedProcess)
    broker.process = process
    return broker


def test_a_forked_broker_serves_logs_and_ends_as_a_spawned_one_would(
    server: ForkServer, tmp_path: Path
) -> None:
    stopped = forked(server, tmp_path / "stopped")
    with socket.create_connection(("127.0.0.1", wait_listening(stopped)), timeout=5):
        pass
    stopped.stop()
    assert stopped.process is not None and stopped.process.returncode == 0
    assert "broker stopped" in stopped.log_path.read_text()

    killed = forked(server, tmp_path / "killed")
    wait_listening(killed)
    killed.kill()
    assert killed.process is not None and killed.process.returncode == -signal.SIGKILL

    refused = forked(server, tmp_path / "refused", limits={"max_connections": "many"})
    assert refused.process is not None and refused.process.wait(timeout=30) == 2
    assert "limits.max_connections" in refused.log_path.read_text()


def test_a_forked_broker_has_the_environment_it_was_started_with(
    server: ForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variable set after the server started that no module reads on import (pytest's own for each test,
    Spark's) is the start's, not the server's (a config's ``!env`` reads it); one a module might read on
    import is not forked but spawned, as is another interpreter."""
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "named-by-the-environment")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)  # as the shared SparkSession sets it
    broker = BrokerProcess(tmp_path / "broker")
    config = broker.config_path.read_text()
    broker.config_path.write_text(config.replace("name: mqtt", "name: !env PYTEST_CURRENT_TEST"))
    command = [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(broker.config_path)]
    with open(broker.log_path, "ab") as log:
        process = server.spawn(command, log, dict(os.environ, PYTHONUNBUFFERED="1"))
        assert isinstance(process, ForkedProcess)
        monkeypatch.setenv("TIMESTONE_SET_LATER", "1")
        assert server.spawn(command, log, dict(os.environ, PYTHONUNBUFFERED="1")) is None
        assert server.spawn(["python3", *command[1:]], log, dict(os.environ)) is None
    broker.process = process
    wait_listening(broker)
    broker.stop()
    assert "listening: named-by-the-environment tcp" in broker.log_path.read_text()


def test_brokers_started_by_the_suite_are_forked(tmp_path: Path) -> None:
    """The suite's brokers come from its fork server (tests/conftest.py), unless the environment differs."""
    if os.environ.get("TIMESTONE_TESTS_FORK") == "0":
        assert BrokerProcess.spawn is None
        return
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        assert isinstance(broker.process, ForkedProcess)
    finally:
        broker.stop()
    assert broker.process.returncode == 0


def wait_listening(broker: BrokerProcess) -> int:
    """The broker's MQTT port, once it listens there."""
    from broker_edge.runtime.launcher import wait_for_port

    assert broker.process is not None
    wait_for_port(broker.port, timeout_s=30, alive=broker.process.poll)
    return broker.port


def test_a_command_the_server_cannot_fork_is_spawned(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "wrapped")
    broker.wrapper = ("env",)
    broker.start()
    try:
        assert type(broker.process) is subprocess.Popen
    finally:
        broker.stop()
