"""A Timestone broker run as its own process through the real command line, for end-to-end tests.

Running ``timestone broker --config FILE`` as a subprocess proves the command and the YAML config, keeps the
broker's event loop away from the test's threads (Spark, clients), and lets a test kill it with SIGKILL and
start it again on the same ports and data directory, as a crash would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import free_port, wait_for_port


class BrokerProcess:
    """One broker: MQTT on ``port``, offsets API on ``offsets_port``, data in ``directory / "data"``."""

    def __init__(self, directory: Path, name: str = "edge-1", **sections: Any) -> None:
        self.directory = directory
        self.name = name
        self.port = free_port()
        self.offsets_port = free_port()
        self.admin_port = free_port()
        directory.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "listeners": [{"name": "mqtt", "host": "127.0.0.1", "port": self.port}],
            "storage": {"directory": str(directory / "data")},
            "offsets_api": {"host": "127.0.0.1", "port": self.offsets_port},
            "admin_http": {"host": "127.0.0.1", "port": self.admin_port},
        }
        for key, value in sections.items():
            config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
        self.config_path = directory / "broker.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = directory / "broker.log"
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    @property
    def offsets_url(self) -> str:
        return f"http://127.0.0.1:{self.offsets_port}"

    def start(self) -> BrokerProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        try:
            wait_for_port(self.port)
            wait_for_port(self.offsets_port)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"broker did not start:\n{self.log_path.read_text()[-3000:]}") from None
        return self

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, no flush, as a power cut would leave it."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
