"""An action's overall state from the states of its executions: scheduled, in progress, completed,
aborted, canceled; or rejected, when its row was not a valid action and nothing was published
(``validation.py``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pipelines.actions.abort import AbortRule, first_fired
from pipelines.actions.states import ALL_STATES, TERMINAL_STATES

ACTION_SCHEDULED = "SCHEDULED"
ACTION_IN_PROGRESS = "IN_PROGRESS"
ACTION_COMPLETED = "COMPLETED"
ACTION_ABORTED = "ABORTED"
ACTION_CANCELED = "CANCELED"
ACTION_REJECTED = "REJECTED"
FINAL_ACTION_STATES = frozenset({ACTION_COMPLETED, ACTION_ABORTED, ACTION_CANCELED, ACTION_REJECTED})


def action_state(
    previous: str | None,
    counts: Counter,
    canceled: bool,
    rules: Sequence[AbortRule] = (),
    *,
    before_start: bool = False,
    open_ended: bool = False,
) -> str:
    """The action's state now; a final state (completed, aborted, canceled) never changes again.

    ``before_start``: its scheduled start has not come; ``open_ended``: a continuous action not ended yet,
    which devices may still join, so it is not complete when every device it has is done.
    """
    if previous in FINAL_ACTION_STATES:
        return previous
    if canceled:
        return ACTION_CANCELED
    if first_fired(rules, counts) is not None:
        return ACTION_ABORTED
    if before_start:
        return ACTION_SCHEDULED
    total = sum(counts.values())
    if total and not open_ended and all(state in TERMINAL_STATES for state in counts if counts[state]):
        return ACTION_COMPLETED
    return ACTION_IN_PROGRESS


def state_counts(states: list[str]) -> Counter:
    """Counts per execution state, with every state present (zero when absent)."""
    counts = Counter({state: 0 for state in ALL_STATES})
    counts.update(states)
    return counts
