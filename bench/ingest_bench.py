"""Ingest on one core: fan-in at 4, 8 and 16 publishers (QoS 0, and QoS 1 with Timestone persisting) and a
fleet of devices each on its own topic, Timestone against Mosquitto 2.0.11 in one run, as ratios.

    .venv/bin/python -m bench.ingest_bench [--rounds 2] [--devices 2000] [--variants] [--floor] [--output F]
    .venv/bin/python -m bench.ingest_bench --against CHECKOUT [--publishers 8] [--fanout 100] [--output FILE]
    .venv/bin/python -m bench.ingest_bench --also CHECKOUT [--qos 0] [--output FILE]

Each broker pinned to the first CPU, the load generator (`bench.loadgen`) on the others, every shape
measured for every broker in each round, in alternating order. Two figures per run: messages delivered to
the subscriber per second, and per second of the broker's own CPU, which is what one core of it delivers
whatever else the machine runs: on a 2-core machine the load generator has one core, which a C broker
outruns, and a row whose load generator saturated (or whose subscriber missed an acknowledged message) is
void, as in every bench here. Timestone runs its defaults (QoS 1 appended to the commitlog and group
committed before the PUBACK); Mosquitto runs with persistence off (a QoS 1 PUBACK from it promises nothing
durable). `--variants` adds Timestone on the standard library's event loop and on its own TCP transport;
`--floor` adds the uvloop floor (`bench/brokers/floor_relay.py`: a relay that frames, logs with one write
per turn, acknowledges and forwards, and does nothing else): what a Python broker on uvloop pays at least.
`--against CHECKOUT` compares this checkout's broker with another checkout's (an older commit, say) instead
of Mosquitto, in the same run on the same shapes; `--also CHECKOUT` runs another checkout's broker beside
this one's, both against Mosquitto (before and after a change, as ratios from one run); `--fanout N` adds
one publisher to N subscribers at QoS 0 and QoS 1. The section goes to bench/results/ingest.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import BrokerUnavailable, Floor, Mosquitto, Timestone
from bench.brokers.base import BrokerUnderTest
from bench.brokers.floor import ABOUT as FLOOR_ABOUT
from bench.brokers.timestone import REPO, commit_of
from bench.loadgen.flow import FlowSpec, Timing
from bench.report import RESULTS_DIR, write_result
from bench.scenarios import fanin, fanout, fleet
from bench.scenarios.base import RunContext
from bench.scenarios.throughput import FlowMeasurement, measure_flow
from bench.sysinfo import machine_info, raise_fd_limit, split_cpus

TIMING = Timing(warmup_s=1.5, measure_s=4.0, drain_s=15.0, connect_timeout_s=120.0)
FAN_IN = (4, 8, 16)


@dataclass
class Figure:
    """One measurement: delivered/s, per second of broker CPU, why it is void ("" when it counts)."""

    rate: float
    per_cpu: float
    broker_cpu_pct: float
    void: str


def measure(ctx: RunContext, broker: BrokerUnderTest, spec: FlowSpec) -> Figure:
    ctx.flows.clear()  # every round measures anew
    measured = measure_flow(ctx, broker, spec)
    if not isinstance(measured, FlowMeasurement):
        return Figure(0.0, 0.0, 0.0, measured)
    result = measured.result
    cpu = result.broker_cpu_pct / 100
    per_cpu = result.delivered_per_s / cpu if cpu > 0 else 0.0
    return Figure(result.delivered_per_s, per_cpu, result.broker_cpu_pct, measured.invalid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.ingest_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--devices", type=int, default=2000)
    parser.add_argument("--variants", action="store_true", help="also Timestone's other loop and transport")
    parser.add_argument("--floor", action="store_true", help="also the uvloop floor (a bare relay)")
    parser.add_argument(
        "--against", type=Path, metavar="CHECKOUT", help="another checkout's broker instead of Mosquitto"
    )
    parser.add_argument(
        "--also",
        type=Path,
        metavar="CHECKOUT",
        help="also another checkout's broker, beside this one's, against the same reference",
    )
    parser.add_argument(
        "--publishers",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=FAN_IN,
        help="fan-in publisher counts, comma-separated (default: 4,8,16)",
    )
    parser.add_argument("--fanout", type=int, default=0, metavar="N", help="also 1 publisher → N subscribers")
    parser.add_argument(
        "--qos",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=(0, 1),
        help="the QoS of the fan-in shapes, comma-separated (default: 0,1; the fleet only with 1)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "ingest.md")
    args = parser.parse_args(argv)
    raise_fd_limit()
    broker_cpus, loadgen_cpus = split_cpus()
    reference: BrokerUnderTest = Timestone(checkout=args.against) if args.against else Mosquitto()
    brokers: list[BrokerUnderTest] = [Timestone(), reference]
    if args.also:
        brokers.insert(1, Timestone(checkout=args.also))
    if args.variants:
        brokers += [Timestone(event_loop="asyncio"), Timestone(transport="native")]
    if args.floor:
        brokers.append(Floor())
    ctx = RunContext(
        brokers=brokers,
        quick=False,
        timing=TIMING,
        repeat=1,
        broker_cpus=broker_cpus,
        loadgen_cpus=loadgen_cpus,
        log=_log,
    )
    for broker in brokers:
        try:
            broker.prepare()
        except BrokerUnavailable as exc:
            _log(f"{broker.label}: not available: {exc}")
            return 1
    shapes = [(f"fanout 1 → {args.fanout:,}, QoS {q}", fanout.spec(q, args.fanout)) for q in (0, 1)]
    shapes = shapes if args.fanout else []
    for qos in args.qos:
        shapes += [(f"fan-in {p} → 1, QoS {qos}", fanin.spec(qos, p)) for p in args.publishers]
    if 1 in args.qos:
        shapes.append((f"fleet: {args.devices:,} devices, QoS 1, 1 in flight", fleet.spec(args.devices)))
    figures: dict[tuple[str, str], list[Figure]] = {}
    loads: list[float] = []
    for round_number in range(args.rounds):
        loads.append(os.getloadavg()[0])
        order = brokers if round_number % 2 == 0 else list(reversed(brokers))
        for name, spec in shapes:
            for broker in order:
                _log(f"round {round_number + 1}: {name}: {broker.label}")
                figure = measure(ctx, broker, spec)
                figures.setdefault((name, broker.label), []).append(figure)
                _log(
                    f"  {figure.rate:,.0f}/s, {figure.per_cpu:,.0f} per broker CPU second"
                    + (f" VOID: {figure.void}" if figure.void else "")
                )
    loads.append(os.getloadavg()[0])
    text = render(figures, [name for name, _ in shapes], brokers, reference, args, loads)
    write_result(text, args.output)
    return 0


def _median(figures: list[Figure], attribute: str) -> float | None:
    valid = [getattr(f, attribute) for f in figures if not f.void]
    return statistics.median(valid) if valid else None


def render(
    figures: dict[tuple[str, str], list[Figure]],
    shapes: list[str],
    brokers: list[BrokerUnderTest],
    reference: BrokerUnderTest,
    args: argparse.Namespace,
    loads: list[float],
) -> str:
    machine = machine_info()
    against = f"the checkout at git {commit_of(args.against)}" if args.against else ""
    lines = [
        f"## Ingest on one core: Timestone against {against or 'Mosquitto'}",
        "",
        "Fan-in: P publishers, each on its own topic, 64-byte payloads, one subscriber on all of them at the "
        "same QoS (QoS 1: 64 in flight per publisher and towards the subscriber). "
        + (
            "Fanout: one publisher on one topic, N subscribers on it at the same QoS, 64-byte payloads. "
            if args.fanout
            else ""
        )
        + (
            "Fleet: devices each on its own topic, QoS 1 with 1 in flight, one QoS 1 consumer. "
            if 1 in args.qos
            else ""
        )
        + "Timestone persists QoS 1 before the PUBACK (its defaults"
        + (
            f", in both checkouts: this one, at git {commit_of(REPO)}, and {against}). "
            if args.against
            else "); Mosquitto runs with persistence off. "
        )
        + (
            f"Two Timestone checkouts take part: this one, at git {commit_of(REPO)}, and the checkout at git "
            f"{commit_of(args.also)}, each against {reference.label}. "
            if args.also
            else ""
        )
        + (f"{FLOOR_ABOUT} " if args.floor else "")
        + f"Each figure is the median of the valid runs of {args.rounds} rounds, the brokers taking turns "
        "(every run in brackets, void ones marked); per CPU second is delivered/s divided by the broker's "
        "CPU use, what one core of it delivers.",
        "",
        "| shape | broker | delivered/s | per broker CPU second | runs (delivered/s; per CPU s) | "
        f"this / {reference.label} per CPU second |",
        "|---|---|---|---|---|---|",
    ]
    for shape in shapes:
        base = _median(figures.get((shape, reference.label), []), "per_cpu")
        for broker in brokers:
            runs = figures.get((shape, broker.label), [])
            rate, per_cpu = _median(runs, "rate"), _median(runs, "per_cpu")
            shown = "; ".join(
                f"{f.rate:,.0f}; {f.per_cpu:,.0f}" + (f" (void: {f.void})" if f.void else "") for f in runs
            )
            ratio = (
                f"{per_cpu / base:.2f}x"
                if broker.label != reference.label and per_cpu and base
                else ("" if broker.label == reference.label else "n/a")
            )
            lines.append(
                f"| {shape} | {broker.label} | {_number(rate)} | {_number(per_cpu)} | {shown} | {ratio} |"
            )
    lines += [
        "",
        f"`bench/ingest_bench.py`, measured {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on "
        f"{machine.cpu_model}, {machine.cores} CPUs, {machine.kernel}, Python {machine.python}; each broker "
        "pinned to CPU 0, the load generator on the other CPU. Load average (1 minute) "
        f"{loads[0]:.2f} at the start, {loads[-1]:.2f} at the end" + _rounds_began(loads) + ".",
    ]
    return "\n".join(lines) + "\n"


def _rounds_began(loads: list[float]) -> str:
    """The load averages taken as each round after the first began, for the section's last line."""
    between = loads[1:-1]
    if not between:
        return ""
    rounds = "round 2" if len(between) == 1 else f"rounds 2 to {len(between) + 1}"
    return f", {', '.join(f'{load:.2f}' for load in between)} as {rounds} began"


def _number(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "void"


def _log(message: str) -> None:
    print(f"[ingest {time.strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
