"""Retries of one device's execution after it failed or timed out, with a limit and a backoff.

An action's ``retries`` name the failure kinds to retry (``failed``, ``timed_out`` or ``any``), how many
times (at most 10, as AWS IoT Jobs allows) and after how long: ``backoff_s`` before the first retry,
multiplied by ``backoff_factor`` before each one after it. A device is retried while its retries so far are
fewer than the limit of the rule for its latest failure. A device that rejected an action refused it: it is
not retried.

The retry is written with the failure it answers (the row goes from IN_PROGRESS or QUEUED to QUEUED with
its next ``attempt`` and ``retry_at``), so the failure is final only once no retry is left; the action is
not complete, nor aborted for it, while a retry may still succeed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pipelines.actions.states import FAILED, QUEUED, TIMED_OUT, Execution

__all__ = ["RetryRule", "retry"]

RETRIED_STATES = {
    "failed": frozenset({FAILED}),
    "timed_out": frozenset({TIMED_OUT}),
    "any": frozenset({FAILED, TIMED_OUT}),
}


@dataclass(frozen=True)
class RetryRule:
    """Retry executions that ended in ``failure_kind`` up to ``max_retries`` times."""

    failure_kind: str
    max_retries: int
    backoff_s: int = 0
    backoff_factor: float = 1.0

    @classmethod
    def from_row(cls, item: Mapping[str, Any]) -> RetryRule:
        return cls(
            failure_kind=item["failure_kind"],
            max_retries=int(item["max_retries"]),
            backoff_s=int(item.get("backoff_s") or 0),
            backoff_factor=float(item.get("backoff_factor") or 1.0),
        )

    def covers(self, state: str) -> bool:
        return state in RETRIED_STATES[self.failure_kind]

    def delay_ms(self, retries_done: int) -> int:
        """The wait before retry number ``retries_done + 1``."""
        return int(self.backoff_s * 1000 * self.backoff_factor**retries_done)


def retry(row: Execution, rules: Sequence[RetryRule], now_ms: int) -> Execution | None:
    """The row queued again for its next attempt, or None when no rule retries it (or none is left)."""
    rule = next((rule for rule in rules if rule.covers(row.state)), None)
    if rule is None:
        return None
    done = row.attempt - 1
    if done >= rule.max_retries:
        return None
    failure = f"{row.state}: {row.status_details}" if row.status_details else row.state
    return replace(
        row,
        state=QUEUED,
        attempt=row.attempt + 1,
        version=row.version + 1,
        status_details=f"retry {done + 1} of {rule.max_retries} after attempt {row.attempt} {failure}",
        retry_at=now_ms + rule.delay_ms(done),
        started_at=None,
        finished_at=None,
        updated_at=now_ms,
    )
