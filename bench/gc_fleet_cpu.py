"""The fleet in process at several young-collection thresholds: CPU per message and the collections it met.

    .venv/bin/python -m bench.gc_fleet_cpu [--devices 10000] [--rounds 7] [--turns 2] [--threshold 20000 ...]

The engine of `bench/ingest_floor.py` (a real ``Broker``, connections fed bytes with no socket) runs its
fleet shape with ``--devices`` devices, each one QoS 1 message on its own topic per round, one QoS 1 consumer,
its garbage collector tuned as the broker's process tunes it (``runtime``: the start-up heap frozen) with each
``runtime.gc_young_threshold`` given (``0``: the default of this checkout), the thresholds taking turns
``--turns`` times, each in a fresh process. Per run: the loop thread's CPU microseconds per message (the
median of ``--rounds`` rounds after a warm-up round), and the collections of those rounds (the devices
connected and the warm-up done): how many, their CPU milliseconds in all and the longest. Every message of
a round is in flight at once, as a fleet's are between their reads and their PUBACKs. Nothing is written
to bench/results.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import ingest_floor
from broker_edge.process.gc_tuning import tune_garbage_collector
from broker_edge.runtime.broker import Broker


class Collections:
    """The collections seen through ``gc.callbacks``: how many, their CPU seconds in all and the longest."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.longest_s = 0.0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.thread_time()
            return
        spent = time.thread_time() - self._began
        self.count += 1
        self.total_s += spent
        self.longest_s = max(self.longest_s, spent)


async def run(devices: int, rounds: int, threshold: int) -> str:
    """One measurement in this process: its line of figures."""
    directory = Path(tempfile.mkdtemp(prefix="gc-fleet-"))
    try:
        broker = Broker(ingest_floor._config(directory))
        await broker.start()
        runtime = broker.config.runtime
        if threshold:
            runtime.gc_young_threshold = threshold
        tune_garbage_collector(runtime)
        seen = Collections()
        gc.callbacks.append(seen)
        try:
            topics = [f"fleet/device-{number}/telemetry" for number in range(devices)]
            per_message_us = await ingest_floor.qos1(  # the collections counted from the first measured round
                ingest_floor.Engine(broker), rounds, topics, 1, "fleet/+/telemetry", warmed=seen.reset
            )
        finally:
            gc.callbacks.remove(seen)
            await broker.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return (
        f"threshold {runtime.gc_young_threshold:>7,}: {per_message_us:6.2f} us per message; "
        f"{seen.count} collections, {seen.total_s * 1000:.1f} ms of CPU, "
        f"the longest {seen.longest_s * 1000:.1f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.gc_fleet_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument(
        "--threshold", type=int, action="append", help="runtime.gc_young_threshold (repeat; 0: the default)"
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single run, in this process
    args = parser.parse_args(argv)
    thresholds = args.threshold or [20_000, 100_000]
    if args.one:
        print(asyncio.run(run(args.devices, args.rounds, thresholds[0])), flush=True)
        return 0
    print(f"{args.devices:,} devices, load average {os.getloadavg()[0]:.2f}", flush=True)
    for turn in range(args.turns):
        for threshold in thresholds if turn % 2 == 0 else reversed(thresholds):
            command = [sys.executable, "-m", "bench.gc_fleet_cpu", "--one", "--threshold", str(threshold)]
            command += ["--devices", str(args.devices), "--rounds", str(args.rounds)]
            subprocess.run(command, check=True, cwd=Path(__file__).resolve().parent.parent)
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
