"""The broker launcher the demo, benchmarks and tests use: a port taken between probe and bind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from broker_edge.runtime.launcher import BrokerProcess


def _bind(port: int) -> socket.socket:
    """A socket bound to ``port`` and not listening, as another process's outgoing connection holds one."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    return sock


def test_a_first_start_chooses_again_a_port_another_process_took(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "broker")
    taken = broker.offsets_port
    squatter = _bind(taken)
    try:
        with broker:
            assert broker.offsets_port != taken
            with socket.create_connection(broker.address, timeout=5):
                pass
            assert "Address already in use" in broker.log_path.read_text()
    finally:
        squatter.close()


def test_a_first_start_chooses_again_a_listener_port_taken_when_a_section_leaves_its_ports_to_it(
    tmp_path: Path,
) -> None:
    """The MQTT listener's port taken (the event loop words it "address already in use"), and an
    ``offsets_api`` section that sets only its tokens: the ports are still the launcher's to choose again."""
    tokens = {"tokens": [{"name": "reader", "token": "t" * 32}]}
    broker = BrokerProcess(tmp_path / "broker", offsets_api=tokens)
    taken = broker.port
    squatter = _bind(taken)
    try:
        with broker:
            assert broker.port != taken
            with socket.create_connection(broker.address, timeout=5):
                pass
            assert "address already in use" in broker.log_path.read_text().lower()
    finally:
        squatter.close()


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
