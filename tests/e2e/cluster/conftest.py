"""Fixtures of the cluster suite: a real etcd (Debian's ``/usr/bin/etcd``) and real broker processes.

- ``etcd_server`` (session): one etcd on free loopback ports (client and peer), data directory of mode 0700,
  ``--logger=zap``; shared by the tests, each of which works under its own key prefix.
- ``etcd`` → ``EtcdTarget(url, prefix)``: that server and a prefix nobody else uses.
- ``private_etcd``: an etcd of the test's own, for tests that stop or pause it (SIGSTOP).
- ``cluster_brokers(node_id, **cluster)`` → a started ``BrokerProcess`` (``timestone broker --config``)
  whose YAML has a ``cluster:`` section pointing at ``etcd`` (free ports for MQTT, offsets API and admin);
  stopped at the end of the test. ``.stop()`` is SIGTERM, ``.kill()`` SIGKILL.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker_edge.launcher import BrokerProcess, free_port

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


_prefixes = itertools.count(1)


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def etcd(etcd_server: EtcdServer) -> EtcdTarget:
    """The shared etcd and a key prefix of this test's own."""
    return EtcdTarget(etcd_server, f"/test{os.getpid()}-{next(_prefixes)}")


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[EtcdTarget]:
    """An etcd of this test's own (it may pause or kill it)."""
    server = EtcdServer(tmp_path / "etcd").start()
    try:
        yield EtcdTarget(server, "/timestone")
    finally:
        server.kill()


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


@pytest.fixture
def cluster_brokers(tmp_path: Path, etcd: EtcdTarget) -> Iterator[Callable[..., BrokerProcess]]:
    """``cluster_brokers("b1", replication_factor=3)`` → a started broker joining this test's cluster."""
    started: list[BrokerProcess] = []

    def start(node_id: str, target: EtcdTarget | None = None, **cluster: Any) -> BrokerProcess:
        broker = cluster_broker(tmp_path, target or etcd, node_id, cluster)
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        broker.stop()
