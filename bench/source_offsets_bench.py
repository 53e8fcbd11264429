"""The Spark source over a topic per device: what one batch costs the checkpoint and the planner.

    .venv/bin/python -m bench.source_offsets_bench [--topics 20000,50000] [--batches 200] [--output FILE]

A real broker process (`timestone broker`) holds `--topics` device topics (`dev/<n>/status`, one record each,
written straight into its store before it starts); a few of them get records between batches, the rest stay
idle. For each count and each read mode of the source (`readBy=partitions`, the default, and
`readBy=topics`, what a cluster, a hub's sites and a JSON start are read by):

* **the planner, without Spark**: a `TimestoneStreamReader` against the broker, as Spark's planner process
  runs it: the first `latestOffset` over every topic, then one after 10 topics changed (and the ranges and
  tasks `partitions` plans for it, and `reportLatestOffset` with the JSON Spark's runner makes of it), one
  with nothing new, the listing alone (`GET /v1/logs` or `GET /v1/partitions`), and the JSON encoding and
  decoding of one batch's offsets (Spark's runner does both every batch). Each call's wall time and the
  planner process's CPU time (`time.process_time`: its own Python and the listing's threads, not the
  broker's), the CPU being what a busy machine leaves readable;
* **under Spark** (`local[2]`, a processing-time query into `noop`, `--batches` batches of 10 records on 10
  topics each): the bytes of each `offsets/N` file, what the checkpoint weighs at the end (Spark keeps
  `minBatchesToRetain`, 100 by default), the medians of the batch's durations Spark reports, and the bytes
  of one progress report (which holds the batch's start and end offsets).

The results go to bench/results/source-offsets.md (`--output`) with the machine and the date.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import net
from bench.report import RESULTS_DIR, output_parser, write_result
from bench.sysinfo import when_and_where
from bench.topics_bench import BenchTimestone, Process, fresh_process

PAYLOAD = b'{"t":21.5}'
CHANGED = 10
READ_MODES = ("partitions", "topics")


def device_topic(number: int) -> str:
    return f"dev/{number}/status"


@dataclass
class Planner:
    """The planner's costs for one count and read mode (seconds, bytes)."""

    first_latest: float = 0.0
    changed_latest: float = 0.0
    idle_latest: float = 0.0
    listing: float = 0.0
    partitions: float = 0.0
    report: float = 0.0
    report_bytes: int = 0
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds of the planner process per call: changed, idle, partitions, report, listing."""
    tasks: int = 0
    ranges: int = 0
    offsets_bytes: int = 0
    json_round_trip: float = 0.0


@dataclass
class SparkRun:
    """One processing-time query of many small batches."""

    batches: int = 0
    offsets_bytes: list[int] = field(default_factory=list)
    offsets_files: int = 0
    checkpoint_bytes: int = 0
    durations: dict[str, float] = field(default_factory=dict)
    progress_bytes: int = 0
    seconds: float = 0.0


@dataclass
class Case:
    topics: int
    read_by: str
    planner: Planner
    spark: SparkRun


def fill(process: Process, topics: int) -> float:
    """`topics` device topics of one record each, written into the broker's store before it starts."""
    from broker_edge.storage import AppendRecord, LogStore, StorageConfig

    began = time.perf_counter()
    store = LogStore(process.data, StorageConfig(durability="none"))
    store.open()
    record = AppendRecord(PAYLOAD, qos=1, client_id="bench-filler")
    for number in range(topics):
        store.append(device_topic(number), record)
    store.flush()
    store.close()
    return time.perf_counter() - began


class Publisher:
    """An MQTT client publishing QoS 1 records to a few device topics at a time."""

    def __init__(self, port: int, topics: int) -> None:
        import paho.mqtt.client as mqtt

        self.topics = topics
        self.random = random.Random(7)
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-source-offsets")
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def publish(self, count: int = CHANGED) -> None:
        sent = [
            self.client.publish(device_topic(self.random.randrange(self.topics)), PAYLOAD, qos=1)
            for _ in range(count)
        ]
        for message in sent:
            message.wait_for_publish(30)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def _timed(call: Any, cpu: dict[str, float] | None = None, name: str = "") -> tuple[Any, float]:
    """``call()`` and its wall time; its CPU time (the process's) goes to ``cpu[name]``."""
    began, began_cpu = time.perf_counter(), time.process_time()
    result = call()
    if cpu is not None:
        cpu[name] = time.process_time() - began_cpu
    return result, time.perf_counter() - began


