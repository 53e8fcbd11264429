"""Commitlog throughput: appends per durability policy next to `dd` with the same fsync pattern, and fetches.

    .venv/bin/python bench/commitlog_bench.py [--dir DIR] [--write] [--quick]

Appends run the way the broker drives the store: on an asyncio loop, in bursts of 256 appends (one socket
read's worth) with the loop turning in between, each burst appended with one `append_batch` per topic (the
broker appends a loop iteration's publishes so); one row repeats the 200 B `group` run with one
`append_message` per record. The time runs until everything is durable under the policy. The disk
baseline is `dd` writing the same bytes in the same pattern, in the same directory, in the same run:

* `fsync` and `group` (a write + fdatasync per append or window)  ->  `dd bs=<bytes per sync> oflag=dsync`,
  as many writes as the store made fdatasyncs (counted in the run: `fsync` syncs once per `append_batch`,
  as the broker appends one socket read's publishes, and once per record with single appends)
* `none`  (writes, no fsync)                ->  `dd bs=<bytes per window> conv=fdatasync` (one sync at the
  end); the store run also ends with an fdatasync of its segment files so both end with the data on disk.

Both sides' sync counts are printed next to each other: a row compares equal sync patterns or says it
does not.

Appends in Python are CPU-bound for small records, so the wall-clock ratio to `dd` depends on how much
of a core the run gets on a shared machine; the table also gives the rate per CPU second ("at one full
core") next to the same `dd` figure, uncapped. Larger records amortise the per-record cost.

Fetches: records/s of `LogStore.read` from disk (cold segments, CRC checked) and from the tail cache, of
`OffsetsClient.fetch_arrow` over loopback HTTP, and of fifty readers replaying the same range (the segment
preads counted, with the shared blocks of `read_cache` and without). `--write` saves the table to
bench/results/commitlog.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import write_result
from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.offsets_api.server import serve
from broker_edge.storage import AppendRecord, Durability, LogStore, StorageConfig

TOPIC = "plant/line-1/device-0001/telemetry"
BURST = 256
MB = 1_000_000
RESULTS = Path(__file__).resolve().parent / "results" / "commitlog.md"


@dataclass(slots=True)
class AppendResult:
    policy: str
    payload: int
    records: int
    seconds: float
    bytes: int
    windows: int
    cpu_seconds: float
    disk_seconds: float
    disk_pattern: str
    syncs: int  # fdatasyncs and syncfs calls the store made for these records
    disk_syncs: int  # the same for the dd run

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / MB

    @property
    def cpu_us_per_append(self) -> float:
        """Process CPU time (loop and writer thread) per append: what the code costs, whatever the load."""
        return self.cpu_seconds / self.records * 1e6

    @property
    def disk_mb_per_s(self) -> float:
        return self.bytes / self.disk_seconds / MB

    @property
    def mb_per_cpu_s(self) -> float:
        """MB/s if the run had a whole core: what the code can do, whatever else runs on the machine."""
        return self.bytes / self.cpu_seconds / MB


def dd_seconds(directory: Path, block: int, count: int, flags: str) -> float:
    """Seconds `dd` reports for writing `count` blocks of `block` bytes with `flags`."""
    target = directory / "dd.bin"
    done = subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", f"bs={block}", f"count={count}", flags],
        capture_output=True,
        text=True,
        check=True,
    )
    target.unlink()
    match = re.search(r"copied, ([\d.e-]+) s", done.stderr)
    if match is None:
        raise RuntimeError(f"unexpected dd output: {done.stderr!r}")
    return float(match.group(1))


def make_records(count: int, payload_size: int) -> list[AppendRecord]:
    payload = os.urandom(payload_size)
    return [AppendRecord(payload, 1, False, "bench-device-0001") for _ in range(count)]


def fdatasync_tree(directory: Path) -> int:
    """fdatasync every segment file under `directory`; how many were synced."""
    synced = 0
    for path in directory.rglob("*.log"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            synced += 1
        finally:
            os.close(fd)
    return synced


def count_syncs(store: LogStore) -> Callable[[], int]:
    """Count the store's syncs from now on: returns a function giving its fdatasyncs + syncfs calls."""
    pool = store.file_pool
    real_fdatasync, calls = pool.fdatasync, [0]
    syncfs_before = store.committer.sync_plan.syncfs_calls

    def counting_fdatasync(path: str) -> None:
        calls[0] += 1
        real_fdatasync(path)

    pool.fdatasync = counting_fdatasync  # type: ignore[method-assign]  # counts the syncs the store makes
    return lambda: calls[0] + store.committer.sync_plan.syncfs_calls - syncfs_before


