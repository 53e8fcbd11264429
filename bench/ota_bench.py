"""OTA fanout benchmark: one action row → every device of a busy fleet, measured stage by stage.

    flock /tmp/timestone-bench.lock .venv/bin/python bench/ota_bench.py --devices 10000 --procs 4

A Timestone broker runs as its own process, the fleet in ``--procs`` processes (devices send telemetry every
``--telemetry-interval`` seconds), and the actions job on a local Spark session in this one. For each target
kind (an explicit list of every device id, one message per device bucket listing its ids, or per device with
``--buckets 0``; a group holding every device, one broadcast) the
job is started afresh and, once both its streams have run their first micro-batch, two actions follow: *cold*
(the first after the job started) and *warm* (the next).

Each stage is timed from the row's commit (the operator's write returning):

- job pickup: the job's action micro-batch reaches the engine;
- publish: every message acknowledged by the broker (durable in its log);
- broker fanout: the broker's own ``messages_sent`` counter has grown by 50/95/100 % of the fleet
  (polled every 100 ms from its admin HTTP endpoint);
- device receipt: each device's clock when the message arrived;
- report: each device's clock when it sent its final report;
- Delta: the final states counted in ``action_summary`` (polled every 250 ms).

The simulator's, the broker's and this process's (job and Spark) CPU are reported next to the figures.
Results go to ``bench/results/ota.md`` under a heading per fleet size (other sizes' sections are kept).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.sysinfo import cpu_seconds, machine_info  # noqa: E402
from broker_edge.runtime.launcher import BrokerProcess  # noqa: E402
from pipelines.actions.buckets import DEFAULT_BUCKETS  # noqa: E402
from pipelines.fleet.device import DeviceBehaviour  # noqa: E402
from pipelines.fleet.fleet import FleetSpec  # noqa: E402
from pipelines.fleet.processes import FleetProcesses, loopback_sources, raise_open_files_limit  # noqa: E402

RESULTS = REPO / "bench" / "results" / "ota.md"
GROUP = "fleet"
TARGETS_10K = {"p95_warm": 5.0, "p95_cold": 10.0, "p100_warm": 10.0, "delta_warm": 15.0}
TARGETS_LARGE = {"p95_warm": 15.0}
PCTS = (50, 95, 100)
TARGET_NAMES = {"ids": "explicit ids", "group": "group"}


def broker_limits(devices: int) -> dict:
    """Limits set explicitly for the bench (not the broker's defaults; see the results file)."""
    return {
        "max_connections": devices + 100,
        "new_connections_per_second": 5000,
        "new_connections_burst": 5000,
        "new_connections_per_second_per_address": 5000,  # the whole fleet connects from loopback
        "new_connections_burst_per_address": 5000,
        "messages_per_second_per_client": 0,
        "max_topics_per_client": 0,
        "receive_maximum": 1024,
    }


def explicit_ids_scheme(buckets: int) -> str:
    if buckets:
        return f"one message per device bucket ({buckets:,} buckets) listing its ids"
    return "one message per device on its own topic"


def percentile(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered) + 0.5) - 1))]


class SentCounter:
    """Polls the broker's ``messages_sent`` counter and remembers when it first reached each value."""

    def __init__(self, admin_port: int, interval_s: float = 0.1) -> None:
        self.url = f"http://127.0.0.1:{admin_port}/metrics"
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sent-counter", daemon=True)
        self.interval_s = interval_s

    def read(self) -> float:
        text = urllib.request.urlopen(self.url, timeout=5).read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("timestone_broker_messages_sent_total{")
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.samples.append((time.time(), self.read()))
            except OSError:
                continue

    def reached(self, since: float, base: float, amount: float) -> float | None:
        """First time after ``since`` at which the counter was at least ``base + amount``."""
        for at, value in self.samples:
            if at >= since and value >= base + amount:
                return at
        return None

    def __enter__(self) -> SentCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class StageClock:
    """What the job does, timed by wrapping its engine's entry point and its publisher."""

    pickups: list[float] = field(default_factory=list)
    published: list[float] = field(default_factory=list)

    def wrap(self, job) -> None:
        engine, publisher = job.engine, job.engine.publisher
        on_action_rows, publish_many = engine.on_action_rows, publisher.publish_many

        def timed_rows(rows, app_id, batch_id):
            rows = list(rows)
            if rows:
                self.pickups.append(time.time())
            return on_action_rows(rows, app_id, batch_id)

        def timed_publish(messages):
            publish_many(messages)
            self.published.append(time.time())

        engine.on_action_rows = timed_rows
        publisher.publish_many = timed_publish
        publisher.publish = lambda topic, payload: timed_publish([(topic, payload)])


