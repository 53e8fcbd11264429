"""Phased rollouts: the target split into phases (5 %, then 15 %, then the rest), each held back until the
one before it has been sent to everyone, has waited its ``wait_s``, has reached its ``success_pct``, and the
rollout's abort rules have had the sample they need to judge it.

The devices are taken in an order of their own per action (a hash of the action and device ids), so a phase
is a sample spread over the fleet rather than its lowest ids, and the job finds the same order whenever it
computes it. Each execution row records its phase; when each phase started follows from the rows (the
previous phase's start, when its last device was sent, when its devices finished), so the job holds no
state of its own and a restart resumes where the table says.

A gate either opens or is lost, never waits for ever: a device that never answers counts as silent once
``in_progress_timeout_s`` has passed since it was sent (``Gate.silent_after_ms``), or once its message
expired before it took it (``EXPIRED``), and a phase whose devices can no longer reach its ``success_pct``
(rejected, failed for good, silent) loses its gate (``gate_lost``): the action is then aborted, as by an
abort rule.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.actions.states import EXPIRED, IN_PROGRESS, QUEUED, SUCCEEDED, Execution

__all__ = [
    "Gate",
    "Phase",
    "gate_lost",
    "phase_number",
    "phase_of_devices",
    "phase_sizes",
    "phase_starts",
    "rollout_key",
    "rollout_order",
]


@dataclass(frozen=True)
class Phase:
    """One phase: its share of the target (``percent`` or ``devices``; neither: the rest), and what holds
    the next phase back."""

    percent: float | None = None
    devices: int | None = None
    wait_s: int | None = None
    success_pct: float | None = None

    @classmethod
    def from_row(cls, item: Mapping[str, Any]) -> Phase:
        return cls(item.get("percent"), item.get("devices"), item.get("wait_s"), item.get("success_pct"))


def rollout_key(action_id: str) -> Callable[[str], tuple[int, str]]:
    """A device's place in the order a rollout reaches its devices in: by CRC-32 of the action and device
    ids, then by id."""
    prefix = f"{action_id}\x00".encode()
    return lambda device_id: (zlib.crc32(prefix + device_id.encode()), device_id)


def rollout_order(action_id: str, device_ids: Iterable[str]) -> list[str]:
    """The devices in the order the rollout reaches them."""
    return sorted(device_ids, key=rollout_key(action_id))


def phase_sizes(phases: Sequence[Phase], total: int) -> list[int]:
    """Devices in each phase of a target of ``total`` devices; the last phase takes the rest.

    Each phase ends where the running sum of the shares before it ends, rounded up: a small target still
    has a first phase of one device, and rounding never adds up to more than the target.
    """
    sizes: list[int] = []
    reached = 0
    exact = 0.0
    for phase in phases[:-1]:
        exact += phase.devices if phase.devices is not None else (phase.percent or 0.0) * total / 100
        end = min(total, max(reached, math.ceil(round(exact, 9))))
        sizes.append(end - reached)
        reached = end
    sizes.append(total - reached)
    return sizes


def phase_of_devices(action_id: str, phases: Sequence[Phase], device_ids: Iterable[str]) -> dict[str, int]:
    """Each device's phase, numbered from 1."""
    ordered = rollout_order(action_id, device_ids)
    out: dict[str, int] = {}
    first = 0
    for number, size in enumerate(phase_sizes(phases, len(ordered)), start=1):
        for device_id in ordered[first : first + size]:
            out[device_id] = number
        first += size
    return out


@dataclass(frozen=True)
class Gate:
    """What every phase's gate asks beyond the phase's own rules: ``sample``, the finished devices the
    action's abort rules need before they judge (their largest ``min_executed``); ``silent_after_ms``, how
    long a device sent the action may stay without a final report before it counts as silent (the action's
    ``in_progress_timeout_s``; None: a device that never answers holds the gate, as it holds the action)."""

    sample: int = 0
    silent_after_ms: int | None = None

    def silent_since(self, row: Execution) -> int | None:
        """When ``row`` turned silent (sent, or started, and no final report since), if it can. A device
        whose message expired before it took it is silent for good, since it expired."""
        if row.state == EXPIRED:
            return row.finished_at or row.updated_at
        if self.silent_after_ms is None or row.terminal:
            return None
        if row.state == IN_PROGRESS:
            since = row.started_at if row.started_at is not None else row.updated_at
        elif row.state == QUEUED and row.published_at is not None and row.retry_at is None:
            since = row.updated_at  # when it was last sent (its first message, or a retry)
        else:
            return None  # not sent yet, or waiting for a retry
        return since + self.silent_after_ms


