"""A QoS 0 flood: 16 publishers x 50,000 messages to one subscriber, Timestone's loops and transports against
Mosquitto, with the broker's event loop watched while it lasts.

    .venv/bin/python -m bench.flood_bench [--publishers 16] [--messages 50000] [--rounds 2]
                                          [--only NAME,...] [--output FILE]

Every configuration is measured in each round, in alternating order, one after the other on a fresh broker
pinned to the first CPU (the load generator, the PINGREQ probe and the `/metrics` poller on the others):

* the flood (`bench.flood_load`): messages sent, delivered, delivered/s from the first publish to the last
  delivery;
* PINGREQ round trips every 20 ms from a probe at a raised priority (`topic_load.Pinger`), and a GET of
  `/metrics` every 250 ms (Timestone): both must be answered throughout;
* Timestone runs under `bench.loop_probe`: a task woken every 2 ms says how late it woke (the loop's lag),
  at the 99th percentile over the flood, with and without the time its thread waited for a CPU;
* the messages the broker dropped by reason (its `/metrics`) and the drop lines in its log.

A run whose subscriber process used 90 % of its core may have measured the load generator: it is marked.
Mosquitto runs with persistence off (it would not persist QoS 0 anyway). The section goes to
bench/results/flood.md (`--output` to write elsewhere).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import re
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import net
from bench.brokers import Mosquitto, Timestone
from bench.brokers.base import BrokerUnderTest, RunningBroker
from bench.flood_load import FloodResult, run_flood
from bench.report import RESULTS_DIR, write_result
from bench.sysinfo import cpu_seconds, machine_busy_seconds, machine_info, raise_fd_limit, split_cpus
from bench.topic_load import Pinger, percentile

SUBSCRIBER_SATURATED_PCT = 90.0


class FloodTimestone(Timestone):
    """Timestone under `bench.loop_probe`, on a given event loop and listener transport, its admin HTTP on a
    known port; the limits the flood does not test lifted as the other benches lift them."""

    def __init__(
        self, event_loop: str, transport: str, extra_limits: dict[str, object] | None = None
    ) -> None:
        super().__init__(transport=transport)
        self.event_loop = event_loop
        self.extra_limits = extra_limits or {}
        self.admin_port = 0

    @property
    def label(self) -> str:
        extra = "".join(f", {key} {value}" for key, value in self.extra_limits.items())
        return f"timestone ({self.event_loop} loop, {self.transport} transport{extra})"

    def command(self, port: int, workdir: Path) -> list[str]:
        self.admin_port = net.free_port()
        limits = "".join(f"  {key}: {value}\n" for key, value in self.extra_limits.items())
        config = workdir / "timestone.yaml"
        config.write_text(
            f"listeners:\n  - host: 127.0.0.1\n    port: {port}\n    transport: {self.transport}\n"
            f"storage:\n  directory: {workdir / 'data'}\n"
            "offsets_api:\n  port: 0\n"
            f"admin_http:\n  port: {self.admin_port}\n"
            f"runtime:\n  event_loop: {self.event_loop}\n"
            "limits:\n"
            "  new_connections_per_second: 0\n"
            "  messages_per_second_per_client: 0\n"
            "  max_topics_per_client: 0\n" + limits + "logging:\n  level: WARNING\n"
        )
        stats = workdir / "loop.json"
        return [sys.executable, "-m", "bench.loop_probe", str(stats), "broker", "--config", str(config)]

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}


@dataclasses.dataclass
class FloodRun:
    """One flood against one configuration, with what was watched meanwhile."""

    label: str
    flood: FloodResult
    broker_cpu_s: float
    broker_cpu_pct: float
    other_cpu_pct: float
    ping_ms: list[float]
    metrics_ms: list[float]
    metrics_failed: int
    loop: dict[str, float]
    drops: dict[str, int]
    drop_lines: int

    @property
    def per_core(self) -> float:
        """Messages delivered per second of the broker's CPU: what one core of it would deliver."""
        return self.flood.delivered / self.broker_cpu_s if self.broker_cpu_s > 0 else 0.0

    @property
    def voided(self) -> str:
        if self.flood.subscriber_lost:
            return "the broker closed the subscriber"
        if self.flood.subscriber_cpu_pct >= SUBSCRIBER_SATURATED_PCT:
            return f"subscriber process at {self.flood.subscriber_cpu_pct:.0f} % of its core"
        return ""


class MetricsPoller:
    """GET /metrics every `interval_s` in a thread: how long each took, and how many failed."""

    def __init__(self, port: int, interval_s: float = 0.25) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.interval_s = interval_s
        self.latencies: list[float] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-poller", daemon=True)

    def __enter__(self) -> MetricsPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as answer:
                    answer.read()
                self.latencies.append(time.perf_counter() - began)
            except OSError:
                self.failed += 1
            self._stop.wait(self.interval_s)