@dataclass
class ActionRun:
    """Every stage of one action, in seconds after the row's commit."""

    label: str
    stages: dict[str, list[float | None]]
    reached: int
    finished: int
    complete: bool
    simulator_cpu: float
    broker_cpu: float
    job_cpu: float


def terminal_count(store, action_id: str) -> int:
    if not store.exists("action_summary"):
        return 0
    table = store.read_arrow("action_summary")
    rows = table.filter(pc.equal(table["action_id"], action_id)).to_pylist()
    if not rows:
        return 0
    row = rows[0]
    return sum(row[f"{s}_count"] for s in ("succeeded", "failed", "rejected", "canceled", "timed_out"))


def run_action(label, store, fleet, broker, sent, clock, devices, target, version) -> ActionRun:
    """Write one action row and follow it through every stage until its final states are in Delta."""
    from pipelines.actions.operator import NewAction, create_action

    ids = [fleet.spec.device_id(i) for i in range(devices)]
    action = NewAction(version=version, url=f"https://example.invalid/fw-{version}.bin", sha256="0" * 64)
    if target == "ids":
        action.device_ids = ids
    else:
        action.group = GROUP
    cpu_before = (fleet.status()[2], cpu_seconds(broker.process.pid), cpu_seconds(os.getpid()))
    sent_base = sent.read()
    pickups, published = len(clock.pickups), len(clock.published)
    create_action(store, action)
    committed = time.time()
    delta_at: list[float] = []
    deadline = committed + 120
    times = []
    while time.time() < deadline:
        done = terminal_count(store, action.action_id)
        delta_at += [time.time()] * (done - len(delta_at))
        if done >= devices:
            break
        time.sleep(0.25)
    times = fleet.times(action.action_id)
    cpu_after = (fleet.status()[2], cpu_seconds(broker.process.pid), cpu_seconds(os.getpid()))
    wall = time.time() - committed

    def since(values):
        return [None if v is None else v - committed for v in values]

    received = [t.received_at for t in times if t.received_at is not None]
    finished = [t.finished_at for t in times if t.finished_at is not None]
    stages = {
        "job pickup": since(clock.pickups[pickups:][:1]),
        "publish (acknowledged by the broker)": since(clock.published[published:][-1:]),
        "broker fanout": since(
            [sent.reached(committed, sent_base, devices * p / 100) for p in (50, 95, 100)]
        ),
        "device receipt": since([percentile(received, p) for p in (50, 95)] + [max(received, default=None)]),
        "final report sent": since(
            [percentile(finished, p) for p in (50, 95)] + [max(finished, default=None)]
        ),
        "final state in Delta": since(
            [
                delta_at[int(devices * p / 100) - 1] if len(delta_at) >= devices * p / 100 else None
                for p in (50, 95, 100)
            ]
        ),
    }
    return ActionRun(
        label=label,
        stages=stages,
        reached=len(received),
        finished=len(delta_at),
        complete=len(delta_at) >= devices,
        simulator_cpu=(cpu_after[0] - cpu_before[0]) / wall * 100,
        broker_cpu=(cpu_after[1] - cpu_before[1]) / wall * 100,
        job_cpu=(cpu_after[2] - cpu_before[2]) / wall * 100,
    )


def log_progress(job) -> None:
    """Each query's micro-batches as Spark timed them (rows, and milliseconds per step), into the job log."""
    for query in job.queries:
        for progress in query.recentProgress:
            durations = " ".join(f"{k}={v}" for k, v in sorted(progress.durationMs.items()))
            logging.getLogger("pipelines.bench").info(
                "%s batch %d at %s: %d rows, %s",
                query.name,
                progress.batchId,
                progress.timestamp,
                progress.numInputRows,
                durations,
            )


def register_devices(store, spec: FleetSpec) -> None:
    now = datetime.now(UTC)
    rows = [
        {"device_id": spec.device_id(i), "group": GROUP, "last_seen": now, "firmware_version": "1.0.0"}
        for i in range(spec.count)
    ]
    store.append("devices", pa.Table.from_pylist(rows, schema=store.spec("devices").arrow_schema), "bench", 0)