def measure_planner(url: str, read_by: str, publisher: Publisher) -> Planner:
    """The planner process's work per batch, as Spark calls it (the reader without Spark)."""
    from sources.options import parse_options
    from sources.stream_api import ReadAllAvailable
    from sources.timestone_source import TimestoneStreamReader

    options = {
        "brokers": f"b={url}",
        "topics": "dev/+/status",
        "readBy": read_by,
        "startingOffsets": "latest",
    }
    reader = TimestoneStreamReader(parse_options(options))
    planner = Planner()
    start = reader.initialOffset()
    end, planner.first_latest = _timed(lambda: reader.latestOffset(start, ReadAllAvailable()))
    publisher.publish()
    cpu = planner.cpu
    changed, planner.changed_latest = _timed(
        lambda: reader.latestOffset(end, ReadAllAvailable()), cpu, "changed"
    )
    report, planner.report = _timed(lambda: json.dumps(reader.reportLatestOffset()), cpu, "report")
    planner.report_bytes = len(report.encode())
    parts, planner.partitions = _timed(lambda: reader.partitions(end, changed), cpu, "partitions")
    planner.tasks = len(parts)
    planner.ranges = sum(len(part.plan.slices) for part in parts)
    _, planner.idle_latest = _timed(lambda: reader.latestOffset(changed, ReadAllAvailable()), cpu, "idle")
    client = reader._client("b")
    listing = client.partitions if read_by == "partitions" else lambda: client.list_logs("dev/+/status")
    _, planner.listing = _timed(listing, cpu, "listing")
    text = json.dumps(changed)
    planner.offsets_bytes = len(text.encode())
    _, planner.json_round_trip = _timed(lambda: json.dumps(json.loads(text)))
    reader.stop()
    return planner


