"""Fanout over a broker cluster: 1 publisher → 1,000 QoS 1 subscribers spread over 3 brokers, against the
same 1,000 subscribers on one broker, taking turns in one run.

    flock /tmp/timestone-bench.lock python -m bench.cluster_fanout_bench [--output FILE]

Real parts only: Debian's etcd on free loopback ports, `timestone broker` processes (defaults: group commit,
QoS 1 logged; the cluster with replication_factor 3), one broker without a cluster beside it, all running
throughout so that a change in the machine's load hits both setups alike.

Each run: subscriber processes (``SUBSCRIBER_PROCESSES``, so that no load process saturates a core) connect
and subscribe to `bench/fanout` at QoS 1 (MQTT 3.1.1, every delivery PUBACKed), subscriber i on broker
i mod 3 (cluster) or all on the single broker; then one publisher process publishes QoS 1 at a fixed rate
(at most ``WINDOW`` unacknowledged) on broker A (cluster) or on the single broker. The payload carries the
send time (CLOCK_MONOTONIC, shared by the processes of one machine); each subscriber takes the latency of
every delivery. Figures over the measurement window: deliveries/s summed over the subscribers, latency p50 and
p99, the CPU of each load process (a run in which one reaches ``SATURATED_PCT`` of a core does not count: the
load generator, not the broker, would be what limits it), the brokers' and etcd's CPU, and the CPU that
everything else on the machine used (the machine is shared).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import multiprocessing as mp
import os
import statistics
import struct
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from bench.cluster_bench import NODES, SECTIONS
from bench.report import run_and_write
from bench.sysinfo import (
    cpu_seconds,
    machine_busy_seconds,
    machine_info,
    machine_load_sentence,
    raise_fd_limit,
)
from broker_edge.runtime.launcher import BrokerProcess
from tests.harness.local_cluster import EtcdServer, EtcdTarget, cluster_broker, settled

BENCH_DIR = Path(__file__).resolve().parent
TOPIC = "bench/fanout"
SUBSCRIBERS = 1000
SUBSCRIBER_PROCESSES = 4
RATES = (50, 200)
"""Publishes per second: 50,000 and 200,000 deliveries/s owed to 1,000 subscribers."""
WINDOW = 64
PAYLOAD = 64
WARMUP_S = 2.0
MEASURE_S = 8.0
RUNS = 2
"""Runs of each setup, taking turns."""
SATURATED_PCT = 90.0
_STAMP = struct.Struct("!q")
_CTX = mp.get_context("spawn")


# -- MQTT 3.1.1 frames (the load processes parse by hand: no codec on the per-message path) ----------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value % 128, value // 128
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _string(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


def _connect(client_id: str) -> bytes:
    body = _string("MQTT") + bytes([4, 0x02]) + (600).to_bytes(2, "big") + _string(client_id)
    return b"\x10" + _varint(len(body)) + body


def _subscribe(topic: str) -> bytes:
    body = (1).to_bytes(2, "big") + _string(topic) + b"\x01"
    return b"\x82" + _varint(len(body)) + body


def _publish(topic: str, packet_id: int, payload: bytes) -> bytes:
    body = _string(topic) + packet_id.to_bytes(2, "big") + payload
    return b"\x32" + _varint(len(body)) + body


def _packets(buffer: bytearray) -> list[tuple[int, bytes]]:
    """Complete packets at the start of ``buffer`` as (first byte, body), removed from it."""
    out = []
    position = 0
    while True:
        if len(buffer) - position < 2:
            break
        length, multiplier, index = 0, 1, position + 1
        while index < len(buffer):
            byte = buffer[index]
            length += (byte & 0x7F) * multiplier
            multiplier *= 128
            index += 1
            if not byte & 0x80:
                break
        else:
            break
        if len(buffer) - index < length:
            break
        out.append((buffer[position], bytes(buffer[index : index + length])))
        position = index + length
    del buffer[:position]
    return out


# -- subscribers ------------------------------------------------------------------------------------------


class _Subscriber(asyncio.Protocol):
    def __init__(self, process: _SubscriberProcess) -> None:
        self.process = process
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.subscribed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        acks = []
        now = time.monotonic_ns()
        process = self.process
        for first, body in _packets(self.buffer):
            kind = first >> 4
            if kind == 3:
                topic_length = int.from_bytes(body[:2], "big")
                payload_at = 2 + topic_length + (2 if first & 0x06 else 0)
                if first & 0x06:
                    acks.append(b"\x40\x02" + body[2 + topic_length : payload_at])
                (sent,) = _STAMP.unpack_from(body, payload_at)
                process.delivered(sent, now)
            elif kind == 9 and not self.subscribed.done():
                self.subscribed.set_result(None)
        if acks and self.transport is not None:
            self.transport.write(b"".join(acks))


class _SubscriberProcess:
    def __init__(self, window: tuple[float, float]) -> None:
        self.window_ns = (int(window[0] * 1e9), int(window[1] * 1e9))
        self.latencies_ms: list[float] = []
        self.in_window = 0
        self.total = 0

    def delivered(self, sent_ns: int, now_ns: int) -> None:
        self.total += 1
        start, end = self.window_ns
        if start <= now_ns < end:
            self.in_window += 1
        if start <= sent_ns < end:
            self.latencies_ms.append((now_ns - sent_ns) / 1e6)


def _subscriber_main(ports: list[int], prefix: str, pipe: Connection) -> None:
    raise_fd_limit()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        process = _SubscriberProcess((0.0, 0.0))
        clients = []
        for index, port in enumerate(ports):
            _, client = await loop.create_connection(lambda: _Subscriber(process), "127.0.0.1", port)
            assert client.transport is not None
            client.transport.write(_connect(f"{prefix}-{index}") + _subscribe(TOPIC))
            clients.append(client)
        await asyncio.wait_for(asyncio.gather(*(c.subscribed for c in clients)), 120)
        pipe.send("ready")
        window_from, window_to, end_by = await loop.run_in_executor(None, pipe.recv)
        process.window_ns = (int(window_from * 1e9), int(window_to * 1e9))
        await asyncio.sleep(max(0.0, window_from - time.monotonic()))
        cpu_from = time.process_time()
        await asyncio.sleep(max(0.0, window_to - time.monotonic()))
        cpu_to = time.process_time()
        await asyncio.sleep(max(0.0, end_by - time.monotonic()))
        for client in clients:
            if client.transport is not None:
                client.transport.write(b"\xe0\x00")
                client.transport.close()
        pipe.send((process.in_window, process.latencies_ms, (cpu_to - cpu_from) / (window_to - window_from)))

    asyncio.run(main())


# -- the publisher ----------------------------------------------------------------------------------------


def _publisher_main(port: int, client_id: str, rate: int, pipe: Connection) -> None:
    async def main() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_connect(client_id))
        buffer = bytearray()
        while not _packets(buffer):
            buffer += await reader.read(4096)
        start, window_from, window_to = pipe.recv()
        window = asyncio.Semaphore(WINDOW)
        acked = 0

        async def read_acks() -> None:
            nonlocal acked
            pending = bytearray()
            while data := await reader.read(65536):
                pending += data
                for first, _ in _packets(pending):
                    if first >> 4 == 4:
                        acked += 1
                        window.release()

        acks = asyncio.create_task(read_acks())
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        sent = 0
        padding = b"x" * (PAYLOAD - _STAMP.size)
        cpu_from = cpu_to = time.process_time()
        while (now := time.monotonic()) < window_to:
            if now >= window_from and cpu_from == cpu_to:
                cpu_from = time.process_time()
            delay = start + sent / rate - now
            if delay > 0:
                await asyncio.sleep(delay)
            try:  # a broker that stops acknowledging ends the run (it shows as fewer publishes)
                await asyncio.wait_for(window.acquire(), max(0.001, window_to - time.monotonic()))
            except TimeoutError:
                break
            writer.write(_publish(TOPIC, sent % 65535 + 1, _STAMP.pack(time.monotonic_ns()) + padding))
            sent += 1
        cpu_to = time.process_time()
        await asyncio.sleep(2.0)
        acks.cancel()
        writer.close()
        pipe.send((sent, acked, (cpu_to - cpu_from) / (window_to - window_from)))

    asyncio.run(main())


# -- one run ------------------------------------------------------------------------------------------------


@dataclass
class Run:
    setup: str
    rate: int
    delivered_per_s: float
    p50_ms: float
    p99_ms: float
    sent: int
    acked: int
    loadgen_cpu_pct: list[float]
    broker_cpu_pct: float
    other_cpu_pct: float

    @property
    def saturated(self) -> bool:
        return max(self.loadgen_cpu_pct) >= SATURATED_PCT


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def run_once(
    setup: str, rate: int, publish_port: int, subscriber_ports: list[int], accounted: list[int], tag: str
) -> Run:
    """One measurement; ``accounted`` are the pids whose CPU is the platform's (brokers, etcd)."""
    pipes, processes = [], []
    share = [subscriber_ports[i::SUBSCRIBER_PROCESSES] for i in range(SUBSCRIBER_PROCESSES)]
    for index, ports in enumerate(share):
        ours, theirs = _CTX.Pipe()
        process = _CTX.Process(target=_subscriber_main, args=(ports, f"{tag}-s{index}", theirs), daemon=True)
        process.start()
        pipes.append(ours)
        processes.append(process)
    for pipe in pipes:
        if not pipe.poll(180):
            raise RuntimeError("subscribers did not connect in time")
        pipe.recv()
    publisher_pipe, theirs = _CTX.Pipe()
    publisher = _CTX.Process(
        target=_publisher_main, args=(publish_port, f"{tag}-pub", rate, theirs), daemon=True
    )
    publisher.start()
    start = time.monotonic() + 1.0
    window_from, window_to = start + WARMUP_S, start + WARMUP_S + MEASURE_S
    end_by = window_to + 5.0
    publisher_pipe.send((start, window_from, window_to))
    for pipe in pipes:
        pipe.send((window_from, window_to, end_by))
    time.sleep(max(0.0, window_from - time.monotonic()))
    busy_from, platform_from = machine_busy_seconds(), sum(cpu_seconds(pid) for pid in accounted)
    time.sleep(max(0.0, window_to - time.monotonic()))
    busy_to, platform_to = machine_busy_seconds(), sum(cpu_seconds(pid) for pid in accounted)
    results = [pipe.recv() for pipe in pipes]
    sent, acked, publisher_cpu = publisher_pipe.recv()
    for process in [*processes, publisher]:
        process.join(30)
    loadgen = [publisher_cpu * 100] + [cpu * 100 for _, _, cpu in results]
    platform = (platform_to - platform_from) / MEASURE_S * 100
    other = (busy_to - busy_from) / MEASURE_S * 100 - platform - sum(loadgen)
    latencies = [value for _, values, _ in results for value in values]
    return Run(
        setup,
        rate,
        sum(count for count, _, _ in results) / MEASURE_S,
        _percentile(latencies, 0.5),
        _percentile(latencies, 0.99),
        sent,
        acked,
        loadgen,
        platform,
        max(0.0, other),
    )


