"""The event loop's pauses at N topics, seen from inside the broker (`bench.loop_probe`).

    .venv/bin/python -m bench.loop_stalls_bench [--topics 100000] [--gc-young-threshold N]

The broker, load generator and PINGREQ probe of `bench/topics_bench.py`, with the broker run under
`bench.loop_probe`. Per phase (round 1 creating every topic, round 2, the offsets API's first request,
every log listed, the first Arrow answer, every record read by partition in requests of 50,000 entries as
the Spark source asks) it prints the most CPU the loop's thread spent between two turns, how late the
probe's task woke at worst, the collections per generation, the PINGREQ p99 where pinged, and the stacks
seen while the loop was late. Then the RSS after round 2 (the topics bench's method). Nothing is written
to bench/results: the figures are for finding pauses, on a machine of any load. ``--gc-young-threshold``
runs the broker with that ``runtime.gc_young_threshold`` instead of its default.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import net
from bench import topics_bench as topics
from bench.sysinfo import rss_bytes, split_cpus
from bench.topic_load import Pinger, percentile, publish_rounds

PARTITION_READ_ENTRIES = 50_000


class ProbedTimestone(topics.BenchTimestone):
    """The topics bench's broker, run under `bench.loop_probe` writing `stats`."""

    def __init__(self, offsets_port: int, stats: Path, gc_young_threshold: int | None = None) -> None:
        super().__init__(offsets_port)
        self.stats = stats
        self.gc_young_threshold = gc_young_threshold

    def command(self, port: int, workdir: Path) -> list[str]:
        command = super().command(port, workdir)
        if self.gc_young_threshold is not None:
            with (workdir / "timestone.yaml").open("a") as config:
                config.write(f"runtime:\n  gc_young_threshold: {self.gc_young_threshold}\n")
        return [sys.executable, "-m", "bench.loop_probe", str(self.stats), *command[1:]]

    def env(self) -> dict[str, str] | None:
        return dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))


class Phases:
    """Starts the probe's phases and prints each one's figures."""

    def __init__(self, stats: Path, port: int, load_cpus: set[int] | None) -> None:
        self.stats = stats
        self.port = port
        self.load_cpus = load_cpus

    def run(self, name: str, action: Callable[[], None], ping: bool = True) -> None:
        Path(f"{self.stats}.phase").write_text(name)
        time.sleep(1.1)  # the probe takes the phase within half a second
        pinger = Pinger(self.port, cpus=self.load_cpus).start() if ping else None
        began = time.perf_counter()
        action()
        seconds = time.perf_counter() - began
        rtts = pinger.stop() if pinger is not None else []
        time.sleep(1.1)
        seen = json.loads(self.stats.read_text())
        collections = ", ".join(
            f"gen {generation}: {int(count)} in {total:.0f} ms (max {most:.0f}, {most_cpu:.0f} of CPU)"
            for generation, (count, total, most, most_cpu) in seen["collections"].items()
            if count
        )
        pings = f"PINGREQ p99 {percentile(rtts, 0.99) * 1000:.1f} ms over {len(rtts)}; " if rtts else ""
        print(
            f"{name} ({seconds:.2f} s): loop CPU between turns at most {seen['max_turn_cpu_ms']:.1f} ms "
            f"({seen['turns_over_5ms']} turns over 5 ms), woke at worst {seen['max_late_ms']:.1f} ms late "
            f"({seen['max_late_not_cpu_wait_ms']:.1f} ms not waiting for a CPU); "
            f"{pings}collections: {collections or 'none'}",
            flush=True,
        )
        for stack, count in seen["stacks"][:12]:
            print(f"    {count:4d} {stack}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser("bench.loop_stalls_bench", description=__doc__)
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument(
        "--gc-young-threshold", type=int, help="runtime.gc_young_threshold (default: the broker's)"
    )
    args = parser.parse_args(argv)
    broker_cpus, load_cpus = split_cpus()
    workdir = Path(tempfile.mkdtemp(prefix="bench-loop-"))
    (workdir / "data").mkdir()
    stats = workdir / "loop.json"
    process = topics.Process(
        ProbedTimestone(net.free_port(), stats, args.gc_young_threshold),
        workdir,
        net.free_port(),
        broker_cpus,
    )
    from broker_edge.offsets_api.client import OffsetsClient

    url = f"http://127.0.0.1:{process.broker.offsets_port}"
    names = [topics.topic_name(number) for number in range(args.topics)]
    work = topics.shares(names, len(names))

    def publish() -> None:
        publish_rounds(process.port, work, topics.PAYLOAD, topics.WINDOW, load_cpus)

    def first_request() -> None:
        with OffsetsClient(url, timeout_s=300) as client:
            client.partitions()

    def listing() -> None:
        with OffsetsClient(url, timeout_s=300) as client:
            assert len(client.list_logs()) == args.topics

    def first_arrow() -> None:
        with OffsetsClient(url, timeout_s=300) as client:
            client.read_partition(0, 0, 10, 1 << 20, ("bench/#",))

    def read_by_partition() -> None:
        with OffsetsClient(url, timeout_s=300) as client:
            for extent in client.partitions():
                position = extent.start_position
                while position < extent.end_position:
                    entries = min(PARTITION_READ_ENTRIES, extent.end_position - position)
                    read = client.read_partition(extent.partition, position, entries, 64 << 20, ("bench/#",))
                    position = read.next_position

    try:
        process.start()
        phases = Phases(stats, process.port, load_cpus)
        phases.run(f"round 1 ({args.topics:,} topics created)", publish)
        phases.run("round 2", publish, ping=False)
        print(f"RSS after round 2: {rss_bytes(process.pid) / 1e6:.1f} MB", flush=True)
        phases.run("the offsets API's first request (its app loaded)", first_request)
        phases.run("every log listed (GET /v1/logs)", listing)
        phases.run("the first Arrow answer (pyarrow loaded)", first_arrow)
        phases.run("every record read by partition", read_by_partition)
    finally:
        if process.proc is not None:
            process.stop(signal.SIGTERM)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
