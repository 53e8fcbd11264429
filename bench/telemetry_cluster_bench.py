"""The telemetry job on a Spark standalone cluster on loopback: what its driver and its executors spend.

    .venv/bin/python -m bench.telemetry_cluster_bench [--quick] [--only-100k | --only-latency] [--output FILE]

A master and two 1-core workers (``tests/spark_cluster.py``), ``timestone broker`` processes holding a
backlog of small JSON readings (published as QoS 1 MQTT, like the simulated fleet's), and the job in a driver
process of its own, as ``timestone pipeline telemetry --available-now`` runs it. While it runs, the CPU and
the peak resident memory (``VmHWM``) of every process are read from /proc, by role: the driver (its Python
process, its JVM, the Python process serving the source's offsets) and the executors (their JVMs and Python
workers). Four runs:

1. the job at 100,000-row batches (``source.max_records_per_trigger``), its first batch not measured (the
   JVMs compile the code then);
2. plain Spark transforms of the same bronze rows on the same cluster (``bench/telemetry_ceiling.py``'s
   ``run_plain``: Parquet in, JSON parsed, duplicates dropped by device and ``seq``, silver and the two
   aggregates as Parquet), in a driver of their own;
3. the job at 1,000,000-row batches;
4. the job at its 1 s trigger while a publisher sends 200 readings/s, publish → silver read from the table by
   another process (``bench/telemetry_bench.py``'s poller); then the same with every batch written from
   each of its partitions (``one_task_rows`` 0), and two floors at the same trigger and rate, Spark's
   ``noop`` sink fed by the source alone and by the job's streaming part. Spark's event log of each says
   how many jobs, stages and tasks a batch ran, by step (``bench/spark_events.py``). ``--only-latency``
   runs only this, into its own section.

Targets: the driver's share of the CPU (driver / driver + executors, from the first batch to the end) at most
10 %, its peak RSS at most 100 MB higher at 1,000,000-row batches than at 100,000; the job's rows/s at
least 0.6x the plain transforms' at 100,000-row batches; publish → silver p50 at most 1.5 s. Writes the
section "On a Spark standalone cluster" of ``bench/results/telemetry.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.report import replace_section  # noqa: E402
from bench.spark_events import (  # noqa: E402
    EventLog,
    batch_totals,
    jobs_between,
    median_step_jobs,
    read_event_log,
)
from bench.sysinfo import machine_info  # noqa: E402
from bench.telemetry_bench import (  # noqa: E402
    BROKER_SECTIONS,
    LoadSampler,
    logged_records,
    percentile,
    poll_tables,
    publish_backlog,
    steady_publisher,
)
from broker_edge.runtime.launcher import BrokerProcess  # noqa: E402
from tests.spark_cluster import StandaloneCluster, spark_environment, standalone_cluster  # noqa: E402

RESULTS = REPO / "bench" / "results" / "telemetry.md"
HEADING = "### On a Spark standalone cluster"
LATENCY_HEADING = "### Latency on a Spark standalone cluster"
#: ``--spark-conf``'s settings, passed to the drivers (JSON)
SPARK_CONF_VARIABLE = "TIMESTONE_BENCH_SPARK_CONF"
TOPICS = 100
#: executors and drivers get this much heap: a 1,000,000-row batch cached on two executors fits
EXECUTOR_MEMORY = "2g"
#: how a result section describes where the job ran
CLUSTER_AND_DRIVER = (
    "A Spark standalone cluster on loopback (a master and two workers of one core each, executors of "
    f"{EXECUTOR_MEMORY}), the job in a driver process of its own with its default configuration"
)
MAX_DRIVER_CPU_SHARE = 0.10
MAX_DRIVER_RSS_GROWTH = 100 << 20
MIN_SHARE_OF_PLAIN = 0.6
MAX_SILVER_P50_S = 1.5
#: the latency runs' names in the report
QUERY_NAMES = {"latency": "job", "every-partition": "job, every partition"}
#: the floor queries of the latency run (:func:`run_floor_driver`)
FLOORS = ("source", "stream")
_TICKS = os.sysconf("SC_CLK_TCK")


# -- processes, read from /proc -----------------------------------------------------------------------------


@dataclass
class Role:
    """CPU seconds and the sum of the peak resident memory of the processes of one role."""

    cpu_s: float = 0.0
    peak_rss: int = 0
    processes: int = 0


@dataclass
class _Seen:
    role: str
    first_ticks: int
    ticks: int = 0
    hwm_kib: int = 0


class ProcessSampler:
    """Reads every few hundred ms the CPU and ``VmHWM`` of a driver's process tree and of the executors
    (the workers' children and theirs), by role; ``mark()`` starts the CPU count from now. A process
    that lives less than one interval between two reads is missed."""

    def __init__(self, driver: int, workers: list[int], interval_s: float = 0.25) -> None:
        self.driver, self.workers, self.interval_s = driver, set(workers), interval_s
        self.seen: dict[int, _Seen] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-sampler", daemon=True)

    def __enter__(self) -> ProcessSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def mark(self) -> None:
        """Count CPU from now: what each process used before (its start, the JVM's boot) is left out."""
        self.sample()
        with self._lock:
            for seen in self.seen.values():
                seen.first_ticks = seen.ticks

    def sample(self) -> None:
        parents = _parents()
        with self._lock:
            for pid in parents:
                seen = self.seen.get(pid)
                # a process's role is what it runs now (the JVM's process starts as the spark-submit
                # script), or what it ran last once it is exiting and its command line reads empty
                role = self._role(pid, parents) or (seen.role if seen else None)
                ticks = _ticks(pid) if role else None
                if role is None or ticks is None:
                    continue
                seen = seen or self.seen.setdefault(pid, _Seen(role, 0))
                seen.role, seen.ticks, seen.hwm_kib = role, ticks, max(seen.hwm_kib, _hwm_kib(pid))

    def _role(self, pid: int, parents: dict[int, int]) -> str | None:
        """The role of a process of the driver's tree or the executors', from what it runs now; None for
        any other process, or one whose command line cannot be read (it is exiting)."""
        command = _command(pid)
        if not command:
            return None
        java = "java" in command.split(" ", 1)[0]
        ancestor = parents.get(pid)
        while ancestor and ancestor not in (self.driver, 1) and ancestor not in self.workers:
            ancestor = parents.get(ancestor)
        if pid == self.driver:
            return "driver Python"
        if ancestor == self.driver:
            return "driver JVM" if java else "driver Python"
        if ancestor in self.workers:
            return "executor JVMs" if java else "executor Python workers"
        return None

    def roles(self) -> dict[str, Role]:
        with self._lock:
            found: dict[str, Role] = {}
            for seen in self.seen.values():
                role = found.setdefault(seen.role, Role())
                role.cpu_s += (seen.ticks - seen.first_ticks) / _TICKS
                role.peak_rss += seen.hwm_kib * 1024
                role.processes += 1
            return found


def _parents() -> dict[int, int]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return found


def _ticks(pid: int) -> int | None:
    """utime + stime: the process's own CPU. Not the children it has waited for (cutime, cstime): the
    sampler sees those itself, and a driver that reaps its JVM would count the JVM twice."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(value) for value in fields[11:13])


def _hwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# -- the job's driver and the plain transforms' driver, each a process of its own ------------------------


def job_config(root: Path, label: str, offsets_url: str, batch_rows: int | None) -> dict[str, Any]:
    source: dict[str, Any] = {"brokers": [f"edge1={offsets_url}"]}
    if batch_rows is not None:
        source["max_records_per_trigger"] = batch_rows
    return {
        "source": source,
        "tables": {"root": str(root / label / "tables"), "backend": "delta-rs"},
        "stream": {"checkpoint": str(root / label / "checkpoint"), "query_name": f"telemetry-{label}"},
    }


def run_driver(args: list[str]) -> int:
    """``--driver SECTION_JSON MASTER [SECONDS [EVENTS_DIR [SETTINGS_JSON]]]``: the job, availableNow (or at
    its trigger for SECONDS); prints ``started`` once its query runs, and its progress reports as JSON when it
    ends. With EVENTS_DIR, Spark's event log goes there and each batch's Spark jobs are labelled with their
    step (:class:`bench.telemetry_bench.StepTrace`, whose per-step times come back too); SETTINGS_JSON sets
    attributes of its :class:`~pipelines.telemetry.job.TelemetryBatch`."""
    section, master = json.loads(args[0]), args[1]
    seconds = float(args[2]) if len(args) > 2 else None
    events = Path(args[3]) if len(args) > 3 else None
    settings = json.loads(args[4]) if len(args) > 4 else {}
    from bench.telemetry_bench import StepTrace
    from pipelines.telemetry.config import load_telemetry_config
    from pipelines.telemetry.job import TelemetryBatch, open_store, start_query

    spark = driver_session("timestone-telemetry", master, events)
    tracer = StepTrace(spark) if events is not None else None
    if tracer is not None:
        tracer.install()
    config = load_telemetry_config(section)
    batch = TelemetryBatch(config, open_store(spark, config))
    for name, value in settings.items():
        setattr(batch, name, value)
    batch.ensure_tables()
    query = start_query(spark, config, batch, available_now=seconds is None)
    print("started", flush=True)
    if seconds is None:
        query.awaitTermination()
    else:
        run_for(query, seconds)
    batch.close()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = [json.loads(p.json) for p in query.recentProgress]
    steps = {r.batch_id: r.step_ms for r in batch.reports}
    traced = {f"{b} {name}": parts for (b, name), parts in tracer.parts.items()} if tracer else {}
    spark.stop()
    print(json.dumps({"progress": progress, "steps": steps, "traced": traced}), flush=True)
    return 0


def run_floor_driver(args: list[str]) -> int:
    """``--floor PART SECTION_JSON MASTER SECONDS EVENTS_DIR``: a query at the job's trigger over the same
    source writing to Spark's ``noop`` sink, for SECONDS; PART ``source``: the records as read, PART
    ``stream``: the job's streaming part (:func:`pipelines.telemetry.job.telemetry_rows`: parse, checks, the
    duplicate flag in the state store). Prints ``started``, then its progress reports as JSON."""
    from pipelines.telemetry import quality as Q
    from pipelines.telemetry.config import load_telemetry_config
    from pipelines.telemetry.job import STATE_STORE_CONF, telemetry_rows
    from sources import register_sources

    part, section, master = args[0], json.loads(args[1]), args[2]
    seconds, events = float(args[3]), Path(args[4])
    spark = driver_session(f"timestone-floor-{part}", master, events)
    config = load_telemetry_config(section)
    register_sources(spark)
    for key, value in STATE_STORE_CONF.items():
        spark.conf.set(key, value)
    records = spark.readStream.format("timestone").options(**config.source_options()).load()
    if part == "stream":
        types = {name: t.strip().lower() for name, t in config.payload.fields.items()}
        records = telemetry_rows(records, config, Q.row_failure_conditions(config.quality.suites, types))
    query = (
        records.writeStream.format("noop")
        .option("checkpointLocation", config.stream.checkpoint)
        .trigger(processingTime=config.stream.trigger_interval)
        .start()
    )
    print("started", flush=True)
    run_for(query, seconds)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = [json.loads(p.json) for p in query.recentProgress]
    spark.stop()
    print(json.dumps({"progress": progress, "steps": {}, "traced": {}}), flush=True)
    return 0


def run_for(query: Any, seconds: float, batches: int = 8, first_batch_s: float = 600) -> None:
    """Stop ``query`` once ``seconds`` have passed since its first batch with rows ended (a new query's first
    batch is slow, and slower the busier the machine) and at least ``batches`` more batches with rows have
    ended since, or once it failed; ``first_batch_s`` at most for that first batch, and as long again for
    the rest."""
    deadline = time.monotonic() + first_batch_s
    while query.isActive and time.monotonic() < deadline:
        if any(p["numInputRows"] for p in query.recentProgress):
            break
        time.sleep(0.2)
    began = time.monotonic()
    deadline = began + first_batch_s
    while query.isActive and time.monotonic() < deadline:
        done = sum(1 for p in query.recentProgress if p["numInputRows"]) - 1
        if time.monotonic() - began >= seconds and done >= batches:
            break
        time.sleep(0.2)
    query.stop()


def driver_session(name: str, master: str, events: Path | None) -> Any:
    """The SparkSession of a driver of this bench on the cluster (with Spark's event log under ``events``)."""
    from bench.spark_events import event_log_conf
    from pipelines.spark_session import local_spark_session

    conf = {"spark.executor.memory": EXECUTOR_MEMORY, **json.loads(os.environ.get(SPARK_CONF_VARIABLE, "{}"))}
    if events is not None:
        conf.update(event_log_conf(events))
    spark = local_spark_session(name, master, conf)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_plain_driver(args: list[str]) -> int:
    """``--plain FILES_JSON OUT MASTER ROUNDS``: the plain transforms ROUNDS times; their runs as JSON."""
    from bench.telemetry_ceiling import run_plain

    files, out, master, rounds = json.loads(Path(args[0]).read_text()), args[1], args[2], int(args[3])
    spark = driver_session("timestone-plain", master, None)
    runs = [run_plain(spark, files, f"{out}/{n}").__dict__ for n in range(rounds)]
    print(json.dumps(runs), flush=True)
    spark.stop()
    return 0


@dataclass
class Run:
    """One driver's run: what it reported, and the CPU and memory of its processes by role."""

    label: str
    roles: dict[str, Role]
    progress: list[dict[str, Any]] = field(default_factory=list)
    steps: dict[str, dict[str, float]] = field(default_factory=dict)
    #: ``"<batch> <step>"``: what :class:`bench.telemetry_bench.StepTrace` timed in the step
    traced: dict[str, dict[str, float]] = field(default_factory=dict)
    events: EventLog | None = None  # Spark's event log of the run
    load: list[float] = field(default_factory=list)  # the load average during the run

    def cpu(self, prefix: str) -> float:
        return sum(r.cpu_s for name, r in self.roles.items() if name.startswith(prefix))

    def rss(self, prefix: str) -> int:
        return sum(r.peak_rss for name, r in self.roles.items() if name.startswith(prefix))

    @property
    def driver_share(self) -> float:
        total = self.cpu("driver") + self.cpu("executor")
        return self.cpu("driver") / total if total else 0.0

    def batches(self, skip_first: bool = True) -> list[dict[str, Any]]:
        with_rows = [p for p in self.progress if p["numInputRows"]]
        return with_rows[1:] if skip_first and len(with_rows) > 1 else with_rows

    def rate(self) -> float:
        """Rows/s of the measured batches, from each one's own time (its trigger to its commit)."""
        batches = self.batches()
        seconds = sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000
        return sum(p["numInputRows"] for p in batches) / seconds if seconds else 0.0


def drive(
    cluster: StandaloneCluster,
    label: str,
    args: list[str],
    timeout_s: float,
    on_started: Callable[[], None] | None = None,
) -> tuple[Run, Any]:
    """Run ``python -m bench.telemetry_cluster_bench ARGS`` as a driver on the cluster while the sampler
    reads its processes and the executors' (``on_started`` called once its query runs); its last output
    line is JSON."""
    command = [sys.executable, "-m", "bench.telemetry_cluster_bench", *args]
    workers = [p.pid for p in cluster.processes[1:]]
    lines: list[str] = []
    with tempfile.TemporaryFile("w+") as errors:
        process = subprocess.Popen(
            command, cwd=REPO, env=spark_environment(), stdout=subprocess.PIPE, stderr=errors, text=True
        )
        assert process.stdout is not None
        with ProcessSampler(process.pid, workers) as sampler:
            deadline = time.monotonic() + timeout_s
            for line in process.stdout:
                lines.append(line)
                if line.strip() == "started":
                    sampler.mark()
                    if on_started is not None:
                        on_started()
                if time.monotonic() > deadline:
                    process.kill()
                    raise TimeoutError(f"{label} did not finish within {timeout_s:.0f} s")
            process.wait(timeout=60)
        if process.returncode != 0 or not lines:
            errors.seek(0)
            stderr_tail = "".join(errors.readlines()[-30:])
            raise RuntimeError(f"{label} exited {process.returncode}: {''.join(lines[-10:])}{stderr_tail}")
    return Run(label, sampler.roles()), json.loads(lines[-1])


# -- the runs ----------------------------------------------------------------------------------------------


@dataclass
class Figures:
    job_100k: Run | None = None
    job_1m: Run | None = None
    plain: list[dict[str, Any]] = field(default_factory=list)
    plain_run: Run | None = None
    #: ``latency``: the job as configured; ``every-partition``: the job writing every batch from each of
    #: its partitions (``one_task_rows`` 0)
    latencies: dict[str, Latency] = field(default_factory=dict)
    backlog: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    floors: dict[str, Run] = field(default_factory=dict)

    @property
    def latency(self) -> Run | None:
        return self.latencies["latency"].run if "latency" in self.latencies else None

    @property
    def silver_latency(self) -> list[float]:
        return self.latencies["latency"].silver if "latency" in self.latencies else []


def job_run(cluster: StandaloneCluster, root: Path, label: str, broker: BrokerProcess, rows: int) -> Run:
    section = job_config(root, label, broker.offsets_url, rows)
    run, answer = drive(cluster, label, ["--driver", json.dumps(section), cluster.master_url], 3600)
    run.progress, run.steps = answer["progress"], answer["steps"]
    return run


def backlog_broker(root: Path, name: str, per_topic: int) -> BrokerProcess:
    broker = BrokerProcess(root / name, **BROKER_SECTIONS)
    broker.start()
    asyncio.run(publish_backlog(broker.port, TOPICS, per_topic, 1800))
    return broker


def bronze_files(root: Path, label: str) -> list[str]:
    from urllib.parse import unquote

    from deltalake import DeltaTable

    return [unquote(uri) for uri in DeltaTable(str(root / label / "tables" / "bronze_telemetry")).file_uris()]


@dataclass
class Latency:
    """A latency run: the job's driver, and publish → visible in bronze and silver (seconds) once warm."""

    run: Run
    bronze: list[float]
    silver: list[float]
    published: int


def measure_latency(
    cluster: StandaloneCluster,
    root: Path,
    label: str,
    warmup_s: float,
    measure_s: float,
    batch_settings: dict[str, Any] | None = None,
) -> Latency:
    """The job at its 1 s trigger while 200 readings/s are published; publish → visible, read by a poller.
    Spark's event log of the run is read back for each batch's jobs, stages and tasks by step.
    ``batch_settings``: attributes of the job's :class:`~pipelines.telemetry.job.TelemetryBatch` to set."""
    broker = BrokerProcess(root / f"{label}-broker", **BROKER_SECTIONS)
    broker.start()
    try:
        section = job_config(root, label, broker.offsets_url, None)
        tables = root / label / "tables"
        total_s = warmup_s + measure_s
        context = mp.get_context("spawn")
        stop, answers, polled = context.Event(), context.Queue(), context.Queue()
        publisher = context.Process(
            target=steady_publisher, args=(broker.port, 50, 200.0, total_s + 900, stop, answers)
        )
        poller = context.Process(
            target=poll_tables,
            args=(
                str(tables / "bronze_telemetry"),
                str(tables / "silver_telemetry"),
                0.1,
                total_s + 900,
                stop,
                polled,
            ),
        )
        poller.start()
        began = [0.0]

        def publish() -> None:  # once the query runs: readings do not wait for the driver to start
            publisher.start()
            assert answers.get(timeout=120)[0] == "ready"
            began[0] = time.time()

        events = root / f"{label}-events"
        args = ["--driver", json.dumps(section), cluster.master_url, str(total_s), str(events)]
        args.append(json.dumps(batch_settings or {}))
        try:
            with LoadSampler() as load:
                run, answer = drive(cluster, label, args, total_s + 900, on_started=publish)
        finally:
            stop.set()
        run.progress, run.steps, run.traced = answer["progress"], answer["steps"], answer["traced"]
        run.events, run.load = read_event_log(events), load.samples
        _, published, _ = answers.get(timeout=120)
        seen = polled.get(timeout=120)
        low = max(began[0] + warmup_s, warmed_up(run))
        silver = [s - ts / 1000 for ts, s in seen["silver"] if ts / 1000 >= low]
        bronze = [s - ts / 1000 for ts, s in seen["bronze"] if ts / 1000 >= low]
        return Latency(run, bronze, silver, published)
    finally:
        _end(publisher, poller)
        broker.stop()


def _end(*processes: Any) -> None:
    """Wait for the helper processes (told to stop), killing one that does not end."""
    for process in processes:
        if process.pid is not None:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join(10)


def measure_floor(cluster: StandaloneCluster, root: Path, part: str, seconds: float) -> Run:
    """A floor query (:func:`run_floor_driver`) over a broker of its own while 200 readings/s are
    published to it, as in :func:`measure_latency`."""
    broker = BrokerProcess(root / f"floor-{part}-broker", **BROKER_SECTIONS)
    broker.start()
    try:
        section = job_config(root, f"floor-{part}", broker.offsets_url, None)
        context = mp.get_context("spawn")
        stop, answers = context.Event(), context.Queue()
        publisher = context.Process(
            target=steady_publisher, args=(broker.port, 50, 200.0, seconds + 900, stop, answers)
        )

        def publish() -> None:
            publisher.start()
            assert answers.get(timeout=120)[0] == "ready"

        events = root / f"floor-{part}-events"
        args = ["--floor", part, json.dumps(section), cluster.master_url, str(seconds), str(events)]
        try:
            with LoadSampler() as load:
                run, answer = drive(cluster, f"floor-{part}", args, seconds + 900, on_started=publish)
        finally:
            stop.set()
        run.progress, run.events, run.load = answer["progress"], read_event_log(events), load.samples
        answers.get(timeout=120)
        return run
    finally:
        _end(publisher)
        broker.stop()


def latency_runs(
    cluster: StandaloneCluster, root: Path, figures: Figures, warmup_s: float, measure_s: float
) -> None:
    """The latency run, the job with every batch written from each of its partitions, then the floors, at
    the same trigger and publishing rate on the same cluster."""
    for label, settings in (("latency", {}), ("every-partition", {"one_task_rows": 0})):
        try:
            figures.latencies[label] = measure_latency(cluster, root, label, warmup_s, measure_s, settings)
        except Exception as exc:
            figures.failures.append(f"{label}: {exc}")
    for part in FLOORS:
        try:
            figures.floors[part] = measure_floor(cluster, root, part, warmup_s + measure_s / 2)
        except Exception as exc:
            figures.failures.append(f"floor {part}: {exc}")


def job_on_backlog(
    cluster: StandaloneCluster, root: Path, figures: Figures, size: str, per_topic: int, rows: int
) -> Run:
    """The job at ``rows``-row batches over a broker of its own holding ``per_topic`` readings a topic."""
    broker = backlog_broker(root, f"broker-{size}", per_topic)
    try:
        figures.backlog[size] = logged_records(broker.offsets_url, "devices/+/telemetry")
        job = job_run(cluster, root, f"job-{size}", broker, rows)
        print(f"job at {rows:,}-row batches: {job.rate():,.0f} rows/s", flush=True)
        return job
    finally:
        broker.stop()


def warmed_up(latency: Run) -> float:
    """When the query's second batch with rows ended (epoch seconds): a new query's first batches are slow,
    and readings published while the driver starts wait for it, so the latency is measured after them."""
    ends = [
        datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        + p["durationMs"]["triggerExecution"] / 1000
        for p in latency.batches(skip_first=False)
    ]
    return ends[1] if len(ends) > 1 else float("inf")


def run(root: Path, quick: bool, only_100k: bool = False) -> Figures:
    figures = Figures()
    per_topic_100k, per_topic_1m = (2_000, 11_000) if quick else (6_000, 20_000)
    with standalone_cluster(root / "cluster", workers=2, cores=1, memory=EXECUTOR_MEMORY) as cluster:
        figures.job_100k = job_on_backlog(cluster, root, figures, "100k", per_topic_100k, 100_000)
        listing = root / "bronze-files.json"
        listing.write_text(json.dumps(bronze_files(root, "job-100k")))
        args = ["--plain", str(listing), str(root / "plain"), cluster.master_url, "3"]
        figures.plain_run, figures.plain = drive(cluster, "plain", args, 3600)
        print(
            f"plain transforms: {[round(r['rows'] / r['seconds']) for r in figures.plain]} rows/s", flush=True
        )
        if only_100k:
            return figures
        figures.job_1m = job_on_backlog(cluster, root, figures, "1m", per_topic_1m, 1_000_000)
        latency_runs(cluster, root, figures, 15.0, 30.0 if quick else 45.0)
    return figures


def run_latency_only(root: Path, quick: bool) -> Figures:
    figures = Figures()
    with standalone_cluster(root / "cluster", workers=2, cores=1, memory=EXECUTOR_MEMORY) as cluster:
        latency_runs(cluster, root, figures, 15.0, 30.0 if quick else 45.0)
    return figures


# -- report -------------------------------------------------------------------------------------------------


def _mib(value: int) -> str:
    return f"{value / (1 << 20):,.0f} MiB"


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def _role_rows(run: Run) -> list[str]:
    rows = []
    for name in ("driver Python", "driver JVM", "executor JVMs", "executor Python workers"):
        role = run.roles.get(name, Role())
        rows.append(
            f"| {run.label} | {name} | {role.processes} | {role.cpu_s:,.1f} | {_mib(role.peak_rss)} |"
        )
    return rows


def _run_line(command: str, started: datetime, wall: float, load: LoadSampler) -> str:
    info = machine_info()
    return (
        f"`{command}`, {started:%Y-%m-%d %H:%M} UTC, {wall:,.0f} s in all. "
        f"{info.cpu_model}, {info.cores} cores, {info.memory_gib:.0f} GiB, Python {sys.version.split()[0]}. "
        f"Load average (1 min) {load.samples[0]:.1f} at the start, {statistics.mean(load.samples):.1f} "
        f"mean / {max(load.samples):.1f} max during the run: the machine was shared with other work."
    )


def render_latency(figures: Figures, started: datetime, wall: float, load: LoadSampler) -> str:
    """``--only-latency``'s section: the latency run and its floors."""
    lines = [
        LATENCY_HEADING,
        "",
        _run_line("python -m bench.telemetry_cluster_bench --only-latency", started, wall, load),
        "",
        f"{CLUSTER_AND_DRIVER} (1 s trigger), its tables on local disk (delta-rs), reading a `timestone "
        "broker` that a publisher sends 200 readings/s to; a poller reads bronze and silver every 100 ms.",
    ]
    if figures.silver_latency:
        p50 = percentile(figures.silver_latency, 50)
        lines += [
            "",
            "| figure | value | target | |",
            "|---|---:|---|---|",
            f"| publish → silver p50 at the 1 s trigger | {p50:.2f} s | ≤ 1.5 s | "
            f"{_met(p50 <= MAX_SILVER_P50_S)} |",
        ]
    lines += _latency_lines(figures)
    for failure in figures.failures:
        lines.append(f"\nFailed: {failure}")
    return "\n".join(lines) + "\n"


def render(figures: Figures, started: datetime, wall: float, load: LoadSampler, flags: str = "") -> str:
    lines = [
        HEADING,
        "",
        _run_line(f"python -m bench.telemetry_cluster_bench{flags}", started, wall, load),
        "",
        f"{CLUSTER_AND_DRIVER}, its tables on local disk (delta-rs), the backlog read from `timestone "
        "broker` processes (100 device topics, JSON readings of about 130 bytes). CPU seconds count from "
        "the query's start (the JVMs' boot left out); peak RSS is each process's `VmHWM`, summed by role.",
        "",
    ]
    job, big = figures.job_100k, figures.job_1m
    plain_rates = [r["rows"] / r["seconds"] for r in figures.plain[1:]] if len(figures.plain) > 1 else []
    plain = statistics.median(plain_rates) if plain_rates else 0.0
    if job is not None and big is None:
        lines += ["| figure | value | target | |", "|---|---:|---|---|", *_small_rows(job, plain)]
        lines += ["", "| run | role | processes | CPU s | peak RSS |", "|---|---|---:|---:|---:|"]
        for each in (job, figures.plain_run):
            if each is not None:
                lines += _role_rows(each)
        lines.append("\nThe 1,000,000-row batches and the latency run were left out (`--only-100k`).")
    if job is not None and big is not None:
        lines += _target_rows(figures, job, big, plain)
        lines += ["", "| run | role | processes | CPU s | peak RSS |", "|---|---|---:|---:|---:|"]
        for each in (job, big, figures.plain_run, figures.latency):
            if each is not None:
                lines += _role_rows(each)
        big_batches = ", ".join(
            f"{p['durationMs']['triggerExecution'] / 1000:.1f} s" for p in big.batches(skip_first=False)
        )
        lines += [
            "",
            f"Backlogs: {figures.backlog.get('100k', 0):,} and {figures.backlog.get('1m', 0):,} readings. "
            "The job's rows/s is its batches' rows over their time (trigger to commit), the first batch left "
            f"out; batches measured at 100,000 rows: {len(job.batches())}; the 1,000,000-row batches took "
            f"{big_batches}. The plain transforms: the median of their last two of three runs "
            f"({', '.join(f'{r:,.0f}' for r in plain_rates)} rows/s).",
        ]
        medians = _median_steps(job)
        if medians:
            lines.append(
                "Median step times of a 100,000-row batch (ms; `profile` is the batch's first Spark job, "
                "which reads the source and fills the cache; the rest run concurrently): "
                + ", ".join(f"`{name}` {ms:,.0f}" for name, ms in medians.items())
                + "."
            )
    lines += _latency_lines(figures)
    for failure in figures.failures:
        lines.append(f"\nFailed: {failure}")
    return "\n".join(lines) + "\n"


def _latency_lines(figures: Figures) -> list[str]:
    """The latency run: publish → visible, then where a small batch's time goes, against the floors."""
    main = figures.latencies.get("latency")
    if main is None or not main.silver or not main.run.batches():
        ran = len(main.run.batches(skip_first=False)) if main is not None else 0
        return [f"\nNo reading measured after the warm-up: the job ran {ran} batch(es) with rows."]
    lat = main.run
    measured = lat.batches()
    durations = [p["durationMs"]["triggerExecution"] / 1000 for p in measured]
    bronze, silver = main.bronze, main.silver
    rows = statistics.median(p["numInputRows"] for p in measured)
    lines = [
        "",
        f"Latency: 200 readings/s over 50 devices ({main.published:,} published), measured from "
        "the end of the query's second batch with rows, at least 15 s after the publishing began; "
        f"publish → visible in bronze p50 {percentile(bronze, 50):.2f} s, p99 "
        f"{percentile(bronze, 99):.2f} s; in silver p50 {percentile(silver, 50):.2f} s, p99 "
        f"{percentile(silver, 99):.2f} s ({len(silver):,} readings); batches median "
        f"{statistics.median(durations):.2f} s, max {max(durations):.2f} s, {rows:,.0f} rows at the median. "
        f"Load average during this run {_load(lat)}.",
        "",
        "Where a batch of the latency run goes (medians over its batches with rows but the first): Spark's "
        "`durationMs` "
        + ", ".join(f"`{key}` {ms:,.0f}" for key, ms in _median_durations(measured).items())
        + " ms; the job's steps (`profile` first, then the tables' writes concurrently) "
        + ", ".join(f"`{name}` {ms:,.0f}" for name, ms in _median_steps(lat).items())
        + " ms.",
    ]
    if lat.events is not None:
        lines += [
            "",
            "By step (medians per batch, from Spark's event log, the jobs labelled by step; `wall` is "
            "the first job's submission to the last one's end, `wait` the stages' summed wait from "
            "submission to their first task's launch; collect, append, merge and open are the driver's "
            "Delta calls):",
            "",
            "| step | jobs | stages | tasks | wall ms | tasks' run ms | wait ms | collect ms | append ms | "
            "merge ms | tables opened | open ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        batch_ids = [p["batchId"] for p in measured]
        jobs = median_step_jobs(lat.events, batch_ids)
        traced = _median_traced(lat, batch_ids)
        for name in sorted(set(jobs) | set(traced)):
            j, t = jobs.get(name, {}), traced.get(name, {})
            cells = [j.get(k, 0.0) for k in ("jobs", "stages", "tasks", "wall_ms", "task_run_ms")]
            cells.append(j.get("first_task_wait_ms", 0.0))
            cells += [t.get(k, 0.0) for k in ("collect", "append", "merge", "open_n", "open")]
            lines.append(f"| `{name}` | " + " | ".join(f"{c:,.0f}" for c in cells) + " |")
    lines += [
        "",
        "The queries side by side, each its own driver, broker and checkpoint on the same cluster, one after "
        "the other, at the same trigger and publishing rate: `job`, the job as configured; `job, every "
        "partition`, the job writing every batch from each of its partitions (`one_task_rows` 0, as before "
        "small batches were written from one); the floors, Spark's `noop` sink: `source`, the records as the "
        "source reads them; `stream`, the job's streaming part (parse, checks, the duplicate flag in the "
        "state store), no table written. Medians over each query's batches with rows but the first; Spark "
        "jobs, stages and tasks per batch from the event log.",
        "",
        "| query | batches | rows | triggerExecution ms | addBatch ms | other durationMs ms | Spark jobs "
        "| stages | tasks | publish → silver p50 / p99 s | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    queries: list[tuple[str, Run, Latency | None]] = [
        (QUERY_NAMES.get(label, label), each.run, each) for label, each in figures.latencies.items()
    ]
    queries += [(f"floor: `{part}`", run, None) for part, run in figures.floors.items()]
    for name, run, latency in queries:
        batches = run.batches()
        if not batches:
            lines.append(f"| {name} | 0 | | | | | | | | | |")
            continue
        ms = _median_durations(batches)
        other = sum(v for key, v in ms.items() if key not in ("addBatch", "triggerExecution"))
        totals = _median_totals(run.events, batches) if run.events is not None else {}
        seen = (
            f"{percentile(latency.silver, 50):.2f} / {percentile(latency.silver, 99):.2f}"
            if latency is not None and latency.silver
            else "—"
        )
        lines.append(
            f"| {name} | {len(batches)} | {statistics.median(p['numInputRows'] for p in batches):,.0f} | "
            f"{ms['triggerExecution']:,.0f} | {ms['addBatch']:,.0f} | {other:,.0f} | "
            f"{totals.get('jobs', 0):.0f} | {totals.get('stages', 0):.0f} | {totals.get('tasks', 0):.0f} | "
            f"{seen} | {_load(run)} |"
        )
    return lines


def _load(run: Run) -> str:
    if not run.load:
        return "not read"
    return f"{statistics.mean(run.load):.1f} mean / {max(run.load):.1f} max"


def _median_durations(batches: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets", "triggerExecution")
    return {key: statistics.median(p["durationMs"].get(key, 0) for p in batches) for key in keys}


def _batch_window_ms(progress: dict[str, Any]) -> tuple[float, float]:
    began = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp() * 1000
    return began, began + progress["durationMs"]["triggerExecution"]


def _median_totals(events: EventLog, batches: list[dict[str, Any]]) -> dict[str, float]:
    per_batch = [batch_totals(events, jobs_between(events, *_batch_window_ms(p))) for p in batches]
    return {key: statistics.median(t[key] for t in per_batch) for key in per_batch[0]}


def _median_traced(run: Run, batch_ids: list[int]) -> dict[str, dict[str, float]]:
    by_step: dict[str, list[dict[str, float]]] = {}
    for key, parts in run.traced.items():
        batch_id, name = key.split(" ", 1)
        if int(batch_id) in batch_ids:
            by_step.setdefault(name, []).append(parts)
    return {
        name: {k: statistics.median(p.get(k, 0.0) for p in found) for k in {k for p in found for k in p}}
        for name, found in by_step.items()
    }


def _small_rows(job: Run, plain: float) -> list[str]:
    rows = [
        f"| driver's share of the CPU, 100,000-row batches | {job.driver_share:.1%} | ≤ 10 % | "
        f"{_met(job.driver_share <= MAX_DRIVER_CPU_SHARE)} |",
        f"| driver's peak RSS (Python and JVM), 100,000-row batches | {_mib(job.rss('driver'))} | | |",
    ]
    if plain:
        share = job.rate() / plain
        rows.append(
            f"| job / plain transforms, 100,000-row batches | {job.rate():,.0f} / {plain:,.0f} rows/s = "
            f"{share:.2f}x | ≥ 0.6x | {_met(share >= MIN_SHARE_OF_PLAIN)} |"
        )
    return rows


def _target_rows(figures: Figures, job: Run, big: Run, plain: float) -> list[str]:
    growth = big.rss("driver") - job.rss("driver")
    rows = [
        "| figure | value | target | |",
        "|---|---:|---|---|",
        f"| driver's share of the CPU, 100,000-row batches | {job.driver_share:.1%} | ≤ 10 % | "
        f"{_met(job.driver_share <= MAX_DRIVER_CPU_SHARE)} |",
        f"| driver's share of the CPU, 1,000,000-row batches | {big.driver_share:.1%} | ≤ 10 % | "
        f"{_met(big.driver_share <= MAX_DRIVER_CPU_SHARE)} |",
        f"| driver's peak RSS (Python and JVM), 100,000 → 1,000,000-row batches | {_mib(job.rss('driver'))} "
        f"→ {_mib(big.rss('driver'))} ({growth / (1 << 20):+,.0f} MiB) | growth ≤ 100 MB | "
        f"{_met(growth <= MAX_DRIVER_RSS_GROWTH)} |",
    ]
    if plain:
        share = job.rate() / plain
        rows.append(
            f"| job / plain transforms, 100,000-row batches | {job.rate():,.0f} / {plain:,.0f} rows/s = "
            f"{share:.2f}x | ≥ 0.6x | {_met(share >= MIN_SHARE_OF_PLAIN)} |"
        )
    if figures.silver_latency:
        p50 = percentile(figures.silver_latency, 50)
        met = _met(p50 <= MAX_SILVER_P50_S)
        rows.append(f"| publish → silver p50 at the 1 s trigger | {p50:.2f} s | ≤ 1.5 s | {met} |")
    return rows


def _median_steps(run: Run) -> dict[str, float]:
    measured = {str(p["batchId"]) for p in run.batches()}
    steps = [s for batch_id, s in run.steps.items() if batch_id in measured]
    names = sorted({name for s in steps for name in s})
    return {name: statistics.median(s[name] for s in steps if name in s) for name in names}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--driver":
        return run_driver(argv[1:])
    if argv and argv[0] == "--plain":
        return run_plain_driver(argv[1:])
    if argv and argv[0] == "--floor":
        return run_floor_driver(argv[1:])
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller backlogs (1,100,000 readings in all)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--only-100k", action="store_true", help="only the 100,000-row batches and the plain transforms"
    )
    parser.add_argument(
        "--only-latency",
        action="store_true",
        help="only the latency run and its floors (its own section of the results)",
    )
    args = parser.parse_args(argv)
    started = datetime.now(UTC)
    began = time.perf_counter()
    with LoadSampler() as load, tempfile.TemporaryDirectory(prefix="telemetry-cluster-") as tmp:
        if args.only_latency:
            figures = run_latency_only(Path(tmp), args.quick)
        else:
            figures = run(Path(tmp), args.quick, args.only_100k)
    wall = time.perf_counter() - began
    if args.only_latency:
        text = render_latency(figures, started, wall, load)
        heading = LATENCY_HEADING
    else:
        flags = "".join(
            f" {flag}" for flag, on in (("--quick", args.quick), ("--only-100k", args.only_100k)) if on
        )
        text, heading = render(figures, started, wall, load, flags), HEADING
    print(text)
    replace_section(args.output, heading, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
