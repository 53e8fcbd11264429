"""Which devices an action is sent to now: its schedule, maintenance windows, phases and rate, together.

A function of the action, its execution rows (as the table holds them) and the time: nothing is kept
between calls, so the job decides the same after a restart. Devices never sent the action go in the
rollout's order (``phases.rollout_order``), phase by phase, as fast as the rate allows since the current
phase started; retries go out when due. Nothing new goes out before ``schedule.start_at``, after
``schedule.end_at`` or outside every maintenance window.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from pipelines.actions.abort import AbortRule, first_fired
from pipelines.actions.model import Action
from pipelines.actions.phases import Gate, gate_lost, phase_number, phase_starts, rollout_key
from pipelines.actions.states import QUEUED, SUCCEEDED, Execution

__all__ = ["Release", "due", "fired_rule", "gate_of", "lost_gate", "rollout_start"]


@dataclass(frozen=True)
class Release:
    """What to send now: first messages (in rollout order) and retries, and the phase the rollout is in."""

    first: list[str]
    retries: list[Execution]
    phase: int | None

    def __bool__(self) -> bool:
        return bool(self.first or self.retries)


def rollout_start(action: Action, rows: Mapping[str, Execution]) -> int:
    """When the rollout started, or will: when it was queued, or its scheduled start if later."""
    queued_at = min((row.queued_at for row in rows.values()), default=action.created_at_ms)
    return max(queued_at, action.schedule.start_at_ms or 0)


def gate_of(action: Action) -> Gate:
    """What every phase gate of ``action`` asks beyond its own rules: the sample its abort rules need
    (their largest ``min_executed``), and when a device that never answers counts as silent."""
    sample = max((rule.min_executed for rule in action.abort_rules), default=0)
    timeout = action.in_progress_timeout_s
    return Gate(sample, timeout * 1000 if timeout else None)


def lost_gate(action: Action, rows: Mapping[str, Execution], now_ms: int) -> tuple[int, str] | None:
    """The phase of ``action`` whose gate can no longer open, and why (``phases.gate_lost``)."""
    if len(action.phases) < 2:
        return None
    return gate_lost(action.phases, rows.values(), rollout_start(action, rows), now_ms, gate_of(action))


def fired_rule(action: Action, rows: Mapping[str, Execution]) -> AbortRule | None:
    """The first abort rule of ``action`` that its rows fire (the action is being aborted), or None."""
    if not action.abort_rules:
        return None
    return first_fired(action.abort_rules, Counter(row.state for row in rows.values()))


def _waiting(row: Execution) -> bool:
    """Never sent the action, and not stopped meanwhile."""
    return row.state == QUEUED and row.published_at is None and row.retry_at is None


def due(action: Action, rows: Mapping[str, Execution], now_ms: int) -> Release:
    """The devices of ``action`` to send its message to at ``now_ms``: none once an abort rule fires on
    ``rows`` (devices that timed out at this tick, rows written before a restart whose abort was not):
    the abort is what comes next, and no device beyond the rows that fired it is sent the action."""
    if fired_rule(action, rows) is not None:
        return Release([], [], None)
    phase = current_phase(action, rows, now_ms)
    if not action.schedule.may_send(now_ms):
        return Release([], [], phase)
    retries = sorted(
        (
            row
            for row in rows.values()
            if row.retry_at is not None and row.retry_at <= now_ms and row.retry_waiting
        ),
        key=lambda row: row.device_id,
    )
    return Release(_first_sends(action, rows, now_ms, phase), retries, phase)


def current_phase(action: Action, rows: Mapping[str, Execution], now_ms: int) -> int | None:
    """The phase being sent now, from 1 (None: the action has no phases)."""
    if len(action.phases) < 2:
        return None
    return len(
        phase_starts(action.phases, rows.values(), rollout_start(action, rows), now_ms, gate_of(action))
    )


def _first_sends(action: Action, rows: Mapping[str, Execution], now_ms: int, phase: int | None) -> list[str]:
    waiting = [device_id for device_id, row in rows.items() if _waiting(row)]
    if not waiting:
        return []
    start = rollout_start(action, rows)
    last = len(action.phases)
    sent_before = 0
    if phase is not None:
        start = phase_starts(action.phases, rows.values(), start, now_ms, gate_of(action))[-1]
        waiting = [d for d in waiting if phase_number(rows[d], last) <= phase]
        sent_before = sum(
            1 for row in rows.values() if row.published_at is not None and phase_number(row, last) < phase
        )
        sent = sum(
            1 for row in rows.values() if row.published_at is not None and phase_number(row, last) == phase
        )
    else:
        sent = sum(1 for row in rows.values() if row.published_at is not None)
    if not action.pace.paced:
        return sorted(waiting)  # everyone at once: the order does not matter
    successes = sorted(row.finished_at or row.updated_at for row in rows.values() if row.state == SUCCEEDED)
    allowed = action.pace.allowed(
        start, now_ms, action.schedule.open_ms, sent_before, limit=sent + len(waiting), successes_ms=successes
    )
    turn = max(0, allowed - sent)
    return heapq.nsmallest(turn, waiting, key=rollout_key(action.id)) if turn else []
