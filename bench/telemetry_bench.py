"""Telemetry path benchmark: MQTT publishes → broker commitlog → ``timestone`` source → Delta tables.

    .venv/bin/python bench/telemetry_bench.py [--quick] [--records N] [--topics N] [--output FILE]

Every part is the real one: a Timestone broker process (``broker_edge.runtime.launcher.BrokerProcess``, i.e.
``timestone broker --config``), MQTT publishers on loopback sockets, the ``timestone`` Spark source, Delta
tables written by delta-rs through ``sinks``, and the telemetry job of ``pipelines/telemetry/job.py``, on a
local[2] Spark session. Three figures:

1. **source → bronze**: a backlog of small telemetry records (JSON like the simulated fleet's) on ~100
   ``devices/<id>/telemetry`` topics, published as QoS 1 frames, is read with ``trigger(availableNow=True)``
   by a query whose ``foreachBatch`` is the job's bronze step alone (``to_bronze`` + an exactly-once
   append of the DataFrame; the batch is not cached, as nothing else reads it). Rows/s from ``start()``
   to termination, and where a micro-batch's time goes: the Spark job in which the tasks read the source
   and write bronze's Parquet files (the job's store appends bronze from the executors), the driver's
   Delta commit, and Spark's own steps (offsets, planning, WAL).
2. **the whole job** (bronze, silver, quarantine, device_minute, devices, dq_results) on the same backlog,
   with the job's per-step times.
3. **latency** at the job's 1 s trigger: a steady publisher (the project's MQTT client, the publish time in
   the payload's ``ts``) while the job runs; another process reads bronze and silver with delta-rs every
   100 ms and notes when each message first becomes visible.

The source alone into a noop sink is ``bench/source_bench.py``'s (not repeated here). Broker, publishers,
table poller and Spark share the machine; CPU seconds of each, and of the rest of the machine ("other
work"), are recorded per phase, with the load average. Writes ``bench/results/telemetry.md``
(``python -m bench`` folds it into ``bench/RESULTS.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import frames  # noqa: E402
from bench.report import replace_section, section_of, write_result  # noqa: E402
from bench.stream_start import first_trigger_s, stream_start_s  # noqa: E402
from bench.sysinfo import machine_busy_seconds, machine_info, spark_process_id  # noqa: E402
from bench.telemetry_ceiling import CeilingRun, run_ceiling, run_plain  # noqa: E402
from broker_edge.runtime.launcher import BrokerProcess  # noqa: E402

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Event

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from pipelines.telemetry.config import TelemetryConfig
    from sinks import BatchWriter, TableStore

RESULTS = REPO / "bench" / "results" / "telemetry.md"
LONG_RUN_HEADING = "### A compressed day"  # bench/telemetry_longrun.py's section of RESULTS
SOURCE_RESULTS = REPO / "bench" / "results" / "source.md"
TARGET_BRONZE_ROWS_PER_S = 150_000
TARGET_BRONZE_P50_S = 1.0
TARGET_SILVER_P50_S = 1.5
TARGET_SILVER_P99_S = 2.5
#: The job's catch-up batch sizes (``source.max_records_per_trigger``) and, for each, the least share of a
#: ceiling's warm rate the whole job's warm rate should reach (against both ceilings, in the same run).
TARGET_JOB_SHARE = {100_000: 0.5, 250_000: 0.6}
TARGET_FIRST_BATCH_OF_CEILING_COLD = 2.0  # job's cold first batch / ceiling's cold run, at most
PAIRS = 3  # measured rounds: each ceiling and the job at each batch size, taking turns
WARM_ROUNDS = 3  # unmeasured rounds before them: the JVM compiles the code of every kind of run meanwhile
#: Two cores; a failed task is tried up to 4 times (Spark's default on a cluster; local mode's is once), as a
#: loaded machine can delay a Python worker's start past Spark's fixed 10 s wait for it.
SPARK_MASTER = "local[2,4]"
WINDOW = 64  # QoS 1 PUBLISHes in flight per backlog connection (the broker's receive_maximum)
POLL_INTERVAL_S = 0.1
BROKER_SECTIONS: dict[str, Any] = {
    "limits": {
        "messages_per_second_per_client": 0,
        "max_topics_per_client": 0,
        "new_connections_per_second": 0,
        "max_connections": 1000,
    },
    "logging": {"level": "WARNING"},
}


@dataclass(frozen=True)
class Settings:
    """Sizes of one run (``--quick`` shrinks them)."""

    records: int
    topics: int
    latency_devices: int
    latency_rate: float
    latency_warmup_s: float
    latency_measure_s: float
    quick: bool
    rates_only: bool = False
    """Only the ceilings and the job at each batch size, taking turns (no bronze, cold or latency runs)."""
    rounds: int | None = None
    """Measured rounds of the ceilings and the job (default ``PAIRS``, one with ``--quick``)."""


# -- payloads and the backlog publisher ------------------------------------------------------------------


def device_id(number: int) -> str:
    return f"bench-{number:04}"


def telemetry_payload(rng: random.Random, ts_ms: int, seq: int, firmware: str, group: str) -> bytes:
    """A reading shaped like ``pipelines/fleet/device.py``'s ``_send_telemetry`` (about 130 bytes)."""
    reading = {
        "ts": ts_ms,
        "seq": seq,
        "temperature": round(rng.gauss(21.0, 3.0), 2),
        "humidity": round(min(100.0, max(0.0, rng.gauss(45.0, 10.0))), 1),
        "battery": round(rng.uniform(20.0, 100.0), 1),
        "firmware": firmware,
        "group": group,
    }
    return json.dumps(reading).encode()


def backlog_frames(number: int, count: int, first_ts_ms: int) -> list[bytes]:
    """``count`` QoS 1 PUBLISH frames of one device: a reading a second (device time) from ``first_ts_ms``."""
    rng = random.Random(number)
    topic = f"devices/{device_id(number)}/telemetry"
    group = "canary" if number % 10 == 0 else "fleet"
    return [
        frames.publish(
            topic,
            telemetry_payload(rng, first_ts_ms + 1000 * seq, seq + 1, "1.0.0", group),
            qos=1,
            packet_id=seq % 65535 + 1,
        )
        for seq in range(count)
    ]


class BacklogConnection(asyncio.Protocol):
    """One device connection (MQTT 3.1.1) writing pre-encoded QoS 1 PUBLISHes, ``WINDOW`` unacknowledged."""

    def __init__(self, client_id: str, publishes: list[bytes], done: asyncio.Future[None]) -> None:
        self.client_id = client_id
        self.publishes = publishes
        self.done = done
        self.sent = 0
        self.acked = 0
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # a stream transport: it writes
        self.transport = transport
        transport.write(frames.connect(self.client_id))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        acks = 0
        while len(self.buffer) >= 2:
            kind, length = self.buffer[0], self.buffer[1]
            if length & 0x80 or len(self.buffer) < 2 + length:
                break  # every packet the broker sends here is short: wait for the rest
            if kind == frames.CONNACK:
                if self.buffer[3] != 0:
                    self._fail(f"CONNACK return code {self.buffer[3]}")
                    return
                self._send(WINDOW)
            elif kind == frames.PUBACK:
                acks += 1
            else:
                self._fail(f"unexpected packet 0x{kind:02x}")
                return
            del self.buffer[: 2 + length]
        if acks:
            self.acked += acks
            if self.acked == len(self.publishes):
                if not self.done.done():
                    self.done.set_result(None)
            else:
                self._send(acks)

    def _send(self, count: int) -> None:
        end = min(len(self.publishes), self.sent + count)
        if end > self.sent and self.transport is not None:
            self.transport.write(b"".join(self.publishes[self.sent : end]))
            self.sent = end

    def _fail(self, reason: str) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"{self.client_id}: {reason}"))
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"{self.client_id}: connection lost ({exc})"))


