"""A cluster on loopback for the benchmarks and tests: a real etcd and broker processes joining it,
set up as production is (docs/security.md), with throwaway certificates (``broker_edge.runtime.local_pki``).

- ``EtcdServer``: one single-member etcd (Debian's ``/usr/bin/etcd``) on free loopback ports, data directory
  of mode 0700; by default with TLS and client certificates (``--client-cert-auth``) and etcd's user
  auth on (``auth enable``, a root user for the tests' own reads and writes; password hashes of the least
  bcrypt cost, ``BCRYPT_FLAGS``); ``user_for(prefix)`` makes
  the user of one cluster, whose role reaches that prefix only, with the same ``etcdctl`` commands the
  docs give. ``pause``/``resume`` freeze it (SIGSTOP) as if it were cut off.
- ``EtcdTarget``: an etcd and the key prefix of one cluster (several clusters may share one etcd);
  ``client()`` an ``Etcd`` as that cluster's user, ``cluster_settings()`` the etcd part of a ``cluster:``
  section.
- ``cluster_broker``: a ``BrokerProcess`` whose YAML has a ``cluster:`` section pointing at a target,
  members with certificates of one cluster CA (``member_tls=False``: plain, on loopback).
- ``cluster_state(target)``: members and partition states as stored in etcd (read over etcd's own JSON
  gateway as root: what the brokers wrote, not what a broker believes); ``settled`` and ``wait_settled``
  wait for every partition to be in sync; ``wait_until`` polls a condition.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_edge.cluster.coordination.etcd import Etcd
from broker_edge.placement import Member, PartitionState
from broker_edge.runtime.launcher import BrokerProcess, free_ports
from broker_edge.runtime.local_pki import LocalPki
from broker_edge.settings.cluster import EtcdAuthConfig, EtcdTlsConfig
from tests.harness.etcd_gateway import GatewayConnections

__all__ = [
    "ETCD_BINARY",
    "ClusterState",
    "EtcdServer",
    "EtcdTarget",
    "cluster_broker",
    "cluster_section",
    "cluster_state",
    "settled",
    "wait_settled",
    "wait_until",
]

WAIT_S = 30.0

BCRYPT_FLAGS = ("--bcrypt-cost", "4")
"""The cost of the users' password hashes: etcd's least. At its default (10) the authentications (every
``etcdctl`` call as root, every client a broker or a test connects) took about half of the CPU the tests'
etcds used. What auth refuses and allows is the same at any cost."""

ETCD_BINARY = shutil.which("etcd") or "/usr/bin/etcd"
ETCDCTL_BINARY = shutil.which("etcdctl") or "/usr/bin/etcdctl"


@dataclass(frozen=True)
class EtcdUser:
    """One cluster's etcd user: its name and the file holding its password."""

    username: str
    password_file: Path