@dataclass
class Figures:
    runs: list[Run] = field(default_factory=list)
    wall_s: float = 0.0


def run(root: Path) -> Figures:
    figures = Figures()
    started = time.monotonic()
    single = BrokerProcess(root / "single", name="single", **SECTIONS).start()
    etcd = EtcdServer(root / "etcd").start()
    brokers: dict[str, BrokerProcess] = {}
    try:
        target = EtcdTarget(etcd, "/bench-fanout")
        for node in NODES:
            brokers[node] = cluster_broker(
                root / "cluster", target, node, {"replication_factor": 3}, **SECTIONS
            )
            brokers[node].start()
        deadline = time.monotonic() + 60
        while not settled(target, set(NODES), 3):
            if time.monotonic() > deadline:
                raise TimeoutError("the cluster did not settle")
            time.sleep(0.1)
        cluster_ports = [brokers[node].port for node in NODES]
        pids = [p.process.pid for p in [single, *brokers.values()] if p.process is not None]
        assert etcd.process is not None
        pids.append(etcd.process.pid)
        turns = [(rate, attempt) for rate in RATES for attempt in range(RUNS)]
        for rate, attempt in turns:  # taking turns, so that a change of the machine's load hits both
            for setup, publish_port, ports in (
                ("one broker", single.port, [single.port] * SUBSCRIBERS),
                ("3 brokers, RF 3", cluster_ports[0], [cluster_ports[i % 3] for i in range(SUBSCRIBERS)]),
            ):
                result = run_once(setup, rate, publish_port, ports, pids, f"r{rate}-{attempt}{setup[0]}")
                print(
                    f"  {setup}, {rate} msg/s: {result.delivered_per_s:,.0f} deliveries/s, "
                    f"p50 {result.p50_ms:.1f} ms, "
                    f"p99 {result.p99_ms:.1f} ms, load processes "
                    f"{', '.join(f'{c:.0f}%' for c in result.loadgen_cpu_pct)}, "
                    f"other {result.other_cpu_pct:.0f}%",
                    flush=True,
                )
                figures.runs.append(result)
    finally:
        for process in [single, *brokers.values()]:
            process.stop()
        etcd.kill()
    figures.wall_s = time.monotonic() - started
    return figures


