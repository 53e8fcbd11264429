"""Footprint of an edge broker: start-up, idle RSS, memory per idle connection, install size and a soak.

    .venv/bin/python -m bench.footprint_bench [--write] [--quick] [--soak-seconds S] [--soak-warmup F]
        [--brokers ...]

* Start-up: a default broker (`footprint_startup.DefaultTimestone`), Mosquitto and amqtt, each started
  `--starts` times in this run: time to listen, time to serve a CONNECT, CPU used until listening, idle
  RSS (median of the starts).
* Memory per idle connection: `--connections` idle MQTT clients (`bench.loadgen.idle`, the `idle`
  scenario's measurement) against each broker in its benchmark configuration.
* Install size: a fresh virtualenv holding only `pip install timestone` (and with `[arrow]`).
* Soak: `soak_bench` for `--soak-seconds` with `--devices` devices (see `soak_load`).

`--write` saves the tables to bench/results/footprint.md (which `python -m bench` appends to RESULTS.md).
Run it under `flock /tmp/timestone-bench.lock` on a shared machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.brokers import BROKER_NAMES, BrokerUnavailable, BrokerUnderTest, Timestone, default_broker
from bench.footprint_floor import TransportFloor
from bench.footprint_install import InstallSize, installed
from bench.footprint_startup import DefaultTimestone, StartupResult, measure_startup
from bench.loadgen.idle import IdleResult, run_idle
from bench.soak_bench import (
    CACHES_FULL,
    MAX_HOURLY_GROWTH,
    RETURNED_SHARE,
    STEADY_S,
    STEADY_SHARE,
    SoakResult,
    SoakSample,
    Trend,
    run_soak,
)
from bench.soak_load import SoakLoad
from bench.sysinfo import machine_info, raise_fd_limit, split_cpus

RESULTS = Path(__file__).resolve().parent / "results" / "footprint.md"

IDLE_RSS_TARGET = 40 * 1024 * 1024
LISTEN_TARGET_S = 0.3
BYTES_PER_CONNECTION_TARGET = 1500
"""1.5 kB, in the decimal kilobytes the peers' figures are quoted in (Mosquitto's 733 bytes: 0.73 kB)."""


@dataclass
class Footprint:
    """Everything one run measured (a part left out or failed is None / absent, with the reason)."""

    date: str
    command: str
    load_before: str
    load_after: str = ""
    startups: list[StartupResult] = field(default_factory=list)
    idle: list[tuple[str, IdleResult]] = field(default_factory=list)
    installs: list[InstallSize] = field(default_factory=list)
    soak: SoakResult | None = None
    unavailable: dict[str, str] = field(default_factory=dict)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.footprint_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: 2 starts, 1,000 connections, 60 s soak"
    )
    parser.add_argument("--brokers", default=",".join(BROKER_NAMES), help="peers next to timestone")
    parser.add_argument("--starts", type=int, default=None, help="starts per broker (default 5, quick 2)")
    parser.add_argument("--connections", type=int, default=None, help="idle connections (default 10,000)")
    parser.add_argument(
        "--soak-seconds", type=float, default=None, help="soak length (default 1200, quick 60)"
    )
    parser.add_argument("--devices", type=int, default=5000, help="devices in the soak (1 msg/s each)")
    parser.add_argument("--churn", type=int, default=25, help="devices reconnecting per second in the soak")
    parser.add_argument(
        "--soak-warmup",
        type=float,
        default=0.5,
        help="fraction of the soak counted as warm-up (default 0.5): warm starts at the first sample after "
        "it with the broker's tail caches full, its sessions steady and the devices back once",
    )
    parser.add_argument(
        "--soak-tail-cache-mib",
        type=int,
        default=32,
        help="storage.tail_cache_total_bytes of the soak broker, MiB (default 32; 0: the broker default)",
    )
    parser.add_argument(
        "--soak-trace",
        default="",
        help="START,FIRST,SECOND seconds: trace the soak broker with tracemalloc from START and report what "
        "grew between snapshots at FIRST and SECOND (slows the broker: for finding growth, not measuring it)",
    )
    parser.add_argument(
        "--transport",
        choices=("native", "asyncio"),
        default=None,
        help="also measure Timestone with its listener's `transport` set to this (idle connections), and run "
        "the soak on it instead of the default",
    )
    parser.add_argument(
        "--skip", default="", help="comma-separated parts to leave out: startup,idle,install,soak"
    )
    parser.add_argument("--write", action="store_true", help=f"save the tables to {RESULTS}")
    parser.add_argument("--output", type=Path, default=None, help="save the tables to this file")
    args = parser.parse_args(argv)
    args.starts = args.starts or (2 if args.quick else 5)
    args.connections = args.connections or (1000 if args.quick else 10_000)
    args.soak_seconds = (
        args.soak_seconds if args.soak_seconds is not None else (60.0 if args.quick else 1200.0)
    )
    args.skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    args.brokers = [name.strip() for name in args.brokers.split(",") if name.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_fd_limit()
    broker_cpus, load_cpus = split_cpus()
    result = Footprint(
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command=" ".join(["python -m bench.footprint_bench", *(sys.argv[1:] if argv is None else argv)]),
        load_before=_load(),
    )
    peers = [default_broker(name) for name in args.brokers if name != "timestone"]
    if "install" not in args.skip:
        for extras in ("", "arrow"):
            _log(f"install size: timestone{f'[{extras}]' if extras else ''}")
            with installed(extras) as install:
                result.installs.append(install)
                if not extras and "startup" not in args.skip:
                    gateway = DefaultTimestone(install.timestone, "timestone (defaults, base install)")
                    _measure_startup(gateway, args, broker_cpus, result)
    if "startup" not in args.skip:
        for broker in [DefaultTimestone(label="timestone (defaults, dev venv)"), *peers]:
            _measure_startup(broker, args, broker_cpus, result)
    if "idle" not in args.skip:
        variant = [Timestone(transport=args.transport)] if args.transport else []
        for broker in [
            default_broker("timestone"),
            *variant,
            TransportFloor(),
            TransportFloor(poll=True),
            *peers,
        ]:
            _log(f"idle connections: {broker.label}, {args.connections:,}")
            if _prepared(broker, result):
                try:
                    with broker.running(broker_cpus) as running:
                        result.idle.append(
                            (broker.label, run_idle(running, args.connections, cpus=load_cpus))
                        )
                except BrokerUnavailable as exc:
                    result.unavailable[broker.label] = str(exc)
    if "soak" not in args.skip:
        _log(f"soak: {args.soak_seconds:.0f} s, {args.devices:,} devices")
        load = SoakLoad(port=0, devices=args.devices, churn_per_s=args.churn)
        sample_s = 5.0 if args.soak_seconds >= 120 else 1.0
        tail_cache = args.soak_tail_cache_mib
        storage = {"tail_cache_total_bytes": tail_cache * 2**20} if tail_cache else None
        result.soak = run_soak(
            args.soak_seconds,
            load,
            sample_s=sample_s,
            warmup_fraction=args.soak_warmup,
            cpus=(broker_cpus, load_cpus),
            storage=storage,
            trace_at=_trace_at(args.soak_trace, args.soak_seconds, args.soak_warmup),
            transport=args.transport,
            log=_log,
        )
    result.load_after = _load()
    text = render(result)
    print(text)
    output = args.output or (RESULTS if args.write else None)
    if output is not None:
        output.write_text(text)
        _log(f"wrote {output}")
    return 0


def _trace_at(text: str, seconds: float, warmup: float) -> tuple[float, float, float] | None:
    """`--soak-trace` as given; else, for a soak of 5 minutes or more, snapshots without tracing before the
    warm window can start (`STEADY_S` in, or 30 s before the end of a longer warm-up) and after the last
    sample: each snapshot stops the broker's loop for seconds (a garbage collection, a count of every
    object), and the backlog that leaves stepped RSS up inside the warm window when the snapshots were taken
    in it."""
    if not text:
        if seconds < 300:
            return None
        return -1.0, max(STEADY_S - 20.0, seconds * warmup - 30.0), seconds - 1.0
    start, first, second = (float(part) for part in text.split(","))
    return start, first, second


def _measure_startup(
    broker: BrokerUnderTest, args: argparse.Namespace, cpus: set[int] | None, result: Footprint
) -> None:
    _log(f"start-up: {broker.label}, {args.starts} starts")
    if _prepared(broker, result):
        try:
            result.startups.append(measure_startup(broker, args.starts, cpus))
        except BrokerUnavailable as exc:
            result.unavailable[broker.label] = str(exc)


def _prepared(broker: BrokerUnderTest, result: Footprint) -> bool:
    try:
        broker.prepare()
    except BrokerUnavailable as exc:
        result.unavailable[broker.label] = str(exc)
        _log(f"  not available: {exc}")
        return False
    return True


def render(result: Footprint) -> str:
    """The markdown of a run: tables per part, then the targets marked met or not."""
    machine = machine_info()
    lines = [
        "## Footprint: start-up, idle memory, install size, soak",
        "",
        f"Measured {result.date} on {machine.cpu_model}, {machine.cores} cores, "
        f"{machine.memory_gib:.0f} GiB, "
        f"Python {machine.python}; load average before {result.load_before}, after {result.load_after} "
        "(a shared machine: other work ran meanwhile, so times are noisy). "
        f"Command: `{result.command}`.",
        "",
    ]
    targets: list[tuple[str, str, bool | None]] = []
    lines += _startup_section(result.startups, targets)
    lines += _idle_section(result.idle, targets)
    lines += _install_section(result.installs)
    lines += _soak_section(result.soak, targets)
    for label, reason in result.unavailable.items():
        lines.append(f"- {label}: not available: {reason}")
    if result.unavailable:
        lines.append("")
    lines += ["### Targets", ""]
    for goal, measured, met in targets:
        verdict = "not measured" if met is None else ("met" if met else "NOT met")
        lines.append(f"- {goal}: {verdict} ({measured})")
    return "\n".join(lines) + "\n"


def _startup_section(startups: list[StartupResult], targets: list) -> list[str]:
    if not startups:
        return []
    lines = [
        "### Start-up and idle RSS",
        "",
        f"Each broker started once uncounted, then {len(startups[0].runs)} times (medians; pinned to one "
        "CPU), no client connected; Timestone with Python's bytecode cache, as a user's shell runs it. "
        "*Listening*: spawn to the first accepted TCP connection; *serving*: to the first CONNACK; *CPU*: "
        "the process's CPU time when it started listening; *idle RSS*: VmRSS 2 s after serving.",
        "",
        "| broker | idle RSS | listening | serving | CPU until listening |",
        "|---|---|---|---|---|",
    ]
    for startup in startups:
        lines.append(
            f"| {startup.label} | {startup.idle_rss / 2**20:.1f} MiB | {startup.listen_s:.3f} s | "
            f"{startup.serve_s:.3f} s | {startup.cpu_s:.2f} s |"
        )
    lines.append("")
    for mine in (s for s in startups if s.label.startswith("timestone")):
        where = mine.label.partition("defaults, ")[2].rstrip(")")
        rss_goal, listen_goal = f"idle RSS ≤ 40 MiB ({where})", f"listening ≤ 0.3 s ({where})"
        targets.append((rss_goal, f"{mine.idle_rss / 2**20:.1f} MiB", mine.idle_rss <= IDLE_RSS_TARGET))
        targets.append((listen_goal, f"{mine.listen_s:.3f} s", mine.listen_s <= LISTEN_TARGET_S))
    return lines


def _idle_section(idle: list[tuple[str, IdleResult]], targets: list) -> list[str]:
    if not idle:
        return []
    lines = [
        "### Memory per idle connection",
        "",
        "Idle MQTT 3.1.1 clients (clean session, keepalive 600 s) connected to each broker in its benchmark "
        "configuration (bench/README.md); (RSS after - RSS before) / connections. Kernel socket buffers are "
        "not in RSS.",
        "",
        "| broker | connections | RSS before | RSS after | bytes per connection |",
        "|---|---|---|---|---|",
    ]
    for label, r in idle:
        lines.append(
            f"| {label} | {r.connected:,} | {r.rss_before / 2**20:.1f} MiB | {r.rss_after / 2**20:.1f} MiB | "
            f"{r.bytes_per_connection:,.0f} |"
        )
    lines.append("")
    mine = next((r for label, r in idle if label == "timestone"), None)
    native = next((r for label, r in idle if label == Timestone(transport="native").label), None)
    floor = next((r for label, r in idle if label == TransportFloor().label), None)
    polled = next((r for label, r in idle if label == TransportFloor(poll=True).label), None)
    if mine is not None and floor is not None:
        total, under = mine.bytes_per_connection, floor.bytes_per_connection
        lines += [
            f"Of Timestone's {total:,.0f} bytes (the default, uvloop's transport), {under:,.0f} are the "
            "uvloop floor (its transport object, libuv handle and entry in the loop's map of transports, "
            f"with a 1-slot protocol); {total - under:,.0f} are the broker's own: its connection, session, "
            "client id and its entry in the map of sessions.",
            "",
        ]
    if native is not None and polled is not None:
        total, under = native.bytes_per_connection, polled.bytes_per_connection
        lines += [
            f"With `transport: native` (the broker's own transport) Timestone holds {total:,.0f} bytes, "
            f"{under:,.0f} of them the poll floor (a socket watched with `loop.add_reader` and a 1-slot "
            "object).",
            "",
        ]
    if mine is not None:
        targets.append(
            (
                f"memory per idle connection ≤ 1.5 kB (1,500 bytes) at {mine.connected:,} connections",
                f"{mine.bytes_per_connection:,.0f} bytes",
                mine.bytes_per_connection <= BYTES_PER_CONNECTION_TARGET,
            )
        )
    return lines


def _install_section(installs: list[InstallSize]) -> list[str]:
    if not installs:
        return []
    lines = [
        "### Install size",
        "",
        "A fresh virtualenv, then `pip install` of this working tree; what the install added to the venv.",
        "",
        "| install | added on disk | largest distributions |",
        "|---|---|---|",
    ]
    for install in installs:
        name = f"timestone[{install.extras}]" if install.extras else "timestone"
        largest = ", ".join(f"{pkg} {size / 2**20:.1f}" for pkg, size in install.packages[:5] if size > 2**20)
        lines.append(f"| `{name}` | {install.added_bytes / 2**20:.1f} MiB | {largest} (MiB) |")
    lines.append("")
    return lines


def _soak_section(soak: SoakResult | None, targets: list) -> list[str]:
    if soak is None:
        return []
    load = soak.load
    lines = [
        "### Soak",
        "",
        f"{soak.duration_s:.0f} s: a default broker with {load.devices:,} devices (persistent sessions) each "
        f"publishing one {load.payload_bytes}-byte QoS 1 message per {load.interval_s:g} s, "
        f"each device dropping its connection once every {load.devices / load.churn_per_s:.0f} s "
        f"({load.churn_per_s} a second, in an order shuffled every round) and coming back 1-3 s later, one "
        f"QoS 1 subscriber to every device and {load.groups} QoS 0 group subscribers. Broker: "
        f"{soak.broker_config}. The tail caches (recent records kept in memory per log) grow until their "
        "store-wide bound of memory: the default bound, 256 MiB, takes longer than a short soak to fill at "
        "this rate, so the soak bounds them lower. " + _warm_text(soak),
        "",
        f"Warm rates: {soak.rate('published'):,.0f} publishes/s, {soak.rate('acked'):,.0f} PUBACKs/s, "
        f"{soak.rate('delivered'):,.0f} deliveries/s, {soak.rate('reconnects'):,.1f} reconnects/s.",
        "",
        "*RSS*: VmRSS at the sample; *after trim*: the RSS the broker read right after its last trim of the "
        "C heap (every 30 s; the free pages that come and go between trims are not in it); *C heap in use*: "
        "glibc's bytes handed out (`mallinfo2`); *Python blocks*: `sys.getallocatedblocks()`.",
        "",
        "| time | RSS | after trim | C heap in use | Python blocks | anonymous | open files | broker CPU | "
        "devices connected | devices back once | acknowledged | tail caches |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    step = max(1, len(soak.samples) // 12)
    shown = soak.samples[::step]
    if soak.samples and shown[-1] is not soak.samples[-1]:
        shown.append(soak.samples[-1])
    for s in shown:
        lines.append(
            f"| {s.at_s:.0f} s | {_mib(s.rss)} | {_mib(s.rss_after_trim or -1)} | {_mib(s.heap_in_use)} | "
            f"{_count(s.python_blocks)} | {_mib(s.rss_anon)} | {s.open_files} | {s.cpu_s:.0f} s | "
            f"{s.devices_connected:,} | {_count(s.devices_returned)} | {s.acked:,} | {_caches_text(s)} |"
        )
    lines.append("")
    growth_goal = (
        f"no growth once warm (RSS trend ≤ {MAX_HOURLY_GROWTH:.0%} of the warm RSS per hour, "
        "open files not drifting up while warm)"
    )
    growth = soak.growth
    if growth is None:
        first, last = (soak.samples[0], soak.samples[-1]) if soak.samples else (None, None)
        whole = f"RSS {_mib(first.rss)} → {_mib(last.rss)} over the whole run; " if first and last else ""
        targets.append((growth_goal, whole + "not judged: " + _no_window_reason(soak), False))
        return lines
    warm = soak.warm
    measured = "RSS after trim" if any(s.rss_after_trim > 0 for s in soak.samples) else "RSS"
    files = soak.trend("open_files")
    lines += [
        "Trends over the warm window (median of its last third minus median of its first third, per hour;",
        "spread: the larger range within one third):",
        "",
    ]
    for label, trend in (
        ("RSS after trim (judged)", soak.trend("rss_after_trim")),
        ("RSS", soak.trend("rss")),
        ("C heap in use", soak.trend("heap_in_use") if warm[0].heap_in_use >= 0 else None),
        ("anonymous (RssAnon)", soak.trend("rss_anon")),
    ):
        if trend is not None:
            lines.append(f"- {label}: {_trend_text(trend)}")
    blocks = soak.trend("python_blocks") if warm[0].python_blocks >= 0 else None
    if blocks is not None:
        lines.append(
            f"- Python blocks: {blocks.first:,.0f} → {blocks.last:,.0f}, {blocks.per_hour:+,.0f}/hour "
            f"(spread {blocks.spread:,.0f})"
        )
    lines += [
        "- raw RSS, least-squares line through every warm sample: "
        f"{soak.rss_least_squares_per_hour / 2**20:+.1f} MiB/hour (the trims' sawtooth tilts it)",
        "",
    ]
    verdict = (
        f"{measured} {growth.first / 2**20:.1f} → {growth.last / 2**20:.1f} MiB (medians of the first and "
        f"last third of the warm window, {warm[0].at_s:.0f}-{warm[-1].at_s:.0f} s), trend "
        f"{growth.per_hour / 2**20:+.1f} MiB/hour where {soak.allowed_per_hour / 2**20:.1f} is allowed, "
        f"spread {growth.spread / 2**20:.1f} MiB; raw RSS {min(s.rss for s in warm) / 2**20:.1f}-"
        f"{max(s.rss for s in warm) / 2**20:.1f} MiB"
    )
    if files is not None:
        low, high = min(s.open_files for s in warm), max(s.open_files for s in warm)
        verdict += f"; open files {files.first:,.0f} → {files.last:,.0f} (medians), {low}-{high}"
    targets.append((growth_goal, verdict, not soak.rss_grows and not soak.open_files_grow))
    if soak.traced:
        lines += ["What grew between the two snapshots of the broker (`bench/traced_broker.py`):", "", "```"]
        lines += [*soak.traced, "```", ""]
    return lines


def _trend_text(trend: Trend) -> str:
    return (
        f"{trend.first / 2**20:.1f} → {trend.last / 2**20:.1f} MiB, {trend.per_hour / 2**20:+.1f} MiB/hour "
        f"(spread {trend.spread / 2**20:.1f} MiB, {trend.points} points)"
    )


def _no_window_reason(soak: SoakResult) -> str:
    if soak.caches_full_at is None:
        return "no warm window, the tail caches never came near their bound"
    if soak.sessions_steady_at is None:
        return "no warm window, the sessions never became steady"
    if soak.returned_at is None:
        return f"no warm window, fewer than {RETURNED_SHARE:.0%} of the devices came back once"
    return "too few warm samples for a trend"


def _mib(value: int) -> str:
    return "-" if value < 0 else f"{value / 2**20:.1f} MiB"


def _count(value: int) -> str:
    return "-" if value < 0 else f"{value:,}"


def _warm_text(soak: SoakResult) -> str:
    """Where the warm window starts, and why there."""
    full_at, steady_at, returned_at = soak.caches_full_at, soak.sessions_steady_at, soak.returned_at
    if full_at is None:
        return "The tail caches never reached their bound: there is no warm window, and no verdict on growth."
    if steady_at is None or soak.warm_from_s is None:
        return "The sessions never became steady: there is no warm window, and no verdict on growth."
    if returned_at is None:
        return "Too few devices came back once: there is no warm window, and no verdict on growth."
    return (
        f"Warm from {soak.warm_from_s:.0f} s: the first sample past the warm-up ({soak.warmup_s:.0f} s, "
        f"fixed before the run) with the tail caches full (at least {CACHES_FULL:.0%} of their bound from "
        f"{full_at:.0f} s), the sessions steady (within {STEADY_SHARE:.0%} of their count {STEADY_S:.0f} s "
        f"before, from {steady_at:.0f} s) and {RETURNED_SHARE:.0%} of the devices back once (dropped and "
        f"resumed their session, from {returned_at:.0f} s)."
    )


def _caches_text(sample: SoakSample) -> str:
    if sample.tail_cache_max_bytes <= 0:
        return "-"
    return f"{sample.tail_cache_bytes / 2**20:.1f} of {sample.tail_cache_max_bytes / 2**20:.0f} MiB"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _log(message: str) -> None:
    print(f"[footprint {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
