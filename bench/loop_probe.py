"""`timestone` run with a bench-only probe of its event loop's pauses, read from a file while it serves.

    python -m bench.loop_probe STATS_FILE broker --config FILE

Runs the `timestone` command (`pipelines.cli.main`) unchanged, plus, once the broker has started:

* a task on its loop woken every 2 ms that records the loop thread's CPU time (`time.thread_time`) between
  two wake-ups (what the loop itself spent without serving anyone else) and how late it woke (wall time:
  also the other threads holding the interpreter, and the machine's other work);
* `gc.callbacks` timing every collection per generation;
* a sampling thread recording every thread's stack (the loop thread's deeper) whenever the task is late by
  more than 15 ms: where the loop was, and which other thread may have held the interpreter's lock.

Every half second `STATS_FILE` is rewritten (JSON). Writing a phase name into `STATS_FILE.phase` starts a
new phase: the figures restart from zero. A PINGREQ round trip mixes the broker's pauses with waiting for a
CPU; these figures separate them. Nothing of it is in the broker itself.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TICK_S = 0.002
LATE_S = 0.015
"""The loop is sampled once its task is this late."""


@dataclass
class Phase:
    """What the probe saw since the phase began."""

    name: str = ""
    max_turn_cpu_ms: float = 0.0
    """The most CPU the loop's thread spent between two wake-ups of the task."""
    max_late_ms: float = 0.0
    max_late_not_cpu_wait_ms: float = 0.0
    """The worst lateness less the time the loop's thread waited for a CPU meanwhile (its run queue wait,
    /proc/thread-self/schedstat): what the broker's own threads held it for (the interpreter's lock, a
    blocking call), the machine's other work left out."""
    turns_over_5ms: int = 0
    late_p50_ms: float = 0.0
    late_p99_ms: float = 0.0
    """How late the task woke, at the median and the 99th percentile of its wake-ups in the phase."""
    late_not_cpu_wait_p99_ms: float = 0.0
    """The 99th percentile of the lateness less the run-queue wait (as ``max_late_not_cpu_wait_ms``)."""
    wakeups: int = 0
    collections: dict[int, list[float]] = field(
        default_factory=lambda: {n: [0, 0.0, 0.0, 0.0] for n in range(3)}
    )
    """Per generation: collections, their total and largest wall milliseconds, and the most CPU milliseconds
    one took (its thread's: what it held the interpreter for, waiting for a CPU left out)."""
    stacks: dict[str, int] = field(default_factory=dict)
    """The loop thread's stacks seen while the task was late, with their counts."""


class LoopProbe:
    """The probe's state, shared by its task, its threads and the collector's callback."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.phase = Phase()
        self._late: list[float] = []
        self._own_late: list[float] = []
        self._beat = time.perf_counter()
        self._gc_began = 0.0
        self._gc_began_cpu = 0.0
        self._loop_thread = threading.get_ident()

    def on_gc(self, stage: str, info: dict[str, Any]) -> None:
        if stage == "start":
            self._gc_began = time.perf_counter()
            self._gc_began_cpu = time.thread_time()
            return
        wall_ms = (time.perf_counter() - self._gc_began) * 1000
        cpu_ms = (time.thread_time() - self._gc_began_cpu) * 1000
        record = self.phase.collections[info["generation"]]
        record[3] = max(record[3], cpu_ms)
        record[0] += 1
        record[1] += wall_ms
        record[2] = max(record[2], wall_ms)

    async def heartbeat(self) -> None:
        last, last_cpu, last_wait = time.perf_counter(), time.thread_time(), _run_queue_wait_s()
        while True:
            await asyncio.sleep(TICK_S)
            now, cpu, wait = time.perf_counter(), time.thread_time(), _run_queue_wait_s()
            phase = self.phase
            turn_ms = (cpu - last_cpu) * 1000
            late_ms = (now - last - TICK_S) * 1000
            phase.max_turn_cpu_ms = max(phase.max_turn_cpu_ms, turn_ms)
            phase.max_late_ms = max(phase.max_late_ms, late_ms)
            own_ms = late_ms - (wait - last_wait) * 1000
            phase.max_late_not_cpu_wait_ms = max(phase.max_late_not_cpu_wait_ms, own_ms)
            phase.turns_over_5ms += turn_ms > 5
            self._late.append(late_ms)
            self._own_late.append(own_ms)
            last, last_cpu, last_wait = now, cpu, wait
            self._beat = now

    def sample(self) -> None:
        while True:
            time.sleep(0.003)
            if time.perf_counter() - self._beat <= LATE_S:
                continue
            names = {thread.ident: thread.name for thread in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                name = names.get(ident, "?")
                if name.startswith("bench-"):
                    continue
                stack = traceback.extract_stack(frame)[-(10 if ident == self._loop_thread else 3) :]
                key = f"[{name}] " + " <- ".join(
                    f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in reversed(stack)
                )
                self.phase.stacks[key] = self.phase.stacks.get(key, 0) + 1

    def write(self) -> None:
        phase_file = Path(f"{self.path}.phase")
        while True:
            time.sleep(0.5)
            try:
                name = phase_file.read_text().strip()
            except OSError:
                name = ""
            if name and name != self.phase.name:
                self.phase = Phase(name)
                self._late, self._own_late = [], []
            late, own = sorted(self._late), sorted(self._own_late)
            if late:
                self.phase.wakeups = len(late)
                self.phase.late_p50_ms = late[len(late) // 2]
                self.phase.late_p99_ms = late[min(len(late) - 1, int(0.99 * len(late)))]
                self.phase.late_not_cpu_wait_p99_ms = own[min(len(own) - 1, int(0.99 * len(own)))]
            stats = asdict(self.phase)
            stats["stacks"] = sorted(stats["stacks"].items(), key=lambda item: -item[1])[:16]
            temporary = Path(f"{self.path}.tmp")
            temporary.write_text(json.dumps(stats))
            os.replace(temporary, self.path)


def _run_queue_wait_s() -> float:
    """Seconds the calling thread has waited on a run queue for a CPU (0 where Linux does not say)."""
    try:
        with open("/proc/thread-self/schedstat") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def main(argv: list[str]) -> int:
    from broker_edge.process.heap_trim import bound_arenas

    bound_arenas()  # as `timestone broker` does first, before this module's threads start
    probe = LoopProbe(Path(argv[0]))
    import broker_edge.runtime.main as runtime

    tune = runtime.tune_garbage_collector

    def tune_and_probe(config: Any) -> None:  # called on the loop once the broker has started
        tune(config)
        asyncio.get_running_loop().create_task(probe.heartbeat())

    runtime.tune_garbage_collector = tune_and_probe
    gc.callbacks.append(probe.on_gc)
    threading.Thread(target=probe.write, name="bench-loop-probe", daemon=True).start()
    threading.Thread(target=probe.sample, name="bench-loop-sampler", daemon=True).start()
    from pipelines.cli import main as timestone

    return timestone(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