def run_fleet(args, workdir: Path) -> tuple[list[ActionRun], dict]:
    from pipelines.actions.config import ActionsConfig, BrokerEndpoint
    from pipelines.actions.job import start_actions_job
    from pipelines.spark_session import local_spark_session
    from sinks import open_table_store

    devices = args.devices
    broker = BrokerProcess(
        workdir / "broker", limits=broker_limits(devices), logging={"level": "WARNING"}
    ).start()
    spec = FleetSpec(
        brokers=[broker.address],
        count=devices,
        groups=[GROUP],
        buckets=args.buckets,
        connects_per_second=args.connects_per_second,
        source_addresses=loopback_sources(devices),
    )
    behaviour = DeviceBehaviour(telemetry_interval_s=args.telemetry_interval, download_delay_s=(0.5, 1.5))
    fleet = FleetProcesses(spec, behaviour, args.procs)
    facts: dict = {"load_before": os.getloadavg()}
    runs: list[ActionRun] = []
    try:
        started = time.monotonic()
        fleet.start()
        connected = fleet.status()[0]
        facts["connect_s"] = time.monotonic() - started
        facts["connected"] = connected
        print(f"{connected:,} devices connected in {facts['connect_s']:.1f} s", flush=True)
        spark = local_spark_session("timestone-ota-bench", "local[2]")
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000")  # every batch, for the log
        store = open_table_store(spark, str(workdir / "tables"), backend="delta-rs")
        register_devices(store, spec)
        versions = (f"2.{n}.0" for n in itertools.count())
        with SentCounter(broker.admin_port) as sent:
            for number, target in enumerate(args.targets):
                config = ActionsConfig(
                    tables_root=str(workdir / "tables"),
                    checkpoint_root=str(workdir / f"checkpoints-{number}"),
                    brokers=[BrokerEndpoint(mqtt_port=broker.port, offsets_api=broker.offsets_url)],
                    trigger_interval_s=args.trigger_interval,
                    tick_interval_s=1.0,
                    device_buckets=args.buckets,
                )
                job = start_actions_job(spark, config, store)
                clock = StageClock()
                clock.wrap(job)
                job.process_available()  # started: both streams have run their first micro-batches
                try:
                    for phase in ("cold", "warm"):
                        label = f"{TARGET_NAMES[target]}, {phase}"
                        run = run_action(
                            label, store, fleet, broker, sent, clock, devices, target, next(versions)
                        )
                        runs.append(run)
                        print(
                            f"{label}: {run.stages}; reached {run.reached}, final in Delta {run.finished}; "
                            f"CPU % of a core: simulator {run.simulator_cpu:.0f}, "
                            f"broker {run.broker_cpu:.0f}, job + Spark {run.job_cpu:.0f}; "
                            f"load {os.getloadavg()[0]:.1f}",
                            flush=True,
                        )
                finally:
                    log_progress(job)
                    job.stop()
        spark.stop()
        facts["load_after"] = os.getloadavg()
        facts["fleet_stats"] = fleet.status()[1]
    finally:
        fleet.stop()
        broker.stop()
    return runs, facts


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def verdicts(runs: list[ActionRun], devices: int) -> list[str]:
    """Each target, with the figure measured and whether it is met."""
    lines = []
    targets = TARGETS_10K if devices <= 10_000 else TARGETS_LARGE
    for run in runs:
        phase = run.label.rsplit(", ", 1)[1]
        receipt = run.stages["device receipt"]
        delta = run.stages["final state in Delta"]
        checks = []
        if phase == "warm":
            checks.append(("95 % receive", receipt[1], targets["p95_warm"]))
            if "p100_warm" in targets:
                checks.append(
                    ("100 % receive", receipt[2] if run.reached == devices else None, targets["p100_warm"])
                )
            if "delta_warm" in targets:
                checks.append(("every final state in Delta", delta[2], targets["delta_warm"]))
        elif "p95_cold" in targets:
            checks.append(("95 % receive", receipt[1], targets["p95_cold"]))
        for what, value, limit in checks:
            met = value is not None and value <= limit
            lines.append(
                f"- {run.label}: {what} within {limit:.0f} s of the commit: "
                f"{fmt(value)} s → **{'met' if met else 'NOT met'}**"
            )
    return lines