async def timed_appends(
    directory: Path,
    config: StorageConfig,
    records: list[AppendRecord],
    topics: list[str],
    batched: bool = True,
) -> tuple[float, int, int, float, int]:
    """(seconds until durable, bytes written, windows, CPU seconds, syncs): `records` spread over `topics`.

    `batched`: each burst's records appended with one `append_batch` per topic, as the broker appends the
    publishes of a loop iteration; otherwise one `append_message` per record. Every topic's log exists
    before the clock starts (a broker's steady state, not its first minutes).
    """
    store = LogStore(directory, config)
    store.open()
    for topic in topics:
        store.append(topic, records[0])
    await store.wait_durable()
    written_before, windows_before = store.committer.bytes_written, store.committer.jobs_completed
    syncs = count_syncs(store)
    append, append_batch = store.append_message, store.append_batch
    topic_count = len(topics)
    fields = [record.batch_fields() for record in records]
    began, cpu_began = time.perf_counter(), time.process_time()
    for start in range(0, len(records), BURST):
        if batched:  # a burst's records grouped per topic, in order
            for first in range(min(topic_count, BURST)):
                append_batch(
                    topics[(start + first) % topic_count], fields[start + first : start + BURST : topic_count]
                )
        else:
            for number, record in enumerate(records[start : start + BURST], start):
                append(
                    topics[number % topic_count], record.payload, record.qos, record.retain, record.client_id
                )
        await asyncio.sleep(0)
    await store.wait_durable()
    final_syncs = fdatasync_tree(directory) if config.durability == "none" else 0
    seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu_began
    written = store.committer.bytes_written - written_before
    windows = store.committer.jobs_completed - windows_before
    synced = syncs() + final_syncs
    store.close()
    return seconds, written, windows, cpu_seconds, synced


