"""The fault suite's harness: a cluster on loopback (etcd with TLS and user auth, brokers whose members
prove themselves with certificates), publishers and subscribers over raw MQTT sockets, the nemeses, and one
run end to end whose history goes to the checker (``tests.e2e.faults.checker``).

- ``Publisher``: QoS 1 on its own topic ``faults/<name>``, MQTT 5 or 3.1.1, up to ``window`` publishes in
  flight on one connection, sequenced unique payloads, never resent: a publish whose connection failed
  before its PUBACK, or that was refused, is simply not acknowledged, and the next one is new. It moves to
  the next broker when its connection fails.
- ``Subscriber``: MQTT 5 on ``faults/#`` with the log's offset on every delivery (the ``offsets`` opt-in).
- nemeses (``NEMESES``): ``kill`` (SIGKILL of the broker leading most partitions, started again), ``pause``
  (SIGSTOP of it for longer than the lease), ``etcd-restart`` (etcd killed for longer than the lease and
  started again on its data), ``rolling`` (every broker stopped and started in turn), ``mixed`` (two of
  those, chosen by the seed), ``partition`` (``b1`` cut from its peers and etcd for longer than the lease
  while its clients still reach it). Each says in which windows a broker must acknowledge nothing.
- ``run_case(nemesis, seed, directory)``: one run; its ``RunResult`` holds the counts and the anomalies.
- ``run_partitioned(seed, directory)`` (what ``run_case`` does for ``partition``): the run, in a network
  namespace of its own (``unshare --net``, as root), where ``b1`` runs in a group of its own (``setpriv``)
  and an iptables rule drops every packet it sends except from its MQTT port: its peers and etcd hear
  nothing from it, its clients do. The rule lives and dies with the namespace; the machine's own packet
  filter is never touched.

Used by ``tests/e2e/faults/test_faults.py`` (a short set of seeds) and ``bench/cluster_faults_bench.py``
(many seeds per nemesis).
"""

from __future__ import annotations

