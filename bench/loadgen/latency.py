"""End-to-end latency at a fixed rate: one paced publisher process, one subscriber process.

The publisher puts (sequence number, CLOCK_MONOTONIC nanoseconds) at the start of each payload just before
writing it; the subscriber subtracts that from its own CLOCK_MONOTONIC on receipt (the clock is system-wide,
so two processes can compare it). Both use plain blocking sockets with TCP_NODELAY: at 1,000 msg/s the cost
that matters is wake-up latency, not throughput, and an event loop would only add to it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import socket
import struct
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from bench import frames, net
from bench.brokers.base import RunningBroker
from bench.loadgen.processes import WorkerFailed, receive
from bench.stream import parse_fixed_header
from bench.sysinfo import cpu_seconds, machine_busy_seconds

_CTX = mp.get_context("spawn")
_STAMP = struct.Struct("!qq")  # sequence number, monotonic ns at send


@dataclass(frozen=True)
class LatencyResult:
    """Latency percentiles (ms) over the messages sent after warm-up."""

    sent: int
    received: int
    measured: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    achieved_rate: float  # messages/s the publisher actually sent over the measured part
    broker_cpu_pct: float
    other_cpu_pct: float  # CPU used by anything else on the machine meanwhile (100 = one core)


def run_latency(
    broker: RunningBroker,
    qos: int,
    rate: int,
    warmup_s: float,
    measure_s: float,
    payload_size: int = 64,
    cpus: set[int] | None = None,
) -> LatencyResult:
    """Publish `rate` msg/s for warm-up + measure seconds; percentiles over the measured messages."""
    warmup = int(rate * warmup_s)
    total = warmup + int(rate * measure_s)
    topic = "bench/latency"
    deadline = time.monotonic() + warmup_s + measure_s + 30
    sub_parent, sub_child = _CTX.Pipe()
    pub_parent, pub_child = _CTX.Pipe()
    cpu_tuple = tuple(sorted(cpus)) if cpus else None
    subscriber = _CTX.Process(
        target=_subscriber_main,
        args=(broker.port, topic, qos, total, deadline, cpu_tuple, sub_child),
        daemon=True,
    )
    publisher = _CTX.Process(
        target=_publisher_main,
        args=(broker.port, topic, qos, rate, total, payload_size, deadline, cpu_tuple, pub_child),
        daemon=True,
    )
    try:
        subscriber.start()
        _expect(sub_parent, "ready", 30, subscriber)
        publisher.start()
        _expect(pub_parent, "ready", 30, publisher)
        go = time.monotonic() + 0.1
        cpu_from, busy_from = cpu_seconds(broker.pid), machine_busy_seconds()
        pub_parent.send(("go", go))
        sent_report = _expect(pub_parent, "done", deadline - time.monotonic() + 5, publisher)
        sub_report = _expect(sub_parent, "done", deadline - time.monotonic() + 5, subscriber)
        elapsed = time.monotonic() - go
        broker_cpu = (cpu_seconds(broker.pid) - cpu_from) / elapsed
        machine_busy = (machine_busy_seconds() - busy_from) / elapsed
    finally:
        for process in (publisher, subscriber):
            if process.pid is None:
                continue
            process.join(timeout=2)
            if process.is_alive():
                process.kill()
                process.join(timeout=2)
    sent, first_ns, last_ns, pub_cpu = sent_report[1:5]
    seqs, latencies, sub_cpu = sub_report[1:4]
    workers_cpu = (pub_cpu + sub_cpu) / elapsed
    measured = sorted(lat for seq, lat in zip(seqs, latencies, strict=True) if seq >= warmup)
    span_s = (last_ns - first_ns) / 1e9
    return LatencyResult(
        sent=sent,
        received=len(seqs),
        measured=len(measured),
        p50_ms=_percentile(measured, 50) / 1e6,
        p99_ms=_percentile(measured, 99) / 1e6,
        max_ms=(measured[-1] / 1e6) if measured else float("nan"),
        achieved_rate=(sent - 1) / span_s if span_s > 0 else 0.0,
        broker_cpu_pct=100 * broker_cpu,
        other_cpu_pct=max(100 * (machine_busy - broker_cpu - workers_cpu), 0.0),
    )


def _percentile(sorted_values: list[int], pct: float) -> float:
    """Nearest-rank percentile (NaN for no values)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * pct // 100))
    return float(sorted_values[int(rank) - 1])