class EtcdServer:
    """One single-member etcd on loopback: ``url`` for clients; ``pause``/``resume`` freeze it (SIGSTOP).
    ``secure``: TLS with client certificates and user auth on (see the module docstring)."""

    def __init__(self, directory: Path, name: str = "etcd", secure: bool = True) -> None:
        self.directory = Path(directory)
        self.name = name
        self.secure = secure
        self.client_port, self.peer_port = free_ports(2)
        self.url = f"{'https' if secure else 'http'}://127.0.0.1:{self.client_port}"
        self.data_dir = self.directory / f"{name}.data"
        self.log_path = self.directory / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.pki = LocalPki(self.directory / f"{name}-pki") if secure else None
        self.root_password = secrets.token_urlsafe(16)
        self._users: dict[str, EtcdUser] = {}
        self._token: str | None = None
        self._connections = GatewayConnections(self.url, self._ssl_context)

    @property
    def tls(self) -> EtcdTlsConfig | None:
        """What an etcd client of this server needs for TLS (its CA, a client certificate)."""
        if self.pki is None:
            return None
        client = self.pki.client("timestone")
        return EtcdTlsConfig(str(self.pki.ca.cert), str(client.cert), str(client.key))

    def _tls_flags(self) -> list[str]:
        if self.pki is None:
            return []
        server = self.pki.server(self.name)
        return [
            "--cert-file",
            str(server.cert),
            "--key-file",
            str(server.key),
            "--client-cert-auth",
            "--trusted-ca-file",
            str(self.pki.ca.cert),
        ]

    def start(self, timeout_s: float = 20.0) -> EtcdServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        peer = f"http://127.0.0.1:{self.peer_port}"
        fresh = not any(self.data_dir.iterdir())
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
            *BCRYPT_FLAGS,
            *self._tls_flags(),
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited:\n{self.log_path.read_text()[-3000:]}")
            if self.healthy():
                if self.secure and fresh:
                    self._enable_auth()
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"etcd did not become healthy:\n{self.log_path.read_text()[-3000:]}")

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.pki is None:
            return None
        context = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        root = self.pki.client("root", common_name=False)
        context.load_cert_chain(str(root.cert), str(root.key))
        return context

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"{self.url}/health", timeout=1, context=self._ssl_context()
            ) as answer:
                return bool(json.loads(answer.read()).get("health") == "true")
        except (OSError, urllib.error.URLError, ValueError):
            return False

    # -- users (the commands docs/cluster.md gives) ----------------------------------------------------------

    def etcdctl(self, *arguments: str, user: str | None = "root") -> str:
        """Run ``etcdctl`` against this server (as ``user``: root by default, None for none)."""
        command = [ETCDCTL_BINARY, "--endpoints", self.url, "--command-timeout=10s"]
        if self.pki is not None:
            root = self.pki.client("root", common_name=False)
            command += ["--cacert", str(self.pki.ca.cert), "--cert", str(root.cert), "--key", str(root.key)]
        if user == "root":
            command += ["--user", f"root:{self.root_password}"]
        done = subprocess.run(
            [*command, *arguments], capture_output=True, text=True, timeout=60, env={"ETCDCTL_API": "3"}
        )
        if done.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(arguments[:3])} failed: {done.stderr.strip()}")
        return done.stdout

    def _enable_auth(self) -> None:
        self.etcdctl("user", "add", "root", f"--new-user-password={self.root_password}", user=None)
        self.etcdctl("auth", "enable", user=None)

    def user_for(self, prefix: str) -> EtcdUser | None:
        """The etcd user of the cluster under ``prefix`` (made on first use): a role that may read and
        write ``<prefix>/`` and nothing else. None without user auth."""
        if not self.secure:
            return None
        user = self._users.get(prefix)
        if user is None:
            name = "timestone-" + re.sub(r"[^A-Za-z0-9_.-]", "-", prefix.strip("/")) or "timestone"
            password = secrets.token_urlsafe(16)
            self.etcdctl("role", "add", name)
            self.etcdctl("role", "grant-permission", name, "readwrite", f"{prefix}/", "--prefix=true")
            self.etcdctl("user", "add", name, f"--new-user-password={password}")
            self.etcdctl("user", "grant-role", name, name)
            password_file = self.directory / f"{name}.password"
            password_file.write_text(password + "\n")
            password_file.chmod(0o600)
            user = self._users[prefix] = EtcdUser(name, password_file)
        return user

    # -- reading and writing as root (the tests' own view, and what an etcd operator can do) ---------------

    def _gateway(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to etcd's JSON gateway as root (authenticating when needed), on this thread's kept-alive
        connection (``etcd_gateway``)."""
        for attempt in range(2):
            headers = {}
            if self.secure:
                if self._token is None or attempt:
                    self._token = self._authenticate()
                headers["Authorization"] = self._token
            try:
                return self._connections.post(path, body, headers)
            except urllib.error.HTTPError as error:
                if error.code != 401 or attempt:
                    raise
        raise AssertionError("unreachable")

    def _authenticate(self) -> str:
        answer = self._connections.post(
            "/v3/auth/authenticate", {"name": "root", "password": self.root_password}, {}
        )
        return str(answer["token"])

    def range(self, prefix: str) -> list[tuple[str, bytes]]:
        """``(key, value)`` of every key under ``prefix``."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        data = self._gateway("/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(end)})
        return [
            (base64.b64decode(kv["key"]).decode(), base64.b64decode(kv.get("value", "")))
            for kv in data.get("kvs", [])
        ]

    def put(self, key: str, value: bytes) -> None:
        """Write ``key`` (not bound to any lease), as someone with write access to etcd would."""
        self._gateway("/v3/kv/put", {"key": _b64(key), "value": base64.b64encode(value).decode()})

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

    @property
    def user(self) -> EtcdUser | None:
        return self.server.user_for(self.prefix)

    @property
    def auth(self) -> EtcdAuthConfig | None:
        user = self.user
        return None if user is None else EtcdAuthConfig(user.username, str(user.password_file))

    def cluster_settings(self, urls: list[str] | None = None) -> dict[str, Any]:
        """The etcd part of a ``cluster:`` section: URLs (``urls``, else this server's), TLS and user."""
        settings: dict[str, Any] = {"etcd": urls or [self.url], "key_prefix": self.prefix}
        tls, user = self.server.tls, self.user
        if tls is not None:
            settings["etcd_tls"] = {"cafile": tls.cafile, "certfile": tls.certfile, "keyfile": tls.keyfile}
        if user is not None:
            settings["etcd_auth"] = {"username": user.username, "password_file": str(user.password_file)}
        return settings

    def client(self, timeout_s: float = 2.0, urls: list[str] | None = None) -> Etcd:
        """An ``Etcd`` as this cluster's user (over TLS when the server is secure)."""
        return Etcd(urls or [self.url], timeout_s, self.server.tls, self.auth)

    def status_options(self) -> list[str]:
        """The ``timestone cluster status`` options that reach this cluster."""
        options = ["--etcd", self.url, "--prefix", self.prefix]
        tls, user = self.server.tls, self.user
        if tls is not None:
            options += [
                "--etcd-cacert",
                tls.cafile,
                "--etcd-cert",
                str(tls.certfile),
                "--etcd-key",
                str(tls.keyfile),
            ]
        if user is not None:
            options += ["--etcd-user", user.username, "--etcd-password-file", str(user.password_file)]
        return options


