"""Shared by the fan-in, fanout and persisted scenarios: one flow per broker and QoS, as table rows.

A flow measurement counts only when the load generator kept up and nothing acknowledged was lost:

* a load-generator process at >= 90 % of its core, or all its CPUs together at >= 90 %, means the load
  generator may have set the pace. While its CPUs have room left, the flow is measured again with twice
  the publisher and subscriber processes (up to `MAX_PROCESSES` each); when they have none, more
  processes cannot help and the row is marked invalid.
* a QoS 1 flow in which acknowledged messages went undelivered is invalid.
* in the persisted scenario, a broker configured to persist that left nothing in its data directory fails
  the run (its persistence was not on).

Each broker configuration (`BrokerUnderTest.config_key`) is measured once per flow in a run; a scenario that
shows the same configuration again shows that measurement, never a second one to choose from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bench.brokers.base import BrokerUnderTest, RunningBroker
from bench.loadgen.flow import FlowResult, FlowSpec, run_flow
from bench.scenarios.base import Measured, Row, RunContext, ScenarioResult, measure, spread
from bench.sysinfo import dir_bytes

COLUMNS = [
    "configuration",
    "published/s",
    "runs (delivered/s)",
    "undelivered",
    "broker CPU",
    "load-gen CPU (per process)",
    "other CPU",
    "broker RSS",
]
#: what every flow's description says about windows and sockets
IN_FLIGHT_AND_TCP = (
    " In flight: at most 64 QoS 1 messages unacknowledged per publisher (the load generator) and per "
    "subscriber (Timestone's `max_inflight_out` 64, Mosquitto's `max_inflight_messages` set to 64 from its "
    "default 20; Aedes and amqtt have no such limit). TCP: each broker's default options (Timestone and "
    "amqtt: TCP_NODELAY, asyncio's default; Mosquitto and Aedes: Nagle on, theirs)."
)
#: a load-generator process (or all its CPUs together) this busy may be what sets the pace
SATURATED_PCT = 90.0
#: most publisher (and subscriber) processes a flow is spread over before a saturated row is given up
MAX_PROCESSES = 4


@dataclass(frozen=True)
class FlowMeasurement:
    """The median run of a flow, what it left on disk, and why it does not count ("" when it does)."""

    result: FlowResult
    on_disk: int
    figures: list[float]
    spec: FlowSpec  # as finally run (with the process counts it needed)
    invalid: str
    drop_notice: str  # what the broker's log says about messages it dropped ("" if nothing)


def persisted_result(key: str, title: str, description: str, rows: list[Row]) -> ScenarioResult:
    """The table of a scenario that compares persisting configurations: deliveries/s, what each left on
    disk, ratios against Timestone with its persistence on."""
    return ScenarioResult(
        key=key,
        title=title,
        description=description,
        figure_name="delivered/s",
        higher_is_better=True,
        columns=[*COLUMNS, "data on disk"],
        rows=rows,
        reference="timestone (persist on)",
    )


def saturation(result: FlowResult, loadgen_cpus: int) -> str:
    """Why the load generator may have set the pace ("" when it did not)."""
    busiest = max(result.loadgen_process_cpu_pct, default=0.0)
    if busiest >= SATURATED_PCT:
        return f"load generator saturated: one process at {busiest:.0f}% of its core"
    if result.loadgen_cpu_pct >= SATURATED_PCT * loadgen_cpus:
        return f"load generator saturated: its {loadgen_cpus} CPU(s) at {result.loadgen_cpu_pct:.0f}%"
    return ""


def verdict(result: FlowResult, spec: FlowSpec, loadgen_cpus: int) -> str:
    """Why this run does not count ("" when it does)."""
    reasons = []
    if spec.qos and result.undelivered:
        reasons.append(f"{result.undelivered:,} acknowledged deliveries never made")
    if saturated := saturation(result, loadgen_cpus):
        reasons.append(saturated)
    return "; ".join(reasons)


def more_processes(spec: FlowSpec, result: FlowResult, loadgen_cpus: int) -> FlowSpec | None:
    """The same flow over twice the processes, when the load generator has CPU left for them."""
    if result.loadgen_cpu_pct >= SATURATED_PCT * loadgen_cpus:
        return None
    publishers = min(spec.publisher_processes * 2, spec.publishers, MAX_PROCESSES)
    subscribers = min(spec.subscriber_processes * 2, spec.subscribers, MAX_PROCESSES)
    if (publishers, subscribers) == (spec.publisher_processes, spec.subscriber_processes):
        return None
    return dataclasses.replace(spec, publisher_processes=publishers, subscriber_processes=subscribers)


def measure_flow(ctx: RunContext, broker: BrokerUnderTest, spec: FlowSpec) -> FlowMeasurement | str:
    """The flow measured against `broker` (once per configuration and run), or why it could not be."""
    key = (broker.config_key, spec)
    if key in ctx.flows:
        return ctx.flows[key]
    loadgen_cpus = len(ctx.loadgen_cpus or ()) or 1
    running_spec = spec
    while True:

        def once(running: RunningBroker, spec: FlowSpec = running_spec) -> tuple[FlowResult, int, str]:
            result = run_flow(running, spec, ctx.timing, ctx.loadgen_cpus)
            return result, dir_bytes(running.data_dir), broker.drop_notice(_read_log(running))

        outcome = measure(ctx, broker, once, lambda r: r[0].delivered_per_s)
        if not isinstance(outcome, Measured):
            ctx.flows[key] = outcome
            return outcome
        result, on_disk, drop_notice = outcome.result
        invalid = verdict(result, running_spec, loadgen_cpus)
        wider = (
            more_processes(running_spec, result, loadgen_cpus) if saturation(result, loadgen_cpus) else None
        )
        if wider is None:
            break
        ctx.log(
            f"    {invalid}: again with {wider.publisher_processes}+{wider.subscriber_processes} processes"
        )
        running_spec = wider
    measured = FlowMeasurement(result, on_disk, outcome.figures, running_spec, invalid, drop_notice)
    ctx.flows[key] = measured
    return measured


def flow_row(
    ctx: RunContext, broker: BrokerUnderTest, case: str, spec: FlowSpec, data_dir_size: bool = False
) -> Row:
    """Measure `spec` against `broker` (or reuse this run's measurement of it) and turn it into a row."""
    ctx.log(f"  {case}: {broker.label}")
    reused = (broker.config_key, spec) in ctx.flows
    measured = measure_flow(ctx, broker, spec)
    if not isinstance(measured, FlowMeasurement):
        return Row(case, broker.label, None, {"configuration": broker.summary}, note=measured)
    r = measured.result
    if not reused:
        ctx.other_cpu.append(r.other_cpu_pct)
    ctx.log(
        f"    delivered/s {r.delivered_per_s:,.0f} (runs: {spread(measured.figures) or 'one'})"
        + (f" INVALID: {measured.invalid}" if measured.invalid else "")
    )
    cells = {
        "configuration": broker.summary,
        "published/s": f"{r.published_per_s:,.0f}",
        "runs (delivered/s)": spread(measured.figures),
        "undelivered": _undelivered(r),
        "broker CPU": f"{r.broker_cpu_pct:.0f}%",
        "load-gen CPU (per process)": _loadgen_cpu(r),
        "other CPU": f"{r.other_cpu_pct:.0f}%",
        "broker RSS": f"{r.broker_rss_bytes / 1e6:.1f} MB",
    }
    invalid = measured.invalid
    if data_dir_size:
        cells["data on disk"] = _size(measured.on_disk)
        if broker.persists and measured.on_disk == 0:
            invalid = "; ".join(filter(None, [invalid, "configured to persist but left no data on disk"]))
            ctx.failures.append(
                f"{broker.label}: configured to persist but left no data in its data directory"
            )
    notes = [*([measured.drop_notice] if measured.drop_notice else []), *r.errors[:2]]
    if reused:
        notes.append("the same measurement as this configuration's row above")
    return Row(case, broker.label, r.delivered_per_s, cells, note="; ".join(notes), invalid=invalid)


def _read_log(running: RunningBroker) -> str:
    try:
        return (running.workdir / "broker.log").read_text(errors="replace")
    except OSError:
        return ""


def _loadgen_cpu(r: FlowResult) -> str:
    per_process = "/".join(f"{cpu:.0f}" for cpu in r.loadgen_process_cpu_pct)
    return f"{r.loadgen_cpu_pct:.0f}% ({per_process})"


def _undelivered(r: FlowResult) -> str:
    """Deliveries owed and not made by the end of the drain (QoS 0 may be dropped; QoS 1 must not)."""
    text = f"{r.undelivered:,}" if r.undelivered else "0"
    if r.stalls:
        text += f" (deliveries stalled {r.stalls}x)"
    if r.redelivered:
        text += f" ({r.redelivered:,} DUP redeliveries, not counted as deliveries)"
    return text


def _size(n: int) -> str:
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
