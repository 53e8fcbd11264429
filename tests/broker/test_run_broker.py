"""The broker as a process: ``python -m broker_edge.main --config FILE`` serving MQTT, /metrics, /health,
$SYS topics and the offsets API, stopping cleanly on SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import yaml

from tests.broker.broker_test_clients import PahoClient
from tests.conftest import free_port


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} not open")


def test_run_broker_subprocess_with_yaml_config(tmp_path):
    mqtt_port, admin_port, api_port = free_port(), free_port(), free_port()
    config = {
        "listeners": [{"name": "main", "type": "tcp", "host": "127.0.0.1", "port": mqtt_port}],
        "admin_http": {"port": admin_port},
        "offsets_api": {"port": api_port},
        "storage": {"directory": str(tmp_path / "data")},
        "sys_topics": {"interval_s": 1},
        "logging": {"format": "json"},
    }
    path = tmp_path / "broker.yaml"
    path.write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [sys.executable, "-m", "broker_edge.main", "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_port(mqtt_port, process)
        sub = PahoClient(mqtt_port, "proc-sub")
        sub.subscribe("p/t", 1)
        sub.subscribe("$SYS/broker/uptime", 0)
        PahoClient(mqtt_port, "proc-pub").publish("p/t", b"through a process", 1)
        messages = sub.expect(2, timeout=5)
        by_topic = {m.topic: m.payload for m in messages}
        assert by_topic["p/t"] == b"through a process"
        assert by_topic["$SYS/broker/uptime"].endswith(b"seconds")
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/health", timeout=5).read())
        assert health["status"] == "ok" and health["listeners"] == {"main": mqtt_port}
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5).read().decode()
        assert 'timestone_broker_messages_received_total{listener="main",qos="1"} 1.0' in metrics
        logs = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{api_port}/v1/logs", timeout=5).read())
        assert [(log["topic"], log["end_offset"]) for log in logs["logs"]] == [("p/t", 1)]
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    connected = [line for line in lines if line["msg"].startswith("connected")]
    assert {line["client_id"] for line in connected} == {"proc-sub", "proc-pub"}


def test_run_broker_config_error_exit_status(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("limits:\n  max_conections: 5\n")
    result = subprocess.run(
        [sys.executable, "-m", "broker_edge.main", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 2
    assert "limits.max_conections" in result.stderr


def test_shipped_conf_broker_yaml_is_exactly_the_defaults():
    from pathlib import Path

    from broker_edge.config.broker import BrokerConfig, load_broker_config

    shipped = Path(__file__).resolve().parents[2] / "conf" / "broker.yaml"
    assert load_broker_config(shipped) == BrokerConfig()
