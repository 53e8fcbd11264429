"""What cluster-wide sessions cost a client: CONNECT and takeover times, on a cluster node and alone.

    flock /tmp/timestone-bench.lock python -m bench.sessions_bench [--output bench/results/sessions.md]

Real parts only: Debian's etcd on free loopback ports, `timestone broker` processes (one alone, three in a
cluster with its defaults), MQTT 5 over loopback TCP with the project's codec, one client at a time.

1. **CONNECT**: a new client id with Clean Start 1 connects (CONNECT → CONNACK) and disconnects; on a cluster
   node the CONNECT first reads and writes the session registry in etcd (two round trips).
2. **Takeover**: a client id with a persistent session and one subscription connects again with Clean
   Start 0 while its previous connection is still open (CONNECT → CONNACK): on the broker alone always the
   same broker (a local takeover); in the cluster alternately on A and B, so every CONNECT moves the session
   over the peer link (the holder disconnects the old connection and hands over the session's state).

The two setups take turns, `ROUNDS` rounds of `PER_ROUND` CONNECTs each, so that changes of the machine's
load hit both alike. Figures: p50 and p99 in milliseconds over all rounds. The CPU that other processes used
during the run is reported: a shared machine shows.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.report import run_and_write
from bench.sysinfo import cpu_seconds, machine_busy_seconds, machine_info, machine_load_sentence
from broker_edge.protocol import PacketDecoder
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    SubAck,
    Subscribe,
    Subscription,
)
from broker_edge.protocol.properties import Properties
from broker_edge.runtime.launcher import BrokerProcess
from tests.harness.local_cluster import EtcdServer, EtcdTarget, cluster_broker, settled, wait_until

BENCH_DIR = Path(__file__).resolve().parent
ROUNDS = 5
PER_ROUND = 100
EXPIRY = 3600


@dataclass
class Figures:
    connect_alone: list[float] = field(default_factory=list)
    connect_cluster: list[float] = field(default_factory=list)
    takeover_alone: list[float] = field(default_factory=list)
    takeover_cluster: list[float] = field(default_factory=list)
    other_cpu: float = 0.0
    wall_s: float = 0.0


class Client:
    """One MQTT 5 connection, blocking, through the project's codec."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = PacketDecoder(role="client", protocol_version=MQTT_5)
        self.pending: list[object] = []

    def send(self, packet: Packet) -> None:
        self.sock.sendall(encode(packet, MQTT_5))

    def receive(self) -> object:
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the broker")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def connect(self, client_id: str, clean: bool, expiry: int = 0) -> float:
        """CONNECT; seconds until CONNACK (which must accept)."""
        properties = Properties(session_expiry_interval=expiry) if expiry else None
        started = time.perf_counter()
        self.send(
            Connect(protocol_version=MQTT_5, client_id=client_id, clean_start=clean, properties=properties)
        )
        answer = self.receive()
        elapsed = time.perf_counter() - started
        if not isinstance(answer, ConnAck) or answer.reason_code != 0:
            raise RuntimeError(f"CONNECT of {client_id} refused: {answer!r}")
        return elapsed

    def close(self) -> None:
        self.sock.close()


def connects(port: int, prefix: str, count: int) -> list[float]:
    """``count`` new client ids connecting with Clean Start 1, then a normal DISCONNECT."""
    times = []
    for n in range(count):
        client = Client(port)
        times.append(client.connect(f"{prefix}-{n}", True))
        client.send(Disconnect())
        client.close()
    return times


def takeovers(ports: list[int], client_id: str, count: int) -> list[float]:
    """``count`` CONNECTs with Clean Start 0 of one persistent session, each taking over the previous
    connection, cycling through ``ports``."""
    first = Client(ports[0])
    first.connect(client_id, False, EXPIRY)
    first.send(Subscribe(1, [Subscription("bench/sessions/#", 1)]))
    if not isinstance(first.receive(), SubAck):
        raise RuntimeError("no SUBACK")
    previous = first
    times = []
    for n in range(count):
        client = Client(ports[(n + 1) % len(ports)])
        times.append(client.connect(client_id, False, EXPIRY))
        previous.close()
        previous = client
    previous.send(Disconnect())
    previous.close()
    return times


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000


def run(directory: Path) -> Figures:
    figures = Figures()
    etcd = EtcdServer(directory / "etcd").start()
    target = EtcdTarget(etcd, "/bench")
    alone = BrokerProcess(directory / "alone", name="alone")
    cluster = [cluster_broker(directory, target, node) for node in ("a", "b", "c")]
    processes: list[BrokerProcess] = [alone, *cluster]
    try:
        for broker in processes:
            broker.start()
        wait_until(lambda: settled(target, {"a", "b", "c"}, 3), 60, "the cluster settled")
        pids = [p.process.pid for p in processes if p.process] + ([etcd.process.pid] if etcd.process else [])
        ours = sum(cpu_seconds(pid) for pid in pids) + time.process_time()
        busy, started = machine_busy_seconds(), time.monotonic()
        for round_ in range(ROUNDS):
            figures.connect_alone += connects(alone.port, f"alone-{round_}", PER_ROUND)
            figures.connect_cluster += connects(cluster[0].port, f"cluster-{round_}", PER_ROUND)
            figures.takeover_alone += takeovers([alone.port], f"mover-alone-{round_}", PER_ROUND)
            figures.takeover_cluster += takeovers(
                [cluster[0].port, cluster[1].port], f"mover-cluster-{round_}", PER_ROUND
            )
        figures.wall_s = time.monotonic() - started
        ours = sum(cpu_seconds(pid) for pid in pids) + time.process_time() - ours
        figures.other_cpu = max(0.0, (machine_busy_seconds() - busy - ours) / figures.wall_s)
    finally:
        for broker in processes:
            broker.stop()
        etcd.kill()
    return figures


def render(figures: Figures, command: str) -> str:
    machine = machine_info()
    shared = machine_load_sentence(figures.other_cpu, "the figures are higher than on an idle machine")

    def row(what: str, alone: list[float], cluster: list[float]) -> str:
        return (
            f"| {what} | {percentile(alone, 0.5):.2f} / {percentile(alone, 0.99):.2f} | "
            f"{percentile(cluster, 0.5):.2f} / {percentile(cluster, 0.99):.2f} | "
            f"{statistics.median(cluster) / statistics.median(alone):.1f}x |"
        )

    return "\n".join(
        [
            "## Sessions across a cluster",
            "",
            f"Written by `{command}` on {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}, "
            f"{figures.wall_s:.0f} s. Machine: {machine.cpu_model}, {machine.cores} CPUs, "
            f"{machine.memory_gib:.1f} GiB, {machine.kernel}, Python {machine.python}. "
            "etcd, four `timestone broker` processes (one alone, three in a cluster) and the client share "
            "the machine (no pinning).",
            "",
            f"Other processes used {figures.other_cpu * 100:.0f}% of a CPU on average during the run "
            f"({shared}).",
            "",
            f"{ROUNDS} rounds of {PER_ROUND} CONNECTs per figure, the setups taking turns; "
            "p50 / p99 in milliseconds, CONNECT to CONNACK, one client at a time.",
            "",
            "| figure | broker alone | cluster node | p50 ratio |",
            "|---|---:|---:|---:|",
            row("CONNECT, new client id, Clean Start 1", figures.connect_alone, figures.connect_cluster),
            row(
                "takeover, Clean Start 0, persistent session (cluster: moving between A and B)",
                figures.takeover_alone,
                figures.takeover_cluster,
            ),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    return run_and_write(argv, "sessions", __doc__, run, render)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
