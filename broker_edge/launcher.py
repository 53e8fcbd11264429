"""Run a Timestone broker as a child process with a generated config: for the demo, benchmarks and tests.

The child runs ``timestone broker --config FILE`` (through this interpreter), so it exercises the real command
and YAML loading, keeps its event loop away from the caller's threads (Spark, clients), and can be killed with
SIGKILL and started again on the same ports and data directory, as after a crash.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (for a child process that needs to know its port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, host: str = "127.0.0.1", timeout_s: float = 15.0) -> None:
    """Block until something accepts TCP connections on ``host:port``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port}")


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class BrokerProcess:
    """One broker on loopback: MQTT on ``port``, offsets API on ``offsets_port``, data under ``directory``.

    ``sections`` are config sections merged over the generated ones, e.g.
    ``limits={"max_connections": 20000}``.
    """

    #: the module run with `python -m` (its command line: `broker --config FILE`)
    module = "pipelines.cli"

    def __init__(self, directory: Path, name: str = "edge1", **sections: Any) -> None:
        self.directory = Path(directory)
        self.name = name
        self.port = free_port()
        self.offsets_port = free_port()
        self.admin_port = free_port()
        self.directory.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "listeners": [{"name": "mqtt", "host": "127.0.0.1", "port": self.port}],
            "storage": {"directory": str(self.directory / "data")},
            "offsets_api": {"host": "127.0.0.1", "port": self.offsets_port},
            "admin_http": {"host": "127.0.0.1", "port": self.admin_port},
        }
        self.config_path = self.directory / "broker.yaml"
        self.config_path.write_text(yaml.safe_dump(_merge(config, sections)))
        self.log_path = self.directory / "broker.log"
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    @property
    def offsets_url(self) -> str:
        return f"http://127.0.0.1:{self.offsets_port}"

    def start(self, timeout_s: float = 30.0) -> BrokerProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module, "broker", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        try:
            wait_for_port(self.port, timeout_s=timeout_s)
            wait_for_port(self.offsets_port, timeout_s=timeout_s)
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
        """SIGTERM and wait for a clean shutdown (SIGKILL after 15 s)."""
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
