"""Replication's CPU per record in the stores: what a leader reads back, what a follower appends.

    .venv/bin/python -m bench.replica_cpu [--topics 16] [--records 64] [--turns 60] [--passes 5] [--json]
    cd OTHER_CHECKOUT && PYTHONPATH=. python THIS_CHECKOUT/bench/replica_cpu.py --json   # another checkout

Two replicated ``LogStore``s with ``durability: none`` in fresh directories under ``/dev/shm`` (tmpfs where it
exists, so no disk sets the pace). Each turn the leader appends ``--records`` 64-byte records to each of
``--topics`` topics and flushes; then ``ReplicatedLog.read_frames`` reads each topic's new records (what a
push to a follower sends; from the windows written last, in memory) and the follower appends them with
``ReplicatedLog.append_at`` (every frame checked, then indexed) and flushes. After 5 warm-up turns,
``--passes`` passes of ``--turns`` turns; the figures are the best pass's process CPU time
(``time.process_time``) per record read and per record appended. The peer link, the group commit's sync and
the sessions are not in it (``bench/workers_bench.py`` measures members whole).

Like ``append_cpu``, the script imports ``broker_edge`` from wherever Python finds it: run it with another
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

PAYLOAD = b"x" * 64


def measure(topics: int, records: int, turns: int, passes: int) -> tuple[float, float]:
    """CPU microseconds per record read by the leader and per record appended by the follower."""
    shm = Path("/dev/shm")
    directory = Path(tempfile.mkdtemp(prefix="replica-cpu-", dir=shm if shm.is_dir() else None))
    try:
        leader = LogStore(directory / "leader", StorageConfig(durability="none"))
        follower = LogStore(directory / "follower", StorageConfig(durability="none"))
        for store in (leader, follower):
            store.open()
            store.replicated_log.enable()
        names = [f"bench/{n}" for n in range(topics)]
        batch = [(PAYLOAD, 1, False, "c", (), *(None,) * 5)] * records
        turn = [(topic, batch) for topic in names]
        sent = dict.fromkeys(names, 0)

        def one_turn() -> tuple[float, float]:
            leader.append_batches(turn)
            leader.flush()
            began = time.process_time()
            read: list[tuple[str, bytes]] = []
            for topic in names:
                frames, count = leader.replicated_log.read_frames(topic, sent[topic], 1 << 20)
                read.append((topic, b"".join(frames)))
                sent[topic] += count
            between = time.process_time()
            for topic, joined in read:
                follower.replicated_log.append_at(topic, joined)
            follower.flush()
            return between - began, time.process_time() - between

        for _ in range(5):
            one_turn()
        best_read = best_append = float("inf")
        per_pass = turns * topics * records
        for _ in range(passes):
            reading = appending = 0.0
            for _ in range(turns):
                read_s, append_s = one_turn()
                reading += read_s
                appending += append_s
            best_read = min(best_read, reading / per_pass * 1e6)
            best_append = min(best_append, appending / per_pass * 1e6)
        leader.close()
        follower.close()
        return best_read, best_append
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=16)
    parser.add_argument("--records", type=int, default=64)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    read_us, append_us = measure(args.topics, args.records, args.turns, args.passes)
    if args.json:
        figures = {"read_us_per_record": round(read_us, 3), "append_us_per_record": round(append_us, 3)}
        print(json.dumps(figures))
    else:
        print(f"{read_us:.2f} µs CPU per record read, {append_us:.2f} per record appended")


if __name__ == "__main__":
    main()
