"""The order in which pytest-xdist hands out the suite's groups: the longest first.

``make test`` runs two workers with ``--dist loadgroup``; xdist hands out the groups (a module, or the tests
of a costly session fixture) in collection order, by default sorted by their number of tests, so the
longest module, two tests on a Spark standalone cluster, came last and ran alone while the other worker
idled. Longest first (xdist's own sort turned off by tests/conftest.py, each worker's collection ordered
here) lets the short groups fill in around the long ones. What a group costs comes from
``tests/durations.json``, seconds per test module as recorded by ``make test-durations`` and shared among
the module's collected tests; a module it does not name counts ``UNRECORDED_TEST_S`` per test, so a stale
record changes the order, never the tests that run.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest

UNRECORDED_TEST_S = 1.0
"""What a test of a module missing from the record is taken to cost."""


def module_of(nodeid: str) -> str:
    """The test module's path in a node id (``tests/x/test_y.py::test_z[p]@group``)."""
    return nodeid.split("::", 1)[0]


def recorded_seconds(record: Path) -> dict[str, float]:
    """Seconds per test module from ``record``; none when it is missing."""
    if not record.exists():
        return {}
    seconds = json.loads(record.read_text())
    return {str(module): float(spent) for module, spent in seconds.items()}


def longest_groups_first(
    items: Sequence[pytest.Item], groups: Sequence[str], record: Path
) -> list[pytest.Item]:
    """``items`` (``groups``: each one's group) with their groups ordered by estimated cost, the costliest
    first; a group's items keep their order and stay together, groups of equal cost keep the order they were
    collected in."""
    recorded = recorded_seconds(record)
    modules = [module_of(item.nodeid) for item in items]
    tests_per_module = Counter(modules)
    cost: defaultdict[str, float] = defaultdict(float)
    first_seen: dict[str, int] = {}
    for index, (module, group) in enumerate(zip(modules, groups, strict=True)):
        spent = recorded.get(module)
        cost[group] += UNRECORDED_TEST_S if spent is None else spent / tests_per_module[module]
        first_seen.setdefault(group, index)
    order = sorted(range(len(items)), key=lambda index: (-cost[groups[index]], first_seen[groups[index]]))
    return [items[index] for index in order]


class DurationRecorder:
    """A pytest plugin (registered by tests/conftest.py for ``--record-durations``) summing the seconds of
    each test module's phases (set-up, call, tear-down) as their reports come in, from every worker, and
    writing them at the session's end to the record ``longest_groups_first`` reads."""

    def __init__(self, record: Path) -> None:
        self.record = record
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[module_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        ordered = {module: round(spent, 1) for module, spent in sorted(self.seconds.items())}
        self.record.write_text(json.dumps(ordered, indent=1) + "\n")
