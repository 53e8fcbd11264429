"""Idle connections: broker memory per connected, idle MQTT client."""

from __future__ import annotations

from bench.brokers.base import RunningBroker
from bench.loadgen.idle import IdleResult, run_idle
from bench.scenarios.base import Measured, Row, RunContext, ScenarioResult, Target, measure

TARGET_BYTES = 4096
COLUMNS = ["configuration", "connections", "RSS before", "RSS after", "connect time"]


def clients(ctx: RunContext) -> int:
    """10,000 idle clients (1,000 in a quick run)."""
    return 1000 if ctx.quick else 10_000


def run(ctx: RunContext) -> ScenarioResult:
    """Measure RSS per idle connection for every broker."""
    count = clients(ctx)
    rows = []
    for broker in ctx.brokers:
        ctx.log(f"  {count:,} idle clients: {broker.label}")

        def once(running: RunningBroker) -> IdleResult:
            return run_idle(running, count, cpus=ctx.loadgen_cpus)

        outcome = measure(ctx, broker, once, lambda r: r.bytes_per_connection)
        if not isinstance(outcome, Measured):
            rows.append(Row("idle", broker.label, None, note=outcome))
            continue
        r = outcome.result
        ctx.log(f"    {r.bytes_per_connection:,.0f} bytes per connection")
        cells = {
            "configuration": broker.summary,
            "connections": f"{r.connected:,}",
            "RSS before": f"{r.rss_before / 1e6:.1f} MB",
            "RSS after": f"{r.rss_after / 1e6:.1f} MB",
            "connect time": f"{r.connect_seconds:.1f} s",
        }
        rows.append(Row("idle", broker.label, r.bytes_per_connection, cells))
    result = ScenarioResult(
        key="idle",
        title=f"Idle connections: {count:,} clients",
        description=(
            f"{count:,} clients connect (MQTT 3.1.1, clean session, keepalive 600 s, 100 connects in flight "
            "at a time) and stay idle. The broker's VmRSS (summed over its process tree) is read from "
            "/proc before they connect and 1 s after the last CONNACK. Figure: (RSS after - RSS before) / "
            "connections, in bytes (lower is better). Kernel socket buffers are not part of RSS."
        ),
        figure_name="bytes/connection",
        higher_is_better=False,
        columns=COLUMNS,
        rows=rows,
    )
    mine = result.figure("idle", "timestone")
    goal = f"< {TARGET_BYTES // 1024} KB broker memory per idle connection"
    result.targets.append(
        Target(goal, "not measured", None)
        if mine is None
        else Target(goal, f"{mine:,.0f} bytes", mine < TARGET_BYTES)
    )
    return result
