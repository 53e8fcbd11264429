"""The broker launcher the demo, benchmarks and tests use: a port taken between probe and bind."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from broker_edge.runtime.launcher import BrokerProcess


def _bind(port: int) -> socket.socket:
    """A socket bound to ``port`` and not listening, as another process's outgoing connection holds one."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    return sock


@pytest.mark.parametrize(
    ("sections", "port", "said"),
    [
        ({}, "offsets_port", "Address already in use"),
        # an offsets_api that sets only its tokens leaves its port to the launcher; the event loop words a
        # listener's taken port in lower case
        (
            {"offsets_api": {"tokens": [{"name": "reader", "token": "t" * 32}]}},
            "port",
            "address already in use",
        ),
    ],
    ids=["offsets-port", "listener-port-with-a-section"],
)
def test_a_first_start_chooses_again_a_port_another_process_took(
    tmp_path: Path, sections: dict[str, Any], port: str, said: str
) -> None:
    broker = BrokerProcess(tmp_path / "broker", **sections)
    taken = getattr(broker, port)
    squatter = _bind(taken)
    try:
        with broker:
            assert getattr(broker, port) != taken
            with socket.create_connection(broker.address, timeout=5):
                pass
            assert said in broker.log_path.read_text()
    finally:
        squatter.close()


class _FirstListenerOnly(BrokerProcess):
    module = "tests.e2e.launcher_stand_in"


def test_a_start_does_not_return_on_another_processs_answer_on_the_brokers_port(tmp_path: Path) -> None:
    """Another process listens on the offsets API's port, taken after the probe, while the broker is alive
    and has bound only its MQTT port: the port answers, but not from the broker (which then fails to bind
    it). The start waits for the broker's own listener and, when none comes, says it did not start."""
    broker = _FirstListenerOnly(tmp_path / "broker")
    squatter = socket.create_server(("127.0.0.1", broker.offsets_port))
    try:
        with pytest.raises(RuntimeError, match="broker did not start"):
            broker.start(timeout_s=3)
        assert broker.process is not None and broker.process.poll() is not None  # stopped, not left behind
    finally:
        squatter.close()
        broker.kill()


def test_a_restart_keeps_its_ports_and_says_why_it_could_not_start(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "broker").start()
    ports = (broker.port, broker.offsets_port)
    broker.kill()
    squatter = _bind(broker.offsets_port)
    try:
        with pytest.raises(RuntimeError, match="Address already in use"):
            broker.start(timeout_s=10)
        assert (broker.port, broker.offsets_port) == ports
    finally:
        squatter.close()
        broker.stop()
