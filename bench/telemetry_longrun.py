"""A compressed day of the telemetry and actions jobs: do their tables, logs, batches and latency stay flat?

    .venv/bin/python bench/telemetry_longrun.py [--minutes 30] [--devices 200] [--output FILE]

Every part is the real one: a ``timestone broker`` process, a simulated fleet (``pipelines/fleet``, its
own process) whose devices send a reading every second and answer OTA actions, and both jobs on one
local[2] Spark session in this process, as ``timestone pipeline`` runs them (the telemetry query supervised
by ``pipelines.supervisor``, the actions job restarting its own), at their default 1 s trigger, with table
maintenance on. The run is a day compressed in time: at a 1 s trigger a day is 86,400 batches, a run of 30
minutes 1,800 of them, so the retention periods are shortened as well (to ``--retention-minutes``) for
vacuum and log clean-up to act within the run; compaction keeps its default minute.

Every ``--sample-s`` the benchmark records, per table, the live data files, the Parquet files on disk and
the Delta log entries, the streaming checkpoints' files, the telemetry batches' durations and the
restarts counted. An OTA action to one group of the fleet is written every ``--ota-every-s``. A separate
process reads bronze and silver with delta-rs every 100 ms and notes when each reading first appears:
publish → bronze / silver latency in the first and the last ``--window-s`` of the run. Half-way, the
Spark Python workers are killed (SIGKILL, again every 10 s until a query fails from it): the failed query
must come back by itself and lose nothing. At the end the fleet stops, the jobs catch up, and every
table is checked against the broker's log: each reading once in bronze and silver.

Writes the section *A compressed day* of ``bench/results/telemetry.md`` (the rest of the file is kept).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.report import replace_section  # noqa: E402
from bench.sysinfo import machine_info  # noqa: E402
from bench.telemetry_bench import (  # noqa: E402
    BROKER_SECTIONS,
    LONG_RUN_HEADING,
    POLL_INTERVAL_S,
    RESULTS,
    LoadSampler,
    logged_records,
    percentile,
    poll_tables,
    quiet_great_expectations,
)
from broker_edge.runtime.launcher import BrokerProcess  # noqa: E402
from pipelines.actions.job import MAINTAINED as ACTIONS_TABLES  # noqa: E402
from pipelines.telemetry.job import TABLES as TELEMETRY_TABLES  # noqa: E402

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sinks import TableStore

HEADING = LONG_RUN_HEADING
SPARK_MASTER = "local[2]"  # what `timestone pipeline` runs on 2 cores: a failed task fails its query
GROUPS = ("canary", "fleet")


@dataclass
class Sample:
    """The state of everything at one moment of the run."""

    elapsed_s: float
    live: dict[str, int]
    on_disk: dict[str, int]
    log_entries: dict[str, int]
    checkpoint_files: dict[str, int]
    batch_s: list[float]  # telemetry batches with data since the previous sample
    restarts: float
    load: float


@dataclass
class Kill:
    """The Python workers killed mid-run, and the query that failed from it coming back."""

    at_s: float
    attempts: int = 0
    restarts_before: float = 0.0
    restarts_after: float = 0.0
    back_after_s: float | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class LongRun:
    minutes: float
    devices: int
    retention_minutes: float
    samples: list[Sample] = field(default_factory=list)
    latency: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    actions: list[tuple[str, float | None]] = field(default_factory=list)  # (id, seconds to complete)
    kill: Kill | None = None
    logged: int = 0
    checks: dict[str, Any] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)


def files_on_disk(location: str) -> int:
    return sum(
        1
        for folder, _, names in os.walk(location)
        if "_delta_log" not in folder
        for name in names
        if name.endswith(".parquet")
    )


def log_entries(location: str) -> int:
    try:
        return sum(
            1 for n in os.listdir(os.path.join(location, "_delta_log")) if n.endswith((".json", ".parquet"))
        )
    except OSError:
        return 0


def checkpoint_files(root: Path) -> int:
    return sum(len(names) for _, _, names in os.walk(root)) if root.exists() else 0


def python_workers(jvm_pid: int) -> list[int]:
    """The Spark Python daemon and workers under the JVM (``pyspark.daemon`` processes)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, frontier = [], [jvm_pid]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, []):
            frontier.append(child)
            try:
                command = Path(f"/proc/{child}/cmdline").read_text()
            except OSError:
                continue
            if "pyspark.daemon" in command or "pyspark.worker" in command:
                found.append(child)
    return found


