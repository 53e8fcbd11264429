"""Timestamps of records along the replicated publish path, to find where its time goes (off by default).

A broker started with ``TIMESTONE_PATH_TRACE=<directory>`` in its environment notes, at each stage a record
passes (forwarded, received by the leader, its group commit cut and synced, pushed, appended and synced on a
follower, acknowledged, committed, routed), ``(stage, topic, first offset, end offset, CLOCK_MONOTONIC ns)``
and writes them to ``<directory>/<node>-<pid>.trace`` (tab separated) as they pile up and at exit. The
clock is shared by the processes of one machine, so marks of several brokers line up by topic and offset;
``bench/cluster_trace.py`` turns them into the time between stages. Without the variable every call site
costs one test of ``ON``.
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path

__all__ = ["ON", "mark", "mark_at", "set_node"]

ON = bool(os.environ.get("TIMESTONE_PATH_TRACE"))
"""Whether this process notes marks (read once, at import)."""

_FLUSH_EVERY = 50_000
_MAX_MARKS = 5_000_000
"""Marks one process writes at most (a forgotten variable does not fill the disk)."""

_node = "?"
_marks: list[tuple[str, str, int, int, int]] = []
_written = 0


def set_node(node: str) -> None:
    """Name this process's marks (the cluster node id)."""
    global _node
    _node = node


def mark(stage: str, topic: str, first: int, end: int) -> None:
    """Records ``[first, end)`` of ``topic`` reach ``stage`` now."""
    mark_at(stage, topic, first, end, time.monotonic_ns())


def mark_at(stage: str, topic: str, first: int, end: int, at_ns: int) -> None:
    """Records ``[first, end)`` of ``topic`` reached ``stage`` at ``at_ns`` (``time.monotonic_ns``)."""
    if end <= first:
        return
    _marks.append((f"{_node}:{stage}", topic, first, end, at_ns))
    if len(_marks) >= _FLUSH_EVERY:
        flush()


def flush() -> None:
    """Append the marks noted so far to this process's file."""
    global _written
    if not _marks or _written >= _MAX_MARKS:
        _marks.clear()
        return
    directory = Path(os.environ.get("TIMESTONE_PATH_TRACE", "."))
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"{stage}\t{topic}\t{first}\t{end}\t{at}\n" for stage, topic, first, end, at in _marks]
    _written += len(lines)
    _marks.clear()
    with (directory / f"{_node}-{os.getpid()}.trace").open("a", encoding="utf-8") as file:
        file.writelines(lines)


if ON:
    atexit.register(flush)
