"""`python -m bench`: run the selected scenarios against the selected brokers and write bench/RESULTS.md.

python -m bench                          # everything, 3 runs per figure (about 15-20 minutes)
python -m bench --quick                  # short smoke run, smaller sizes, one run per figure
python -m bench --only fanout,latency --brokers timestone,mosquitto
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import signal
import statistics
import sys
import time
from collections.abc import Collection
from pathlib import Path

from bench.brokers import BROKER_NAMES, VARIANT_NAMES, BrokerUnavailable, default_broker
from bench.loadgen.flow import Timing
from bench.report import BrokerInfo, RunInfo, extra_sections, render
from bench.scenarios import SCENARIOS
from bench.scenarios.base import RunContext, ScenarioResult
from bench.sysinfo import machine_info, raise_fd_limit, split_cpus

BENCH_DIR = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="short smoke run: small sizes, one run per figure"
    )
    parser.add_argument(
        "--only", default=",".join(SCENARIOS), help=f"comma-separated scenarios ({', '.join(SCENARIOS)})"
    )
    parser.add_argument(
        "--brokers",
        default=",".join(BROKER_NAMES),
        help=f"comma-separated brokers ({', '.join(BROKER_NAMES)}; also {', '.join(VARIANT_NAMES)})",
    )
    parser.add_argument(
        "--repeat", type=int, default=None, help="runs per figure, median kept (default 3, quick 1)"
    )
    parser.add_argument(
        "--output", type=Path, default=BENCH_DIR / "RESULTS.md", help="where to write the results"
    )
    args = parser.parse_args(argv)
    args.only = _names(args.only, SCENARIOS, parser, "scenario")
    args.brokers = _names(args.brokers, (*BROKER_NAMES, *VARIANT_NAMES), parser, "broker")
    args.repeat = max(1, args.repeat if args.repeat is not None else (1 if args.quick else 3))
    return args


def _names(text: str, known: Collection[str], parser: argparse.ArgumentParser, what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"unknown {what}(s): {', '.join(unknown) or '(none given)'}")
    return names


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write RESULTS.md; 0, or 1 when a check failed (a persisting broker left no
    data), 130 on Ctrl-C."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    raise_fd_limit()
    broker_cpus, loadgen_cpus = split_cpus()
    timing = Timing(warmup_s=1.0, measure_s=2.0) if args.quick else Timing()
    ctx = RunContext(
        brokers=[default_broker(name) for name in args.brokers],
        quick=args.quick,
        timing=timing,
        repeat=args.repeat,
        broker_cpus=broker_cpus,
        loadgen_cpus=loadgen_cpus,
        log=_log,
    )
    run = RunInfo(
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command=" ".join(["python -m bench", *(sys.argv[1:] if argv is None else argv)]),
        quick=args.quick,
        repeat=args.repeat,
        cpu_split=cpu_split(broker_cpus, loadgen_cpus),
        load_average=" ".join(f"{x:.2f}" for x in os.getloadavg()),
    )
    for broker in ctx.brokers:
        _log(f"preparing {broker.name}")
        try:
            broker.prepare()
        except BrokerUnavailable as exc:
            ctx.unprepared[broker.name] = str(exc)
            _log(f"  {broker.name}: not available: {exc}")
    results: list[ScenarioResult] = []
    started = time.monotonic()
    try:
        for key in args.only:
            _log(f"scenario {key}")
            results.append(SCENARIOS[key](ctx))
    except KeyboardInterrupt:
        _log(f"interrupted: brokers and workers stopped, {args.output} left as it was")
        return 130
    except SystemExit:
        _log(f"terminated: brokers and workers stopped, {args.output} left as it was")
        raise
    run = dataclasses.replace(
        run,
        load_average_end=" ".join(f"{x:.2f}" for x in os.getloadavg()),
        other_cpu_mean=statistics.fmean(ctx.other_cpu) if ctx.other_cpu else None,
    )
    text = render(run, machine_info(), broker_infos(ctx), results, extra_sections(BENCH_DIR / "results"))
    args.output.write_text(text)
    _log(f"wrote {args.output} after {time.monotonic() - started:.0f} s")
    for failure in ctx.failures:
        _log(f"FAILED: {failure}")
    return 1 if ctx.failures else 0


def broker_infos(ctx: RunContext) -> list[BrokerInfo]:
    """Every broker configuration of the run: version, whether it was measured, how it was configured."""
    infos = []
    brokers = {b.label: b for b in ctx.brokers} | ctx.seen
    for label, broker in brokers.items():
        reason = ctx.unprepared.get(broker.name) or ctx.unavailable.get(label)
        status = f"not available: {reason}" if reason else "measured"
        infos.append(BrokerInfo(label, broker.version(), status, broker.config_notes()))
    return infos


def cpu_split(broker: set[int] | None, loadgen: set[int] | None) -> str:
    """Which CPUs the broker and the load generator were pinned to, in words."""
    if not broker or not loadgen:
        return "no pinning (a single CPU is available): broker and load generator share it"
    return (
        f"broker pinned to CPU {_cpus(broker)}; the load generator (publisher and subscriber processes, "
        f"separate from each other) pinned to CPU {_cpus(loadgen)}"
    )


def _cpus(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """Turn SIGTERM into SystemExit so that every `finally` stops its broker and workers."""
    raise SystemExit(128 + signum)
