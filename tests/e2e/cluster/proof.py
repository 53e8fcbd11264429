"""What the cluster proofs share: etcd's record of the cluster, logs read back, devices, a cuttable etcd link.

- ``cluster_state(target)``: members and partition states as stored in etcd (read over etcd's own JSON
  gateway, ``/v3/kv/range``, so the test reads what the brokers wrote, not what a broker believes).
- ``read_log(broker, topic)``: the committed records of a topic from a broker's offsets API.
- ``metric(broker, name, **labels)``: one sample of a broker's ``/metrics``, as Prometheus parses it.
- ``Device``: a publisher on its own topic that publishes QoS 1 one message at a time through a list of
  brokers, moving to the next broker when its connection fails, and never resending: every PUBACKed payload
  is recorded, in order, so the test can check each of them is in the log exactly once.
- ``check_nothing_acknowledged_was_lost(devices, brokers)``: every acknowledged payload once on each broker.
- ``session_record(target, client_id)``: the session registry's record of a client id, as etcd holds it.
- ``EtcdProxy``: a TCP relay between one broker and etcd that the test can cut (connections dropped, new ones
  refused) and mend: the broker really loses etcd while everything else keeps running.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from broker_edge.cluster.features.sessions_records import SessionRecord
from broker_edge.protocol import PacketDecoder
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import Connect, Disconnect, PubAck, Publish
from broker_edge.runtime.launcher import BrokerProcess
from tests.harness.local_cluster import (
    WAIT_S,
    ClusterState,
    EtcdTarget,
    cluster_state,
    settled,
    wait_settled,
    wait_until,
)

__all__ = [
    "WAIT_S",
    "ClusterState",
    "cluster_state",
    "leadership_spread",
    "settled",
    "wait_settled",
    "wait_until",
]


def leadership_spread(target: EtcdTarget, nodes: tuple[str, ...]) -> bool:
    """Whether every one of ``nodes`` leads partitions, each within one of the others: the controller moves
    no leadership any more (a publish made while one moves may be refused by the leader it reached)."""
    leaders = cluster_state(target).leaders()
    counts = [leaders.get(node, 0) for node in nodes]
    return min(counts) > 0 and max(counts) - min(counts) <= 1


def cluster_status(target: EtcdTarget) -> dict[str, Any]:
    """What ``timestone cluster status --json`` prints for this cluster (the operator's view)."""
    command = [sys.executable, "-m", "pipelines.cli", "cluster", "status", *target.status_options()]
    result = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def status_leaders(status: dict[str, Any]) -> dict[str, int]:
    """node_id → partitions it leads, as ``cluster status`` shows them."""
    counts: dict[str, int] = {}
    for state in status["states"]:
        if state["leader"] is not None:
            counts[state["leader"]] = counts.get(state["leader"], 0) + 1
    return counts


def status_in_sync(status: dict[str, Any], node: str) -> int:
    """In how many partitions' in-sync sets ``cluster status`` shows ``node``."""
    return sum(node in state["isr"] for state in status["states"])


def started(make: Callable[[], BrokerProcess], attempts: int = 3) -> BrokerProcess:
    """``make()`` started; made again on fresh ports when another process took one of its free ports
    between their choice and the bind (the machine is shared)."""
    for attempt in range(attempts):
        broker = make()
        try:
            return broker.start()
        except RuntimeError as error:
            if "address already in use" not in str(error) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


# -- reading logs back ------------------------------------------------------------------------------------


def logged(broker: BrokerProcess, text: str) -> int:
    """How many times ``text`` stands in the broker's log file."""
    return broker.log_path.read_text(errors="replace").count(text)


def metric(broker: BrokerProcess, name: str, **labels: str) -> float:
    """The sample ``name`` with ``labels`` of the broker's ``GET /metrics`` (AssertionError when absent)."""
    url = f"http://127.0.0.1:{broker.admin_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"no {name} {labels} in the /metrics of the broker on port {broker.port}")


def read_log(broker: BrokerProcess, topic: str, token: str | None = None) -> list[tuple[int, bytes]]:
    """``(offset, payload)`` of every committed record of ``topic`` on ``broker`` ([] while it has none), as
    a reader (with ``token`` when its offsets API wants one)."""
    records: list[tuple[int, bytes]] = []
    offset = 0
    quoted = urllib.parse.quote(topic, safe="")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    while True:
        url = f"{broker.offsets_url}/v1/logs/{quoted}/records?offset={offset}&max_records=10000&format=jsonl"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
                lines = answer.read().splitlines()
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return records
            raise
        if not lines:
            return records
        for line in lines:
            record = json.loads(line)
            records.append((record["offset"], base64.b64decode(record["payload"])))
        offset = records[-1][0] + 1


# -- devices ------------------------------------------------------------------------------------------


class Device(threading.Thread):
    """Publishes QoS 1 on ``topic``, one message at a time, through ``brokers`` (moving on when one fails).

    ``acked`` holds every payload the broker acknowledged with success, in order; a message whose
    connection failed before its PUBACK, or that was refused, is not resent (the next one is new).
    """

    def __init__(
        self, name: str, topic: str, brokers: list[BrokerProcess], start_at: int = 0, version: int = 5
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.client_id = name
        self.topic = topic
        self.brokers = brokers
        self.version = version
        self.acked: list[bytes] = []
        self.ack_times: list[float] = []
        self.refused = 0
        self.failures = 0
        self.moves = 0
        self.stopping = threading.Event()
        self.start_at = start_at

    def run(self) -> None:
        index = self.start_at
        sequence = 0
        sock: socket.socket | None = None
        decoder: PacketDecoder | None = None
        while not self.stopping.is_set():
            if sock is None:
                broker = self.brokers[index % len(self.brokers)]
                try:
                    sock, decoder = self._connect(broker)
                except OSError:
                    index += 1
                    time.sleep(0.05)
                    continue
            assert decoder is not None
            payload = self.message(sequence)
            sequence += 1
            try:
                sock.sendall(
                    encode(Publish(self.topic, payload, 1, packet_id=sequence % 65535 + 1), self.version)
                )
                answer = self._receive(sock, decoder)
            except OSError:
                answer = None
            if isinstance(answer, PubAck) and answer.reason_code < 0x80:
                self.acked.append(payload)
                self.ack_times.append(time.monotonic())
                continue
            if isinstance(answer, PubAck):
                self.refused += 1
                time.sleep(0.05)
                continue
            self.failures += 1  # the connection failed or closed: move to the next broker
            sock.close()
            sock = None
            index += 1
            self.moves += 1
        if sock is not None:
            sock.close()

    def message(self, sequence: int) -> bytes:
        """The payload of the ``sequence``-th message (unique per device; a subclass may shape it)."""
        return f"{self.client_id}:{sequence}".encode()

    def _connect(self, broker: BrokerProcess) -> tuple[socket.socket, PacketDecoder]:
        sock = socket.create_connection(broker.address, timeout=10)
        decoder = PacketDecoder(role="client", protocol_version=self.version)
        sock.sendall(
            encode(
                Connect(protocol_version=self.version, client_id=self.client_id, clean_start=True),
                self.version,
            )
        )
        answer = self._receive(sock, decoder)
        if answer is None or getattr(answer, "reason_code", getattr(answer, "return_code", 1)) != 0:
            sock.close()
            raise OSError(f"not connected: {answer!r}")
        return sock, decoder

    @staticmethod
    def _receive(sock: socket.socket, decoder: PacketDecoder) -> Any:
        pending: list[Any] = []
        deadline = time.monotonic() + 15
        while not pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            sock.settimeout(remaining)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                return None
            if not data:
                return None
            pending.extend(decoder.feed(data))
        packet = pending[0]
        return None if isinstance(packet, Disconnect) else packet

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def check_nothing_acknowledged_was_lost(
    devices: list[Device], brokers: list[BrokerProcess], token: str | None = None
) -> None:
    """Every payload each device had acknowledged is in its topic's log on every one of ``brokers``, once,
    in acknowledgement order, at the same offset on each (read as a reader, with ``token``)."""
    for device in devices:
        assert device.acked, f"{device.client_id} had nothing acknowledged"

        def complete(device: Device = device) -> bool:
            payloads = {payload for _, payload in read_log(brokers[0], device.topic, token)}
            return (
                all(
                    set(device.acked) <= {p for _, p in read_log(broker, device.topic, token)}
                    for broker in brokers
                )
                and set(device.acked) <= payloads
            )

        wait_until(complete, what=f"every acknowledged message of {device.client_id} on every survivor")
        logs = [read_log(broker, device.topic, token) for broker in brokers]
        acked = set(device.acked)
        placed = [{payload: offset for offset, payload in log if payload in acked} for log in logs]
        for log, where in zip(logs, placed, strict=True):
            copies = [payload for _, payload in log if payload in acked]
            assert len(copies) == len(acked), f"{device.client_id}: an acknowledged message twice or missing"
            assert copies == device.acked, f"{device.client_id}: not in acknowledgement order"
            assert where == placed[0], f"{device.client_id}: offsets differ between brokers"


# -- a cuttable link to etcd ------------------------------------------------------------------------------


class EtcdProxy:
    """A TCP relay on a free loopback port to etcd; ``cut()`` drops its connections and refuses new ones."""

    def __init__(self, target_url: str) -> None:
        parts = urllib.parse.urlsplit(target_url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 2379)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.url = f"{parts.scheme}://127.0.0.1:{self.listener.getsockname()[1]}"
        self.open = True
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Drop every relayed connection and refuse new ones (the broker's etcd is gone)."""
        self.open = False
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def mend(self) -> None:
        self.open = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


# -- the session registry ---------------------------------------------------------------------------------


def session_record(target: EtcdTarget, client_id: str) -> SessionRecord | None:
    """The registry's record of ``client_id`` as stored in etcd (None when there is none)."""
    found = [
        value
        for key, value in target.server.range(f"{target.prefix}/sessions/{client_id}")
        if key.endswith(f"/{client_id}")
    ]
    return SessionRecord.from_json(found[0]) if found else None


# -- placement --------------------------------------------------------------------------------------------


def copies_spread(target: EtcdTarget, nodes: tuple[str, ...], partitions: int, replicas: int = 2) -> bool:
    """Every one of ``partitions`` with ``replicas`` replicas, all in sync and led by one of ``nodes``,
    and every node within one copy of the others: nothing moves any more."""
    state = cluster_state(target)
    if set(state.members) != set(nodes) or len(state.partitions) != partitions:
        return False
    copies = dict.fromkeys(nodes, 0)
    for partition in state.partitions.values():
        in_sync = len(partition.replicas) == len(partition.isr) == replicas
        if not in_sync or partition.leader not in nodes:
            return False
        for replica in partition.replicas:
            copies[replica] += 1
    return max(copies.values()) - min(copies.values()) <= 1


def socket_owners(pids: dict[str, int], port: int) -> dict[int, str]:
    """Remote port of each connection to ``port`` → the member whose process holds the broker's end."""
    inodes: dict[str, str] = {}
    for node, pid in pids.items():
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = node
    owners = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if int(local.split(":")[1], 16) == port and inode in inodes:
            owners[int(remote.split(":")[1], 16)] = inodes[inode]
    return owners
