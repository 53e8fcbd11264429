"""Times measured without the time their threads waited for a CPU: on a busy machine (a parallel test's
Spark) that wait is the machine's, not a stall a bound is about. The threads are this test process's, and
those of other processes named (a broker's event loop in a process of its own, etcd)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def run_queue_waits(pid: int | str = "self") -> dict[str, float]:
    """Seconds each thread of process ``pid`` (this one by default) has waited on a run queue for a CPU
    (Linux's schedstat; empty where it does not say)."""
    waits: dict[str, float] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return waits
    for task in tasks:
        try:
            waits[task.name] = _waited_s(task)
        except (OSError, IndexError, ValueError):
            continue
    return waits


def longest_wait_s(before: dict[str, float], after: dict[str, float]) -> float:
    """The longest a thread waited for a CPU between two `run_queue_waits` of one process."""
    return max((after[task] - before[task] for task in after.keys() & before.keys()), default=0.0)


def loop_wait_s(pid: int) -> float:
    """Seconds the main thread of process ``pid`` (a broker's event loop) has waited on a run queue for a
    CPU; 0 where Linux does not say."""
    try:
        return _waited_s(Path(f"/proc/{pid}/task/{pid}"))
    except (OSError, IndexError, ValueError):
        return 0.0


def _waited_s(task: Path) -> float:
    return int((task / "schedstat").read_text().split()[1]) / 1e9


def round_trip_s(exchange: Callable[[], object], broker_pid: int | None = None) -> float:
    """Seconds ``exchange()`` (a request and its answer) took, less the longest run-queue wait meanwhile of
    one of this process's threads or of the event loop of the broker process ``broker_pid``."""
    before = run_queue_waits()
    loop_before = loop_wait_s(broker_pid) if broker_pid else 0.0
    began = time.monotonic()
    exchange()
    elapsed = time.monotonic() - began
    waited = longest_wait_s(before, run_queue_waits())
    loop_waited = loop_wait_s(broker_pid) - loop_before if broker_pid else 0.0
    return elapsed - max(waited, loop_waited)
