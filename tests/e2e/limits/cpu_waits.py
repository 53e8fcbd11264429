"""Round trips measured without the time this test process's threads waited for a CPU: on a busy machine
(a parallel test's Spark) that wait is the machine's, not a stall of the broker a bound is about."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def run_queue_waits() -> dict[str, float]:
    """Seconds each thread of this process has waited on a run queue for a CPU (Linux's schedstat; empty
    where it does not say)."""
    waits: dict[str, float] = {}
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return waits
    for task in tasks:
        try:
            waits[task.name] = int((task / "schedstat").read_text().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            continue
    return waits


def round_trip_s(exchange: Callable[[], object]) -> float:
    """Seconds ``exchange()`` (a request and its answer) took, less the longest run-queue wait of one of
    this process's threads meanwhile."""
    before = run_queue_waits()
    began = time.monotonic()
    exchange()
    elapsed = time.monotonic() - began
    after = run_queue_waits()
    waited = max((after[task] - before[task] for task in after.keys() & before.keys()), default=0.0)
    return elapsed - waited