def directory_bytes(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


def run_spark(spark: Any, url: str, read_by: str, batches: int, publisher: Publisher) -> SparkRun:
    """A processing-time query read while `batches` batches of records arrive, one after the other."""
    checkpoint = Path(tempfile.mkdtemp(prefix="bench-source-offsets-"))
    run = SparkRun()
    began = time.perf_counter()
    query = (
        spark.readStream.format("timestone")
        .option("brokers", f"b={url}")
        .option("topics", "dev/+/status")
        .option("readBy", read_by)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        progress: list[dict[str, Any]] = []
        seen = -1
        while len(progress) < batches:
            publisher.publish()
            deadline = time.monotonic() + 120
            resend = time.monotonic() + 5  # (the query's start may come after the first records)
            while time.monotonic() < deadline:
                last = query.lastProgress
                if last is not None and last["batchId"] > seen and last["numInputRows"] > 0:
                    break
                if time.monotonic() > resend and not progress:
                    publisher.publish()
                    resend = time.monotonic() + 5
                time.sleep(0.01)
            else:
                raise RuntimeError(f"no batch read the records within 120 s ({query.exception()})")
            seen = last["batchId"]
            progress.append(last)
        run.seconds = time.perf_counter() - began
    finally:
        query.stop()
    offsets = sorted(
        (p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
    )
    run.batches = len(progress)
    run.offsets_bytes = [path.stat().st_size for path in offsets]
    run.offsets_files = len(offsets)
    run.checkpoint_bytes = directory_bytes(checkpoint)
    for name in ("latestOffset", "queryPlanning", "walCommit", "addBatch", "triggerExecution"):
        run.durations[name] = statistics.median(p["durationMs"].get(name, 0) for p in progress)
    run.progress_bytes = len(json.dumps(progress[-1], default=str).encode())
    shutil.rmtree(checkpoint, ignore_errors=True)
    return run


def _spark() -> Any:
    from pipelines.spark_session import local_spark_session
    from sources import register_sources

    spark = local_spark_session(app_name="source-offsets-bench", master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    register_sources(spark)
    return spark


def run_count(spark: Any, topics: int, batches: int) -> list[Case]:
    cases = []
    with fresh_process(BenchTimestone(net.free_port()), "bench-source-offsets-", None) as process:
        seconds = fill(process, topics)
        print(f"{topics:,} topics written in {seconds:.1f} s", flush=True)
        process.start()
        url = f"http://127.0.0.1:{process.broker.offsets_port}"
        publisher = Publisher(process.port, topics)
        try:
            for read_by in READ_MODES:
                planner = measure_planner(url, read_by, publisher)
                print(f"{topics:,} {read_by}: {planner}", flush=True)
                spark_run = run_spark(spark, url, read_by, batches, publisher)
                print(f"{topics:,} {read_by}: {spark_run}", flush=True)
                cases.append(Case(topics, read_by, planner, spark_run))
        finally:
            publisher.close()
            process.stop(signal.SIGTERM)
    return cases


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def _wall_cpu(wall: float, cpu: float) -> str:
    return f"{wall * 1000:,.0f} / {cpu * 1000:,.0f} ms"


def render(cases: list[Case], batches: int, seconds: float) -> str:
    lines = [
        "## The Spark source over a topic per device: checkpoint and planner per batch",
        "",
        f"`bench/source_offsets_bench.py`, {when_and_where()} {seconds:.0f} s in all. A real broker process "
        "holds the device topics (one record each, written into its store before it starts); each batch "
        f"brings {CHANGED} records to {CHANGED} of them, the rest idle.",
        "",
        "The planner without Spark (what Spark's planner process runs per batch), wall / CPU of the planner "
        "process:",
        "",
        "| topics | readBy | offsets JSON per batch | latestOffset, 10 changed | reportLatestOffset + JSON "
        "| latestOffset, nothing new | listing alone | partitions (tasks, ranges) | JSON encode+decode |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in cases:
        p, cpu = case.planner, case.planner.cpu
        lines.append(
            f"| {case.topics:,} | {case.read_by} | {p.offsets_bytes:,} B "
            f"| {_wall_cpu(p.changed_latest, cpu['changed'])} "
            f"| {_wall_cpu(p.report, cpu['report'])} ({p.report_bytes:,} B) "
            f"| {_wall_cpu(p.idle_latest, cpu['idle'])} | {_wall_cpu(p.listing, cpu['listing'])} "
            f"| {_wall_cpu(p.partitions, cpu['partitions'])} ({p.tasks}, {p.ranges}) "
            f"| {_ms(p.json_round_trip)} |"
        )
    lines += [
        "",
        f"Under Spark (`local[2]`, processing-time trigger, into `noop`), {batches} batches of {CHANGED} "
        "records:",
        "",
        "| topics | readBy | offsets/N bytes (first, last) | offsets/ files kept | checkpoint after the run "
        "| median latestOffset | median queryPlanning | median walCommit | median triggerExecution "
        "| one progress report |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in cases:
        s = case.spark
        d = s.durations
        lines.append(
            f"| {case.topics:,} | {case.read_by} | {s.offsets_bytes[0]:,} B, {s.offsets_bytes[-1]:,} B | "
            f"{s.offsets_files} | {s.checkpoint_bytes / 1e6:,.2f} MB | {d['latestOffset']:,.0f} ms | "
            f"{d['queryPlanning']:,.0f} ms | {d['walCommit']:,.0f} ms | {d['triggerExecution']:,.0f} ms | "
            f"{s.progress_bytes:,} B |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = output_parser("source_offsets_bench", __doc__, RESULTS_DIR / "source-offsets.md")
    parser.add_argument("--topics", default="20000,50000", help="comma-separated topic counts")
    parser.add_argument("--batches", type=int, default=200, help="batches of each Spark query")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    spark = _spark()
    try:
        cases = [
            case for count in args.topics.split(",") for case in run_count(spark, int(count), args.batches)
        ]
    finally:
        spark.stop()
    write_result(render(cases, args.batches, time.perf_counter() - began), args.output)


if __name__ == "__main__":
    main()