import itertools
import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from broker_edge.protocol import PacketDecoder
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import (
    ConnAck,
    Connect,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from broker_edge.protocol.properties import Properties
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.cluster.proof import read_log
from tests.e2e.faults.checker import Ack, Delivery, History, Silence, anomalies, payload
from tests.harness.local_cluster import (
    EtcdServer,
    EtcdTarget,
    cluster_broker,
    cluster_state,
    settled,
    wait_until,
)

__all__ = ["NEMESES", "FaultCluster", "Publisher", "RunResult", "Subscriber", "run_case"]

LEASE_TTL_S = 2
TOPIC_ROOT = "faults"
ISOLATED_GID = 4242
"""The group ``b1`` runs in when it may be cut off (``partition``)."""


# -- clients ---------------------------------------------------------------------------------------------


class _Connection:
    """One MQTT connection over a plain socket, with the project's own codec."""

    def __init__(self, broker: BrokerProcess, client_id: str, version: int, properties: Properties | None):
        self.sock = socket.create_connection(broker.address, timeout=5)
        self.version = version
        self.decoder = PacketDecoder(role="client", protocol_version=version)
        self.pending: list[Any] = []
        self.send(
            Connect(protocol_version=version, client_id=client_id, clean_start=True, properties=properties)
        )
        answer = self.receive(5.0)
        if not isinstance(answer, ConnAck) or answer.reason_code != 0:
            self.close()
            raise OSError(f"not connected: {answer!r}")

    def send(self, packet: Any) -> None:
        self.sock.sendall(encode(packet, self.version))

    def receive(self, timeout_s: float) -> Any:
        """The next packet, None when none came within ``timeout_s``; OSError when the connection ended."""
        if not self.pending:
            self.sock.settimeout(timeout_s)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not data:
                raise OSError("connection closed")
            self.pending.extend(self.decoder.feed(data))
            if not self.pending:
                return None
        return self.pending.pop(0)

    def close(self) -> None:
        self.sock.close()


class Publisher(threading.Thread):
    """Sequenced QoS 1 publishes on ``faults/<name>`` at about ``rate`` a second, ``window`` in flight."""

    def __init__(
        self,
        name: str,
        brokers: list[BrokerProcess],
        start_at: int,
        version: int,
        rate: float,
        window: int = 8,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.topic = f"{TOPIC_ROOT}/{name}"
        self.brokers = brokers
        self.index = start_at
        self.version = version
        self.rate = rate
        self.window = window
        self.acks: list[Ack] = []
        self.refused = 0
        self.unanswered = 0
        self.sent = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        sequence = 0
        next_at = time.monotonic()
        while not self.stopping.is_set():
            broker = self.brokers[self.index % len(self.brokers)]
            try:
                connection = _Connection(broker, self.name, self.version, None)
            except OSError:
                self.index += 1
                time.sleep(0.1)
                continue
            in_flight: dict[int, tuple[int, float]] = {}
            try:
                while not self.stopping.is_set():
                    now = time.monotonic()
                    while len(in_flight) < self.window and now >= next_at:
                        packet_id = sequence % 65535 + 1
                        connection.send(
                            Publish(self.topic, payload(self.name, sequence), 1, packet_id=packet_id)
                        )
                        in_flight[packet_id] = (sequence, now)
                        sequence += 1
                        self.sent += 1
                        next_at = max(next_at + 1 / self.rate, now - 1.0)
                    answer = connection.receive(0.02)
                    if isinstance(answer, PubAck) and answer.packet_id in in_flight:
                        acked, _ = in_flight.pop(answer.packet_id)
                        if answer.reason_code < 0x80:
                            self.acks.append(Ack(acked, broker.name, time.time()))
                        else:
                            self.refused += 1
                    if in_flight and min(at for _, at in in_flight.values()) < time.monotonic() - 20:
                        raise OSError("no answer within 20 s")
            except OSError:
                self.index += 1  # the connection failed: what was in flight stays unanswered
            finally:
                self.unanswered += len(in_flight)
                connection.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


class Subscriber(threading.Thread):
    """Every delivery on ``faults/#`` through one broker (the next when it fails), with its log offset."""

    def __init__(self, name: str, brokers: list[BrokerProcess], start_at: int) -> None:
        super().__init__(name=name, daemon=True)
        self.brokers = brokers
        self.index = start_at
        self.deliveries: list[Delivery] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        properties = Properties()
        properties.user_properties = [("offsets", "on")]
        while not self.stopping.is_set():
            broker = self.brokers[self.index % len(self.brokers)]
            try:
                connection = _Connection(broker, self.name, 5, properties)
            except OSError:
                self.index += 1
                time.sleep(0.1)
                continue
            try:
                connection.send(Subscribe(1, [Subscription(f"{TOPIC_ROOT}/#", 1)]))
                while not self.stopping.is_set():
                    packet = connection.receive(0.1)
                    if isinstance(packet, Publish):
                        self.deliveries.append(
                            Delivery(self.name, packet.topic, packet.payload, _offset(packet))
                        )
                        if packet.qos and packet.packet_id is not None:
                            connection.send(PubAck(packet.packet_id))
                    elif packet is not None and not isinstance(packet, SubAck):
                        raise OSError(f"unexpected {packet!r}")
            except OSError:
                self.index += 1
                time.sleep(0.1)
            finally:
                connection.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def _offset(packet: Publish) -> int | None:
    if packet.properties is None:
        return None
    for key, value in packet.properties.user_properties:
        if key == "offset":
            return int(value)
    return None


# -- the cluster -----------------------------------------------------------------------------------------


class FaultCluster:
    """etcd and ``size`` brokers (replication factor 3) on loopback, set up as production is."""

    def __init__(self, directory: Path, size: int = 3, cuttable: bool = False) -> None:
        self.directory = directory
        self.cuttable = cuttable
        self.etcd = EtcdServer(directory / "etcd")
        self.target = EtcdTarget(self.etcd, "/timestone")
        self.nodes = [f"b{i}" for i in range(1, size + 1)]
        self.brokers: list[BrokerProcess] = []

    def start(self) -> FaultCluster:
        self.etcd.start()
        settings = {"lease_ttl_s": LEASE_TTL_S, "replication_factor": 3}
        for node in self.nodes:
            broker = cluster_broker(self.directory, self.target, node, settings)
            if self.cuttable and node == "b1":
                broker.wrapper = ("setpriv", f"--regid={ISOLATED_GID}", "--clear-groups", "--")
            self.brokers.append(broker.start())
        self.wait_settled()
        return self

    def wait_settled(self, timeout_s: float = 60) -> None:
        replicas = min(3, len(self.nodes))
        wait_until(
            lambda: settled(self.target, set(self.nodes), replicas),
            timeout_s,
            "the cluster settled",
            self.state,
        )

    def state(self) -> object:
        return cluster_state(self.target)

    def busiest_leader(self) -> BrokerProcess:
        leaders = cluster_state(self.target).leaders()
        name = max(self.nodes, key=lambda node: leaders.get(node, 0))
        return self.brokers[self.nodes.index(name)]

    def replicas_of(self, topic: str) -> list[BrokerProcess]:
        from broker_edge.placement import partition_of

        state = cluster_state(self.target)
        partition = state.partitions[partition_of(topic, len(state.partitions))]
        return [broker for broker in self.brokers if broker.name in partition.replicas]

    def close(self) -> None:
        for broker in self.brokers:
            if broker.process is not None and broker.process.poll() is None:
                broker.process.send_signal(signal.SIGCONT)
            broker.kill()
        self.etcd.kill()


# -- nemeses: each does its harm and heals; returns the windows in which a broker must stay silent -------

Nemesis = Callable[[FaultCluster, random.Random], list[Silence]]
READ_LATE_S = 1.0
"""How long after a broker was killed or stopped a publisher's thread (one of nine, on a loaded machine) may
still read a PUBACK the broker wrote before: a stopped or dead process writes nothing, so a silence begins
then."""


def kill_leader(cluster: FaultCluster, rng: random.Random) -> list[Silence]:
    broker = cluster.busiest_leader()
    broker.kill()
    start = time.time() + READ_LATE_S  # what it wrote before it died may still be read
    time.sleep(rng.uniform(LEASE_TTL_S + 0.5, LEASE_TTL_S + 2.0))
    end = time.time()
    broker.start()
    return [Silence(broker.name, start, end, "killed")]


def pause_leader(cluster: FaultCluster, rng: random.Random) -> list[Silence]:
    broker = cluster.busiest_leader()
    assert broker.process is not None
    broker.process.send_signal(signal.SIGSTOP)
    start = time.time() + READ_LATE_S  # what it wrote before the signal may still be read
    time.sleep(rng.uniform(LEASE_TTL_S + 0.5, LEASE_TTL_S + 2.0))
    end = time.time()
    broker.process.send_signal(signal.SIGCONT)
    return [Silence(broker.name, start, end, "paused (SIGSTOP)")]


def restart_etcd(cluster: FaultCluster, rng: random.Random) -> list[Silence]:
    cluster.etcd.kill()
    time.sleep(rng.uniform(LEASE_TTL_S + 0.5, LEASE_TTL_S + 2.0))
    cluster.etcd.start()
    return []


def rolling_restart(cluster: FaultCluster, rng: random.Random) -> list[Silence]:
    silences: list[Silence] = []
    for broker in rng.sample(cluster.brokers, len(cluster.brokers)):
        start = time.time()
        broker.stop()
        end = time.time()
        broker.start()
        silences.append(Silence(broker.name, start + 0.5, end, "stopped (SIGTERM)"))
        cluster.wait_settled()
    return silences


def partition_b1(cluster: FaultCluster, rng: random.Random) -> list[Silence]:
    """``b1`` hears its peers and etcd but nothing it sends reaches them; its clients still reach it."""
    if not cluster.cuttable:
        raise RuntimeError("partition: the cluster was not started cuttable (run it with run_partitioned)")
    b1 = cluster.brokers[0]
    rule = ["OUTPUT", "-o", "lo", "-p", "tcp", "-m", "owner", "--gid-owner", str(ISOLATED_GID)]
    rule += ["!", "--sport", str(b1.port), "-j", "DROP"]
    subprocess.run(["iptables", "-A", *rule], check=True)
    start = time.time()
    time.sleep(rng.uniform(LEASE_TTL_S + 1.0, LEASE_TTL_S + 3.0))
    end = time.time()
    subprocess.run(["iptables", "-D", *rule], check=True)
    # by a lease after the cut it has fenced itself (it proves nothing to etcd): from then on, silence
    return [Silence(b1.name, start + LEASE_TTL_S, end, "cut off from its peers and etcd")]


def mixed(cluster: FaultCluster, rng: random.Random) -> list[Silence]:
    silences: list[Silence] = []
    for nemesis in rng.sample([kill_leader, pause_leader, restart_etcd], 2):
        silences += nemesis(cluster, rng)
        time.sleep(rng.uniform(0.5, 1.5))
    return silences


NEMESES: dict[str, Nemesis] = {
    "kill": kill_leader,
    "pause": pause_leader,
    "etcd-restart": restart_etcd,
    "rolling": rolling_restart,
    "mixed": mixed,
    "partition": partition_b1,
}


# -- one run ---------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    nemesis: str
    seed: int
    brokers: int
    acknowledged: int = 0
    refused: int = 0
    unanswered: int = 0
    deliveries: int = 0
    unavailable_s: float = 0.0
    """The longest time any publisher went without an acknowledgement while the fault lasted and after."""
    leader_moves: int = 0
    anomalies: list[str] = field(default_factory=list)


def run_case(
    nemesis: str,
    seed: int,
    directory: Path,
    brokers: int = 3,
    publishers: int = 6,
    rate: float = 60.0,
    settle_s: float = 2.0,
    cuttable: bool = False,
) -> RunResult:
    """Start a cluster, load it, apply ``nemesis`` (seeded by ``seed``), heal, wait until the replicas
    agree, and check the history. ``partition`` runs in a network namespace of its own
    (``run_partitioned``)."""
    if nemesis == "partition" and not cuttable:
        return run_partitioned(seed, directory, brokers)
    rng = random.Random(seed)
    cluster = FaultCluster(directory, brokers, cuttable).start()
    result = RunResult(nemesis, seed, brokers)
    writers: list[Publisher] = []
    readers: list[Subscriber] = []
    try:
        readers = [Subscriber(f"s{i}", cluster.brokers, i) for i in range(brokers)]
        writers = [
            Publisher(f"p{i}", cluster.brokers, i, 5 if i % 2 == 0 else 4, rate) for i in range(publishers)
        ]
        for thread in [*readers, *writers]:
            thread.start()
        time.sleep(settle_s)
        before = cluster_state(cluster.target).partitions
        fault_at = time.time()
        silences = NEMESES[nemesis](cluster, rng)
        time.sleep(settle_s)
        cluster.wait_settled()
        time.sleep(settle_s)
        for writer in writers:
            writer.stop()
        stopped_at = time.time()
        after = cluster_state(cluster.target).partitions
        result.leader_moves = sum(1 for p, s in after.items() if before[p].leader != s.leader)
        history = History(silences=silences)
        for writer in writers:
            history.acks[writer.topic] = writer.acks
            result.acknowledged += len(writer.acks)
            result.refused += writer.refused
            result.unanswered += writer.unanswered
            times = [fault_at, *(ack.at for ack in writer.acks if ack.at >= fault_at), stopped_at]
            gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
            result.unavailable_s = max([result.unavailable_s, *gaps])
        time.sleep(0.5)  # the subscribers receive the last records
        for reader in readers:
            reader.stop()
            history.deliveries += reader.deliveries
        # Read after the subscribers stopped: a publish sent just before its writer stopped (unanswered) can
        # still be appended, and delivered, after a read made earlier.
        history.logs = _agreed_logs(cluster, [writer.topic for writer in writers])
        result.deliveries = len(history.deliveries)
        result.anomalies = anomalies(history)
        return result
    finally:
        for writer in writers:
            writer.stopping.set()
        for reader in readers:
            reader.stopping.set()
        cluster.close()


def _agreed_logs(
    cluster: FaultCluster, topics: list[str], timeout_s: float = 30
) -> dict[str, dict[str, list[tuple[int, bytes]]]]:
    """broker → topic → its log, read once every replica of each topic holds the same records (or, after
    ``timeout_s``, as they are: the checker names the difference)."""
    logs: dict[str, dict[str, list[tuple[int, bytes]]]] = {broker.name: {} for broker in cluster.brokers}
    deadline = time.monotonic() + timeout_s
    for topic in topics:
        replicas = cluster.replicas_of(topic)
        while True:
            try:
                copies = {broker.name: read_log(broker, topic) for broker in replicas}
            except (OSError, urllib.error.URLError):
                copies = {}
            agreed = bool(copies) and len({tuple(copy) for copy in copies.values()}) == 1
            if agreed or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for name, copy in copies.items():
            logs[name][topic] = copy
    return {name: held for name, held in logs.items() if held}


def run_partitioned(seed: int, directory: Path, brokers: int = 3) -> RunResult:
    """The ``partition`` run in a network namespace of its own (see the module docstring)."""
    script = (
        f"ip link set lo up && exec {sys.executable} -m tests.e2e.faults.harness {seed} {directory} {brokers}"
    )
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).resolve().parents[3],  # where ``tests`` is a package
    )
    if done.returncode != 0:
        raise RuntimeError(f"the partitioned run failed:\n{done.stderr[-3000:]}")
    return RunResult(**json.loads(done.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":  # inside the namespace: one partition run, its result as one JSON line
    seed_text, directory_text, brokers_text = sys.argv[1:4]
    outcome = run_case("partition", int(seed_text), Path(directory_text), int(brokers_text), cuttable=True)
    print(json.dumps(asdict(outcome)))
