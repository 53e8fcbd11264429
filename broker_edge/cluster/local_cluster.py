"""A cluster on loopback for the demo, benchmarks and tests: a real etcd and broker processes joining it.

- ``EtcdServer``: one single-member etcd (Debian's ``/usr/bin/etcd``) on free loopback ports, data directory
  of mode 0700; ``pause``/``resume`` freeze it (SIGSTOP) as if it were cut off.
- ``EtcdTarget``: an etcd and the key prefix of one cluster (several clusters may share one etcd).
- ``cluster_broker``: a ``BrokerProcess`` whose YAML has a ``cluster:`` section pointing at a target.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_edge.launcher import BrokerProcess, free_port

__all__ = ["ETCD_BINARY", "EtcdServer", "EtcdTarget", "cluster_broker", "cluster_section"]

ETCD_BINARY = shutil.which("etcd") or "/usr/bin/etcd"


class EtcdServer:
    """One single-member etcd on loopback: ``url`` for clients; ``pause``/``resume`` freeze it (SIGSTOP)."""

    def __init__(self, directory: Path, name: str = "etcd") -> None:
        self.directory = Path(directory)
        self.name = name
        self.client_port = free_port()
        self.peer_port = free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.data_dir = self.directory / f"{name}.data"
        self.log_path = self.directory / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> EtcdServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        peer = f"http://127.0.0.1:{self.peer_port}"
        command = [
            ETCD_BINARY,
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir),
            "--logger=zap",
            "--log-level=warn",
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"{self.name}={peer}",
            "--initial-cluster-state",
            "new",
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited:\n{self.log_path.read_text()[-3000:]}")
            if self.healthy():
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"etcd did not become healthy:\n{self.log_path.read_text()[-3000:]}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as answer:
                return bool(json.loads(answer.read()).get("health") == "true")
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def pause(self) -> None:
        """SIGSTOP: etcd answers nothing (as if cut off) until ``resume``."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)


@dataclass(frozen=True)
class EtcdTarget:
    """An etcd to use and the key prefix that is this test's alone."""

    server: EtcdServer
    prefix: str

    @property
    def url(self) -> str:
        return self.server.url


def cluster_section(target: EtcdTarget, node_id: str, **overrides: Any) -> dict[str, Any]:
    """A ``cluster:`` section for ``node_id`` on ``target`` (advertised addresses default to bound ones)."""
    section: dict[str, Any] = {"node_id": node_id, "etcd": [target.url], "key_prefix": target.prefix}
    section.update(overrides)
    return section


def cluster_broker(
    directory: Path, target: EtcdTarget, node_id: str, cluster: dict[str, Any] | None = None, **sections: Any
) -> BrokerProcess:
    """A broker process (not started) that joins the cluster on ``target`` as ``node_id``; its config file
    is ``directory/<node_id>/broker.yaml``, its log ``broker.log`` beside it."""
    section = cluster_section(target, node_id, **(cluster or {}))
    return BrokerProcess(directory / node_id, name=node_id, cluster=section, **sections)
