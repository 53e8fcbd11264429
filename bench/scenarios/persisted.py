"""Persisted QoS 1 fan-in: the fan-in QoS 1 flow with the commitlog on and off, and Mosquitto beside it."""

from __future__ import annotations

from bench.brokers import Aedes, Mosquitto, Timestone
from bench.brokers.base import BrokerUnderTest
from bench.scenarios import fanin
from bench.scenarios.base import RunContext, ScenarioResult, Target, ratio_target
from bench.scenarios.throughput import flow_row, persisted_result

CASE = "QoS 1"


def variants(ctx: RunContext) -> list[BrokerUnderTest]:
    """Timestone with persistence on and off, Mosquitto with persistence off and on, Aedes (its in-memory
    default), of those selected."""
    names = {b.name for b in ctx.brokers}
    out: list[BrokerUnderTest] = []
    if "timestone" in names:
        out += [Timestone(persist=True), Timestone(persist=False)]
    if "mosquitto" in names:
        out += [Mosquitto(persistence=False), Mosquitto(persistence=True)]
    if "aedes" in names:
        out.append(Aedes())
    return out


def run(ctx: RunContext) -> ScenarioResult:
    """Measure the fan-in QoS 1 flow for each variant, reporting the bytes each wrote to its data dir."""
    rows = [flow_row(ctx, broker, CASE, fanin.spec(1), data_dir_size=True) for broker in variants(ctx)]
    result = persisted_result(
        "persisted",
        "Persisted QoS 1 fan-in",
        (
            "The fan-in QoS 1 flow (4 publishers → 1 subscriber, 64 in flight per publisher) against "
            "Timestone with its default persistence (QoS 1 appended to the commitlog with group commit "
            "before the PUBACK) and with `storage: {persist: []}`, and against Mosquitto with persistence "
            "off and on. Mosquitto's persistence is a snapshot of its in-memory store written every "
            "`autosave_interval` (1 s here), not a write before the PUBACK: it is shown for scale, not as an "
            "equivalent; it runs as the `mosquitto` account, which owns its data directory. Aedes keeps its "
            "default in-memory persistence (its on-disk stores are separate packages): it too is shown for "
            "scale. 'data on disk' is what the broker left in its data directory after the run; a broker "
            "configured to persist that left nothing fails the run. Configurations also measured in the "
            "fan-in scenario show that same measurement."
        ),
        rows,
    )
    for row in rows:
        if row.broker == "timestone (persist off)" and _megabytes(row.cells.get("data on disk", "")) > 1.0:
            row.note = "persistence was not switched off: `storage: {persist: []}` still wrote to disk"
            row.figure = None
    on, off = result.figure(CASE, "timestone (persist on)"), result.figure(CASE, "timestone (persist off)")
    target = ratio_target("persisted (group commit) QoS 1 fan-in ≥ 80% of non-persisted", on, off, 0.8)
    result.targets.append(target if on is not None else Target(target.goal, "not measured", None))
    return result


def _megabytes(cell: str) -> float:
    """Parse the 'data on disk' cell ("4.3 MB", "12.0 KB", "0 B") back into megabytes."""
    try:
        value, unit = cell.split()
        return float(value) * {"MB": 1.0, "KB": 1e-3, "B": 1e-6}[unit]
    except (ValueError, KeyError):
        return 0.0
