"""What ``systemctl stop`` does to a broker serving devices over TLS (the unit's ``KillSignal=SIGTERM``):
publishers sending QoS 1 flat out, the broker stops at once (exit 0, well within ``TimeoutStopSec``), every
connection ends, and after the next start every publish it acknowledged is in the log. What systemd itself
does cannot run here (no systemd as PID 1): the unit's content is checked by
``tests/e2e/packaging/test_systemd_units.py``."""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
import yaml

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import free_ports, wait_for_port
from pipelines.cli import main
from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.commitlog.e2e_helpers import read_log

pytestmark = pytest.mark.timeout(120)
TOPIC = "plant/1/temp"


class Publisher:
    """A TLS client publishing ``name:<seq>`` at QoS 1, at most 100 unacknowledged, until told to stop."""

    def __init__(self, name: str, port: int, version: int, ca: Path) -> None:
        self.name = name
        self.client = PahoClient(
            port, name, version=version, tls_context=ssl.create_default_context(cafile=ca)
        )
        self.infos: list[mqtt.MQTTMessageInfo] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._publish, daemon=True)
        self.thread.start()

    def _publish(self) -> None:
        while not self.stopping.is_set():
            if len(self.infos) - len(self.acked) > 100:
                time.sleep(0.001)
                continue
            info = self.client.client.publish(TOPIC, f"{self.name}:{len(self.infos)}", 1)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                return
            self.infos.append(info)

    @property
    def acked(self) -> list[int]:
        return [seq for seq, info in enumerate(list(self.infos)) if info.is_published()]


def test_sigterm_under_tls_load_stops_at_once_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    assert main(["pki", "ca", str(tmp_path / "ca")]) == 0
    assert main(["pki", "issue", "server", "edge", "--ca", str(tmp_path / "ca"), "--ip", "127.0.0.1"]) == 0
    port, offsets_port = free_ports(2)
    tls = {
        "certfile": str(tmp_path / "ca" / "server-edge.pem"),
        "keyfile": str(tmp_path / "ca" / "server-edge.key"),
    }
    config = {
        "listeners": [{"name": "devices", "type": "tls", "host": "127.0.0.1", "port": port, "tls": tls}],
        "storage": {"directory": str(tmp_path / "data")},
        "offsets_api": {"host": "127.0.0.1", "port": offsets_port},
        "admin_http": {"port": 0},
        "limits": {"messages_per_second_per_client": 0},
    }
    (tmp_path / "broker.yaml").write_text(yaml.safe_dump(config))

    def start() -> subprocess.Popen[bytes]:
        with open(tmp_path / "broker.log", "ab") as log:
            command = [
                sys.executable,
                "-m",
                "pipelines.cli",
                "broker",
                "--config",
                str(tmp_path / "broker.yaml"),
            ]
            broker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(port, alive=broker.poll)
        return broker

    broker = start()
    ca = tmp_path / "ca" / "ca.pem"
    publishers = [Publisher(f"v5-{n}", port, 5, ca) for n in range(2)] + [Publisher("v311", port, 4, ca)]
    try:
        assert wait_for(lambda: min(len(p.acked) for p in publishers) >= 300, timeout=30)
        stopped_at = time.monotonic()
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(timeout=20) == 0
        assert time.monotonic() - stopped_at < 10  # the unit's TimeoutStopSec is 60
        for publisher in publishers:
            publisher.stopping.set()
            publisher.thread.join(timeout=10)
        for publisher in publishers:  # each connection ended (MQTT 5 ones are sent 0x8B, which a client
            publisher.client.disconnects.get(timeout=5)  # may lose to the reset of a socket closed unread)
        acked = {p.name: p.acked for p in publishers}
        broker = start()
        with OffsetsClient(f"http://127.0.0.1:{offsets_port}", retry_backoff_s=0.2) as reader:
            rows = read_log(reader, TOPIC)
    finally:
        for publisher in publishers:
            publisher.stopping.set()
            publisher.client.close()
        broker.terminate()
        broker.wait(timeout=20)
    logged = {row["payload"].decode() for row in rows}
    for name, seqs in acked.items():
        missing = [seq for seq in seqs if f"{name}:{seq}" not in logged]
        assert not missing, f"{name}: acknowledged but not in the log after the stop: {missing[:10]}"
    assert "Traceback" not in (tmp_path / "broker.log").read_text()