def sample(
    store: TableStore, checkpoints: Path, queries: list[Any], seen: set[int], restarts: float, began: float
) -> Sample:
    names = (*TELEMETRY_TABLES, *ACTIONS_TABLES)
    locations = {name: store.location(name) for name in names if store.exists(name)}
    batch_s = []
    for query in queries:
        for progress in query.recentProgress:
            key = hash((str(query.id), progress.batchId))
            if progress.numInputRows and key not in seen and query.name == "telemetry":
                seen.add(key)
                batch_s.append(progress.durationMs.get("triggerExecution", 0) / 1000)
    return Sample(
        elapsed_s=time.monotonic() - began,
        live={name: store.data_files(name) for name in locations},
        on_disk={name: files_on_disk(location) for name, location in locations.items()},
        log_entries={name: log_entries(location) for name, location in locations.items()},
        checkpoint_files={d.name: checkpoint_files(d) for d in sorted(checkpoints.glob("*")) if d.is_dir()},
        batch_s=batch_s,
        restarts=restarts,
        load=os.getloadavg()[0],
    )


def run(args: argparse.Namespace, root: Path) -> LongRun:
    from pipelines.actions.buckets import DEFAULT_BUCKETS
    from pipelines.actions.config import ActionsConfig, BrokerEndpoint
    from pipelines.actions.job import start_actions_job
    from pipelines.actions.operator import NewAction, create_action, summaries
    from pipelines.fleet.device import DeviceBehaviour
    from pipelines.fleet.fleet import FleetSpec
    from pipelines.fleet.processes import FleetProcesses, loopback_sources
    from pipelines.maintenance.config import MaintenanceConfig
    from pipelines.metrics import PipelineMetrics
    from pipelines.spark_session import local_spark_session
    from pipelines.supervisor import Supervisor
    from pipelines.telemetry.config import load_telemetry_config
    from pipelines.telemetry.job import open_store, supervise

    figures = LongRun(args.minutes, args.devices, args.retention_minutes)
    retention_h = args.retention_minutes / 60
    maintenance = {"vacuum_interval_s": args.vacuum_every_s, "retention_hours": retention_h}
    maintenance["log_retention_hours"] = retention_h
    tables, checkpoints = root / "tables", root / "checkpoints"
    broker = BrokerProcess(root / "broker", **BROKER_SECTIONS).start()
    spec = FleetSpec(
        brokers=[broker.address],
        count=args.devices,
        groups=list(GROUPS),
        buckets=DEFAULT_BUCKETS,
        source_addresses=loopback_sources(args.devices),
    )
    behaviour = DeviceBehaviour(telemetry_interval_s=args.telemetry_interval, download_delay_s=(0.5, 1.5))
    fleet = FleetProcesses(spec, behaviour, 1)
    context = mp.get_context("spawn")
    stop_polling = context.Event()
    polled = context.Queue()
    spark: SparkSession | None = None
    threads: list[threading.Thread] = []
    try:
        fleet.start()
        spark = local_spark_session("timestone-longrun", SPARK_MASTER)
        spark.sparkContext.setLogLevel("ERROR")
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "200")
        jvm_pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]  # py4j types the gateway loosely; a local session has its process
        quiet_great_expectations()
        metrics = PipelineMetrics()
        telemetry = load_telemetry_config(
            {
                "source": {"brokers": [f"edge1={broker.offsets_url}"]},
                "tables": {"root": str(tables), "backend": "delta-rs", "maintenance": maintenance},
                "stream": {"checkpoint": str(checkpoints / "telemetry")},
            }
        )
        store = open_store(spark, telemetry)
        supervisor = Supervisor("telemetry", telemetry.stream.restart, metrics)
        runner = threading.Thread(
            target=supervise, args=(spark, telemetry), kwargs={"supervisor": supervisor}, name="telemetry"
        )
        runner.start()
        threads.append(runner)
        actions = start_actions_job(
            spark,
            ActionsConfig(
                tables_root=str(tables),
                checkpoint_root=str(checkpoints / "actions"),
                brokers=[BrokerEndpoint(mqtt_port=broker.port, offsets_api=broker.offsets_url)],
                backend="delta-rs",
                maintenance=MaintenanceConfig(**maintenance),
            ),
            metrics=metrics,
        )
        poller = context.Process(
            target=poll_tables,
            args=(
                store.location("bronze_telemetry"),
                store.location("silver_telemetry"),
                POLL_INTERVAL_S,
                args.minutes * 60 + 600,
                stop_polling,
                polled,
            ),
            daemon=True,
        )
        poller.start()
        figures.checks["poller"] = poller.pid
        began = time.monotonic()
        wall_began = time.time()
        end = began + args.minutes * 60
        seen: set[int] = set()
        next_sample, next_action, action_number = began, began + 60, 0
        pending: dict[str, float] = {}
        kill_at = began + args.minutes * 60 * args.kill_at
        with LoadSampler() as load:
            while time.monotonic() < end:
                now = time.monotonic()
                if now >= next_sample:
                    queries = [*supervisor.running(), *actions.queries]
                    restarts = metrics.restarts("telemetry") + metrics.restarts("actions")
                    figures.samples.append(sample(store, checkpoints, queries, seen, restarts, began))
                    last = figures.samples[-1]
                    print(
                        f"{last.elapsed_s / 60:5.1f} min: live files {sum(last.live.values())}, on disk "
                        f"{sum(last.on_disk.values())}, log entries {sum(last.log_entries.values())}, "
                        f"checkpoint files {sum(last.checkpoint_files.values())}, batches "
                        f"{len(last.batch_s)} (median {statistics.median(last.batch_s or [0]):.2f} s), "
                        f"restarts {restarts:.0f}, load {last.load:.1f}",
                        flush=True,
                    )
                    next_sample += args.sample_s
                if now >= next_action:
                    action_number += 1
                    new = NewAction(
                        group=GROUPS[action_number % 2],
                        version=f"2.{action_number}.0",
                        url=f"https://firmware.example.invalid/fw-2.{action_number}.0.bin",
                        sha256=f"{action_number:064x}",
                        created_by="longrun",
                    )
                    pending[create_action(store, new)] = now
                    next_action += args.ota_every_s
                for action_id, created in list(pending.items()):
                    rows = summaries(store, action_id)
                    if rows and rows[0]["action_state"] != "IN_PROGRESS":
                        figures.actions.append((action_id, time.monotonic() - created))
                        del pending[action_id]
                if figures.kill is None and now >= kill_at:
                    figures.kill = kill_workers(jvm_pid, metrics, supervisor, actions, began)
                if supervisor.gave_up is not None or actions.gave_up is not None:
                    raise RuntimeError(f"a query failed for good: {supervisor.gave_up or actions.gave_up}")
                time.sleep(1.0)
            figures.actions += [(action_id, None) for action_id in pending]
            fleet.stop()  # the end of the day: no new readings; the jobs catch up
            figures.logged = logged_records(broker.offsets_url, "devices/+/telemetry")
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and table_rows(store, "silver_telemetry") < figures.logged:
                time.sleep(1)
            time.sleep(3)
            figures.loads = load.samples
        stop_polling.set()
        seen_rows = polled.get(timeout=120)
        figures.latency = latency_windows(seen_rows, wall_began, args.minutes * 60, args.window_s)
        supervisor.stop()
        runner.join(timeout=120)
        actions.stop()
        figures.checks.update(exactly_once(store, figures.logged))
        figures.samples.append(sample(store, checkpoints, [], seen, figures.samples[-1].restarts, began))
    finally:
        stop_polling.set()
        fleet.stop()
        if spark is not None:
            spark.stop()
        broker.stop()
    return figures


