"""A cluster on loopback for the demo, benchmarks and tests: a real etcd and broker processes joining it.

- ``EtcdServer``: one single-member etcd (Debian's ``/usr/bin/etcd``) on free loopback ports, data directory
  of mode 0700; ``pause``/``resume`` freeze it (SIGSTOP) as if it were cut off.
- ``EtcdTarget``: an etcd and the key prefix of one cluster (several clusters may share one etcd).
- ``cluster_broker``: a ``BrokerProcess`` whose YAML has a ``cluster:`` section pointing at a target.
- ``cluster_state(target)``: members and partition states as stored in etcd (read over etcd's own JSON
  gateway, ``/v3/kv/range``: what the brokers wrote, not what a broker believes); ``settled`` and
  ``wait_settled`` wait for every partition to be in sync; ``wait_until`` polls a condition.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_edge.cluster.view import Member, PartitionState
from broker_edge.runtime.launcher import BrokerProcess, free_port

__all__ = [
    "ETCD_BINARY",
    "ClusterState",
    "EtcdServer",
    "EtcdTarget",
    "cluster_broker",
    "cluster_section",
    "cluster_state",
    "etcd_range",
    "settled",
    "wait_settled",
    "wait_until",
]

WAIT_S = 30.0

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


# -- etcd's record of the cluster ----------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def etcd_range(url: str, prefix: str) -> list[tuple[str, bytes]]:
    """``(key, value)`` of every key under ``prefix`` in the etcd at ``url`` (its JSON gateway)."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps({"key": _b64(prefix), "range_end": _b64(end)}).encode()
    request = urllib.request.Request(f"{url}/v3/kv/range", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        data = json.loads(answer.read())
    return [
        (base64.b64decode(kv["key"]).decode(), base64.b64decode(kv.get("value", "")))
        for kv in data.get("kvs", [])
    ]


@dataclass
class ClusterState:
    members: dict[str, Member] = field(default_factory=dict)
    partitions: dict[int, PartitionState] = field(default_factory=dict)

    def leaders(self) -> dict[str, int]:
        """node_id → partitions it leads."""
        counts: dict[str, int] = {}
        for state in self.partitions.values():
            if state.leader is not None:
                counts[state.leader] = counts.get(state.leader, 0) + 1
        return counts


def cluster_state(target: EtcdTarget) -> ClusterState:
    state = ClusterState()
    for _key, value in etcd_range(target.url, f"{target.prefix}/members/"):
        member = Member.from_json(value)
        state.members[member.node_id] = member
    for _key, value in etcd_range(target.url, f"{target.prefix}/partitions/"):
        partition = PartitionState.from_json(value)
        state.partitions[partition.partition] = partition
    return state


def wait_settled(target: EtcdTarget, nodes: set[str], replicas: int, timeout: float = WAIT_S) -> None:
    """Wait until the cluster on ``target`` is ``nodes`` with every partition fully in sync."""
    wait_until(
        lambda: settled(target, nodes, replicas),
        timeout,
        f"{sorted(nodes)} settled with {replicas} in-sync replicas per partition",
        lambda: cluster_state(target),
    )


def settled(target: EtcdTarget, nodes: set[str], replicas: int, partitions: int = 16) -> bool:
    """Every partition led by one of ``nodes``, with ``replicas`` in-sync replicas, all of them live."""
    state = cluster_state(target)
    if set(state.members) != nodes or len(state.partitions) != partitions:
        return False
    return all(
        p.leader in nodes and len(p.isr) == replicas and set(p.isr) <= nodes
        for p in state.partitions.values()
    )


def wait_until(
    condition: Callable[[], bool],
    timeout: float = WAIT_S,
    what: str = "condition",
    state: Callable[[], object] | None = None,
) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` (and showing ``state()``) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            shown = f": {state()}" if state is not None else ""
            raise AssertionError(f"timed out waiting for {what}{shown}")
        time.sleep(0.1)
