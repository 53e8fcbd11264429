"""A fleet on one broker: 10,000 devices publishing QoS 1, each on its own topic, against Mosquitto and Aedes.

    .venv/bin/python -m bench.fleet_bench [--devices 10000] [--repeat 3] [--quick] [--output FILE]

Timestone, Mosquitto and Aedes, each with its persistence on, and the uvloop floor (`brokers/floor_relay.py`,
what any Python broker on uvloop pays for the same sockets) measured one after the other in the same run
with the same load (`bench.scenarios.fleet`): the broker pinned to the first CPU, the devices and the
consumer to the others. A row whose load generator saturated its CPU or whose consumer missed an
acknowledged message is marked invalid and takes part in no ratio. The section goes to
bench/results/fleet.md with the machine, the date and the load the rest of the machine put on it.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import Aedes, BrokerUnavailable, Floor, Mosquitto, Timestone
from bench.cli import broker_infos, cpu_split
from bench.report import RESULTS_DIR, output_parser, scenario_table, write_result
from bench.scenarios import fleet
from bench.scenarios.base import RunContext, ScenarioResult
from bench.sysinfo import machine_info, raise_fd_limit, split_cpus


def main(argv: list[str] | None = None) -> int:
    """Run the fleet against every peer and write the section; 1 when a persisting broker left no data."""
    parser = output_parser("bench.fleet_bench", __doc__, RESULTS_DIR / "fleet.md")
    parser.add_argument("--devices", type=int, default=fleet.DEVICES)
    parser.add_argument("--repeat", type=int, default=3, help="runs per broker, the median kept")
    parser.add_argument("--quick", action="store_true", help=f"{fleet.QUICK_DEVICES} devices, one run")
    args = parser.parse_args(argv)
    raise_fd_limit()
    broker_cpus, loadgen_cpus = split_cpus()
    ctx = RunContext(
        brokers=[Timestone(persist=True), Mosquitto(persistence=True), Aedes(persistence=True), Floor()],
        quick=args.quick,
        timing=fleet.QUICK_TIMING if args.quick else fleet.TIMING,
        repeat=1 if args.quick else max(1, args.repeat),
        broker_cpus=broker_cpus,
        loadgen_cpus=loadgen_cpus,
        log=_log,
    )
    for broker in ctx.brokers:
        try:
            broker.prepare()
        except BrokerUnavailable as exc:
            ctx.unprepared[broker.name] = str(exc)
            _log(f"{broker.label}: not available: {exc}")
    load_before = os.getloadavg()
    result = fleet.run(ctx, fleet.QUICK_DEVICES if args.quick else args.devices)
    write_result(render(ctx, result, load_before, os.getloadavg()), args.output)
    for failure in ctx.failures:
        _log(f"FAILED: {failure}")
    return 1 if ctx.failures else 0


def render(
    ctx: RunContext,
    result: ScenarioResult,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> str:
    """The section: the scenario's table and targets, then how and where it was measured."""
    machine = machine_info()
    other = statistics.fmean(ctx.other_cpu) if ctx.other_cpu else 0.0
    busy = (
        "other work was running: absolute figures are low, ratios come from the same run"
        if other >= 10
        else "otherwise idle"
    )
    kind = "quick smoke run, one run per broker" if ctx.quick else f"the median of {ctx.repeat} runs each"
    lines = scenario_table(result)
    lines += [
        f"`bench/fleet_bench.py` ({kind}), measured {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on "
        f"{machine.cpu_model}, {machine.cores} CPUs, {machine.memory_gib:.1f} GiB, {machine.kernel}, Python "
        f"{machine.python}; {cpu_split(ctx.broker_cpus, ctx.loadgen_cpus)}. Load average "
        f"{load_before[0]:.2f} when the run started and {load_after[0]:.2f} when it ended; the rest of the "
        f"machine used {other:.0f}% CPU on average during the measurements (100% = one core: {busy}).",
        "",
        "| broker | version | status | configuration |",
        "|---|---|---|---|",
    ]
    for info in broker_infos(ctx):
        lines.append(f"| {info.label} | {info.version} | {info.status} | {info.config} |")
    lines += [
        "",
        "The storage targets of a topic per device (100,000 topics against 8, memory, disk, restarts with "
        "1,000,000 topics, the Spark source, the event loop's latency) are measured and marked in the "
        "section 'Many topics on one broker' (bench/results/topics.md).",
    ]
    return "\n".join(lines) + "\n"


def _log(message: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