def _expect(conn: Connection, kind: str, timeout: float, process: BaseProcess) -> tuple:
    message = receive(conn, max(timeout, 0.1), "latency worker", process)
    if message[0] != kind:
        raise WorkerFailed(f"latency worker: {message[1:]}")
    return message


def _connect(port: int, client_id: str) -> socket.socket:
    sock = socket.create_connection((net.HOST, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(frames.connect(client_id))
    reply = _read_frame(sock, bytearray())
    if reply is None or reply[0] != frames.CONNACK or reply[3] != 0:
        raise ConnectionError(f"CONNACK refused or missing: {reply!r}")
    return sock


def _read_frame(sock: socket.socket, buf: bytearray) -> bytes | None:
    """Read exactly one frame (blocking); leftover bytes stay in `buf`."""
    while True:
        parsed = parse_fixed_header(buf, 0)
        if parsed is not None and len(buf) >= parsed[1]:
            frame = bytes(buf[: parsed[1]])
            del buf[: parsed[1]]
            return frame
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk


def _pin(cpus: tuple[int, ...] | None) -> None:
    if cpus:
        os.sched_setaffinity(0, set(cpus))


def _subscriber_main(
    port: int,
    topic: str,
    qos: int,
    total: int,
    deadline: float,
    cpus: tuple[int, ...] | None,
    conn: Connection,
) -> None:
    try:
        _pin(cpus)
        sock = _connect(port, "bench-latency-sub")
        sock.sendall(frames.subscribe(1, topic, qos))
        buf = bytearray()
        suback = _read_frame(sock, buf)
        if suback is None or suback[0] != frames.SUBACK or suback[-1] == 0x80:
            raise ConnectionError(f"SUBACK refused or missing: {suback!r}")
        conn.send(("ready",))
        cpu_start = time.process_time()
        seqs: list[int] = []
        latencies: list[int] = []
        sock.settimeout(0.5)
        while len(seqs) < total and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            now = time.monotonic_ns()
            if not chunk:
                break
            buf += chunk
            pos, acks = 0, []
            while (parsed := parse_fixed_header(buf, pos)) is not None and pos + parsed[1] <= len(buf):
                header_len, length = parsed
                if buf[pos] >> 4 == 3:
                    topic_len = (buf[pos + header_len] << 8) | buf[pos + header_len + 1]
                    body = pos + header_len + 2 + topic_len
                    if (buf[pos] >> 1) & 3:
                        acks.append(bytes((frames.PUBACK, 2)) + bytes(buf[body : body + 2]))
                        body += 2
                    seq, sent_ns = _STAMP.unpack_from(buf, body)
                    seqs.append(seq)
                    latencies.append(now - sent_ns)
                pos += length
            del buf[:pos]
            if acks:
                sock.sendall(b"".join(acks))
        with contextlib.suppress(OSError):
            sock.sendall(frames.DISCONNECT_FRAME)
        sock.close()
        conn.send(("done", seqs, latencies, time.process_time() - cpu_start))
    except Exception as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))


def _publisher_main(
    port: int,
    topic: str,
    qos: int,
    rate: int,
    total: int,
    payload_size: int,
    deadline: float,
    cpus: tuple[int, ...] | None,
    conn: Connection,
) -> None:
    try:
        _pin(cpus)
        sock = _connect(port, "bench-latency-pub")
        padding = bytes(max(payload_size - _STAMP.size, 0))
        conn.send(("ready",))
        _, start = conn.recv()
        cpu_start = time.process_time()
        sock.setblocking(False)
        interval = 1.0 / rate
        sent, first_ns, last_ns = 0, 0, 0
        for seq in range(total):
            target = start + seq * interval
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if time.monotonic() > deadline:
                break
            now_ns = time.monotonic_ns()
            frame = frames.publish(topic, _STAMP.pack(seq, now_ns) + padding, qos, (seq % 65535) + 1)
            sock.setblocking(True)
            sock.sendall(frame)
            sock.setblocking(False)
            first_ns = first_ns or now_ns
            last_ns = now_ns
            sent += 1
            with contextlib.suppress(BlockingIOError):
                while sock.recv(65536):  # PUBACKs: read and drop
                    pass
        time.sleep(0.2)
        with contextlib.suppress(OSError):
            sock.setblocking(True)
            sock.sendall(frames.DISCONNECT_FRAME)
        sock.close()
        conn.send(("done", sent, first_ns, last_ns, time.process_time() - cpu_start))
    except Exception as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