def report(args, runs: list[ActionRun], facts: dict) -> str:
    machine = machine_info()
    devices = args.devices
    lines = [
        f"## {devices:,} devices",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {machine.cpu_model}, {machine.cores} cores, "
        f"shared with other work: load average {facts['load_before'][0]:.1f} before the run, "
        f"{facts.get('load_after', (float('nan'),))[0]:.1f} after. Broker, fleet ({args.procs} processes, "
        f"{len(loopback_sources(devices))} loopback source address(es)) and Spark (`local[2]`) share the "
        f"2 cores. {facts['connected']:,} devices connected in {facts['connect_s']:.1f} s, each sending "
        f"telemetry every {args.telemetry_interval:g} s (QoS 1, logged); trigger interval "
        f"{args.trigger_interval:g} s. Explicit ids: {explicit_ids_scheme(args.buckets)}. Broker limits set "
        f"for the bench: {broker_limits(devices)}.",
        "",
        "Seconds after the action row's commit (p50 / p95 / p100 over devices; one figure where one event):",
        "",
        "| stage | " + " | ".join(run.label for run in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for stage in runs[0].stages:
        cells = [" / ".join(fmt(v) for v in run.stages[stage]) or "—" for run in runs]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    lines.append(
        "| devices reached / final in Delta | "
        + " | ".join(f"{r.reached:,} / {r.finished:,}" for r in runs)
        + " |"
    )
    for name, attr in (("simulator", "simulator_cpu"), ("broker", "broker_cpu"), ("job + Spark", "job_cpu")):
        lines.append(
            f"| CPU of the {name} (% of one core) | "
            + " | ".join(f"{getattr(r, attr):.0f} %" for r in runs)
            + " |"
        )
    if devices in (10_000, 50_000):
        lines += ["", "Targets:", "", *verdicts(runs, devices), ""]
    else:
        lines += [
            "",
            f"The targets are stated for 10,000 and 50,000 devices; this run has {devices:,}, so they are "
            "not judged here. For reference, against the 10,000-device targets:",
            "",
            *verdicts(runs, devices),
            "",
        ]
    return "\n".join(lines)


def save(section: str, heading: str) -> None:
    """Replace the section under ``heading`` of the results file, keeping the others: fleet sizes first,
    smallest first, then the other sections (the exponential rollout's, ``bench/rollout_bench.py``)."""
    text = RESULTS.read_text() if RESULTS.exists() else "# OTA fanout\n"
    parts = [p.rstrip() + "\n" for p in re.split(r"(?m)^(?=## )", text) if p.strip()]
    intro = [p for p in parts if not p.startswith("## ")]
    sections = [p for p in parts if p.startswith("## ") and not p.startswith(heading)] + [section]

    def order(part: str) -> tuple[bool, int]:
        digits = re.match(r"## ([\d,]+) devices", part)
        return (digits is None, int(digits.group(1).replace(",", "")) if digits else 0)

    RESULTS.write_text("\n".join(intro + sorted(sections, key=order)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--procs", type=int, default=4, help="processes of the simulated fleet")
    parser.add_argument("--telemetry-interval", type=float, default=5.0)
    parser.add_argument("--trigger-interval", type=float, default=0.5)
    parser.add_argument("--connects-per-second", type=float, default=2000.0)
    parser.add_argument("--targets", default="ids,group", help="comma-separated: ids, group")
    parser.add_argument(
        "--buckets",
        type=int,
        default=DEFAULT_BUCKETS,
        help="device buckets of explicit-id actions (0: one message per device on its own topic)",
    )
    parser.add_argument("--no-save", action="store_true", help="print only, do not update the results file")
    args = parser.parse_args(argv)
    args.targets = [t for t in args.targets.split(",") if t]
    unknown = set(args.targets) - set(TARGET_NAMES)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; expected ids and/or group")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    raise_open_files_limit()
    job_log = logging.FileHandler(RESULTS.parent / "ota-job.log", mode="w")
    job_log.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(message)s"))
    logging.getLogger("pipelines").addHandler(job_log)
    logging.getLogger("pipelines").setLevel(logging.INFO)
    workdir = Path(tempfile.mkdtemp(prefix="timestone-ota-bench-"))
    try:
        runs, facts = run_fleet(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    section = report(args, runs, facts)
    if not args.no_save:
        save(section, f"## {args.devices:,} devices")
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
