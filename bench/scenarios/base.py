"""What every scenario shares: the run context, result rows, targets, and measuring each broker in turn.

A scenario measures one thing for every selected broker, each measurement against a freshly started broker
(so no run inherits another's memory or queues), repeated `repeat` times, keeping the median run. A broker
that cannot be started becomes a "not available" row with the reason, never a failed run.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from bench.brokers.base import BrokerUnavailable, BrokerUnderTest, RunningBroker
from bench.loadgen.flow import Timing
from bench.loadgen.processes import WorkerFailed

T = TypeVar("T")


@dataclass
class RunContext:
    """Everything a scenario needs to know about this run."""

    brokers: list[BrokerUnderTest]  # in the default configuration, in the order asked for
    quick: bool
    timing: Timing
    repeat: int
    broker_cpus: set[int] | None
    loadgen_cpus: set[int] | None
    log: Callable[[str], None] = print
    unavailable: dict[str, str] = field(default_factory=dict)  # broker label -> why it could not run
    unprepared: dict[str, str] = field(default_factory=dict)  # broker name -> why it could not be installed
    seen: dict[str, BrokerUnderTest] = field(default_factory=dict)  # every broker label measured, in order
    other_cpu: list[float] = field(default_factory=list)  # "other CPU" % of every measurement kept
    flows: dict[tuple, Any] = field(default_factory=dict)  # (config key, flow spec) -> its measurement
    failures: list[str] = field(default_factory=list)  # what makes the whole run fail (exit status 1)


@dataclass
class Row:
    """One broker's figures for one case of a scenario."""

    case: str
    broker: str  # label shown in the table
    figure: float | None  # the headline figure; None when there is none (not available, failed)
    cells: dict[str, str] = field(default_factory=dict)
    note: str = ""
    invalid: str = ""  # why this row does not count (shown, never used in a ratio or target); "" if it does


@dataclass
class Target:
    """A goal for Timestone's figure, and whether this run met it (None: not measured)."""

    goal: str
    measured: str
    met: bool | None


@dataclass
class ScenarioResult:
    """A scenario's table: rows, the columns besides the headline figure, and its targets."""

    key: str
    title: str
    description: str
    figure_name: str
    higher_is_better: bool
    columns: list[str]
    rows: list[Row]
    targets: list[Target] = field(default_factory=list)
    reference: str = "timestone"  # the label the ratio column divides by each row
    notes: list[str] = field(default_factory=list)

    def figure(self, case: str, broker: str) -> float | None:
        """The headline figure of (case, broker label) if that row is valid, else None."""
        for row in self.rows:
            if row.case == case and row.broker == broker:
                return None if row.invalid else row.figure
        return None


@dataclass
class Measured(Generic[T]):
    """The median run of a repeated measurement, and every run's figure."""

    result: T
    figures: list[float]


def measure(
    ctx: RunContext,
    broker: BrokerUnderTest,
    run_once: Callable[[RunningBroker], T],
    figure_of: Callable[[T], float],
) -> Measured[T] | str:
    """Run `run_once` against a fresh `broker` `ctx.repeat` times; the median run, or why there is none."""
    ctx.seen.setdefault(broker.label, broker)
    if broker.name in ctx.unprepared:
        return f"not available: {ctx.unprepared[broker.name]}"
    if broker.label in ctx.unavailable:
        return f"not available: {ctx.unavailable[broker.label]}"
    results: list[T] = []
    for attempt in range(ctx.repeat):
        try:
            with broker.running(cpus=ctx.broker_cpus) as running:
                results.append(run_once(running))
        except BrokerUnavailable as exc:
            ctx.unavailable[broker.label] = str(exc)
            ctx.log(f"    {broker.label}: not available: {exc}")
            return f"not available: {exc}"
        except (WorkerFailed, OSError) as exc:  # this measurement failed; the run goes on with the next
            ctx.log(f"    {broker.label}: run {attempt + 1} failed: {type(exc).__name__}: {exc}")
            return f"failed: {exc}"
    figures = [figure_of(r) for r in results]
    median = statistics.median_low(figures)
    return Measured(results[figures.index(median)], figures)


def spread(figures: list[float]) -> str:
    """The range of the repeated runs' figures, for the table ("" for a single run)."""
    if len(figures) < 2:
        return ""
    return f"{_compact(min(figures))} to {_compact(max(figures))}"


def _compact(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def ratio_target(goal: str, mine: float | None, theirs: float | None, share: float) -> Target:
    """Target "mine >= share * theirs" (higher is better)."""
    if mine is None or theirs is None or theirs <= 0:
        return Target(goal, "not measured (no valid row on one side)", None)
    return Target(goal, f"{mine / theirs:.2f}x ({mine:,.0f} vs {theirs:,.0f})", mine >= share * theirs)
