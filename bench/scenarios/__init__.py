"""The scenarios, by the names used with `--only`, in the order they run."""

from __future__ import annotations

from collections.abc import Callable

from bench.scenarios import fanin, fanout, idle, latency, persisted
from bench.scenarios.base import RunContext, ScenarioResult

SCENARIOS: dict[str, Callable[[RunContext], ScenarioResult]] = {
    "fanin": fanin.run,
    "fanout": fanout.run,
    "latency": latency.run,
    "idle": idle.run,
    "persisted": persisted.run,
}