def render(figures: Figures, command: str) -> str:
    machine = machine_info()
    other = statistics.mean(run_.other_cpu_pct for run_ in figures.runs) / 100 if figures.runs else 0.0
    load = machine_load_sentence(other, "the figures are worse than on an idle machine")
    lines = [
        "## Fanout over a broker cluster",
        "",
        f"Written by `{command}` on {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}, "
        f"{figures.wall_s:.0f} s. Machine: {machine.cpu_model}, {machine.cores} CPUs, "
        f"{machine.memory_gib:.1f} GiB, {machine.kernel}, Python {machine.python}. etcd, three cluster "
        "brokers, one broker alone and the load processes share the machine (no pinning). Other processes "
        f"used {other:.0%} of a CPU on average ({load}): the `other CPU` column is what everything else "
        "used during each measurement, in % of one CPU.",
        "",
        f"1 publisher → {SUBSCRIBERS:,} subscribers on `{TOPIC}`, QoS 1 both ways (MQTT 3.1.1 subscribers, "
        f"every delivery PUBACKed), {PAYLOAD}-byte payloads, the publisher at a fixed rate "
        f"(deliveries/s owed: {SUBSCRIBERS:,} per publish/s) with at most {WINDOW} unacknowledged. "
        "One broker: everyone on it. Cluster: 3 brokers, replication_factor 3, acks=all with "
        "min_insync_replicas 2, "
        f"subscriber i on broker i mod 3, the publisher on broker A. {MEASURE_S:.0f} s measured after "
        f"{WARMUP_S:.0f} s; {RUNS} runs of each, "
        f"taking turns. Subscribers in {SUBSCRIBER_PROCESSES} processes, the publisher in its own; a run in "
        f"which a load process used ≥ {SATURATED_PCT:.0f} % of a CPU does not count (marked).",
        "",
        "| setup | publishes/s | deliveries/s | latency p50 / p99 (ms) | published / PUBACKed | "
        "load processes (% CPU) | all brokers + etcd (% CPU) | other CPU (%) |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for run_ in figures.runs:
        mark = " (load generator saturated: does not count)" if run_.saturated else ""
        lines.append(
            f"| {run_.setup}{mark} | {run_.rate} | {run_.delivered_per_s:,.0f} | "
            f"{run_.p50_ms:.1f} / {run_.p99_ms:.1f} | "
            f"{run_.sent:,} / {run_.acked:,} | {', '.join(f'{c:.0f}' for c in run_.loadgen_cpu_pct)} | "
            f"{run_.broker_cpu_pct:.0f} | {run_.other_cpu_pct:.0f} |"
        )
    lines.append("")
    for rate, setup in [(rate, setup) for rate in RATES for setup in ("one broker", "3 brokers, RF 3")]:
        valid = [r for r in figures.runs if r.setup == setup and r.rate == rate and not r.saturated]
        if valid:
            lines.append(
                f"- **{setup}, {rate} publishes/s** ({rate * SUBSCRIBERS:,} deliveries/s owed), median of "
                f"{len(valid)} valid runs: "
                f"{statistics.median(r.delivered_per_s for r in valid):,.0f} deliveries/s, latency p50 "
                f"{statistics.median(r.p50_ms for r in valid):.1f} ms, p99 "
                f"{statistics.median(r.p99_ms for r in valid):.1f} ms."
            )
        else:
            lines.append(f"- **{setup}, {rate} publishes/s**: no valid run.")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_and_write(argv, "cluster-fanout", __doc__, run, render)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
