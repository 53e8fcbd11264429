"""Shared by the fan-in, fanout and persisted scenarios: one flow per broker and QoS, as table rows."""

from __future__ import annotations

from bench.brokers.base import BrokerUnderTest, RunningBroker
from bench.loadgen.flow import FlowResult, FlowSpec, run_flow
from bench.scenarios.base import Measured, Row, RunContext, measure, spread
from bench.sysinfo import dir_bytes

COLUMNS = [
    "published/s",
    "runs (delivered/s)",
    "undelivered",
    "broker CPU",
    "load-gen CPU",
    "other CPU",
    "broker RSS",
]


def flow_row(
    ctx: RunContext, broker: BrokerUnderTest, case: str, spec: FlowSpec, data_dir_size: bool = False
) -> Row:
    """Measure `spec` against `broker` and turn the median run into a row."""
    ctx.log(f"  {case}: {broker.label}")

    def once(running: RunningBroker) -> tuple[FlowResult, int]:
        result = run_flow(running, spec, ctx.timing, ctx.loadgen_cpus)
        return result, dir_bytes(running.data_dir)

    outcome = measure(ctx, broker, once, lambda r: r[0].delivered_per_s)
    if not isinstance(outcome, Measured):
        return Row(case, broker.label, None, note=outcome)
    r, on_disk = outcome.result
    ctx.other_cpu.append(r.other_cpu_pct)
    ctx.log(f"    delivered/s {r.delivered_per_s:,.0f} (runs: {spread(outcome.figures) or 'one'})")
    cells = {
        "published/s": f"{r.published_per_s:,.0f}",
        "runs (delivered/s)": spread(outcome.figures),
        "undelivered": _undelivered(r),
        "broker CPU": f"{r.broker_cpu_pct:.0f}%",
        "load-gen CPU": f"{r.loadgen_cpu_pct:.0f}%" + (" (saturated)" if r.loadgen_cpu_pct > 90 else ""),
        "other CPU": f"{r.other_cpu_pct:.0f}%",
        "broker RSS": f"{r.broker_rss_bytes / 1e6:.1f} MB",
    }
    if data_dir_size:
        cells["data on disk"] = _size(on_disk)
    return Row(case, broker.label, r.delivered_per_s, cells, note="; ".join(r.errors[:2]))


def _undelivered(r: FlowResult) -> str:
    """Deliveries owed and not made by the end of the drain (QoS 0 may be dropped; QoS 1 must not)."""
    text = f"{r.undelivered:,}" if r.undelivered else "0"
    if r.stalls:
        text += f" (deliveries stalled {r.stalls}x)"
    return text


def _size(n: int) -> str:
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
