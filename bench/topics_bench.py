"""Many topics on one broker: N distinct topics against 8 topics, memory, disk, restarts, the loop's latency.

    .venv/bin/python -m bench.topics_bench [--topics 100000] [--million 1000000] [--quick] [--output FILE]

Every figure comes from a real broker process (`timestone broker`, default persistence: QoS 1 appended with
group commit before the PUBACK) pinned to the first CPU, driven by the load generator pinned to the others:

* **rounds**: the same number of QoS 1 messages, once on `--topics` distinct topics (one message per topic:
  the first round creates every log, the second appends to each again) and once on 8 topics, 4 publisher
  connections, 64 in flight each; PUBACKs/s per round, the ratio N topics / 8 topics from the same run;
* **memory, disk, inodes** after the two rounds: the broker's RSS, the data directory's allocated bytes
  and its files and directories, against the targets (RSS ≤ 50 MB + 300 B per topic; disk ≤ the records'
  bytes + 64 B per record + 200 B per topic, the records' bytes being what publishers sent that the log
  keeps: payload and client id, and each topic's name once);
* **the event loop**: PINGREQ round trips every 5 ms from a probe process while the topics are created
  (round 1), listed (`GET /v1/logs`, every log) and read by Spark (an availableNow query over every topic,
  read by partition); p99 against 10 ms, beside the same round 1 on 8 topics (the floor that the machine
  and a broker kept busy by 256 messages in flight give, whatever the topics);
* **the Spark source**: the same rows read by an availableNow query in 4 batches (`maxRecordsPerTrigger`)
  on 8 topics and on N topics by storage partition (the default), and on N topics by topic
  (`readBy=topics`, the checkpoint format before partition reads): rows/s, the ratio N / 8 topics, the
  slowest `latestOffset` (planning) and the bytes each batch adds to the checkpoint's `offsets/`;
* **restarts**: from SIGTERM (a clean stop) and from SIGKILL to the first MQTT handshake, at N topics and
  with `--million` topics (written straight into the store, one record each, then served by the broker).

The results go to bench/results/topics.md (`--output`), with the machine, the date and the load the rest of
the machine put on it: ratios are measured in the same run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import net
from bench.brokers.timestone import Timestone
from bench.report import RESULTS_DIR, output_parser, write_result
from bench.sysinfo import cpu_seconds, machine_busy_seconds, machine_info, rss_bytes, split_cpus
from bench.topic_load import Pinger, PublishResult, percentile, publish_rounds

PAYLOAD = b'{"t":21.5,"h":40.1,"v":3.31}'
CONNECTIONS = 4
WINDOW = 64
CLIENT_ID_BYTES = len("bench-00000-0")  # what the load generator's client ids weigh (about)
RSS_BASE = 50_000_000
RSS_PER_TOPIC = 300
DISK_PER_RECORD = 64
DISK_PER_TOPIC = 200
PING_P99_MS = 10.0
RESTART_CLEAN_S = 5.0
RESTART_KILLED_S = 10.0


Extra = Callable[["Process", "Case", "set[int] | None"], None]
"""What a case does after its rounds, before its restarts."""


class BenchTimestone(Timestone):
    """The benchmark's Timestone with its offsets API on a known port (listings, Spark)."""

    def __init__(self, offsets_port: int) -> None:
        super().__init__()
        self.offsets_port = offsets_port
        self.start_timeout = 300.0

    def command(self, port: int, workdir: Path) -> list[str]:
        command = super().command(port, workdir)
        config = workdir / "timestone.yaml"
        text = config.read_text()
        config.write_text(
            text.replace("offsets_api:\n  port: 0\n", f"offsets_api:\n  port: {self.offsets_port}\n")
        )
        return command


@dataclass
class Process:
    """A broker process on a data directory that outlives it (restarts)."""

    broker: BenchTimestone
    workdir: Path
    port: int
    cpus: set[int] | None
    proc: subprocess.Popen[bytes] | None = None
    start_cpu: float = 0.0
    """The CPU seconds the broker used until its first MQTT handshake (the machine's load left out)."""

    def start(self) -> float:
        """Start it; seconds until its first MQTT handshake."""
        began = time.perf_counter()
        self.proc = self.broker.popen(self.port, self.workdir, self.cpus)
        deadline = began + self.broker.start_timeout
        while not net.mqtt_handshake(self.port, timeout=0.5):
            if self.proc.poll() is not None:
                log = (self.workdir / "broker.log").read_text()[-2000:]
                raise RuntimeError(f"the broker exited: {log}")
            if time.perf_counter() > deadline:
                raise RuntimeError("the broker did not accept MQTT in time")
            time.sleep(0.02)
        seconds = time.perf_counter() - began
        self.start_cpu = cpu_seconds(self.proc.pid)
        return seconds

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def data(self) -> Path:
        return self.workdir / "data"


