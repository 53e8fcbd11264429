"""What making one group-commit window durable costs when it touches several files, three ways.

    .venv/bin/python -m bench.sync_window_bench [--files 1,2,3,4,8] [--windows 400] [--rounds 2]
        [--neighbour-mib 0,100] [--output bench/results/sync-window.md]

A cluster member keeps each partition it leads in files of its own, so one of its windows touches several
files where a broker alone touches one. Each window here appends 4 KiB to each of K files of a directory on
the filesystem of this checkout (where a broker's ``storage.directory`` would be), then makes them durable:

- **in turn**: one ``fdatasync`` after the other;
- **at once**: the commitlog's own way below ``storage.syncfs_min_segments`` (``SyncPlan.sync_all``: the
  fdatasyncs issued together from a pool of threads);
- **syncfs**: the commitlog's way from that many files on (``fs_sync.sync_filesystem``: one ``syncfs(2)``).

Per window: the wall time (median, and p99) and the CPU time of this process, its threads and the kernel's
work done for them included (``getrusage``), the methods taking turns ``--rounds`` times. The process runs on
the first CPU. ``--neighbour-mib N``: meanwhile another process on the other CPU writes N MiB/s into a file
of the same filesystem without syncing it (a neighbour whose dirty pages a syncfs has to write as well; 0:
none). Nothing is written to bench/results unless ``--output`` is given.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import write_result
from bench.sysinfo import split_cpus, when_and_where
from broker_edge.storage.file_pool import FileHandlePool
from broker_edge.storage.fs_sync import sync_filesystem, syncfs_available
from broker_edge.storage.group_commit import SyncPlan

BLOCK = b"x" * 4096
METHODS = ("in turn", "at once", "syncfs")

NEIGHBOUR = """
import os, sys, time
rate, path = int(sys.argv[1]) << 20, sys.argv[2]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
chunk, written = b"y" * (1 << 20), 0
while True:
    os.write(fd, chunk)
    written += len(chunk)
    if written >= 1 << 30:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, 0)
        written = 0
    time.sleep(len(chunk) / rate)
"""
"""The neighbour: buffered writes at a rate, in a file it empties past 1 GiB, never synced."""


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(directory: Path, files: int, method: str, windows: int) -> tuple[float, float, float]:
    """(median wall ms, p99 wall ms, CPU µs) per window of ``files`` files made durable by ``method``."""
    paths = [str(directory / f"segment-{n}.log") for n in range(files)]
    pool = FileHandlePool()
    plan = SyncPlan(sync=True)
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)

    def in_turn() -> None:
        for path in paths:
            pool.fdatasync(path)

    sync: Callable[[], None] = {
        "in turn": in_turn,
        "at once": lambda: plan.sync_all(pool, paths),
        "syncfs": lambda: sync_filesystem(directory_fd),
    }[method]
    for path in paths:
        with pool.open(path, create=True):
            pass
    positions = dict.fromkeys(paths, 0)
    walls = []
    cpu_before = _cpu_s()
    try:
        for _ in range(windows):
            for path in paths:
                positions[path] += pool.pwritev(path, [BLOCK], positions[path])
            began = time.perf_counter()
            sync()
            walls.append((time.perf_counter() - began) * 1e3)
        cpu = (_cpu_s() - cpu_before) / windows * 1e6
    finally:
        plan.shutdown()
        pool.close()
        os.close(directory_fd)
    walls.sort()
    return statistics.median(walls), walls[int(len(walls) * 0.99)], cpu


def run(args: argparse.Namespace) -> str:
    own_cpus, other_cpus = split_cpus()
    if own_cpus:
        os.sched_setaffinity(0, own_cpus)
    rows: list[str] = []
    for neighbour in args.neighbour_mib:
        scratch = Path(tempfile.mkdtemp(prefix="sync-window-", dir=args.directory))
        writer = None
        if neighbour:
            command = [sys.executable, "-c", NEIGHBOUR, str(neighbour), str(scratch / "neighbour.bin")]
            writer = subprocess.Popen(
                command, preexec_fn=(lambda: os.sched_setaffinity(0, other_cpus)) if other_cpus else None
            )
        try:
            figures: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
            for round_number in range(args.rounds):
                for files in args.files:
                    order = METHODS if round_number % 2 == 0 else METHODS[::-1]
                    for method in order:
                        directory = scratch / f"{files}-{method.replace(' ', '-')}-{round_number}"
                        directory.mkdir()
                        figures.setdefault((files, method), []).append(
                            measure(directory, files, method, args.windows)
                        )
                        shutil.rmtree(directory)
            for (files, method), runs in figures.items():
                wall = statistics.median(r[0] for r in runs)
                p99 = statistics.median(r[1] for r in runs)
                cpu = statistics.median(r[2] for r in runs)
                each = "; ".join(f"{r[2]:.0f}" for r in runs)
                rows.append(
                    f"| {neighbour} | {files} | {method} | {wall:.3f} | {p99:.3f} | {cpu:.0f} | {each} |"
                )
        finally:
            if writer is not None:
                writer.kill()
                writer.wait()
            shutil.rmtree(scratch, ignore_errors=True)
    head = [
        f"`bench/sync_window_bench.py`, {when_and_where()} {args.windows} windows a run, the methods taking "
        f"turns {args.rounds} times (each figure the median of the runs); directory: {args.directory}.",
        "",
        "| neighbour writing (MiB/s) | files a window | made durable | wall ms (median) | wall ms (p99) "
        "| CPU µs a window | CPU µs, each run |",
        "|---:|---:|---|---:|---:|---:|---|",
    ]
    return "\n".join(head + rows) + "\n"


def _numbers(text: str) -> list[int]:
    return [int(number) for number in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.sync_window_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=_numbers, default=[1, 2, 3, 4, 8])
    parser.add_argument("--windows", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--neighbour-mib", type=_numbers, default=[0, 100])
    parser.add_argument(
        "--directory", type=Path, default=Path(__file__).resolve().parent.parent, help="where the files go"
    )
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if not syncfs_available(args.directory):
        parser.error(f"syncfs does not reach the filesystem of {args.directory}")
    write_result(run(args), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