def phase_starts(
    phases: Sequence[Phase], rows: Iterable[Execution], start_ms: int, now_ms: int, gate: Gate = Gate()
) -> list[int]:
    """When each phase that has started did (epoch ms), from the first. The one after phase ``i`` starts
    at the latest of: every device of phase ``i`` was sent the action (or ended without it); its ``wait_s``
    passed since it started; ``success_pct`` % of its devices succeeded; and ``gate.sample`` devices of the
    phases so far finished (fewer when fewer were sent, or some are silent: the abort rules judge what there
    is, and the next phase adds to it)."""
    by_phase = _by_phase(phases, rows)
    starts = [start_ms]
    so_far: list[Execution] = []
    for number, phase in enumerate(phases[:-1], start=1):
        members = by_phase.get(number, [])
        so_far += members
        opens = _next_phase_opens(phase, members, so_far, starts[-1], gate, now_ms)
        if opens is None or opens > now_ms:
            break
        starts.append(opens)
    return starts


def gate_lost(
    phases: Sequence[Phase], rows: Iterable[Execution], start_ms: int, now_ms: int, gate: Gate = Gate()
) -> tuple[int, str] | None:
    """The phase (from 1) whose gate can no longer open, and why: fewer of its devices can still succeed
    than its ``success_pct`` needs (the others rejected it, failed for good, or are silent), decided once
    the abort rules had their sample (they judge first); None while every gate may still open."""
    rows = list(rows)
    current = len(phase_starts(phases, rows, start_ms, now_ms, gate))
    if current >= len(phases) or not phases[current - 1].success_pct:
        return None
    by_phase = _by_phase(phases, rows)
    so_far = [row for number in range(1, current + 1) for row in by_phase.get(number, [])]
    sample = min(gate.sample, len(so_far) - len(_silent(so_far, gate, now_ms)))
    if sum(1 for row in so_far if row.executed) < sample:
        return None
    members = by_phase.get(current, [])
    needed = _successes_needed(phases[current - 1], members)
    succeeded = sum(1 for row in members if row.state == SUCCEEDED)
    silent = _silent(members, gate, now_ms)
    able = sum(1 for row in members if not row.terminal and row.device_id not in silent)
    if succeeded + able >= needed:
        return None
    percent = phases[current - 1].success_pct
    return current, (
        f"phases[{current - 1}].success_pct {percent:g} % cannot be reached: {succeeded} of its "
        f"{len(members)} devices succeeded and {able} may still, {needed} needed"
        + (f" ({len(silent)} silent)" if silent else "")
    )


def phase_number(row: Execution, count: int) -> int:
    """The phase (from 1) of ``row`` in a rollout of ``count`` phases: the last for a row without one (the
    row had no phases when it was queued) or of a phase the row no longer has (its ``phases`` were cut
    short in place while it ran), so no device is left in a phase that never comes."""
    return min(row.phase or count, count)


def _by_phase(phases: Sequence[Phase], rows: Iterable[Execution]) -> dict[int, list[Execution]]:
    by_phase: dict[int, list[Execution]] = {}
    for row in rows:
        by_phase.setdefault(phase_number(row, len(phases)), []).append(row)
    return by_phase


def _successes_needed(phase: Phase, members: Sequence[Execution]) -> int:
    return math.ceil(round((phase.success_pct or 0.0) * len(members) / 100, 9))


def _silent(rows: Iterable[Execution], gate: Gate, now_ms: int) -> dict[str, int]:
    """Devices of ``rows`` silent by ``now_ms``, with since when."""
    silent = {}
    for row in rows:
        since = gate.silent_since(row)
        if since is not None and since <= now_ms:
            silent[row.device_id] = since
    return silent


def _next_phase_opens(
    phase: Phase,
    members: Sequence[Execution],
    so_far: Sequence[Execution],
    started_ms: int,
    gate: Gate,
    now_ms: int,
) -> int | None:
    """When the phase after this one may start; None while something still holds it back."""
    if any(row.published_at is None and not row.terminal for row in members):
        return None  # not every device of this phase has been sent the action yet
    opens = max([started_ms, *(row.published_at for row in members if row.published_at is not None)])
    if phase.wait_s:
        opens = max(opens, started_ms + phase.wait_s * 1000)
    if phase.success_pct:
        needed = _successes_needed(phase, members)
        succeeded = sorted(row.finished_at or row.updated_at for row in members if row.state == SUCCEEDED)
        if len(succeeded) < needed:
            return None
        if needed:
            opens = max(opens, succeeded[needed - 1])
    if gate.sample:
        silent = _silent(so_far, gate, now_ms)
        needed = min(gate.sample, len(so_far) - len(silent))
        finished = sorted(row.finished_at or row.updated_at for row in so_far if row.executed)
        if len(finished) < needed:
            return None
        if needed:
            opens = max(opens, finished[needed - 1], *silent.values())
    return opens
