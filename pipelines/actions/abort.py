"""When an action is aborted: thresholds of failures among the devices that finished it.

``abort_rules`` (several per action, as AWS IoT Jobs' abort criteria) each count one failure kind:
``failed``, ``rejected``, ``timed_out``, or ``any`` of the three, and fire once at least ``min_executed``
devices have finished and ``threshold_pct`` % of them ended that way. A device whose action message expired
before it took it (``EXPIRED``) never tried: it is not counted as finished, so a rollout whose online devices
succeeded is not aborted a day later by those that never came online. The earlier ``abort_criteria``
(``failure_pct`` of failed or timed-out devices) is one more rule. The first rule that fires is named in the
summary (``aborted_by``, and the reason with the counts that crossed it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.actions.states import EXECUTED_STATES, FAILED, REJECTED, TIMED_OUT

__all__ = ["AbortRule", "abort_rules", "first_fired"]

COUNTED_STATES = {
    "failed": frozenset({FAILED}),
    "rejected": frozenset({REJECTED}),
    "timed_out": frozenset({TIMED_OUT}),
    "any": frozenset({FAILED, REJECTED, TIMED_OUT}),
    "failed_or_timed_out": frozenset({FAILED, TIMED_OUT}),
}
"""The execution states each failure kind counts (the last is ``abort_criteria``'s)."""
_ENDED = {
    "failed": "failed",
    "rejected": "rejected it",
    "timed_out": "timed out",
    "any": "failed, rejected it or timed out",
    "failed_or_timed_out": "failed or timed out",
}


@dataclass(frozen=True)
class AbortRule:
    """Abort once ``min_executed`` executions finished and ``threshold_pct`` % or more ended in the states
    of ``failure_kind``; ``field`` is where the rule is in the row (``abort_rules[1]``)."""

    field: str
    failure_kind: str
    threshold_pct: float
    min_executed: int = 1

    def counted(self, counts: Counter) -> tuple[int, int]:
        """(executions of the kind, finished executions): an EXPIRED device never had the action, it is
        neither."""
        executed = sum(counts[state] for state in EXECUTED_STATES)
        return sum(counts[state] for state in COUNTED_STATES[self.failure_kind]), executed

    def fired(self, counts: Counter) -> bool:
        failures, executed = self.counted(counts)
        if executed < max(1, self.min_executed):
            return False
        return failures * 100.0 >= self.threshold_pct * executed

    def reason(self, counts: Counter) -> str:
        """The threshold crossed and the counts that crossed it."""
        failures, executed = self.counted(counts)
        share = 100.0 * failures / executed if executed else 0.0
        if self.field == "abort_criteria":
            threshold, minimum = "abort_criteria.failure_pct", "abort_criteria.min_executed"
        else:
            threshold = f"{self.field} ({self.failure_kind})"
            minimum = f"{self.field}.min_executed"
        return (
            f"{threshold} {self.threshold_pct:g} % reached: {failures} of {executed} finished devices "
            f"{_ENDED[self.failure_kind]} ({share:.1f} %; {minimum} {self.min_executed})"
        )


def abort_rules(row: Mapping[str, Any]) -> tuple[AbortRule, ...]:
    """The rules of an ``actions`` row: ``abort_criteria`` first, then each of ``abort_rules``."""
    rules = []
    legacy = row.get("abort_criteria") or {}
    if legacy.get("failure_pct") is not None:
        minimum = int(legacy.get("min_executed") or 1)
        rules.append(
            AbortRule("abort_criteria", "failed_or_timed_out", float(legacy["failure_pct"]), minimum)
        )
    for index, item in enumerate(row.get("abort_rules") or ()):
        rules.append(
            AbortRule(
                f"abort_rules[{index}]",
                item["failure_kind"],
                float(item["threshold_pct"]),
                int(item.get("min_executed") or 1),
            )
        )
    return tuple(rules)


def first_fired(rules: Sequence[AbortRule], counts: Counter) -> AbortRule | None:
    return next((rule for rule in rules if rule.fired(counts)), None)
