"""The commitlog's CPU per record appended as a fleet appends: many topics, one record each, per loop turn.

    .venv/bin/python -m bench.append_cpu [--topics 2000] [--turns 50] [--passes 5] [--json]
    cd OTHER_CHECKOUT && PYTHONPATH=. python THIS_CHECKOUT/bench/append_cpu.py --json   # another checkout

A ``LogStore`` with ``durability: none`` in a fresh directory under ``/dev/shm`` (tmpfs where it exists, so no
disk sets the pace): each turn is one ``append_batches`` of ``--topics`` batches, one 100-byte record without
MQTT 5 fields each (a device's QoS 1 publish on a topic of its own), then a ``flush``. After 5 warm-up
turns, ``--passes`` passes of ``--turns`` turns; the figure is the best pass's process CPU time
(``time.process_time``) per record. Topics get past ``HOT`` rows in the active segment after 32 turns, so
the figure is mostly what a fleet that has published for a while costs.

Like ``engine_cpu``, the script imports ``broker_edge`` from wherever Python finds it: run it with another
checkout on ``PYTHONPATH`` to measure that one (before and after a change, taking turns).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from broker_edge.storage import LogStore, StorageConfig

PAYLOAD = b"x" * 100


def measure(topics: int, turns: int, passes: int) -> float:
    """CPU microseconds per record: the best of ``passes`` passes of ``turns`` turns over ``topics``."""
    shm = Path("/dev/shm")
    directory = Path(tempfile.mkdtemp(prefix="append-cpu-", dir=shm if shm.is_dir() else None))
    try:
        store = LogStore(directory, StorageConfig(durability="none"))
        store.open()
        turn = [
            (f"fleet/device-{n}/telemetry", [(PAYLOAD, 1, False, f"device-{n}", (), *(None,) * 5)])
            for n in range(topics)
        ]
        for _ in range(5):
            store.append_batches(turn)
            store.flush()
        best = float("inf")
        for _ in range(passes):
            began = time.process_time()
            for _ in range(turns):
                store.append_batches(turn)
                store.flush()
            best = min(best, (time.process_time() - began) / (turns * topics) * 1e6)
        store.close()
        return best
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    figure = round(measure(args.topics, args.turns, args.passes), 3)
    if args.json:
        print(json.dumps({"append_us_per_record": figure, "topics": args.topics}))
    else:
        print(f"{figure:.2f} µs CPU per record ({args.topics:,} topics a turn)")


if __name__ == "__main__":
    main()
