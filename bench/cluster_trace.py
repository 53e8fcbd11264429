"""Where a replicated QoS 1 record's time goes: the path traces of a cluster bench run as a table.

    python -m bench.cluster_trace DIRECTORY --topic TOPIC [--publisher a --leader c --subscriber b]

``DIRECTORY`` holds the ``*.trace`` files the brokers wrote with ``TIMESTONE_PATH_TRACE`` set (see
``broker_edge/observe/path_trace.py``) and the bench's own (``bench:sent``, ``bench:delivered``);
``bench.cluster_bench --latency-only --trace DIRECTORY`` writes them and prints this table. Each row is the
time from one stage to the next of every record that passed both (p50 / p99, ms), along the path
publish on A → forwarded to the leader C → C's group commit → pushed to the followers → their group
commits → their acknowledgements → C's high watermark → pushed to B → routed on B → delivered.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

__all__ = ["load", "rows", "table"]


def load(directory: Path, topic: str) -> dict[int, dict[str, int]]:
    """offset → stage → the earliest time (ns) the record of ``topic`` at that offset reached it."""
    stages: dict[int, dict[str, int]] = defaultdict(dict)
    for path in sorted(directory.glob("*.trace")):
        with path.open(encoding="utf-8") as file:
            for line in file:
                stage, name, first, end, at = line.rstrip("\n").split("\t")
                if name != topic:
                    continue
                at_ns = int(at)
                for offset in range(int(first), int(end)):
                    seen = stages[offset]
                    if at_ns < seen.get(stage, at_ns + 1):
                        seen[stage] = at_ns
    return stages


def _chain(publisher: str, leader: str, subscriber: str, other: str) -> list[tuple[str, str, str]]:
    a, c, b, o = publisher, leader, subscriber, other
    return [
        ("sent by the device → forwarded by A", "bench:sent", f"{a}:forward"),
        ("forwarded by A → received by leader C (peer link)", f"{a}:forward", f"{c}:received"),
        ("received → C's group commit cuts the job", f"{c}:received", f"{c}:cut"),
        ("cut → synced on C (writer thread: queue + fdatasync)", f"{c}:cut", f"{c}:synced"),
        ("synced → durable on C's loop", f"{c}:synced", f"{c}:durable"),
        ("durable → replication stage on C", f"{c}:durable", f"{c}:replicating"),
        (f"replication stage → records pushed to {b.upper()}", f"{c}:replicating", f"{c}:send>{b}"),
        (f"pushed → appended on {b.upper()}", f"{c}:send>{b}", f"{b}:appended"),
        (f"appended → {b.upper()}'s group commit cuts the job", f"{b}:appended", f"{b}:cut"),
        (f"cut → synced on {b.upper()}", f"{b}:cut", f"{b}:synced"),
        (f"synced → durable on {b.upper()}'s loop", f"{b}:synced", f"{b}:durable"),
        (f"durable on {b.upper()} → its acknowledgement on C", f"{b}:durable", f"{c}:ack<{b}"),
        (f"pushed → appended on {o.upper()}", f"{c}:send>{o}", f"{o}:appended"),
        (f"appended → {o.upper()}'s group commit cuts the job", f"{o}:appended", f"{o}:cut"),
        (f"cut → synced on {o.upper()}", f"{o}:cut", f"{o}:synced"),
        (f"synced → durable on {o.upper()}'s loop", f"{o}:synced", f"{o}:durable"),
        (f"durable on {o.upper()} → its acknowledgement on C", f"{o}:durable", f"{c}:ack<{o}"),
        (f"pushed → {o.upper()}'s acknowledgement on C", f"{c}:send>{o}", f"{c}:ack<{o}"),
        (f"pushed → {b.upper()}'s acknowledgement on C", f"{c}:send>{b}", f"{c}:ack<{b}"),
        ("replication stage → high watermark moves on C", f"{c}:replicating", f"{c}:hw"),
        (f"watermark moves → pushed to {b.upper()}", f"{c}:hw", f"{c}:hw>{b}"),
        (f"watermark pushed → routed on {b.upper()}", f"{c}:hw>{b}", f"{b}:routed"),
        (f"routed on {b.upper()} → delivered to the device", f"{b}:routed", "bench:delivered"),
        ("watermark moves → C answers A", f"{c}:hw", f"{c}:answered"),
        ("C answers → A has the answer", f"{c}:answered", f"{a}:answered"),
        ("end to end: sent → delivered", "bench:sent", "bench:delivered"),
    ]


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def rows(
    stages: dict[int, dict[str, int]], publisher: str = "a", leader: str = "c", subscriber: str = "b"
) -> list[tuple[str, int, float, float]]:
    """(step, records measured, p50 ms, p99 ms) of every step with at least one record."""
    other = publisher  # the other follower (replication factor 3)
    result: list[tuple[str, int, float, float]] = []
    for label, start, end in _chain(publisher, leader, subscriber, other):
        deltas = [
            (seen[end] - seen[start]) / 1e6 for seen in stages.values() if start in seen and end in seen
        ]
        if deltas:
            result.append((label, len(deltas), _percentile(deltas, 0.5), _percentile(deltas, 0.99)))
    return result


def table(measured: list[tuple[str, int, float, float]]) -> str:
    lines = ["| step | records | p50 (ms) | p99 (ms) |", "|---|---:|---:|---:|"]
    lines += [f"| {label} | {count} | {p50:.2f} | {p99:.2f} |" for label, count, p50, p99 in measured]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_trace", description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--publisher", default="a")
    parser.add_argument("--leader", default="c")
    parser.add_argument("--subscriber", default="b")
    args = parser.parse_args(argv)
    stages = load(args.directory, args.topic)
    print(table(rows(stages, args.publisher, args.leader, args.subscriber)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
