"""An action's overall state from the states of its executions: in progress, completed, aborted, canceled;
or rejected, when its row was not a valid action and nothing was published (``validation.py``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pipelines.actions.states import ALL_STATES, FAILED, TERMINAL_STATES, TIMED_OUT

ACTION_IN_PROGRESS = "IN_PROGRESS"
ACTION_COMPLETED = "COMPLETED"
ACTION_ABORTED = "ABORTED"
ACTION_CANCELED = "CANCELED"
ACTION_REJECTED = "REJECTED"
FINAL_ACTION_STATES = frozenset({ACTION_COMPLETED, ACTION_ABORTED, ACTION_CANCELED, ACTION_REJECTED})

FAILURE_STATES = frozenset({FAILED, TIMED_OUT})
"""Execution states that count as failures for abort criteria (a device REJECTED by policy is not one)."""


@dataclass(frozen=True, slots=True)
class AbortCriteria:
    """Abort once ``min_executed`` executions finished and ``failure_pct`` % or more of them failed."""

    failure_pct: float | None = None
    min_executed: int = 1

    def should_abort(self, counts: Counter) -> bool:
        if self.failure_pct is None:
            return False
        executed = sum(counts[state] for state in TERMINAL_STATES)
        if executed < max(1, self.min_executed):
            return False
        failures = sum(counts[state] for state in FAILURE_STATES)
        return failures * 100.0 >= self.failure_pct * executed

    def reason(self, counts: Counter) -> str:
        """Why an action was aborted: the threshold crossed and the counts that crossed it."""
        executed = sum(counts[state] for state in TERMINAL_STATES)
        failures = sum(counts[state] for state in FAILURE_STATES)
        share = 100.0 * failures / executed if executed else 0.0
        return (
            f"abort_criteria.failure_pct {self.failure_pct:g} % reached: {failures} of {executed} finished "
            f"devices failed or timed out ({share:.1f} %; abort_criteria.min_executed {self.min_executed})"
        )


def action_state(previous: str | None, counts: Counter, canceled: bool, criteria: AbortCriteria) -> str:
    """The action's state now; a final state (completed, aborted, canceled) never changes again."""
    if previous in FINAL_ACTION_STATES:
        return previous
    if canceled:
        return ACTION_CANCELED
    if criteria.should_abort(counts):
        return ACTION_ABORTED
    total = sum(counts.values())
    if total and all(state in TERMINAL_STATES for state in counts if counts[state]):
        return ACTION_COMPLETED
    return ACTION_IN_PROGRESS


def state_counts(states: list[str]) -> Counter:
    """Counts per execution state, with every state present (zero when absent)."""
    counts = Counter({state: 0 for state in ALL_STATES})
    counts.update(states)
    return counts