async def publish_backlog(port: int, topics: int, per_topic: int, timeout_s: float) -> float:
    """Publish ``per_topic`` readings on each of ``topics`` device topics; seconds until every PUBACK."""
    loop = asyncio.get_running_loop()
    first_ts_ms = int(time.time() * 1000) - 1000 * per_topic  # the last ``per_topic`` seconds of a 1 Hz fleet
    batches = [backlog_frames(number, per_topic, first_ts_ms) for number in range(topics)]
    began = time.perf_counter()
    connections: list[BacklogConnection] = []
    for number, publishes in enumerate(batches):
        factory = partial(BacklogConnection, device_id(number), publishes, loop.create_future())
        _, connection = await loop.create_connection(factory, "127.0.0.1", port)
        connections.append(connection)
    try:
        await asyncio.wait_for(asyncio.gather(*(c.done for c in connections)), timeout_s)
    finally:
        for connection in connections:
            if connection.transport is not None:
                connection.transport.write(frames.DISCONNECT_FRAME)
                connection.transport.close()
    return time.perf_counter() - began


def logged_records(offsets_url: str, pattern: str) -> int:
    """Records the broker's logs matching ``pattern`` hold (through the offsets API)."""
    from broker_edge.offsets_api.client import OffsetsClient

    with OffsetsClient(offsets_url) as client:
        return sum(log.end_offset - log.start_offset for log in client.list_logs(pattern))


# -- the steady publisher and the table poller (each its own process) -------------------------------------


def steady_publisher(
    port: int, devices: int, rate: float, limit_s: float, stop: Event, answers: Queue
) -> None:
    """Publish ``rate`` readings/s round-robin over ``devices`` connections until ``stop`` (or ``limit_s``).

    Uses the project's lean MQTT 5 client. Each payload's ``ts`` is the publish time (epoch ms). Answers
    ``("ready", connections)`` once connected, then ``("done", published, [(ts_ms, puback_s)])``,
    ``puback_s`` being publish → PUBACK.
    """
    asyncio.run(_publish_steadily(port, devices, rate, limit_s, stop, answers))


async def _publish_steadily(
    port: int, devices: int, rate: float, limit_s: float, stop: Event, answers: Queue
) -> None:
    from pipelines.fleet.client import MqttClient

    clients = [
        await MqttClient.connect("127.0.0.1", port, f"steady-{device_id(n)}", keep_alive=60)
        for n in range(devices)
    ]
    answers.put(("ready", len(clients)))
    rng = random.Random(7)
    acks: list[tuple[int, float]] = []
    pending: set[asyncio.Task[None]] = set()

    async def publish(client: MqttClient, topic: str, payload: bytes, ts_ms: int, began: float) -> None:
        await client.publish(topic, payload, 1)
        acks.append((ts_ms, time.perf_counter() - began))

    start = time.perf_counter()
    published = 0
    for n in range(int(rate * limit_s)):
        if stop.is_set():
            break
        delay = start + n / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        number = n % devices
        ts_ms = int(time.time() * 1000)
        payload = telemetry_payload(rng, ts_ms, n // devices + 1, "1.0.0", "fleet")
        topic = f"devices/{device_id(number)}/telemetry"
        task = asyncio.create_task(publish(clients[number], topic, payload, ts_ms, time.perf_counter()))
        pending.add(task)
        task.add_done_callback(pending.discard)
        published += 1
    if pending:
        await asyncio.wait(pending, timeout=30)
    for client in clients:
        await client.disconnect()
    answers.put(("done", published, acks))


def poll_tables(
    bronze: str, silver: str, interval_s: float, limit_s: float, stop: Event, answers: Queue
) -> None:
    """Every ``interval_s``, note when each row of bronze and silver first became visible (delta-rs reads).

    Answers ``{"bronze": [(ts_ms, seen_s)], "silver": [...], "polls": [poll seconds]}`` when ``stop`` is set
    (or after ``limit_s``). Bronze's ``ts`` is parsed from the payload, silver's is its ``event_time``. A row
    is its (topic, offset): one that comes back in a file the job's compaction wrote is not seen again.
    """
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    seen: dict[str, dict[tuple[str, int], tuple[float, float]]] = {"bronze": {}, "silver": {}}
    files: dict[str, set[str]] = {"bronze": set(), "silver": set()}
    tables: dict[str, DeltaTable] = {}
    polls: list[float] = []
    deadline = time.monotonic() + limit_s
    while not stop.is_set() and time.monotonic() < deadline:
        began = time.perf_counter()
        for name, path in (("bronze", bronze), ("silver", silver)):
            try:
                if name in tables:
                    tables[name].update_incremental()
                elif DeltaTable.is_deltatable(path):
                    tables[name] = DeltaTable(path)
                else:
                    continue
                now = time.time()
                new = [uri for uri in tables[name].file_uris() if uri not in files[name]]
            except Exception:  # a commit being written: look again next time
                continue
            for uri in new:
                files[name].add(uri)
                path = uri if "://" in uri else unquote(uri)  # delta-rs percent-encodes local paths
                time_column = "payload" if name == "bronze" else "event_time"
                try:
                    rows = pq.read_table(path, columns=["topic", "offset", time_column]).to_pylist()
                except FileNotFoundError:  # vacuumed since the listing: its rows were seen in others
                    continue
                for row in rows:
                    key = (row["topic"], row["offset"])
                    if key not in seen[name]:
                        moment = row[time_column]
                        ts_ms = json.loads(moment)["ts"] if name == "bronze" else moment.timestamp() * 1000
                        seen[name][key] = (ts_ms, now)
        polls.append(time.perf_counter() - began)
        time.sleep(max(0.0, interval_s - (time.perf_counter() - began)))
    answers.put({**{name: list(rows.values()) for name, rows in seen.items()}, "polls": polls})


# -- CPU and load accounting -----------------------------------------------------------------------------


def tree_cpu(pid: int | None, include_children: bool = True) -> float:
    """CPU seconds of ``pid``'s process tree (see ``bench/source_bench.py``); 0 for no pid."""
    if pid is None:
        return 0.0
    from bench.source_bench import tree_cpu_seconds

    return tree_cpu_seconds(pid, include=include_children)


@dataclass
class CpuUse:
    """CPU seconds used during one phase, by part; ``other`` is the rest of the machine."""

    wall: float
    broker: float
    spark: float
    driver: float
    helpers: float
    machine: float

    @property
    def other(self) -> float:
        return max(0.0, self.machine - self.broker - self.spark - self.driver - self.helpers)


class CpuMeter:
    """Samples the CPU of the broker, Spark (JVM and Python workers), this process and the helpers."""

    def __init__(self, broker: int | None, spark: int | None, helpers: Callable[[], list[int]]) -> None:
        self.broker, self.spark, self.helpers = broker, spark, helpers

    def sample(self) -> tuple[float, ...]:
        return (
            time.perf_counter(),
            tree_cpu(self.broker),
            tree_cpu(self.spark),
            tree_cpu(os.getpid(), include_children=False),
            sum(tree_cpu(pid) for pid in self.helpers()),
            machine_busy_seconds(),
        )

    @contextmanager
    def measure(self) -> Iterator[list[CpuUse]]:
        """``with meter.measure() as use:`` — ``use[0]`` is the phase's CpuUse once the block ends."""
        before = self.sample()
        out: list[CpuUse] = []
        try:
            yield out
        finally:
            after = self.sample()
            out.append(CpuUse(*[b - a for a, b in zip(before, after, strict=True)]))


class LoadSampler:
    """The 1-minute load average every 2 s in a daemon thread, for the report."""

    def __init__(self) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(2.0):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.samples.append(os.getloadavg()[0])


# -- figures ---------------------------------------------------------------------------------------------


@dataclass
class ThroughputRun:
    """One availableNow query over the backlog."""

    name: str
    rows: int
    seconds: float
    cpu: CpuUse
    progress: list[dict[str, Any]]
    #: per batch: (rows, Spark job s incl. source read, Delta write on the driver s), bronze-only query
    bronze_split: list[tuple[int, float, float]] = field(default_factory=list)
    #: per batch: the telemetry job's step times in ms
    steps: list[dict[str, float]] = field(default_factory=list)
    checked: str = ""
    #: seconds from ``start()`` to the first batch's trigger: the query's start (the job's runs)
    startup_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    @property
    def running_rate(self) -> float:
        """Rows/s of the query once running: from its first batch's trigger to its tables complete."""
        running = self.seconds - self.startup_s
        return self.rows / running if running > 0 else 0.0


@dataclass
class LatencyRun:
    """The steady publisher against the running job."""

    published: int
    window: tuple[float, float]
    puback: list[float]
    bronze: list[float]
    silver: list[float]
    in_window: int
    polls: list[float]
    cpu: CpuUse
    progress: list[dict[str, Any]]
    steps: list[dict[str, float]]


@dataclass(frozen=True)
class ColdJob:
    """The whole job's first run in a fresh Spark process: its first batch and the whole backlog."""

    rows: int
    seconds: float
    first_batch_s: float
    first_batch_rows: int

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


@dataclass
class Figures:
    settings: Settings
    fill_seconds: float = 0.0
    bronze: list[ThroughputRun] = field(default_factory=list)
    #: the whole job's warm runs, by catch-up batch size
    jobs: dict[int, list[ThroughputRun]] = field(default_factory=dict)
    ceilings: list[CeilingRun] = field(default_factory=list)
    plains: list[CeilingRun] = field(default_factory=list)
    job_cold: ColdJob | None = None
    ceiling_cold: CeilingRun | None = None
    latency: LatencyRun | None = None
    #: Spark's own start of a streaming query on a Python data source (``bench/stream_start.py``), s
    stream_start_s: float | None = None
    failures: list[str] = field(default_factory=list)


def quiet_great_expectations() -> None:
    """GX logs its ephemeral context at INFO (it sets that logger's level when it is first used)."""
    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.WARNING)


