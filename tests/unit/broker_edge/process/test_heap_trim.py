"""The broker gives the free pages of the C heap back: memory freed between live blocks leaves its RSS.

Blocks above 512 bytes come from the C heap; glibc on its own returns only free space at the top of its
heap, so blocks freed between blocks that stay (what a broker under load does all the time) stay resident
and its RSS creeps up while the memory in use is flat. These tests fragment a fresh process's heap that way
and see the trim give it back, and see the broker's sweep trim.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile

from broker_edge.config import load_dataclass
from broker_edge.process.heap_trim import HeapTrimmer, heap_in_use, resident_bytes
from broker_edge.runtime.broker import Broker
from broker_edge.settings.broker import BrokerConfig

MIB = 2**20

FRAGMENT = """
from broker_edge.process.heap_trim import HeapTrimmer

def rss():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))

start = rss()
size = 4000  # a name, not a literal: a constant product would be one shared object
blocks = [b"x" * size for _ in range(12_000)]  # 48 MB of C heap, touched
kept = blocks[::64]  # one block in 64 lives on and pins the free space around it
del blocks
freed = rss()
trimmed = HeapTrimmer().trim()
print(start, freed, rss(), trimmed, len(kept))
"""


def test_memory_freed_between_live_blocks_stays_resident_until_the_trim_returns_it():
    output = subprocess.run(
        [sys.executable, "-c", FRAGMENT], capture_output=True, text=True, check=True, timeout=60
    )
    start_text, freed_text, after_trim_text, trimmed, _ = output.stdout.split()
    start, freed, after_trim = int(start_text), int(freed_text), int(after_trim_text)
    assert trimmed == "True", "a Linux build of glibc has malloc_trim"
    assert freed - start > 30 * MIB, "freeing alone gave the memory back: nothing left to show"
    assert freed - after_trim > 30 * MIB, (
        f"the trim returned {(freed - after_trim) / MIB:.1f} MiB of {(freed - start) / MIB:.1f} MiB freed"
    )


def test_the_trimmer_trims_once_per_interval():
    trimmer = HeapTrimmer(interval_s=30.0, now=100.0)
    for now in (100.0, 110.0, 129.9):
        trimmer.tick(now)
    assert trimmer.trims == 0
    trimmer.tick(130.0)
    trimmer.tick(145.0)
    assert trimmer.trims == 1 and trimmer.next_at == 160.0
    trimmer.tick(161.0)
    assert trimmer.trims == 2


def test_heap_in_use_follows_what_is_allocated_and_freed():
    before = heap_in_use()
    size = 4000  # above pymalloc's 512 bytes: from the C heap
    blocks = [b"x" * size for _ in range(10_000)]
    held = heap_in_use()
    del blocks
    after = heap_in_use()
    assert before > 0
    assert held - before > 35 * MIB, f"{(held - before) / MIB:.1f} MiB for 40 MB of blocks"
    assert held - after > 35 * MIB


def test_a_trim_records_the_rss_right_after_it():
    trimmer = HeapTrimmer()
    assert trimmer.rss_after_trim == 0
    assert trimmer.trim()
    resident = resident_bytes()
    assert trimmer.rss_after_trim > 10 * MIB
    assert abs(trimmer.rss_after_trim - resident) < 8 * MIB, (trimmer.rss_after_trim, resident)


def _gauge(broker: Broker, name: str) -> float:
    return next(f for f in broker.metrics.families if f.name == f"timestone_broker_{name}").total()


def test_the_broker_sweep_trims_the_heap():
    async def run() -> int:
        with tempfile.TemporaryDirectory() as tmp:
            config = load_dataclass(
                BrokerConfig,
                {
                    "listeners": [{"name": "tcp", "type": "tcp", "host": "127.0.0.1", "port": 0}],
                    "storage": {"directory": tmp},
                    "offsets_api": {"enabled": False},
                    "admin_http": {"enabled": False},
                },
            )
            broker = Broker(config)
            await broker.start()
            try:
                assert broker.heap_trimmer.trims == 0
                assert broker.heap_trimmer.next_at > broker.loop.time() + 20, "not at start"
                assert _gauge(broker, "rss_after_trim_bytes") == 0, "no trim yet"
                broker.heap_trimmer.next_at = broker.loop.time()
                await asyncio.sleep(1.5)  # the sweep runs every second
                assert _gauge(broker, "heap_trims") == broker.heap_trimmer.trims
                assert _gauge(broker, "rss_after_trim_bytes") == broker.heap_trimmer.rss_after_trim > 10 * MIB
                assert _gauge(broker, "heap_in_use_bytes") > MIB
                assert _gauge(broker, "python_allocated_blocks") > 10_000
                return broker.heap_trimmer.trims
            finally:
                await broker.stop()

    assert asyncio.run(run()) == 1


ARENAS = """
import os, sys, threading
from broker_edge.process.heap_trim import bound_arenas, heap_count

bounded = bound_arenas() if sys.argv[1] == "bound" else False
threads = 6
together = threading.Barrier(threads + 1)

def allocate():
    size = 4000
    kept = [b"x" * size for _ in range(100)]  # from the C heap: this thread's arena
    together.wait()
    together.wait()
    del kept

workers = [threading.Thread(target=allocate) for _ in range(threads)]
for worker in workers:
    worker.start()
together.wait()  # every thread has allocated and is still alive
print(bounded, heap_count())
together.wait()
for worker in workers:
    worker.join()
"""


def _heaps(mode: str) -> tuple[str, int]:
    env = {key: value for key, value in os.environ.items() if key != "MALLOC_ARENA_MAX"}
    done = subprocess.run(
        [sys.executable, "-c", ARENAS, mode], capture_output=True, text=True, timeout=60, env=env, check=True
    )
    bounded, heaps = done.stdout.split()
    return bounded, int(heaps)


def test_bounded_arenas_keep_six_allocating_threads_to_two_heaps():
    """Unbounded, glibc gives each allocating thread a heap of its own; bounded at start, the threads share
    one besides the main thread's."""
    assert _heaps("bound") == ("True", 2)
    bounded, heaps = _heaps("default")
    assert bounded == "False" and heaps > 2


def test_an_arena_bound_in_the_environment_is_left_as_the_operator_set_it():
    env = dict(os.environ, MALLOC_ARENA_MAX="4")
    code = "from broker_edge.process.heap_trim import bound_arenas; print(bound_arenas())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "False"
