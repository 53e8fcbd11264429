"""The commitlog's CPU per record appended as a fleet appends: many topics, one record each, per loop turn.

    .venv/bin/python -m bench.append_cpu [--topics 2000] [--turns 50] [--passes 5] [--qos 1] [--json]
    cd OTHER_CHECKOUT && PYTHONPATH=. python THIS_CHECKOUT/bench/append_cpu.py --json   # another checkout

A ``LogStore`` with ``durability: none`` in a fresh directory under ``/dev/shm`` (tmpfs where it exists, so no
disk sets the pace): each turn is one ``append_batches`` of ``--topics`` batches, one 100-byte record without
MQTT 5 fields each (a device's QoS 1 publish on a topic of its own), then a ``flush``. After 5 warm-up
turns, ``--passes`` passes of ``--turns`` turns; the figure is the best pass's process CPU time
(``time.process_time``) per record. Topics get past ``HOT`` rows in the active segment after 32 turns, so
the figure is mostly what a fleet that has published for a while costs. ``--qos 2`` appends QoS 2 records
as a broker alone does, each keeping its publisher's packet id (record version 2); ``--qos 2-plain`` QoS 2
records without it (version 1, as brokers before 2026-12-01 wrote them).

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
from broker_edge.storage.record import qos_with_packet_id

PAYLOAD = b"x" * 100
_NONE = (None,) * 5
"""A record's MQTT 5 fields: none."""


def _qos_field(qos: str, n: int) -> int:
    """The record's ``qos`` field for device ``n``: 1, 2 without a packet id, or 2 keeping one."""
    if qos == "2":
        return qos_with_packet_id(2, n % 65535 + 1)
    return 2 if qos == "2-plain" else 1


def measure(topics: int, turns: int, passes: int, qos: str = "1") -> float:
    """CPU microseconds per record: the best of ``passes`` passes of ``turns`` turns over ``topics``."""
    shm = Path("/dev/shm")
    directory = Path(tempfile.mkdtemp(prefix="append-cpu-", dir=shm if shm.is_dir() else None))
    try:
        store = LogStore(directory, StorageConfig(durability="none"))
        store.open()
        turn = [
            (f"fleet/device-{n}/telemetry", [(PAYLOAD, _qos_field(qos, n), False, f"device-{n}", (), *_NONE)])
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
    parser.add_argument("--qos", choices=("1", "2", "2-plain"), default="1")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    figure = round(measure(args.topics, args.turns, args.passes, args.qos), 3)
    if args.json:
        print(json.dumps({"append_us_per_record": figure, "topics": args.topics, "qos": args.qos}))
    else:
        print(f"{figure:.2f} µs CPU per record ({args.topics:,} topics a turn, QoS {args.qos})")


if __name__ == "__main__":
    main()
