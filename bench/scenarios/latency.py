"""Latency: one publisher paced at 1,000 msg/s, one subscriber, send timestamp in the payload."""

from __future__ import annotations

import math

from bench.brokers.base import RunningBroker
from bench.loadgen.latency import LatencyResult, run_latency
from bench.scenarios.base import Measured, Row, RunContext, ScenarioResult, Target, measure, spread

RATE = 1000
TARGET_P99_MS = 2.0
COLUMNS = ["configuration", "p50 ms", "max ms", "runs (p99 ms)", "received/sent", "broker CPU", "other CPU"]


def run(ctx: RunContext) -> ScenarioResult:
    """Measure p50/p99/max for every broker at QoS 0 and QoS 1."""
    warmup_s, measure_s = (1.0, 3.0) if ctx.quick else (2.0, 10.0)
    rows = []
    for qos in (0, 1):
        for default in ctx.brokers:
            broker = default.with_tcp_nodelay()
            ctx.log(f"  QoS {qos}: {broker.label}")

            def once(running: RunningBroker, qos: int = qos) -> LatencyResult:
                return run_latency(running, qos, RATE, warmup_s, measure_s, cpus=ctx.loadgen_cpus)

            outcome = measure(ctx, broker, once, lambda r: r.p99_ms)
            if not isinstance(outcome, Measured):
                rows.append(Row(f"QoS {qos}", broker.label, None, note=outcome))
                continue
            r = outcome.result
            ctx.other_cpu.append(r.other_cpu_pct)
            ctx.log(f"    p50 {r.p50_ms:.3f} ms, p99 {r.p99_ms:.3f} ms, max {r.max_ms:.3f} ms")
            cells = {
                "configuration": broker.summary,
                "p50 ms": f"{r.p50_ms:.3f}",
                "max ms": f"{r.max_ms:.3f}",
                "runs (p99 ms)": spread(outcome.figures),
                "received/sent": f"{r.received:,}/{r.sent:,}",
                "broker CPU": f"{r.broker_cpu_pct:.0f}%",
                "other CPU": f"{r.other_cpu_pct:.0f}%",
            }
            figure = None if math.isnan(r.p99_ms) else r.p99_ms
            reasons = []
            if qos and r.received < r.sent:
                reasons.append(f"{r.sent - r.received:,} QoS 1 messages never received")
            if r.achieved_rate < 0.9 * RATE:
                reasons.append(f"the publisher reached only {r.achieved_rate:,.0f} msg/s")
            invalid = "; ".join(reasons)
            rows.append(Row(f"QoS {qos}", broker.label, figure, cells, invalid=invalid))
    result = ScenarioResult(
        key="latency",
        title=f"Latency at {RATE:,} msg/s",
        description=(
            f"One publisher paced at {RATE:,} msg/s (64-byte payloads starting with the send time), one "
            f"subscriber at the same QoS; {warmup_s:.0f} s of warm-up, then {measure_s:.0f} s measured "
            f"({int(RATE * measure_s):,} messages). Latency is publish-call to receipt, both clocks "
            "CLOCK_MONOTONIC of the same machine. Figure: p99 in ms (lower is better). Every broker runs "
            "with TCP_NODELAY here (Mosquitto `set_tcp_nodelay true`, Aedes `noDelay: true`; Timestone's and "
            "amqtt's asyncio default), the same on all: with Nagle on, a peer's small deliveries would wait "
            "for the previous one's ACK. The throughput scenarios keep each broker's default TCP options."
        ),
        figure_name="p99 ms",
        higher_is_better=False,
        columns=COLUMNS,
        rows=rows,
    )
    for qos in (0, 1):
        p99 = result.figure(f"QoS {qos}", "timestone")
        goal = f"p99 latency QoS {qos} < {TARGET_P99_MS:g} ms at {RATE:,} msg/s"
        if p99 is None:
            result.targets.append(Target(goal, "not measured", None))
        else:
            result.targets.append(Target(goal, f"{p99:.3f} ms", p99 < TARGET_P99_MS))
    return result