def scrape_drops(port: int) -> dict[str, int]:
    """`messages_dropped_total` by reason, from the broker's /metrics (nonzero ones)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    drops = {}
    for reason, value in re.findall(r'messages_dropped_total\{reason="([^"]+)"\} ([0-9.e+]+)', text):
        if float(value):
            drops[reason] = int(float(value))
    return drops


def measure(
    broker: BrokerUnderTest,
    publishers: int,
    messages: int,
    broker_cpus: set[int] | None,
    load_cpus: set[int] | None,
) -> FloodRun:
    with broker.running(broker_cpus) as running:
        time.sleep(1.0)  # the probe's task starts once the broker has
        return _measure_running(broker, running, publishers, messages, load_cpus)


def _measure_running(
    broker: BrokerUnderTest, running: RunningBroker, publishers: int, messages: int, cpus: set[int] | None
) -> FloodRun:
    admin = broker.admin_port if isinstance(broker, FloodTimestone) else 0
    stats = running.workdir / "loop.json"
    if admin:
        (running.workdir / "loop.json.phase").write_text("flood")
        scrape_drops(admin)  # loads the admin endpoint before the flood, as a scraper would have
        time.sleep(0.6)
    pinger = Pinger(running.port, 0.02, cpus).start()
    time.sleep(0.5)
    poller = MetricsPoller(admin) if admin else None
    cpu0, busy0 = cpu_seconds(running.pid), machine_busy_seconds()
    began = time.monotonic()
    if poller is not None:
        with poller:
            flood = run_flood(running.port, publishers, messages, cpus)
    else:
        flood = run_flood(running.port, publishers, messages, cpus)
    wall = time.monotonic() - began
    broker_cpu = cpu_seconds(running.pid) - cpu0
    other = machine_busy_seconds() - busy0 - broker_cpu
    rtts = pinger.stop()
    loop: dict[str, float] = {}
    drops: dict[str, int] = {}
    if admin:
        time.sleep(0.6)  # the probe writes its file every half second
        with open(stats) as file:
            loop = {k: v for k, v in json.load(file).items() if isinstance(v, (int, float))}
        drops = scrape_drops(admin)
    log = (running.workdir / "broker.log").read_text(errors="replace")
    drop_lines = sum(1 for line in log.splitlines() if "dropped" in line)
    return FloodRun(
        label=broker.label,
        flood=flood,
        broker_cpu_s=broker_cpu,
        broker_cpu_pct=100.0 * broker_cpu / wall,
        other_cpu_pct=100.0 * other / wall,
        ping_ms=[rtt * 1000 for rtt in rtts],
        metrics_ms=[latency * 1000 for latency in (poller.latencies if poller else [])],
        metrics_failed=poller.failed if poller else 0,
        loop=loop,
        drops=drops,
        drop_lines=drop_lines,
    )


def configurations() -> dict[str, BrokerUnderTest]:
    return {
        "uvloop-asyncio": FloodTimestone("uvloop", "asyncio"),
        "uvloop-native": FloodTimestone("uvloop", "native"),
        "asyncio-asyncio": FloodTimestone("asyncio", "asyncio"),
        "asyncio-native": FloodTimestone("asyncio", "native"),
        "mosquitto": Mosquitto(persistence=False),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.flood_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--publishers", type=int, default=16)
    parser.add_argument("--messages", type=int, default=50_000, help="per publisher")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default="", help=f"configurations, of: {', '.join(configurations())}")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "flood.md")
    args = parser.parse_args(argv)
    raise_fd_limit()
    chosen = configurations()
    if args.only:
        chosen = {name: chosen[name] for name in args.only.split(",")}
    broker_cpus, load_cpus = split_cpus()
    if load_cpus:
        os.sched_setaffinity(0, load_cpus)
    load_before = os.getloadavg()
    runs: dict[str, list[FloodRun]] = {name: [] for name in chosen}
    for round_number in range(args.rounds):
        names = list(chosen) if round_number % 2 == 0 else list(reversed(chosen))
        for name in names:
            run = measure(chosen[name], args.publishers, args.messages, broker_cpus, load_cpus)
            runs[name].append(run)
            _log(summary_line(run))
    write_result(render(runs, args, broker_cpus, load_cpus, load_before, os.getloadavg()), args.output)
    return 0


def summary_line(run: FloodRun) -> str:
    flood = run.flood
    return (
        f"{run.label}: {flood.delivered:,} of {flood.sent:,} delivered ({flood.delivered_pct:.2f} %) at "
        f"{flood.rate:,.0f}/s ({run.per_core:,.0f} per broker CPU second); "
        f"PINGREQ p99 {percentile(run.ping_ms, 0.99):.1f} ms max "
        f"{max(run.ping_ms, default=0):.1f}; /metrics max {max(run.metrics_ms, default=0):.0f} ms "
        f"({run.metrics_failed} failed); loop lag p99 {run.loop.get('late_p99_ms', float('nan')):.1f} ms; "
        f"drops {run.drops or 'none'}; broker CPU {run.broker_cpu_pct:.0f} %, other {run.other_cpu_pct:.0f} %"
        + (f"; VOID: {run.voided}" if run.voided else "")
    )


def render(
    runs: dict[str, list[FloodRun]],
    args: argparse.Namespace,
    broker_cpus: set[int] | None,
    load_cpus: set[int] | None,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> str:
    machine = machine_info()
    total = args.publishers * args.messages
    lines = [
        "## A QoS 0 flood: 16 publishers to one subscriber",
        "",
        f"{args.publishers} publishers each write {args.messages:,} QoS 0 messages (64-byte payloads, a "
        f"topic each) as fast as the broker reads them, to one QoS 0 subscriber on all of them ({total:,} "
        "messages). Rate: delivered messages over the time from the first publish to the last delivery. "
        "Loop lag: how late a task woken every 2 ms inside the broker woke, 99th percentile over the "
        "flood (in brackets: less the time its thread waited for a CPU). PINGREQ: round trips of a probe "
        "every 20 ms. `/metrics`: a GET every 250 ms, the slowest answer. Each configuration in every round, "
        "in alternating order; every run listed.",
        "",
        "| broker | delivered | delivered/s | per broker CPU second | loop lag p99 ms | PINGREQ p99 / max ms "
        "| /metrics max ms (failed) | drops by reason | broker CPU | subscriber CPU | other CPU | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, measured in runs.items():
        for run in measured:
            flood = run.flood
            loop_lag = (
                f"{run.loop['late_p99_ms']:.1f} ({run.loop['late_not_cpu_wait_p99_ms']:.1f})"
                if run.loop
                else "n/a"
            )
            metrics = (
                f"{max(run.metrics_ms, default=0):.0f} ({run.metrics_failed})" if run.metrics_ms else "n/a"
            )
            drops = ", ".join(f"{reason} {count:,}" for reason, count in sorted(run.drops.items())) or "none"
            lines.append(
                f"| {run.label} | {flood.delivered:,} of {flood.sent:,} ({flood.delivered_pct:.2f} %) | "
                f"{flood.rate:,.0f} | {run.per_core:,.0f} | {loop_lag} | "
                f"{percentile(run.ping_ms, 0.99):.1f} / "
                f"{max(run.ping_ms, default=0):.1f} | {metrics} | {drops} | {run.broker_cpu_pct:.0f} % | "
                f"{flood.subscriber_cpu_pct:.0f} % | {run.other_cpu_pct:.0f} % | "
                f"{('VOID: ' + run.voided) if run.voided else ''} |"
            )
        del name
    ratios = _ratios(runs, lambda run: run.flood.rate)
    if ratios:
        lines += ["", "Median delivered/s of the valid runs against Mosquitto's: " + "; ".join(ratios) + "."]
    per_core = _ratios(runs, lambda run: run.per_core)
    if per_core:
        lines += ["", "Per broker CPU second, against Mosquitto's: " + "; ".join(per_core) + "."]
    lines += [
        "",
        f"`bench/flood_bench.py`, measured {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on "
        f"{machine.cpu_model}, {machine.cores} CPUs, {machine.kernel}, Python {machine.python}; broker on "
        f"CPU {_cpus(broker_cpus)}, load generator, probe and poller on CPU {_cpus(load_cpus)}. Load average "
        f"{load_before[0]:.2f} at the start and {load_after[0]:.2f} at the end.",
    ]
    return "\n".join(lines) + "\n"


def _ratios(runs: dict[str, list[FloodRun]], figure: Callable[[FloodRun], float]) -> list[str]:
    mosquitto = [figure(r) for r in runs.get("mosquitto", []) if not r.voided]
    if not mosquitto:
        return []
    reference = statistics.median(mosquitto)
    out = []
    for name, measured in runs.items():
        valid = [figure(r) for r in measured if not r.voided]
        if name != "mosquitto" and valid:
            out.append(f"{measured[0].label} {statistics.median(valid) / reference:.2f}x")
    return out


def _cpus(cpus: set[int] | None) -> str:
    return ",".join(map(str, sorted(cpus))) if cpus else "any"


def _log(message: str) -> None:
    print(f"[flood {time.strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