class StepTrace:
    """``--trace``: what each step of each batch did, by wrapping the job's step and the store's calls.

    Per (batch, step): the Spark jobs it started and their summed wall time (the jobs carry the step in
    their description; Spark's status store keeps them), the time spent bringing Spark rows to the
    driver as Arrow, in delta-rs appends and merges (those include their collect), and the Delta tables
    opened (each open reads the table's log).
    """

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.local = threading.local()
        self.parts: dict[tuple[int, str], dict[str, float]] = {}
        self.lock = threading.Lock()

    def add(self, part: str, seconds: float) -> None:
        key = getattr(self.local, "key", None)
        if key is None:
            return
        with self.lock:
            parts = self.parts.setdefault(key, {})
            parts[part] = parts.get(part, 0.0) + 1000 * seconds
            parts[part + "_n"] = parts.get(part + "_n", 0.0) + 1

    def install(self) -> None:
        from pipelines.telemetry import job
        from sinks import delta_rs

        trace, sc = self, self.spark.sparkContext
        step = job._Batch.step

        def traced_step(batch: Any, name: str, work: Callable[[], Any]) -> Any:
            previous = sc.getLocalProperty("spark.job.description")
            sc.setLocalProperty("spark.job.description", f"trace {batch.out.batch_id} {name}")
            trace.local.key = (batch.out.batch_id, name)
            try:
                return step(batch, name, work)
            finally:
                trace.local.key = None
                sc.setLocalProperty("spark.job.description", cast(str, previous))  # None unsets it

        job._Batch.step = traced_step  # type: ignore[method-assign, assignment]  # traced while it runs

        def timed(owner: Any, attr: str, part: str) -> None:
            original = getattr(owner, attr)

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                began = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    trace.add(part, time.perf_counter() - began)

            setattr(owner, attr, wrapper)

        timed(delta_rs, "_as_arrow", "collect")
        timed(delta_rs.DeltaRsTableStore, "append", "append")
        timed(delta_rs.DeltaRsTableStore, "merge", "merge")
        timed(delta_rs.DeltaRsTableStore, "_open", "open")

    def spark_jobs(self) -> None:
        """Fold the traced Spark jobs (count, summed wall ms) into ``parts``."""
        jobs = self.spark.sparkContext._jsc.sc().statusStore().jobsList(None)
        for i in range(jobs.size()):
            data = jobs.apply(i)
            described = data.description()
            if not described.isDefined() or not str(described.get()).startswith("trace "):
                continue
            _, batch_id, name = str(described.get()).split(" ", 2)
            began, ended = data.submissionTime(), data.completionTime()
            ms = ended.get().getTime() - began.get().getTime() if ended.isDefined() else 0
            parts = self.parts.setdefault((int(batch_id), name), {})
            parts["jobs"] = parts.get("jobs", 0.0) + ms
            parts["jobs_n"] = parts.get("jobs_n", 0.0) + 1

    def render(self, batch_ids: set[int]) -> list[str]:
        steps = sorted({name for b, name in self.parts if b in batch_ids})
        columns = ("jobs_n", "jobs", "collect", "append", "merge", "open_n", "open")
        lines = [
            "| step (median per batch) | Spark jobs | their ms | collect ms | append ms | merge ms | "
            "tables opened | open ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name in steps:
            rows = [self.parts.get((b, name), {}) for b in batch_ids if (b, name) in self.parts]
            cells = [f"{statistics.median(r.get(c, 0.0) for r in rows):,.0f}" for c in columns]
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
        return lines


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (``pct`` in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(-(-len(ordered) * pct // 100)) - 1))]


# -- Spark phases ----------------------------------------------------------------------------------------


def telemetry_config(
    root: Path, label: str, offsets_url: str, batch_rows: int | None = None
) -> TelemetryConfig:
    """The job's default configuration with this run's broker, tables and checkpoint (and catch-up batch
    size, ``source.max_records_per_trigger``, when given)."""
    from pipelines.telemetry.config import load_telemetry_config

    source: dict[str, Any] = {"brokers": [f"edge1={offsets_url}"]}
    if batch_rows is not None:
        source["max_records_per_trigger"] = batch_rows
    return load_telemetry_config(
        {
            "source": source,
            "tables": {"root": str(root / label / "tables"), "backend": "delta-rs"},
            "stream": {"checkpoint": str(root / label / "checkpoint"), "query_name": f"telemetry-{label}"},
        }
    )


def bronze_only_query(
    spark: SparkSession,
    config: TelemetryConfig,
    store: TableStore,
    split: list[tuple[int, float, float]],
) -> StreamingQuery:
    """The job's source and bronze step alone, availableNow; ``split`` gets each batch's time split.

    The bronze DataFrame goes to ``out.append`` as in the job, with the job's store. The split (rows, the
    Spark job's seconds including the source read, the driver's Delta write) comes from the store's report
    of each append.
    """
    from pipelines.telemetry import transforms as T
    from sinks import exactly_once
    from sinks.delta_rs import AppendReport, DeltaRsTableStore
    from sources import register_sources

    register_sources(spark)
    if not isinstance(store, DeltaRsTableStore):
        raise TypeError(f"the bronze split needs the delta-rs store, got {type(store).__name__}")

    def note(report: AppendReport) -> None:
        split.append((report.rows, report.spark_s, report.driver_s))

    store.on_append = note

    def write_bronze(records: DataFrame, out: BatchWriter) -> None:
        out.append("bronze_telemetry", T.to_bronze(records, datetime.now(UTC)))

    return (
        spark.readStream.format("timestone")
        .options(**config.source_options())
        .load()
        .writeStream.queryName(config.stream.query_name)
        .option("checkpointLocation", config.stream.checkpoint)
        # one table from the batch: nothing reads the batch twice, so it is not cached (the job, which
        # derives five tables from each batch, caches it)
        .foreachBatch(exactly_once(store, write_bronze, persist=False))
        .trigger(availableNow=True)
        .start()
    )


def finish(query: StreamingQuery, timeout_s: float) -> list[dict[str, Any]]:
    """Wait for an availableNow query (stopping it after ``timeout_s``); its progress reports."""
    if not query.awaitTermination(int(timeout_s)):
        query.stop()
        raise TimeoutError(f"query {query.name} did not finish within {timeout_s:.0f} s")
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return [json.loads(progress.json) for progress in query.recentProgress]


def table_rows(store: TableStore, name: str) -> int:
    """Rows of a table, from its Delta log's file statistics (no data read)."""
    from deltalake import DeltaTable

    if not store.exists(name):
        return 0
    actions = DeltaTable(store.location(name)).get_add_actions(flatten=True)
    return int(sum(actions.column("num_records").to_pylist()))


def measure_bronze(
    spark: SparkSession, root: Path, label: str, broker: BrokerProcess, meter: CpuMeter, timeout_s: int
) -> ThroughputRun:
    """One source → bronze run over everything the broker holds."""
    from pipelines.telemetry.job import open_store

    config = telemetry_config(root, label, broker.offsets_url)
    store = open_store(spark, config)
    store.ensure("bronze_telemetry")
    split: list[tuple[int, float, float]] = []
    with meter.measure() as use:
        began = time.perf_counter()
        progress = finish(bronze_only_query(spark, config, store, split), timeout_s)
        seconds = time.perf_counter() - began
    rows = sum(p["numInputRows"] for p in progress)
    if rows and not split:
        raise RuntimeError("bronze appends made no reports")
    stored = table_rows(store, "bronze_telemetry")
    checked = f"{stored:,} rows in bronze" + ("" if stored == rows else f" (source read {rows:,})")
    return ThroughputRun(label, rows, seconds, use[0], progress, bronze_split=split, checked=checked)


def measure_job(
    spark: SparkSession,
    root: Path,
    label: str,
    broker: BrokerProcess,
    meter: CpuMeter,
    timeout_s: float,
    batch_rows: int | None = None,
) -> ThroughputRun:
    """The whole telemetry job, availableNow, over everything the broker holds, until every table is
    complete (batches of ``batch_rows`` records, else the job's default)."""
    from pipelines.telemetry.job import TelemetryBatch, open_store, start_query

    config = telemetry_config(root, label, broker.offsets_url, batch_rows)
    store = open_store(spark, config)
    batch = TelemetryBatch(config, store)
    batch.ensure_tables()
    quiet_great_expectations()
    try:
        with meter.measure() as use:
            began, started_at = time.perf_counter(), time.time()
            progress = finish(start_query(spark, config, batch, available_now=True), timeout_s)
            seconds = time.perf_counter() - began
    finally:
        batch.close()
    rows = sum(p["numInputRows"] for p in progress)
    counts = {name: table_rows(store, name) for name in ("bronze_telemetry", "silver_telemetry")}
    quarantined = table_rows(store, "telemetry_quarantine")
    checked = (
        f"{counts['bronze_telemetry']:,} rows in bronze, {counts['silver_telemetry']:,} in silver, "
        f"{quarantined:,} quarantined, {table_rows(store, 'device_minute'):,} device minutes, "
        f"{table_rows(store, 'devices'):,} devices"
    )
    steps = [dict(report.step_ms) for report in batch.reports]
    startup = first_trigger_s(progress, started_at) if progress else 0.0
    return ThroughputRun(
        label, rows, seconds, use[0], progress, steps=steps, checked=checked, startup_s=startup
    )


def measure_latency(
    spark: SparkSession, root: Path, settings: Settings, meter_for: Callable[[BrokerProcess], CpuMeter]
) -> LatencyRun:
    """The job at its 1 s trigger on a fresh broker and tables, fed by a steady publisher.

    The measurement window opens once the warm-up time has passed *and* the query has finished two
    batches with data (a cold query's first batches are slow), and lasts ``latency_measure_s``.
    """
    from pipelines.spark_session import stop_between_batches
    from pipelines.telemetry.job import TelemetryBatch, open_store, start_query

    context = mp.get_context("spawn")
    limit_s = settings.latency_warmup_s + settings.latency_measure_s + 180
    with BrokerProcess(root / "latency-broker", **BROKER_SECTIONS) as broker:
        config = telemetry_config(root, "latency", broker.offsets_url)
        store = open_store(spark, config)
        batch = TelemetryBatch(config, store)
        batch.ensure_tables()
        quiet_great_expectations()
        answers, polled = context.Queue(), context.Queue()
        stop_publishing, stop_polling = context.Event(), context.Event()
        publisher = context.Process(
            target=steady_publisher,
            args=(
                broker.port,
                settings.latency_devices,
                settings.latency_rate,
                limit_s,
                stop_publishing,
                answers,
            ),
            daemon=True,
        )
        bronze, silver = store.location("bronze_telemetry"), store.location("silver_telemetry")
        poller = context.Process(
            target=poll_tables,
            args=(bronze, silver, POLL_INTERVAL_S, limit_s + 60, stop_polling, polled),
            daemon=True,
        )
        children = [publisher, poller]
        meter = meter_for(broker)
        meter.helpers = lambda: [p.pid for p in children if p.pid is not None and p.is_alive()]
        query = start_query(spark, config, batch)
        try:
            publisher.start()
            poller.start()
            answers.get(timeout=60)  # ("ready", connections)
            began = time.monotonic()
            while time.monotonic() - began < limit_s - settings.latency_measure_s - 60 and (
                time.monotonic() - began < settings.latency_warmup_s
                or sum(1 for p in query.recentProgress if p.numInputRows) < 2
            ):
                if query.exception() is not None:
                    raise RuntimeError(str(query.exception()))
                time.sleep(0.2)
            with meter.measure() as use:
                low = time.time()
                time.sleep(settings.latency_measure_s)
                high = time.time()
            stop_publishing.set()
            _, published, acks = answers.get(timeout=60)
            # let the job catch up with the last publishes (bounded), then stop the poller
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and table_rows(store, "silver_telemetry") < published:
                if query.exception() is not None:
                    raise RuntimeError(str(query.exception()))
                time.sleep(0.2)
            time.sleep(3 * POLL_INTERVAL_S)
            stop_polling.set()
            seen = polled.get(timeout=60)
        finally:
            stop_publishing.set()
            stop_polling.set()
            stop_between_batches(query)
            batch.close()
            for child in children:
                child.join(timeout=15)
                if child.is_alive():
                    child.kill()

    def latencies(rows: list[tuple[float, float]]) -> list[float]:
        return [seen_s - ts / 1000 for ts, seen_s in rows if low * 1000 <= ts <= high * 1000]

    window = [datetime.fromtimestamp(t, UTC).isoformat()[:23] for t in (low, high)]
    progress = [json.loads(p.json) for p in query.recentProgress]
    in_window = [
        p for p in progress if p.get("numInputRows") and window[0] <= p["timestamp"][:23] <= window[1]
    ]
    batch_ids = {p["batchId"] for p in in_window}
    return LatencyRun(
        published=published,
        window=(low, high),
        puback=[s for ts, s in acks if low * 1000 <= ts <= high * 1000],
        bronze=latencies(seen["bronze"]),
        silver=latencies(seen["silver"]),
        in_window=sum(1 for ts, _ in acks if low * 1000 <= ts <= high * 1000),
        polls=seen["polls"],
        cpu=use[0],
        progress=in_window,
        steps=[dict(r.step_ms) for r in batch.reports if r.batch_id in batch_ids],
    )


def bronze_files(store: TableStore) -> list[str]:
    """The live Parquet files of a delta-rs bronze table (the ceiling's input: the same bronze rows)."""
    from deltalake import DeltaTable

    return [unquote(uri) for uri in DeltaTable(store.location("bronze_telemetry")).file_uris()]


def in_fresh_process(args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run ``python ARGS`` (a fresh Spark process); the JSON object its last output line holds."""
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout_s, cwd=REPO, check=False
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{args[0]} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return json.loads(lines[-1])


def cold_ceiling(files: list[str], root: Path) -> CeilingRun:
    """The engine ceiling's first run in a fresh Spark process."""
    root.mkdir(parents=True, exist_ok=True)
    listing = root / "bronze-files.json"
    listing.write_text(json.dumps(files))
    ceiling = REPO / "bench" / "telemetry_ceiling.py"
    answer = in_fresh_process([str(ceiling), str(listing), str(root / "out"), SPARK_MASTER], 900)
    return CeilingRun(**answer)


def cold_job(offsets_url: str, root: Path) -> ColdJob:
    """The whole job's first run in a fresh Spark process (``--cold-job``)."""
    answer = in_fresh_process([str(Path(__file__).resolve()), "--cold-job", offsets_url, str(root)], 900)
    return ColdJob(**answer)


def run_cold_job(offsets_url: str, root: Path) -> ColdJob:
    """In this (fresh) process: start Spark, run the whole job over the backlog once."""
    from pipelines.spark_session import local_spark_session
    from pipelines.telemetry.job import TelemetryBatch, open_store, start_query

    spark = local_spark_session("timestone-telemetry-cold", SPARK_MASTER)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        config = telemetry_config(root, "cold-job", offsets_url)
        batch = TelemetryBatch(config, open_store(spark, config))
        batch.ensure_tables()
        quiet_great_expectations()
        began = time.perf_counter()
        progress = finish(start_query(spark, config, batch, available_now=True), 900)
        seconds = time.perf_counter() - began
        batch.close()
    finally:
        spark.stop()
    first = progress[0]
    return ColdJob(
        rows=sum(p["numInputRows"] for p in progress),
        seconds=seconds,
        first_batch_s=first["durationMs"].get("triggerExecution", 0) / 1000,
        first_batch_rows=first["numInputRows"],
    )


def warm_runs(
    spark: SparkSession,
    root: Path,
    broker: BrokerProcess,
    meter: CpuMeter,
    files: list[str],
    settings: Settings,
    figures: Figures,
) -> None:
    """The ceilings and the job at each batch size taking turns: ``WARM_ROUNDS`` rounds unmeasured, then
    ``PAIRS`` measured (one each with ``--quick``). A run that fails becomes a 'failed' line."""
    warm_rounds, rounds = (1, 1) if settings.quick else (WARM_ROUNDS, PAIRS)
    rounds = settings.rounds or rounds
    for number in range(warm_rounds + rounds):
        measured = number >= warm_rounds
        label = f"{number - warm_rounds + 1}" if measured else f"warm-up-{number + 1}"
        try:
            ceiling = run_ceiling(spark, files, str(root / f"ceiling-{label}"))
            plain = run_plain(spark, files, str(root / f"plain-{label}"))
            jobs = {
                rows: measure_job(spark, root, f"job-{rows // 1000}k-{label}", broker, meter, 900, rows)
                for rows in TARGET_JOB_SHARE
            }
        except Exception as exc:
            figures.failures.append(f"warm round {label}: {exc}")
            continue
        if not measured:
            print(f"warm-up round {number + 1} done")
            continue
        figures.ceilings.append(ceiling)
        figures.plains.append(plain)
        for rows, job in jobs.items():
            figures.jobs.setdefault(rows, []).append(job)
        print(
            f"round {label}: engine ceiling {ceiling.rate:,.0f}, plain transforms {plain.rate:,.0f}, "
            + ", ".join(
                f"job at {rows:,}-row batches {job.rate:,.0f} ({job.running_rate:,.0f} running)"
                for rows, job in jobs.items()
            )
            + " rows/s"
        )
    try:
        figures.stream_start_s = stream_start_s(spark)
    except Exception as exc:
        figures.failures.append(f"a streaming query's start: {exc}")


def run(settings: Settings, root: Path, figures: Figures) -> None:
    """Every phase in order; a phase that fails becomes a 'failed' line and the others still run."""
    from pipelines.spark_session import local_spark_session
    from pipelines.telemetry.job import open_store

    per_topic = settings.records // settings.topics
    spark = local_spark_session("timestone-telemetry-bench", SPARK_MASTER)
    spark.sparkContext.setLogLevel("ERROR")
    spark_pid = spark_process_id(spark)
    try:
        with BrokerProcess(root / "backlog-broker", **BROKER_SECTIONS) as broker:
            print(f"publishing {per_topic * settings.topics:,} readings on {settings.topics} topics ...")
            figures.fill_seconds = asyncio.run(publish_backlog(broker.port, settings.topics, per_topic, 600))
            held = logged_records(broker.offsets_url, "devices/+/telemetry")
            print(f"  {held:,} records logged in {figures.fill_seconds:.1f} s")
            meter = CpuMeter(broker.process.pid if broker.process else None, spark_pid, list)
            # warm-up: the same bronze query over the whole backlog into scratch tables (Python workers,
            # imports, delta-rs, and the JVM's compiled code for batches of this size), not measured; its
            # bronze table is also the engine ceiling's input
            warm = telemetry_config(root, "warm-up", broker.offsets_url)
            warm_store = open_store(spark, warm)
            for attempt in range(3):  # on a loaded machine a Python worker can miss Spark's fixed wait
                try:
                    finish(bronze_only_query(spark, warm, warm_store, []), 600)
                    break
                except Exception:  # StreamingQueryException from awaitTermination, or finish's own
                    if attempt == 2:
                        raise
            files = bronze_files(warm_store)
            if settings.rates_only:
                warm_runs(spark, root, broker, meter, files, settings, figures)
                return
            for number in range(1 if settings.quick else 3):
                try:
                    result = measure_bronze(spark, root, f"bronze-{number + 1}", broker, meter, 600)
                    figures.bronze.append(result)
                    print(f"source → bronze, run {number + 1}: {result.rate:,.0f} rows/s ({result.checked})")
                except Exception as exc:  # reported as a failed figure
                    figures.failures.append(f"source → bronze run {number + 1}: {exc}")
            for name, cold in (
                ("ceiling", lambda: cold_ceiling(files, root / "ceiling-cold")),
                ("job", lambda: cold_job(broker.offsets_url, root / "job-cold")),
            ):
                try:
                    cold_run = cold()
                    setattr(figures, f"{name}_cold", cold_run)
                    print(f"{name}, cold (fresh Spark process): {cold_run.rate:,.0f} rows/s")
                except Exception as exc:
                    figures.failures.append(f"{name}, cold: {exc}")
            warm_runs(spark, root, broker, meter, files, settings, figures)
        try:
            figures.latency = measure_latency(
                spark,
                root,
                settings,
                lambda b: CpuMeter(b.process.pid if b.process else None, spark_pid, list),
            )
            lat = figures.latency
            if lat.bronze:
                print(
                    f"latency: publish → bronze p50 {percentile(lat.bronze, 50):.2f} s, "
                    f"→ silver p50 {percentile(lat.silver, 50) if lat.silver else float('nan'):.2f} s"
                )
        except Exception as exc:
            figures.failures.append(f"latency: {exc}")
    finally:
        spark.stop()


# -- report ----------------------------------------------------------------------------------------------


def _ms(progress: list[dict[str, Any]], key: str) -> float:
    return sum(p.get("durationMs", {}).get(key, 0) for p in progress) / 1000


def _median_steps(steps: list[dict[str, float]], skip_first: bool) -> dict[str, float]:
    used = steps[1:] if skip_first and len(steps) > 1 else steps
    names = dict.fromkeys(name for s in used for name in s)
    return {name: statistics.median(s[name] for s in used if name in s) for name in names}


def _source_reference() -> str:
    """The source-into-noop headline of bench/results/source.md, if it is there."""
    try:
        text = SOURCE_RESULTS.read_text()
    except OSError:
        return "not measured yet (`bench/source_bench.py --write`)"
    found = re.search(r"\*\*Source: ([\d,]+) rows/s.*?\*\*([\d,]+) rows/s\*\*", text, re.S)
    if not found:
        return "see the *Spark source* section"
    return f"{found.group(1)} rows/s cold broker, {found.group(2)} rows/s warm"


def _cpu_cells(cpu: CpuUse) -> str:
    return (
        f"{cpu.broker:.1f} | {cpu.spark:.1f} | {cpu.driver:.1f} | "
        f"{cpu.other:.1f} ({cpu.other / cpu.wall:.2f} cores)"
    )


def render(figures: Figures, wall: float, load: LoadSampler, started: datetime) -> str:
    s = figures.settings
    machine = machine_info()
    samples = load.samples
    lines = [
        "## Telemetry path (broker → source → bronze, silver, gold)",
        "",
        f"`bench/telemetry_bench.py{' --quick' if s.quick else ''}`, {started:%Y-%m-%d %H:%M} UTC, "
        f"{wall:.0f} s in all{' (quick run: smaller sizes, one run per figure)' if s.quick else ''}. "
        f"{machine.cpu_model}, {machine.cores} cores, {machine.memory_gib:.0f} GiB, {machine.kernel}, "
        f"Python {machine.python}. Load average (1 min) {samples[0]:.1f} at the start, "
        f"{statistics.mean(samples):.1f} mean / {max(samples):.1f} max during the run, "
        f"{samples[-1]:.1f} at the end; the machine was shared with other work (the *other* CPU columns).",
        "",
        "Real parts only: a `timestone broker` process (group commit, QoS 1 persisted), MQTT publishers on "
        "loopback, the `timestone` Spark source, delta-rs Delta tables through `sinks`, the telemetry job "
        "(`pipelines/telemetry/job.py`) with its default configuration, local[2] Spark "
        "(a failed task tried up to 4 times: a loaded machine can delay a Python worker's start past Spark's "
        "fixed 10 s wait).",
        "",
    ]
    bronze_rate = statistics.median(r.rate for r in figures.bronze) if figures.bronze else None
    lat = figures.latency
    rows = ["| figure | value | target | |", "|---|---:|---|---|"]
    if bronze_rate is not None:
        rows.append(
            f"| source → bronze, availableNow (median of {len(figures.bronze)}) | {bronze_rate:,.0f} rows/s "
            f"| ≥ {TARGET_BRONZE_ROWS_PER_S:,} rows/s | {_met(bronze_rate >= TARGET_BRONZE_ROWS_PER_S)} |"
        )
    rows += _ceiling_rows(figures)
    if lat is not None and lat.bronze:
        p50 = percentile(lat.bronze, 50)
        rows += [
            f"| publish → visible in bronze, p50 | {p50:.2f} s | ≤ {TARGET_BRONZE_P50_S:.1f} s | "
            f"{_met(p50 <= TARGET_BRONZE_P50_S)} |",
            f"| publish → visible in bronze, p99 | {percentile(lat.bronze, 99):.2f} s | — | |",
        ]
        if lat.silver:
            p50, p99 = percentile(lat.silver, 50), percentile(lat.silver, 99)
            rows += [
                f"| publish → visible in silver, p50 | {p50:.2f} s | ≤ {TARGET_SILVER_P50_S:.1f} s | "
                f"{_met(p50 <= TARGET_SILVER_P50_S)} |",
                f"| publish → visible in silver, p99 | {p99:.2f} s | ≤ {TARGET_SILVER_P99_S:.1f} s | "
                f"{_met(p99 <= TARGET_SILVER_P99_S)} |",
            ]
    rows.append(
        f"| source alone into noop (`bench/source_bench.py`, for reference) | {_source_reference()} | | |"
    )
    lines += [*rows, ""]
    for failure in figures.failures:
        lines.append(f"- **failed**: {failure}")
    if figures.failures:
        lines.append("")
    lines += _render_throughput(figures)
    if lat is not None:
        lines += _render_latency(lat, s)
    return "\n".join(lines) + "\n"


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def _ceiling_rows(figures: Figures) -> list[str]:
    """Both ceilings and the whole job at each batch size, warm (medians of the interleaved runs, and the
    job's share of each ceiling), then the cold figures."""
    rows = []
    ceilings = {
        "engine ceiling (the job's work as plain Spark, Parquet → Parquet)": figures.ceilings,
        "plain transforms (parse, dedup, silver, minutes, devices; no quality checks)": figures.plains,
    }
    medians = {name: statistics.median(c.rate for c in runs) for name, runs in ceilings.items() if runs}
    for name, rate in medians.items():
        rows.append(f"| {name}, warm, median of {len(ceilings[name])} | {rate:,.0f} rows/s | — | |")
    for batch_rows, runs in sorted(figures.jobs.items()):
        whole = statistics.median(j.rate for j in runs)
        running = statistics.median(j.running_rate for j in runs)
        rows += [
            f"| whole job (every table, data quality included), {batch_rows:,}-row batches, warm, median of "
            f"{len(runs)}: from `start()` | {whole:,.0f} rows/s | — | |",
            "| the same runs once the query runs (from its first batch's trigger, Spark's start of the "
            f"query left out: median {statistics.median(j.startup_s for j in runs):.2f} s) | "
            f"{running:,.0f} rows/s | — | |",
        ]
        target = TARGET_JOB_SHARE[batch_rows]
        for name, rate in medians.items():
            share, short = running / rate, name.split(" (")[0]
            rows.append(
                f"| job at {batch_rows:,}-row batches, running / {short} | {share:.0%} | ≥ {target:.0%} | "
                f"{_met(share >= target)} |"
            )
        for name, rate in medians.items():
            rows.append(
                f"| job at {batch_rows:,}-row batches from `start()` / {name.split(' (')[0]} | "
                f"{whole / rate:.0%} | — | |"
            )
    if figures.stream_start_s is not None:
        rows.append(
            "| a streaming query's start on a Python data source that plans one tiny batch "
            f"(`bench/stream_start.py`, median of 3) | {figures.stream_start_s:.2f} s | — | |"
        )
    cold, first = figures.ceiling_cold, figures.job_cold
    if cold is not None:
        rows.append(
            f"| engine ceiling, cold (fresh Spark process) | {cold.seconds:.1f} s ({cold.rate:,.0f} rows/s) "
            "| — | |"
        )
    if first is not None:
        rows.append(
            f"| whole job, cold (fresh Spark process): first batch of {first.first_batch_rows:,} rows | "
            f"{first.first_batch_s:.1f} s (whole backlog {first.seconds:.1f} s, {first.rate:,.0f} rows/s) | "
            "— | |"
        )
    if cold is not None and first is not None and cold.seconds:
        ratio = first.first_batch_s / cold.seconds
        rows.append(
            f"| job's cold first batch / ceiling's cold run | {ratio:.2f}x | "
            f"≤ {TARGET_FIRST_BATCH_OF_CEILING_COLD:.0f}x | "
            f"{_met(ratio <= TARGET_FIRST_BATCH_OF_CEILING_COLD)} |"
        )
    return rows


def default_trigger_limit() -> str:
    """The job's default ``source.max_records_per_trigger``, as the report prints it."""
    from pipelines.telemetry.config import SourceConfig

    limit = SourceConfig().max_records_per_trigger
    return "none" if limit is None else f"{limit:,}"


def _render_throughput(figures: Figures) -> list[str]:
    s = figures.settings
    per_topic = s.records // s.topics
    payload_bytes = len(telemetry_payload(random.Random(0), 1_767_225_600_000, 1, "1.0.0", "fleet"))
    lines = [
        "### Backlog throughput",
        "",
        f"{per_topic * s.topics:,} readings (JSON payloads like the simulated fleet's, about "
        f"{payload_bytes} bytes) on {s.topics} `devices/<id>/telemetry` "
        f"topics, published as QoS 1 frames over {s.topics} connections ({WINDOW} in flight each) in "
        f"{figures.fill_seconds:.1f} s ({per_topic * s.topics / max(figures.fill_seconds, 1e-9):,.0f} "
        "msg/s, not a figure of this benchmark), then read from offset 0 with `trigger(availableNow=True)` "
        "and the job's source options (`minPartitions` Spark's defaultParallelism; `maxRecordsPerTrigger` "
        f"{default_trigger_limit()} by default, and {', '.join(f'{n:,}' for n in TARGET_JOB_SHARE)} "
        "for the job's catch-up runs). *source → bronze* runs the job's bronze step alone in `foreachBatch` "
        "(`to_bronze`, `exactly_once` without caching the batch, which only bronze reads, delta-rs "
        "append) after a warm-up "
        "query doing the same over the whole backlog into scratch tables; *job* is "
        "`start_query(..., available_now=True)` with a new `TelemetryBatch` and fresh tables, at each batch "
        "size. Rows/s is rows / wall time from `start()` until every table is complete. The *engine "
        "ceiling* and the *plain transforms* (`bench/telemetry_ceiling.py`) read the warm-up's bronze files "
        f"(the same {per_topic * s.topics:,} rows) at once: the ceiling writes silver, quarantine, device "
        "minutes and devices as plain Parquet; the plain transforms only parse, deduplicate and write "
        "silver, minutes and devices. The ceilings and the job at each batch size take turns in the same "
        f"Spark session: {WARM_ROUNDS} rounds unmeasured (the JVM keeps compiling Spark's code for "
        f"minutes), then {PAIRS} measured. *Cold* runs are each the first work of a "
        "fresh local[2] Spark process (its start not counted), one for the ceiling, one for the job.",
        "",
        "| run | rows | s | rows/s | batches (s each) | CPU s: broker | Spark (JVM + workers) | driver "
        "| other work | tables afterwards |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    runs = [*figures.bronze, *[run for rows in sorted(figures.jobs) for run in figures.jobs[rows]]]
    for r in runs:
        each = ", ".join(f"{p['durationMs'].get('triggerExecution', 0) / 1000:.1f}" for p in r.progress)
        lines.append(
            f"| {r.name} | {r.rows:,} | {r.seconds:.1f} | {r.rate:,.0f} | {len(r.progress)} ({each}) | "
            f"{_cpu_cells(r.cpu)} | {r.checked} |"
        )
    lines.append("")
    if figures.ceilings or figures.plains:
        lines += [
            "| ceiling run | rows | s | rows/s | silver | device minutes | devices | quarantined |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        named = [("ceiling", figures.ceilings), ("plain", figures.plains)]
        for kind, ceiling_runs in named:
            for number, c in enumerate(ceiling_runs, 1):
                lines.append(
                    f"| {kind}-{number} | {c.rows:,} | {c.seconds:.1f} | {c.rate:,.0f} | {c.silver:,} | "
                    f"{c.minutes:,} | {c.devices:,} | {c.quarantined:,} |"
                )
        lines.append("")
    if figures.bronze:
        lines += [
            "Where the time of the source → bronze runs goes (seconds, all batches; Spark's own steps from "
            "the query progress `durationMs`, the two parts of `addBatch` timed by the delta-rs store's "
            "append):",
            "",
            "| run | wall | latestOffset | queryPlanning | walCommit + commitOffsets | addBatch | of which "
            "the Spark job (source read, then the tasks write the files or the rows go to the driver) | of "
            "which the driver's Delta write or commit | rows/s of the Spark job |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in figures.bronze:
            job = sum(x[1] for x in r.bronze_split)
            write = sum(x[2] for x in r.bronze_split)
            lines.append(
                f"| {r.name} | {r.seconds:.1f} | {_ms(r.progress, 'latestOffset'):.1f} | "
                f"{_ms(r.progress, 'queryPlanning'):.1f} | "
                f"{_ms(r.progress, 'walCommit') + _ms(r.progress, 'commitOffsets'):.1f} | "
                f"{_ms(r.progress, 'addBatch'):.1f} | {job:.1f} | {write:.2f} | "
                f"{r.rows / job if job else 0:,.0f} |"
            )
        lines.append("")
    return lines + _job_step_lines(figures)


def _job_step_lines(figures: Figures) -> list[str]:
    """Per batch size: the median time of each of the job's steps per batch, and Spark's own durations."""
    lines: list[str] = []
    for batch_rows, job_runs in sorted(figures.jobs.items()):
        medians = _median_steps([step for run in job_runs for step in run.steps], skip_first=False)
        progress = [p["durationMs"] for run in job_runs for p in run.progress]
        if not medians or not progress:
            continue
        add_batch = statistics.median(d.get("addBatch", 0) for d in progress)
        trigger = statistics.median(d.get("triggerExecution", 0) for d in progress)
        lines += [
            f"Whole job at {batch_rows:,}-row batches, {len(progress)} batches: median time of each step per "
            "batch (ms; `collect` is the batch's one Spark job, bronze's append runs beside `profile` and "
            "`dedup`, the steps after them concurrently), and the batch's `addBatch`: "
            + ", ".join(f"`{name}` {ms:,.0f}" for name, ms in medians.items())
            + f"; addBatch median {add_batch:,.0f} ms, triggerExecution median {trigger:,.0f} ms.",
            "",
        ]
    return lines


def _render_latency(lat: LatencyRun, s: Settings) -> list[str]:
    def row(name: str, values: list[float]) -> str:
        if not values:
            return f"| {name} | 0 | — | — | — |"
        return (
            f"| {name} | {len(values):,} | {percentile(values, 50):.2f} | {percentile(values, 99):.2f} | "
            f"{max(values):.2f} |"
        )

    durations = [p["durationMs"].get("triggerExecution", 0) / 1000 for p in lat.progress]
    medians = _median_steps(lat.steps, skip_first=False)
    lines = [
        "### Latency at the 1 s trigger",
        "",
        f"{s.latency_rate:,.0f} readings/s round-robin over {s.latency_devices} devices (the project's MQTT "
        "client, QoS 1, the publish time in the payload's `ts`) into a fresh broker while the job runs with "
        f"its default 1 s processing-time trigger; a separate process reads bronze and silver with delta-rs "
        f"every {POLL_INTERVAL_S * 1000:.0f} ms (`update_incremental`, new files only) and notes when each "
        f"reading first appears (so up to {POLL_INTERVAL_S * 1000:.0f} ms of each figure is the poll "
        f"interval; median poll took {statistics.median(lat.polls) * 1000 if lat.polls else 0:.0f} ms). "
        f"The measurement starts after at least {s.latency_warmup_s:.0f} s and two batches with data (a new "
        f"query's first batches are slow); figures are for the {lat.in_window:,} readings published in the "
        f"next {lat.window[1] - lat.window[0]:.0f} s ({lat.published:,} published in all).",
        "",
        "| publish → | readings | p50 s | p99 s | max s |",
        "|---|---:|---:|---:|---:|",
        row("PUBACK (appended to the commitlog, group commit)", lat.puback),
        row("visible in bronze", lat.bronze),
        row("visible in silver", lat.silver),
        "",
        f"Micro-batches with data in the window: {len(durations)}, "
        + (
            f"rows per batch median {statistics.median(p['numInputRows'] for p in lat.progress):,.0f}, "
            f"triggerExecution median {statistics.median(durations):.2f} s, "
            f"p90 {percentile(durations, 90):.2f} s, "
            f"max {max(durations):.2f} s. "
            if durations
            else ""
        )
        + "Median step times per batch (ms; `profile`, the batch's first Spark job, which reads the source "
        "and caches the flagged rows, then every table's write concurrently): "
        + ", ".join(f"`{name}` {ms:,.0f}" for name, ms in medians.items())
        + ". Spark's own steps per batch, median ms: "
        + ", ".join(
            f"`{key}` {statistics.median(p['durationMs'].get(key, 0) for p in lat.progress):,.0f}"
            for key in ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")
            if lat.progress
        )
        + ".",
        "",
        f"CPU s during the publishing ({lat.cpu.wall:.0f} s): broker {lat.cpu.broker:.1f}, Spark (JVM + "
        f"workers) {lat.cpu.spark:.1f}, driver {lat.cpu.driver:.1f}, publisher and poller "
        f"{lat.cpu.helpers:.1f}, other work {lat.cpu.other:.1f} ({lat.cpu.other / lat.cpu.wall:.2f} cores).",
        "",
    ]
    return lines


# -- command line ----------------------------------------------------------------------------------------


def latency_only(settings: Settings, trace: bool = False) -> int:
    """``--latency-only``: the latency phase alone, its section and the load printed (no file written);
    with ``trace``, what each step of a batch did (:class:`StepTrace`) and the Delta commits per batch."""
    from pipelines.spark_session import local_spark_session

    root = Path(tempfile.mkdtemp(prefix="timestone-telemetry-latency-"))
    spark = local_spark_session("timestone-telemetry-bench", SPARK_MASTER)
    spark.sparkContext.setLogLevel("ERROR")
    spark_pid = spark_process_id(spark)

    def meter_for(broker: BrokerProcess) -> CpuMeter:
        return CpuMeter(broker.process.pid if broker.process else None, spark_pid, list)

    tracer = StepTrace(spark) if trace else None
    if tracer is not None:
        tracer.install()
    try:
        with LoadSampler() as load:
            lat = measure_latency(spark, root, settings, meter_for)
        if tracer is not None:
            from deltalake import DeltaTable

            from pipelines.telemetry.job import TABLES

            tracer.spark_jobs()
            batches = {p["batchId"] for p in lat.progress}
            print("\n".join(tracer.render(batches)))
            tables = root / "latency" / "tables"
            commits = {n: DeltaTable(str(tables / n)).version() for n in TABLES if (tables / n).exists()}
            print(f"Delta versions after the run (all batches): {commits}")
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    samples = load.samples
    print(
        f"load average (1 min): {samples[0]:.1f} at the start, {statistics.mean(samples):.1f} mean / "
        f"{max(samples):.1f} max, {samples[-1]:.1f} at the end"
    )
    for name, values in (("bronze", lat.bronze), ("silver", lat.silver)):
        if values:
            print(
                f"publish → {name}: p50 {percentile(values, 50):.2f} s, p99 {percentile(values, 99):.2f} s, "
                f"max {max(values):.2f} s ({len(values):,} readings)"
            )
    print("\n".join(_render_latency(lat, settings)))
    return 0


def settings_from(args: argparse.Namespace) -> Settings:
    if args.quick:
        return Settings(
            args.records or 100_000, args.topics, 50, 200.0, 10.0, 20.0, True, args.rates_only, args.rounds
        )
    return Settings(
        args.records or 500_000, args.topics, 50, 200.0, 15.0, 45.0, False, args.rates_only, args.rounds
    )


RATES_HEADING = "### Catch-up rate by batch size, a run of its own"


def render_rates(figures: Figures, wall: float, load: LoadSampler, started: datetime) -> str:
    """``--rates-only``: the ceilings and the job at each batch size, as a section of its own."""
    s, machine, samples = figures.settings, machine_info(), load.samples
    warm, measured = (1, 1) if s.quick else (WARM_ROUNDS, PAIRS)
    measured = s.rounds or measured
    rounds = f"{warm} unmeasured round(s), then {measured} measured"
    options = (" --quick" if s.quick else "") + (f" --rounds {s.rounds}" if s.rounds else "")
    lines = [
        RATES_HEADING,
        "",
        f"`bench/telemetry_bench.py --rates-only{options} --records {s.records}`, "
        f"{started:%Y-%m-%d %H:%M} UTC, {wall:.0f} s in all. {machine.cpu_model}, {machine.cores} cores, "
        f"{machine.memory_gib:.0f} GiB. Load average (1 min) {samples[0]:.1f} at the start, "
        f"{statistics.mean(samples):.1f} mean / {max(samples):.1f} max (the machine may be shared with "
        "other work: the higher the load, the further every rate falls below the idle machine's); read the "
        f"shares, measured in the same run with the runs taking turns ({rounds}).",
        "",
        f"{s.records:,} readings on {s.topics} device topics, as in *Backlog throughput*; the job with its "
        "default configuration but `source.max_records_per_trigger` at each batch size, fresh tables each "
        "run.",
        "",
        "| figure | value | target | |",
        "|---|---:|---|---|",
        *_ceiling_rows(figures),
        "",
        "| run | engine ceiling | plain transforms | "
        + " | ".join(f"job, {rows:,}-row batches" for rows in sorted(figures.jobs))
        + " |",
        "|---|---:|---:|" + "---:|" * len(figures.jobs),
    ]
    for number, (ceiling, plain) in enumerate(zip(figures.ceilings, figures.plains, strict=False)):
        jobs = [
            figures.jobs[rows][number] for rows in sorted(figures.jobs) if len(figures.jobs[rows]) > number
        ]
        lines.append(
            f"| {number + 1} | {ceiling.rate:,.0f} | {plain.rate:,.0f} | "
            + " | ".join(
                f"{job.running_rate:,.0f} running, {job.rate:,.0f} from `start()` "
                f"({sum(1 for p in job.progress if p.get('numInputRows'))} batches, start "
                f"{job.startup_s:.2f} s; {job.running_rate / plain.rate:.0%} and {job.rate / plain.rate:.0%} "
                "of this round's plain transforms)"
                for job in jobs
            )
            + " |"
        )
    lines += [f"- **failed**: {failure}" for failure in figures.failures]
    lines += ["", *_job_step_lines(figures)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="100k records, a shorter latency run (~2 min)")
    parser.add_argument("--records", type=int, default=None, help="backlog readings (default 500,000)")
    parser.add_argument("--topics", type=int, default=100, help="device topics of the backlog (default 100)")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"markdown file (default {RESULTS})")
    parser.add_argument(
        "--latency-only",
        action="store_true",
        help="only the latency phase (~1.5 min; ~1 min with --quick); printed, no file written",
    )
    parser.add_argument(
        "--trace", action="store_true", help="with --latency-only: Spark jobs, collects and writes per step"
    )
    parser.add_argument(
        "--rates-only",
        action="store_true",
        help="only the ceilings and the job at each batch size; written as a section of its own",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="measured rounds (default 3; 1 with --quick)"
    )
    parser.add_argument("--cold-job", nargs=2, metavar=("OFFSETS_URL", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    settings = settings_from(args)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.cold_job:  # one cold run for the parent benchmark, answered as JSON
        print(json.dumps(run_cold_job(args.cold_job[0], Path(args.cold_job[1])).__dict__))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: brokers, Spark
    if args.latency_only:
        return latency_only(settings, trace=args.trace)
    started = datetime.now(UTC)
    began = time.perf_counter()
    figures = Figures(settings)
    root = Path(tempfile.mkdtemp(prefix="timestone-telemetry-bench-"))
    try:
        with LoadSampler() as load:
            run(settings, root, figures)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if settings.rates_only:
        replace_section(
            args.output, RATES_HEADING, render_rates(figures, time.perf_counter() - began, load, started)
        )
        print(f"wrote {args.output}")
        return 1 if figures.failures else 0
    text = render(figures, time.perf_counter() - began, load, started)
    # the sections of other runs: bench/telemetry_longrun.py's and --rates-only's
    kept = "".join(section_of(args.output, heading) for heading in (RATES_HEADING, LONG_RUN_HEADING))
    write_result(text + ("\n" + kept if kept else ""), args.output)
    return 1 if figures.failures else 0


if __name__ == "__main__":
    sys.exit(main())