def kill_workers(jvm_pid: int, metrics: Any, supervisor: Any, actions: Any, began: float) -> Kill:
    """SIGKILL Spark's Python workers (again every 10 s, up to 6 times) until a query fails from it, then
    wait until every query runs again."""
    kill = Kill(at_s=time.monotonic() - began)
    kill.restarts_before = metrics.restarts("telemetry") + metrics.restarts("actions")
    for attempt in range(6):
        kill.attempts = attempt + 1
        for pid in python_workers(jvm_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        waited = time.monotonic()
        while time.monotonic() - waited < 10:
            if metrics.restarts("telemetry") + metrics.restarts("actions") > kill.restarts_before:
                break
            time.sleep(0.2)
        else:
            continue
        break
    failed_at = time.monotonic()
    while time.monotonic() - failed_at < 120:
        if len(supervisor.running()) == 1 and len(actions.queries) == 2:
            kill.back_after_s = time.monotonic() - failed_at
            break
        time.sleep(0.2)
    kill.restarts_after = metrics.restarts("telemetry") + metrics.restarts("actions")
    print(f"workers killed ({kill.attempts} time(s)): {kill}", flush=True)
    return kill


def table_rows(store: TableStore, name: str) -> int:
    from deltalake import DeltaTable

    if not store.exists(name):
        return 0
    actions = DeltaTable(store.location(name)).get_add_actions(flatten=True)
    return int(sum(actions.column("num_records").to_pylist()))


def exactly_once(store: TableStore, logged: int) -> dict[str, Any]:
    """Each reading of the broker's log once in bronze and once in silver."""
    checks: dict[str, Any] = {"logged": logged}
    for name in ("bronze_telemetry", "silver_telemetry"):
        keys = store.read_arrow(name).select(["broker", "topic", "offset"]).to_pylist()
        unique = {(k["broker"], k["topic"], k["offset"]) for k in keys}
        checks[name] = (len(keys), len(unique))
    return checks


def latency_windows(
    seen: dict[str, list[tuple[float, float]]], wall_began: float, seconds: float, window_s: float
) -> dict[str, dict[str, list[float]]]:
    """publish → visible, for readings published in the first and the last ``window_s`` of the run (the
    first minute left out: the jobs' first batches compile their code)."""
    windows = {
        "start": (wall_began + 60, wall_began + 60 + window_s),
        "end": (wall_began + seconds - window_s - 10, wall_began + seconds - 10),
    }
    out: dict[str, dict[str, list[float]]] = {}
    for label, (low, high) in windows.items():
        out[label] = {
            table: [seen_s - ts / 1000 for ts, seen_s in rows if low * 1000 <= ts <= high * 1000]
            for table, rows in seen.items()
            if table in ("bronze", "silver")
        }
    return out


# -- report ----------------------------------------------------------------------------------------------


def render(figures: LongRun, started: datetime, wall_s: float) -> str:
    machine = machine_info()
    loads = figures.loads or [0.0]
    # the first sample a minute in (the jobs' first batches compile their code), and the last one
    first = next((s for s in figures.samples if s.elapsed_s >= 60), figures.samples[0])
    last = figures.samples[-1]
    lines = [
        HEADING,
        "",
        f"`bench/telemetry_longrun.py --minutes {figures.minutes:g}`, {started:%Y-%m-%d %H:%M} UTC, "
        f"{wall_s / 60:.0f} min in all. {machine.cpu_model}, {machine.cores} cores, "
        f"{machine.memory_gib:.0f} GiB. Load average (1 min) {loads[0]:.1f} at the start, "
        f"{statistics.mean(loads):.1f} mean / {max(loads):.1f} max (the machine may be shared with "
        "other work: durations are as loaded as the machine was); the figures to "
        "read are the start against the end of the same run.",
        "",
        f"{figures.devices} simulated devices, a reading a second each (about {figures.devices} "
        "readings/s), both jobs at their default 1 s trigger on one local[2] Spark session, table "
        "maintenance on (compaction every minute, vacuum and log clean-up every "
        f"{figures.checks.get('vacuum_every_s', 0) / 60:g} min), an OTA action to a group every "
        f"{figures.checks.get('ota_every_s', 0) / 60:g} min. A day compressed: {figures.minutes:g} minutes "
        f"at a 1 s trigger are {figures.minutes * 60:,.0f} batches of the 86,400 of a day, so the "
        f"retention periods were shortened to {figures.retention_minutes:g} minutes for vacuum and log "
        "clean-up to act within the run.",
        "",
        "What stays bounded, and by what: live data files by compaction (at most `min_files` - 1 small "
        "files per partition of each table between two compactions, plus the compacted ones); Parquet files "
        "on disk by vacuum (what compaction and merges replaced within the retention period and the vacuum "
        "interval, and each writer's latest batch); Delta log entries by log clean-up (the log retention and "
        "the interval); a streaming checkpoint by `checkpoint_batches` (100 batches of offsets and commits). "
        "Each of these figures therefore rises to its bound and then goes up and down around it; a table "
        "nobody maintained would instead gain a file and a log entry with every batch. The start window of "
        "the latency table begins a minute in, while the job may still be catching up with what arrived "
        "during its first batches (which compile the code: the longest batch of the first minutes).",
        "",
        "| minute | telemetry batches | batch s, median / max | live data files (all tables) | "
        "Parquet files on disk | Delta log entries | checkpoint files (actions, telemetry) | restarts "
        "| load |",
        "|---:|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    for s in figures.samples:
        durations = s.batch_s or [0.0]
        checkpoints = ", ".join(str(v) for v in s.checkpoint_files.values())
        lines.append(
            f"| {s.elapsed_s / 60:.1f} | {len(s.batch_s)} | {statistics.median(durations):.2f} / "
            f"{max(durations):.2f} | {sum(s.live.values())} | {sum(s.on_disk.values())} | "
            f"{sum(s.log_entries.values())} | {checkpoints} | {s.restarts:.0f} | {s.load:.1f} |"
        )
    lines += [
        "",
        "Per table, after the first minute and at the end, once the jobs caught up (live data files / "
        "Parquet files on disk / log entries):",
        "",
        f"| table | minute {first.elapsed_s / 60:.1f} | end |",
        "|---|---|---|",
    ]
    for name in last.live:
        at = [
            (t.live.get(name, 0), t.on_disk.get(name, 0), t.log_entries.get(name, 0)) for t in (first, last)
        ]
        lines.append(f"| `{name}` | {' / '.join(map(str, at[0]))} | {' / '.join(map(str, at[1]))} |")
    lines += [
        "",
        "| publish → | window | readings | p50 s | p99 s | max s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for table in ("bronze", "silver"):
        for label in ("start", "end"):
            values = figures.latency.get(label, {}).get(table, [])
            if values:
                lines.append(
                    f"| {table} | {label} | {len(values):,} | {percentile(values, 50):.2f} | "
                    f"{percentile(values, 99):.2f} | {max(values):.2f} |"
                )
    done = [s for _, s in figures.actions if s is not None]
    lines += [
        "",
        f"OTA actions: {len(figures.actions)} written, {len(done)} completed"
        + (f" (median {statistics.median(done):.0f} s from the row to its final summary)." if done else "."),
    ]
    kill = figures.kill
    if kill is not None:
        back = f"{kill.back_after_s:.1f} s" if kill.back_after_s is not None else "not within 120 s"
        lines.append(
            f"Killed mid-run: Spark's Python workers, at minute {kill.at_s / 60:.0f} (SIGKILL, "
            f"{kill.attempts} time(s) until a query failed from it); restarts counted "
            f"{kill.restarts_before:.0f} → {kill.restarts_after:.0f}; every query running again {back} "
            "after the failure."
        )
    checks = figures.checks
    bronze, silver = checks.get("bronze_telemetry", (0, 0)), checks.get("silver_telemetry", (0, 0))
    lines += [
        f"Exactly once, at the end against the broker's log ({figures.logged:,} readings): bronze "
        f"{bronze[0]:,} rows ({bronze[1]:,} distinct), silver {silver[0]:,} rows ({silver[1]:,} distinct).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument(
        "--telemetry-interval", type=float, default=1.0, help="seconds between a device's readings"
    )
    parser.add_argument("--ota-every-s", type=float, default=300.0)
    parser.add_argument("--vacuum-every-s", type=float, default=300.0)
    parser.add_argument("--retention-minutes", type=float, default=10.0)
    parser.add_argument("--sample-s", type=float, default=60.0)
    parser.add_argument("--window-s", type=float, default=180.0)
    parser.add_argument(
        "--kill-at", type=float, default=0.5, help="when to kill the workers (share of the run)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started, began = datetime.now(UTC), time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="timestone-longrun-"))
    try:
        figures = run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures.checks.update(vacuum_every_s=args.vacuum_every_s, ota_every_s=args.ota_every_s)
    text = render(figures, started, time.monotonic() - began)
    print(text)
    replace_section(args.output, HEADING, text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
