"""Phased rollouts: the target split into phases (5 %, then 15 %, then the rest), each held back until the
one before it has been sent to everyone, has waited its ``wait_s`` and has reached its ``success_pct``.

The devices are taken in an order of their own per action (a hash of the action and device ids), so a phase
is a sample spread over the fleet rather than its lowest ids, and the job finds the same order whenever it
computes it. Each execution row records its phase; when each phase started follows from the rows (the
previous phase's start, when its last device was sent, when its devices succeeded), so the job holds no
state of its own and a restart resumes where the table says.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.actions.states import SUCCEEDED, Execution

__all__ = ["Phase", "phase_of_devices", "phase_sizes", "phase_starts", "rollout_key", "rollout_order"]


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


def phase_starts(phases: Sequence[Phase], rows: Iterable[Execution], start_ms: int, now_ms: int) -> list[int]:
    """When each phase that has started did (epoch ms), from the first: the one after phase ``i`` starts
    once all of phase ``i``'s devices were sent it (or ended without it), its ``wait_s`` has passed since
    it started, and ``success_pct`` % of its devices have succeeded: at the latest of these moments."""
    by_phase: dict[int, list[Execution]] = {}
    for row in rows:
        by_phase.setdefault(row.phase or len(phases), []).append(row)
    starts = [start_ms]
    for number, phase in enumerate(phases[:-1], start=1):
        members = by_phase.get(number, [])
        opens = _next_phase_opens(phase, members, starts[-1])
        if opens is None or opens > now_ms:
            break
        starts.append(opens)
    return starts


def _next_phase_opens(phase: Phase, members: Sequence[Execution], started_ms: int) -> int | None:
    """When the phase after this one may start; None while something still holds it back."""
    if any(row.published_at is None and not row.terminal for row in members):
        return None  # not every device of this phase has been sent the action yet
    opens = max([started_ms, *(row.published_at for row in members if row.published_at is not None)])
    if phase.wait_s:
        opens = max(opens, started_ms + phase.wait_s * 1000)
    if phase.success_pct:
        needed = math.ceil(round(phase.success_pct * len(members) / 100, 9))
        succeeded = sorted(row.finished_at or row.updated_at for row in members if row.state == SUCCEEDED)
        if len(succeeded) < needed:
            return None
        if needed:
            opens = max(opens, succeeded[needed - 1])
    return opens
