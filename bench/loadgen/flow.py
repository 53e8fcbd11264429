"""One throughput measurement: P publishers and S subscribers against a running broker.

Subscribers connect and subscribe first (in one or more processes), then publishers connect (in their own
process). Everyone gets the same absolute schedule: publish from `start`, measure over
[start + warm-up, start + warm-up + measure), stop publishing at the end of the window, then drain. Rates come
from the workers' counter samples interpolated at the window's edges; the broker's CPU use is read from /proc
at the same edges.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from bench.brokers.base import RunningBroker
from bench.loadgen.processes import WorkerSet
from bench.loadgen.worker import BLOB_FRAMES, WorkerReport, WorkerSpec
from bench.sysinfo import cpu_seconds, machine_busy_seconds, rss_bytes


@dataclass(frozen=True)
class FlowSpec:
    """Who publishes what to whom."""

    publishers: int
    subscribers: int
    qos: int
    topics: tuple[str, ...]
    subscription: str
    payload_size: int = 64
    window: int = 64  # QoS 1 in-flight PUBLISHes per publisher
    ahead: int = 2000  # messages the publishers may be ahead of the average subscriber
    subscriber_processes: int = 1
    publisher_processes: int = 1
    blob_frames: int = BLOB_FRAMES  # frames pre-built per topic (thousands of topics: fewer)


@dataclass(frozen=True)
class Timing:
    """How long each phase lasts (seconds)."""

    warmup_s: float = 2.0
    measure_s: float = 5.0
    drain_s: float = 15.0  # the longest drain: it ends once every subscriber has everything it is owed
    connect_timeout_s: float = 60.0


@dataclass
class FlowResult:
    """Rates over the measurement window and totals over the whole run."""

    published_per_s: float
    delivered_per_s: float  # deliveries at the subscribers (one message to S subscribers counts S)
    sent: int
    acked: int
    delivered: int
    expected: int  # deliveries owed for what was sent (QoS 1: every acknowledged message to every subscriber)
    min_per_subscriber: int
    stalls: int  # times deliveries stopped for 0.25 s and the limiter let the publishers go on regardless
    broker_cpu_pct: float
    loadgen_cpu_pct: float
    other_cpu_pct: float  # CPU used by anything else on the machine during the window (100 = one core)
    broker_rss_bytes: int
    loadgen_process_cpu_pct: list[float] = field(default_factory=list)  # each process, 100 = one core
    redelivered: int = 0  # PUBLISH packets with the DUP flag at the subscribers, not counted in `delivered`
    errors: list[str] = field(default_factory=list)

    @property
    def undelivered(self) -> int:
        """Deliveries owed but not made by the end of the drain (0: every subscriber got every message)."""
        return max(self.expected - self.delivered, 0)


def run_flow(broker: RunningBroker, spec: FlowSpec, timing: Timing, cpus: set[int] | None) -> FlowResult:
    """Run one measurement against `broker`; raise WorkerFailed if the load generator could not."""
    cpu_tuple = tuple(sorted(cpus)) if cpus else None
    with WorkerSet(spec.subscriber_processes) as workers:

        def start_worker(role: str, index: int, count: int, **fields: Any) -> None:
            worker = WorkerSpec(
                role=role,
                port=broker.port,
                clients=count,
                client_prefix=f"bench-{role[:3]}{index}-",
                qos=spec.qos,
                payload_size=spec.payload_size,
                connect_timeout_s=timing.connect_timeout_s,
                cpus=cpu_tuple,
                **fields,
            )
            workers.start(worker, ready_timeout=timing.connect_timeout_s + 15)

        for index, count in enumerate(_split(spec.subscribers, spec.subscriber_processes)):
            start_worker(
                "subscribe",
                index,
                count,
                topics=spec.topics,
                subscription=spec.subscription,
                shared_index=index,
            )
        first = 0
        for index, count in enumerate(_split(spec.publishers, spec.publisher_processes)):
            turn = first % len(spec.topics)
            start_worker(
                "publish",
                index,
                count,
                # client i of this process publishes on topic (first + i): every publisher its own topic
                topics=spec.topics[turn:] + spec.topics[:turn],
                window=spec.window,
                ahead=spec.ahead,
                blob_frames=spec.blob_frames,
                subscribers_total=spec.subscribers,
                publisher_share=count / spec.publishers,
            )
            first += count
        start = time.monotonic() + 0.2
        window_from = start + timing.warmup_s
        window_to = window_from + timing.measure_s
        end_by = window_to + timing.drain_s
        workers.send_all(("go", start, window_to, end_by))
        _sleep_until(window_from)
        cpu_from, busy_from = cpu_seconds(broker.pid), machine_busy_seconds()
        _sleep_until(window_to)
        cpu_to, busy_to = cpu_seconds(broker.pid), machine_busy_seconds()
        rss = rss_bytes(broker.pid)
        publishers = workers.reports(timeout=end_by - time.monotonic() + 30, role="publish")
        owed = sum(r.acked if spec.qos else r.sent for r in publishers)
        workers.send_all(("expect", owed), role="subscribe")
        reports = publishers + workers.reports(timeout=end_by - time.monotonic() + 30, role="subscribe")
    span = timing.measure_s
    return _summarise(
        spec, reports, window_from, window_to, (cpu_to - cpu_from) / span, (busy_to - busy_from) / span, rss
    )


def _summarise(
    spec: FlowSpec,
    reports: list[WorkerReport],
    t0: float,
    t1: float,
    broker_cpu: float,
    machine_busy: float,
    rss: int,
) -> FlowResult:
    publishers = [r for r in reports if r.role == "publish"]
    subscribers = [r for r in reports if r.role == "subscribe"]
    span = t1 - t0
    published = sum(_at(r.samples, t1, 1) - _at(r.samples, t0, 1) for r in publishers) / span
    delivered = sum(_at(r.samples, t1, 3) - _at(r.samples, t0, 3) for r in subscribers) / span
    per_process = [(_at(r.samples, t1, 4) - _at(r.samples, t0, 4)) / span for r in reports]
    loadgen_cpu = sum(per_process)
    sent = sum(r.sent for r in publishers)
    acked = sum(r.acked for r in publishers)
    owed_per_subscriber = acked if spec.qos else sent
    return FlowResult(
        published_per_s=published,
        delivered_per_s=delivered,
        sent=sent,
        acked=acked,
        delivered=sum(r.received for r in subscribers),
        expected=owed_per_subscriber * spec.subscribers,
        min_per_subscriber=min((r.per_client_min for r in subscribers), default=0),
        stalls=sum(r.stalls for r in publishers),
        broker_cpu_pct=100 * broker_cpu,
        loadgen_cpu_pct=100 * loadgen_cpu,
        other_cpu_pct=max(100 * (machine_busy - broker_cpu - loadgen_cpu), 0.0),
        broker_rss_bytes=rss,
        loadgen_process_cpu_pct=[100 * cpu for cpu in per_process],
        redelivered=sum(r.redelivered for r in subscribers),
        errors=[e for r in reports for e in r.errors][:5],
    )


def _at(samples: list[tuple[float, int, int, int, float]], t: float, column: int) -> float:
    """Value of `column` at time t, linearly interpolated between the samples around it."""
    if not samples:
        return 0.0
    if t <= samples[0][0]:
        return float(samples[0][column])
    for before, after in itertools.pairwise(samples):
        if before[0] <= t <= after[0]:
            if after[0] == before[0]:
                return float(after[column])
            share = (t - before[0]) / (after[0] - before[0])
            return before[column] + share * (after[column] - before[column])
    return float(samples[-1][column])


def _split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)