@dataclass(frozen=True)
class SparkRun:
    """One availableNow query: rows, seconds, batches, the slowest latestOffset, offsets/ bytes per batch."""

    rows: int
    seconds: float
    batches: int
    latest_offset_ms: float
    offsets_bytes: list[int]

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


@dataclass
class Case:
    """One broker run over a set of topics."""

    label: str
    topics: int
    messages: int
    rounds: list[PublishResult] = field(default_factory=list)
    rss: int = 0
    disk: int = 0
    inodes: int = 0
    pings: dict[str, list[float]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    spark: dict[str, SparkRun] = field(default_factory=dict)
    restart_clean: float = 0.0
    restart_killed: float = 0.0


def disk_usage(path: Path) -> tuple[int, int]:
    """(allocated bytes, files and directories) under `path` (a sparse file counts what it holds)."""
    allocated, entries = 0, 0
    for root, directories, files in os.walk(path):
        entries += len(directories) + len(files)
        for name in files:
            try:
                allocated += (Path(root) / name).stat().st_blocks * 512
            except OSError:
                continue
    return allocated, entries


def shares(topics: list[str], messages: int) -> list[list[str]]:
    """`messages` publishes cycling over `topics`, dealt to the connections in turn."""
    sequence = [topics[number % len(topics)] for number in range(messages)]
    return [sequence[number::CONNECTIONS] for number in range(CONNECTIONS)]


@contextmanager
def fresh_process(broker: BenchTimestone, prefix: str, cpus: set[int] | None) -> Iterator[Process]:
    """A broker `Process` on a new work directory (its data directory made), not started; on the way out
    it is killed if it still runs and the directory is removed."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    (workdir / "data").mkdir()
    process = Process(broker, workdir, net.free_port(), cpus)
    try:
        yield process
    finally:
        if process.proc is not None:
            process.stop(signal.SIGKILL)
        shutil.rmtree(workdir, ignore_errors=True)


def run_case(
    label: str,
    topics: list[str],
    messages: int,
    cpus: tuple[set[int] | None, set[int] | None],
    extra: Extra,
    ping: bool = False,
) -> Case:
    """A fresh broker: two rounds of `messages` over `topics`, then its memory and disk (and `extra`)."""
    broker_cpus, load_cpus = cpus
    case = Case(label, len(topics), messages)
    with fresh_process(BenchTimestone(net.free_port()), "bench-topics-", broker_cpus) as process:
        process.start()
        work = shares(topics, messages)
        pinger = Pinger(process.port, cpus=load_cpus).start() if ping else None
        case.rounds.append(publish_rounds(process.port, work, PAYLOAD, WINDOW, load_cpus))
        if pinger is not None:
            case.pings["topics created (round 1)"] = pinger.stop()
        case.rounds.append(publish_rounds(process.port, work, PAYLOAD, WINDOW, load_cpus))
        time.sleep(1.0)
        case.rss = rss_bytes(process.pid)
        case.disk, case.inodes = disk_usage(process.data)
        extra(process, case, load_cpus)
        process.stop(signal.SIGTERM)
        case.restart_clean = process.start()
        publish_rounds(process.port, shares(topics[:1000], 1000), PAYLOAD, WINDOW, load_cpus)
        process.stop(signal.SIGKILL)
        case.restart_killed = process.start()
        process.stop(signal.SIGTERM)
    return case


SPARK_BATCHES = 4


def spark_only(spark: Any) -> Extra:
    """What the 8-topic broker does after its rounds: the Spark query by partition."""

    def extra(process: Process, case: Case, load_cpus: set[int] | None) -> None:
        _spark_query(spark, process, 2 * case.messages, "partitions")  # a warm-up: Spark's first query
        case.spark["by partition"] = _spark_query(spark, process, 2 * case.messages, "partitions")

    return extra


def listing_and_spark(spark: Any) -> Extra:
    """What the N-topic broker does after its rounds: every log listed, then Spark reading every topic by
    partition and by topic, the loop's latency measured throughout."""

    def extra(process: Process, case: Case, load_cpus: set[int] | None) -> None:
        from broker_edge.offsets_api.client import OffsetsClient

        url = f"http://127.0.0.1:{process.broker.offsets_port}"
        pinger = Pinger(process.port, cpus=load_cpus).start()
        began = time.perf_counter()
        with OffsetsClient(url, timeout_s=300) as client:
            listed = len(client.list_logs())
        case.timings["listing every log, s"] = time.perf_counter() - began
        case.pings["every log listed (GET /v1/logs)"] = pinger.stop()
        assert listed == case.topics, (listed, case.topics)

        rows = 2 * case.messages
        pinger = Pinger(process.port, cpus=load_cpus).start()
        case.spark["by partition"] = _spark_query(spark, process, rows, "partitions")
        case.pings["read by Spark (availableNow, by partition)"] = pinger.stop()
        case.spark["by topic (readBy=topics)"] = _spark_query(spark, process, rows, "topics")

    return extra


def _spark() -> Any:
    from pipelines.spark_session import local_spark_session
    from sources import register_sources

    spark = local_spark_session(app_name="topics-bench", master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    register_sources(spark)
    return spark


def _spark_query(spark: Any, process: Process, rows: int, read_by: str) -> SparkRun:
    """An availableNow query over every topic in `SPARK_BATCHES` batches into `noop`."""
    checkpoint = Path(tempfile.mkdtemp(prefix="bench-topics-checkpoint-"))
    url = f"http://127.0.0.1:{process.broker.offsets_port}"
    began = time.perf_counter()
    query = (
        spark.readStream.format("timestone")
        .option("brokers", f"b={url}")
        .option("topics", "bench/#")
        .option("startingOffsets", "earliest")
        .option("readBy", read_by)
        .option("maxRecordsPerTrigger", str(-(-rows // SPARK_BATCHES)))
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - began
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    offsets = sorted(
        (p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
    )
    offsets_bytes = [path.stat().st_size for path in offsets]
    shutil.rmtree(checkpoint, ignore_errors=True)
    read = sum(p["numInputRows"] for p in progress)
    assert read == rows, (read, rows)
    slowest = max((p["durationMs"].get("latestOffset", 0) for p in query.recentProgress), default=0)
    return SparkRun(read, seconds, len(progress), float(slowest), offsets_bytes)


@dataclass
class Million:
    topics: int
    fill_seconds: float
    restart_clean: float
    restart_killed: float
    cpu_clean: float
    cpu_killed: float
    rss: int
    disk: int
    inodes: int


def run_million(topics: int, cpus: tuple[set[int] | None, set[int] | None]) -> Million:
    """`topics` logs of one record each, written straight into a store, then served by the broker."""
    from broker_edge.storage import AppendRecord, LogStore, StorageConfig

    broker_cpus, load_cpus = cpus
    with fresh_process(BenchTimestone(net.free_port()), "bench-million-", broker_cpus) as process:
        began = time.perf_counter()
        store = LogStore(process.data, StorageConfig(durability="none"))
        store.open()
        record = AppendRecord(PAYLOAD, qos=1, client_id="bench-filler")
        for number in range(topics):
            store.append(topic_name(number), record)
            if number % 50_000 == 49_999:
                store.flush()
        store.close()
        fill = time.perf_counter() - began
        process.start()  # the broker's first start on it (its own files: sessions, ...)
        process.stop(signal.SIGTERM)
        clean = process.start()
        cpu_clean = process.start_cpu
        time.sleep(1.0)
        rss = rss_bytes(process.pid)
        some = shares([topic_name(n) for n in range(1000)], 1000)
        publish_rounds(process.port, some, PAYLOAD, WINDOW, load_cpus)
        process.stop(signal.SIGKILL)
        killed = process.start()
        cpu_killed = process.start_cpu
        process.stop(signal.SIGTERM)
        disk, inodes = disk_usage(process.data)
        return Million(topics, fill, clean, killed, cpu_clean, cpu_killed, rss, disk, inodes)


def topic_name(number: int) -> str:
    return f"bench/device-{number:07}/telemetry"


def _mark(ok: bool) -> str:
    return "meets the target" if ok else "**misses the target**"


def render(cases: list[Case], million: Million | None, other_cpu: float, seconds: float, quick: bool) -> str:
    machine = machine_info()
    few, many = cases
    shared = (
        "other work was running: absolute figures are low, ratios come from the same run"
        if other_cpu > 0.1
        else "otherwise idle"
    )
    lines = [
        "## Many topics on one broker",
        "",
        f"`bench/topics_bench.py`{' (--quick: a smoke run, small sizes)' if quick else ''}: Timestone "
        "(default persistence: QoS 1 appended with group commit before the PUBACK) pinned to one CPU, the "
        f"load generator ({CONNECTIONS} connections, {WINDOW} in flight each, {len(PAYLOAD)} B payloads) to "
        f"the other. Measured {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC on {machine.cpu_model}, "
        f"{machine.cores} CPUs, {machine.memory_gib:.1f} GiB, {machine.kernel}, Python {machine.python}; "
        f"{seconds:.0f} s in all; the rest of the machine used {other_cpu:.2f} CPUs on average meanwhile "
        f"({shared}).",
        "",
        "| | round 1 PUBACKs/s | round 2 PUBACKs/s | broker RSS | data on disk | files and dirs "
        "| restart after SIGTERM | after SIGKILL |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in cases:
        lines.append(
            f"| {case.messages:,} messages on {case.topics:,} topics | {case.rounds[0].rate:,.0f} | "
            f"{case.rounds[1].rate:,.0f} | {case.rss / 1e6:.1f} MB | {case.disk / 1e6:.1f} MB | "
            f"{case.inodes:,} | {case.restart_clean:.2f} s | {case.restart_killed:.2f} s |"
        )
    if million is not None:
        lines.append(
            f"| {million.topics:,} topics, one record each (written into the store in "
            f"{million.fill_seconds:.0f} s) | | | {million.rss / 1e6:.1f} MB | {million.disk / 1e6:.1f} MB | "
            f"{million.inodes:,} | "
            f"{million.restart_clean:.2f} s | {million.restart_killed:.2f} s |"
        )
    ratio1 = many.rounds[0].rate / few.rounds[0].rate
    ratio2 = many.rounds[1].rate / few.rounds[1].rate
    rss_limit = RSS_BASE + RSS_PER_TOPIC * many.topics
    records = 2 * many.messages
    names = sum(len(topic_name(n)) for n in range(many.topics))
    record_bytes = records * (len(PAYLOAD) + CLIENT_ID_BYTES) + names
    disk_limit = record_bytes + DISK_PER_RECORD * records + DISK_PER_TOPIC * many.topics
    lines += [
        "",
        "Targets:",
        "",
        f"- round 1 at {many.topics:,} topics / 8 topics: **{ratio1:.2f}x** (≥ 0.8x: "
        f"{_mark(ratio1 >= 0.8)}); round 2: **{ratio2:.2f}x** ({_mark(ratio2 >= 0.8)})",
        f"- RSS at {many.topics:,} topics: {many.rss / 1e6:.1f} MB against {rss_limit / 1e6:.1f} MB "
        f"({_mark(many.rss <= rss_limit)}); {(many.rss - few.rss) / many.topics:,.0f} B per topic over the "
        "8-topic broker",
        f"- disk at {many.topics:,} topics: {many.disk / 1e6:.1f} MB against {disk_limit / 1e6:.1f} MB "
        f"({_mark(many.disk <= disk_limit)}; {records:,} records of {record_bytes / 1e6:.1f} MB)",
    ]
    if million is not None:
        lines.append(
            f"- restart with {million.topics:,} topics: {million.restart_clean:.2f} s after a clean stop "
            f"(≤ {RESTART_CLEAN_S:.0f} s: {_mark(million.restart_clean <= RESTART_CLEAN_S)}), "
            f"{million.restart_killed:.2f} s after SIGKILL (≤ {RESTART_KILLED_S:.0f} s: "
            f"{_mark(million.restart_killed <= RESTART_KILLED_S)}); the broker's own CPU until its first "
            f"handshake: {million.cpu_clean:.2f} s and {million.cpu_killed:.2f} s (what the restarts take "
            "whatever the rest of the machine does)"
        )
    for phase, rtts in many.pings.items():
        p99 = percentile(rtts, 0.99) * 1000
        floor = few.pings.get(phase)
        lines.append(
            f"- PINGREQ round trip while {phase}: p99 **{p99:.1f} ms** (≤ {PING_P99_MS:.0f} ms: "
            f"{_mark(p99 <= PING_P99_MS)}), p50 {percentile(rtts, 0.5) * 1000:.1f} ms, max "
            f"{max(rtts, default=0) * 1000:.1f} ms over {len(rtts):,} pings"
            + (
                f"; the same round on 8 topics: p99 {percentile(floor, 0.99) * 1000:.1f} ms, p50 "
                f"{percentile(floor, 0.5) * 1000:.1f} ms (what this machine and a saturated broker give "
                "whatever the topics)"
                if floor
                else ""
            )
        )
    for name, value in many.timings.items():
        lines.append(f"- {name}: {value:,.2f}")
    lines += _spark_lines(few, many)
    lines += [
        "",
        "The load generator's CPU per round (s): "
        + ", ".join(
            f"{case.topics:,} topics {round_.cpu_seconds:.1f}" for case in cases for round_ in case.rounds
        )
        + ". With one core for the load generator, a round whose load generator used most of its wall time "
        "may have been paced by it.",
    ]
    return "\n".join(lines) + "\n"


def _spark_lines(few: Case, many: Case) -> list[str]:
    """The Spark source's table and its target (rows/s at N topics ≥ 0.8x the same rows on 8 topics)."""
    lines = [
        "",
        f"Spark source (`local[2]`, availableNow into `noop`, the same {2 * many.messages:,} rows in "
        f"{SPARK_BATCHES} batches by `maxRecordsPerTrigger`, one Spark session for every query, warmed up by "
        "a first query on 8 topics):",
        "",
        "| | rows/s | seconds | batches | slowest latestOffset | offsets/ bytes per batch (first, last) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    runs = [(f"{few.topics:,} topics, {name}", run) for name, run in few.spark.items()]
    runs += [(f"{many.topics:,} topics, {name}", run) for name, run in many.spark.items()]
    for label, run in runs:
        first, last = (run.offsets_bytes[0], run.offsets_bytes[-1]) if run.offsets_bytes else (0, 0)
        lines.append(
            f"| {label} | {run.rate:,.0f} | {run.seconds:.1f} | {run.batches} | "
            f"{run.latest_offset_ms:,.0f} ms | {first:,} B, {last:,} B |"
        )
    base, partitions = few.spark.get("by partition"), many.spark.get("by partition")
    if base is not None and partitions is not None:
        ratio = partitions.rate / base.rate
        planning = partitions.latest_offset_ms
        by_topic = many.spark.get("by topic (readBy=topics)", partitions)
        lines += [
            "",
            f"- Spark rows/s at {many.topics:,} topics / 8 topics (by partition): **{ratio:.2f}x** (≥ 0.8x: "
            f"{_mark(ratio >= 0.8)}); the slowest planning (latestOffset) {planning:,.0f} ms (well under a "
            f"second: {_mark(planning < 1000)}); each batch adds one `offsets/` file of "
            f"{max(partitions.offsets_bytes, default=0):,} B at most (by topic: "
            f"{max(by_topic.offsets_bytes, default=0):,} B)",
        ]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = output_parser("bench.topics_bench", __doc__, RESULTS_DIR / "topics.md")
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--million", type=int, default=1_000_000, help="topics of the restart case (0: skip)")
    parser.add_argument("--quick", action="store_true", help="10,000 topics, 100,000 in the restart case")
    args = parser.parse_args(argv)
    topics_count = 10_000 if args.quick else args.topics
    million_count = 100_000 if args.quick and args.million else args.million
    cpus = split_cpus()
    began, busy_before = time.perf_counter(), machine_busy_seconds()
    own_before = _own_cpu()
    spark = _spark()
    try:
        few = run_case(
            "8 topics", [topic_name(n) for n in range(8)], topics_count, cpus, spark_only(spark), ping=True
        )
        print(f"8 topics: {[f'{r.rate:,.0f}' for r in few.rounds]} PUBACKs/s", flush=True)
        names = [topic_name(n) for n in range(topics_count)]
        many = run_case("many", names, topics_count, cpus, listing_and_spark(spark), ping=True)
        print(f"{topics_count:,} topics: {[f'{r.rate:,.0f}' for r in many.rounds]} PUBACKs/s", flush=True)
    finally:
        spark.stop()
    million = run_million(million_count, cpus) if million_count else None
    seconds = time.perf_counter() - began
    other = max(0.0, machine_busy_seconds() - busy_before - (_own_cpu() - own_before)) / seconds
    write_result(render([few, many], million, other, seconds, args.quick), args.output)


def _own_cpu() -> float:
    """CPU of this process and its children (brokers, load generator, Spark): not "other work"."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


if __name__ == "__main__":
    main()