def cluster_section(
    target: EtcdTarget, node_id: str, member_tls: Path | None = None, **overrides: Any
) -> dict[str, Any]:
    """A ``cluster:`` section for ``node_id`` on ``target`` (advertised addresses default to bound ones);
    with ``member_tls`` (a directory), members prove who they are with certificates of the cluster CA kept
    there. A client stays on the member a test connects it to (``hand_over_connections: false``: tests
    place clients on members on purpose), unless ``hand_over_connections=True`` is given."""
    section: dict[str, Any] = {
        "node_id": node_id,
        "listen": {"port": 0},
        "hand_over_connections": False,
        **target.cluster_settings(),
    }
    if member_tls is not None:
        pki = LocalPki(member_tls, "cluster-ca")
        member = pki.member(node_id)
        section["tls"] = {
            "certfile": str(member.cert),
            "keyfile": str(member.key),
            "cafile": str(pki.ca.cert),
        }
    section.update(overrides)
    return section


def cluster_broker(
    directory: Path,
    target: EtcdTarget,
    node_id: str,
    cluster: dict[str, Any] | None = None,
    member_tls: bool = True,
    **sections: Any,
) -> BrokerProcess:
    """A broker process (not started) that joins the cluster on ``target`` as ``node_id``; its config file
    is ``directory/<node_id>/broker.yaml``, its log ``broker.log`` beside it. ``member_tls``: with a
    member certificate of the cluster CA kept in ``directory/cluster-pki`` (else plain, on loopback)."""
    pki = directory / "cluster-pki" if member_tls else None
    section = cluster_section(target, node_id, pki, **(cluster or {}))
    return BrokerProcess(directory / node_id, name=node_id, cluster=section, **sections)


# -- etcd's record of the cluster ----------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


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
    """The members and partition records etcd holds (values that are not records are left out)."""
    state = ClusterState()
    for _key, value in target.server.range(f"{target.prefix}/members/"):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            member = Member.from_json(value)
            state.members[member.node_id] = member
    for _key, value in target.server.range(f"{target.prefix}/partitions/"):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            partition = PartitionState.from_json(value)
            state.partitions[partition.partition] = partition
    return state


def wait_settled(
    target: EtcdTarget,
    nodes: set[str],
    replicas: int,
    timeout: float = WAIT_S,
    processes: dict[str, BrokerProcess] | None = None,
) -> None:
    """Wait until the cluster on ``target`` is ``nodes`` with every partition fully in sync; on a timeout
    the failure shows etcd's record and, of ``processes`` (node_id → its broker), each one's state and log
    tail, so a member that never joined says why."""

    def state() -> str:
        shown = str(cluster_state(target))
        for node, process in sorted((processes or {}).items()):
            shown += f"\n--- {node}: {_process_state(process)}\n{_log_tail(process.log_path)}"
        return shown

    wait_until(
        lambda: settled(target, nodes, replicas),
        timeout,
        f"{sorted(nodes)} settled with {replicas} in-sync replicas per partition",
        state,
    )


def _process_state(process: BrokerProcess) -> str:
    if process.process is None:
        return "never started"
    code = process.process.poll()
    return "running" if code is None else f"exited with {code}"


def _log_tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError as exc:
        return f"(no log: {exc})"


def settled(target: EtcdTarget, nodes: set[str], replicas: int, partitions: int = 16) -> bool:
    """Every partition led by one of ``nodes``, with ``replicas`` in-sync replicas, all of them live."""
    state = cluster_state(target)
    if set(state.members) != nodes or len(state.partitions) != partitions:
        return False
    return all(
        p.leader in nodes and len(p.isr) == replicas and set(p.isr) <= nodes
        for p in state.partitions.values()
    )


def leadership_settled(target: EtcdTarget) -> bool:
    """Whether the controller's balancing (``assignment.balance_leaders``) has no leadership left to move:
    no live member in sync on a partition leads two fewer than that partition's leader. Until then a
    partition may change leader at any moment, and a publish its old leader was holding is refused (0x83)."""
    return _leaders_balanced(cluster_state(target))


def _leaders_balanced(state: ClusterState) -> bool:
    counts = state.leaders()
    return all(
        counts.get(replica, 0) + 1 >= counts[partition.leader]
        for partition in state.partitions.values()
        if partition.leader is not None
        for replica in partition.isr
        if replica in state.members and replica != partition.leader
    )


def placement_settled(target: EtcdTarget, replication_factor: int) -> bool:
    """Whether the controller has nothing left to move: every partition's replicas are ``replication_factor``
    copies all in sync, every live member holds its share of them within one, and leadership is settled
    (``leadership_settled``). While a joining member takes its copies, a partition about to drop the copy of
    its leader first moves its leadership, spread evenly or not."""
    state = cluster_state(target)
    held = dict.fromkeys(state.members, 0)
    for partition in state.partitions.values():
        if len(partition.replicas) != replication_factor or set(partition.isr) != set(partition.replicas):
            return False
        for replica in partition.replicas:
            held[replica] = held.get(replica, 0) + 1
    return max(held.values()) - min(held.values()) <= 1 and _leaders_balanced(state)


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