def dd_pattern(policy: str, written: int, windows: int, syncs: int) -> tuple[int, int, str, int]:
    """(block, blocks, flags, syncs) of the `dd` run that writes and syncs like a store run did.

    `fsync` and `group`: one dsync write per sync the store made; `none`: a write per window, one sync.
    """
    if policy == "none":
        return max(1, written // windows), windows, "conv=fdatasync", 1
    syncs = max(1, syncs)
    return max(1, written // syncs), syncs, "oflag=dsync", syncs


def warm_page_cache(directory: Path, size: int) -> None:
    """Write and delete `size` bytes, so that neither side pays the first use of page-cache memory.

    On a virtual machine the first write into guest memory never used before costs several times a
    later one; whichever of the two runs came first would pay for both.
    """
    directory.mkdir(parents=True, exist_ok=True)
    block = os.urandom(4 << 20)
    scratch = directory / "warm.bin"
    with open(scratch, "wb") as out:
        for _ in range(0, size, len(block)):
            out.write(block)
    scratch.unlink()


def bench_append(
    root: Path, policy: Durability, payload_size: int, count: int, repeat: int, batched: bool = True
) -> AppendResult:
    """The fastest of `repeat` runs, next to the fastest of `repeat` dd runs with the same pattern.

    Runs and `dd` alternate (which goes first alternates too), after a warm-up of the page cache, so
    that the state of the machine favours neither.
    """
    records = make_records(count, payload_size)
    config = StorageConfig(durability=policy, segment_bytes=256 * 1024 * 1024)
    warm_page_cache(root, count * (payload_size + 64))
    runs: list[tuple[float, int, int, float, int]] = []
    dd_runs: list[tuple[float, str, int]] = []  # (bytes/s, pattern, syncs)

    def run_dd(run: tuple[float, int, int, float, int]) -> None:  # in the pattern of that store run
        block, blocks, flags, syncs = dd_pattern(policy, run[1], run[2], run[4])
        rate = block * blocks / dd_seconds(root, block, blocks, flags)
        dd_runs.append((rate, f"dd bs={block} count={blocks} {flags}", syncs))

    for attempt in range(repeat):
        if attempt % 2:
            run_dd(runs[-1])
        directory = root / f"append-{policy}-{payload_size}-{attempt}"
        runs.append(asyncio.run(timed_appends(directory, config, records, [TOPIC], batched)))
        if not attempt % 2:
            run_dd(runs[-1])
    seconds, written, windows, cpu_seconds, syncs = best = min(runs)
    block, blocks, flags, _ = dd_pattern(policy, written, windows, syncs)
    pattern = f"dd bs={block} count={blocks} {flags}"
    if not any(run[1] == pattern for run in dd_runs):  # windows vary a little from run to run
        run_dd(best)
    dd_rate, pattern, dd_syncs = max(run for run in dd_runs if run[1] == pattern)
    disk_seconds = written / dd_rate
    label = policy if batched else f"{policy}, single appends"
    return AppendResult(
        label,
        payload_size,
        count,
        seconds,
        written,
        windows,
        cpu_seconds,
        disk_seconds,
        pattern,
        syncs,
        dd_syncs,
    )


def bench_many_topics(root: Path, topics: int, count: int) -> dict[str, float]:
    """appends/s of `group` with one record per topic per burst round: syncfs vs concurrent fdatasyncs."""
    names = [f"plant/line-{number % 7}/device-{number:05d}/telemetry" for number in range(topics)]
    records = make_records(count, 200)
    rates = {}
    for label, minimum in (("one syncfs per window", 8), ("fdatasyncs of its segments at once", 0)):
        config = StorageConfig(durability="group", syncfs_min_segments=minimum)
        seconds, *_ = asyncio.run(timed_appends(root / f"many-{minimum}", config, records, names))
        rates[f"group, 200 B, {topics} topics, {label}"] = count / seconds
    return rates


def bench_reads(root: Path, count: int) -> dict[str, float]:
    """records/s read from disk, from the tail cache, and through the offsets API."""
    directory = root / "reads"
    store = LogStore(directory, StorageConfig(durability="none"))
    store.open()
    for record in make_records(count, 200):
        store.append(TOPIC, record)
    store.flush()
    rates: dict[str, float] = {}

    began = time.perf_counter()
    offset = 0
    while offset < count:
        offset += len(store.read(TOPIC, offset, 1000, 1 << 24))
    rates["read from disk (LogStore.read, 1000 per call)"] = count / (time.perf_counter() - began)

    tail = count - 500  # within the tail cache (it keeps the last 896 to 1024 records)
    rounds = 1000
    began = time.perf_counter()
    for _ in range(rounds):
        store.read(TOPIC, tail, 500, 1 << 24)
    rates["read from tail cache (caught-up readers, 500 per call)"] = (
        rounds * 500 / (time.perf_counter() - began)
    )

    rates["offsets API, Arrow over loopback HTTP (5000 per fetch)"] = _http_rate(store, count)
    store.close()
    for label, cache_bytes in (("shared blocks", 8 << 20), ("read cache off", 0)):
        reads, rate = _fanout_rate(directory, cache_bytes, readers=50, records=min(count, 20_000))
        rates[f"50 readers replaying one range, {label} ({reads:,} segment preads)"] = rate
    return rates


def _fanout_rate(directory: Path, cache_bytes: int, readers: int, records: int) -> tuple[int, float]:
    """(segment preads, records/s delivered to all readers): readers take turns, 64 records per read, as
    subscribers with a window of 64 would, over the first `records` records of a cold store."""
    config = StorageConfig(durability="none", tail_cache_records=16, read_cache_bytes=cache_bytes)
    store = LogStore(directory, config)
    store.open()
    pool = store.file_pool
    real_pread, reads = pool.pread, [0]

    def counting_pread(path: str, size: int, position: int) -> bytes:
        reads[0] += path.endswith(".log")
        return real_pread(path, size, position)

    pool.pread = counting_pread  # type: ignore[method-assign]  # counts the reads the cache does not spare
    positions = [0] * readers
    began = time.perf_counter()
    while positions[-1] < records:
        for number in range(readers):
            positions[number] += len(store.read(TOPIC, positions[number], 64, 1 << 20))
    seconds = time.perf_counter() - began
    store.close()
    return reads[0], readers * records / seconds


def _http_rate(store: LogStore, count: int) -> float:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner, port = asyncio.run_coroutine_threadsafe(serve(store), loop).result()
    try:
        with OffsetsClient(f"http://127.0.0.1:{port}") as client:
            began = time.perf_counter()
            offset = 0
            while offset < count:
                offset += client.fetch_arrow(TOPIC, offset, 5000, 1 << 26).num_rows
            return count / (time.perf_counter() - began)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()


def render(
    appends: list[AppendResult], many: dict[str, float], reads: dict[str, float], seconds: float, repeat: int
) -> str:
    load = os.getloadavg()[0]
    lines = [
        "## Commitlog",
        "",
        f"Run on {os.cpu_count()} CPUs (load average {load:.1f} at the end), "
        f"Python {sys.version.split()[0]}, "
        f"{seconds:.0f} s. One topic, appends in bursts of {BURST} on an asyncio loop, timed until durable.",
        "Disk baseline: `dd` in the same directory and run, same bytes, same write size and fsync pattern.",
        f"Each figure is the fastest of {repeat} runs (ours and dd alike, taking turns, after a warm-up "
        "of the page cache).",
        "",
        "| policy | payload | records | syncs (ours / dd) | appends/s | MB/s (frames) | CPU µs/append "
        "| MB/s at one full core | dd, same pattern | MB/s dd | ours / dd | at one core / dd |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for result in appends:
        ratio = result.mb_per_s / result.disk_mb_per_s
        core_ratio = result.mb_per_cpu_s / result.disk_mb_per_s
        same = "" if result.syncs == result.disk_syncs else " **(not equal)**"
        lines.append(
            f"| {result.policy} | {result.payload} B | {result.records} "
            f"| {result.syncs:,} / {result.disk_syncs:,}{same} | {result.records_per_s:,.0f} "
            f"| {result.mb_per_s:.1f} | {result.cpu_us_per_append:.1f} | {result.mb_per_cpu_s:.1f} "
            f"| `{result.disk_pattern}` | {result.disk_mb_per_s:.1f} "
            f"| {ratio:.0%} {'ok' if ratio >= 0.5 else 'below 50 %'} "
            f"| {core_ratio:.0%} {'ok' if core_ratio >= 0.5 else 'below 50 %'} |"
        )
    lines += ["", "| appends spread over many topics (one log per device) | appends/s |", "|---|---:|"]
    lines += [f"| {name} | {rate:,.0f} |" for name, rate in many.items()]
    lines += ["", "| fetch (200 B payloads) | records/s |", "|---|---:|"]
    lines += [f"| {name} | {rate:,.0f} |" for name, rate in reads.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", help="directory on the disk to measure (default: a temporary directory)")
    parser.add_argument("--write", action="store_true", help=f"also write {RESULTS.relative_to(Path.cwd())}")
    parser.add_argument("--quick", action="store_true", help="a tenth of the records (a smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement, the fastest counts")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="commitlog-bench-", dir=args.dir) as tmp:
        root = Path(tmp)
        plan: list[tuple[Durability, int, int, bool]] = [
            ("fsync", 200, 500, True),
            ("fsync", 200, 500, False),
            ("fsync", 1024, 500, True),
        ]
        plan += [("group", 200, 300_000, True)]
        plan += [
            ("group", 200, 300_000, False),
            ("group", 1024, 100_000, True),
            ("group", 16384, 20_000, True),
        ]
        plan += [("none", 200, 300_000, True), ("none", 1024, 100_000, True), ("none", 16384, 20_000, True)]
        appends = [
            bench_append(root, policy, size, count // scale, args.repeat, batched)
            for policy, size, count, batched in plan
        ]
        many = bench_many_topics(root, 500, 20_000 // scale)
        reads = bench_reads(root, 200_000 // scale)
    table = render(appends, many, reads, time.perf_counter() - began, args.repeat)
    write_result(table, RESULTS if args.write else None)


if __name__ == "__main__":
    main()
