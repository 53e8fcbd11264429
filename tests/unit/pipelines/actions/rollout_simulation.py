"""A rollout run by the actions engine's own decisions on a virtual clock, against devices that answer as the
demo's simulated devices do: a whole phased rollout in milliseconds, so that hundreds of seeds can be tried.

What the engine decides is decided by the same functions here: ``release.due`` (schedule, phases and their
gates, rate, retries due), ``states.apply_report`` (a device's reports), ``retries.retry`` (a failure
queued again), ``states.platform_transition`` (timeouts), ``abort.first_fired`` (the abort rules) and
``release.lost_gate`` (a phase gate that can no longer open). The engine's order is kept: a batch of
reports is folded in and the action summarised (maybe aborted) before the next tick sends anything.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipelines.actions.abort import first_fired
from pipelines.actions.model import Action
from pipelines.actions.phases import phase_of_devices
from pipelines.actions.release import due, lost_gate
from pipelines.actions.retries import retry
from pipelines.actions.states import (
    FAILED,
    IN_PROGRESS,
    TIMED_OUT,
    Execution,
    StatusReport,
    apply_report,
    platform_transition,
    queued,
)
from pipelines.actions.summary import state_counts
from pipelines.fleet.device import DeviceBehaviour

TICK_MS = 500
"""How often the engine's clock tick runs (the actions job ticks every half second or so)."""
REPORT_DELAY_MS = (20, 300)
"""From a device's report to the engine folding it in (MQTT, the broker's log, the reports stream)."""


@dataclass(frozen=True)
class Outcome:
    state: str
    """ABORTED, COMPLETED or IN_PROGRESS (still running when the simulation's time ran out)."""
    phase: int | None
    reason: str
    sent: frozenset[str]
    """Every device the action was sent to (its first message or a retry)."""
    aborted_by: str | None = None


class RolloutSimulation:
    """``action`` to ``devices`` (all on ``firmware``), the devices acting as ``behaviour`` says with their
    randomness from ``rng``."""

    def __init__(
        self,
        action: Action,
        devices: Sequence[str],
        behaviour: DeviceBehaviour,
        rng: random.Random,
        start_ms: int = 1_700_000_000_000,
    ) -> None:
        self.action = action
        self.behaviour = behaviour
        self.rng = rng
        self.now = start_ms
        phases = phase_of_devices(action.id, action.phases, devices) if len(action.phases) > 1 else {}
        self.rows = {d: queued(action.id, d, start_ms, phase=phases.get(d)) for d in devices}
        self.sent: set[str] = set()
        self.unreachable: set[str] = set()
        """Devices that never answer (off for good once sent the action)."""
        self._reports: list[tuple[int, int, StatusReport]] = []
        self._seq = 0
        self._device_seq: dict[str, int] = {}
        self._phase: int | None = None
        """The phase the last tick was sending (what the engine's summary shows)."""

    def run(self, limit_s: float = 3_600) -> Outcome:
        end = self.now + int(limit_s * 1000)
        while self.now < end:
            outcome = self._fold_reports() or self._tick()
            if outcome is not None:
                return outcome
            self.now += TICK_MS
        return self._outcome("IN_PROGRESS", "the simulation's time ran out")

    # -- the engine ------------------------------------------------------------------------------------------

    def _fold_reports(self) -> Outcome | None:
        """The reports that reached the engine by now, folded in; then the summary (the abort rules)."""
        while self._reports and self._reports[0][0] <= self.now:
            _at, _seq, report = heapq.heappop(self._reports)
            row = apply_report(self.rows[report.device_id], report)
            if row is not None:
                self.rows[report.device_id] = self._after_failure(row)
        return self._summarise()

    def _tick(self) -> Outcome | None:
        limit = (self.action.in_progress_timeout_s or 0) * 1000
        for device_id, row in list(self.rows.items()):
            started = row.started_at
            if limit and row.state == IN_PROGRESS and started is not None and self.now - started >= limit:
                timed_out = platform_transition(row, TIMED_OUT, "no final report", self.now)
                if timed_out is not None:
                    self.rows[device_id] = self._after_failure(timed_out)
        outcome = self._summarise()
        if outcome is not None:
            return outcome
        release = due(self.action, self.rows, self.now)
        self._phase = release.phase
        for device_id in release.first:
            self._send(device_id, replace(self.rows[device_id], published_at=self.now, updated_at=self.now))
        for row in release.retries:
            self._send(row.device_id, replace(row, retry_at=None, updated_at=self.now))
        return None

    def _summarise(self) -> Outcome | None:
        counts = state_counts([row.state for row in self.rows.values()])
        rule = first_fired(self.action.abort_rules, counts)
        if rule is not None:
            return self._outcome("ABORTED", rule.reason(counts), rule.field)
        lost = lost_gate(self.action, self.rows, self.now)
        if lost is not None:
            return self._outcome("ABORTED", lost[1], f"phases[{lost[0] - 1}]")
        if all(row.terminal for row in self.rows.values()):
            return self._outcome("COMPLETED", "every device finished")
        return None

    def _after_failure(self, row: Execution) -> Execution:
        if row.state not in (FAILED, TIMED_OUT):
            return row
        return retry(row, self.action.retries, self.now) or row

    def _outcome(self, state: str, reason: str, aborted_by: str | None = None) -> Outcome:
        return Outcome(state, self._phase, reason, frozenset(self.sent), aborted_by)

    # -- the devices -----------------------------------------------------------------------------------------

    def _send(self, device_id: str, row: Execution) -> None:
        """The action's message reaches the device, which answers as the demo's devices do."""
        self.rows[device_id] = row
        self.sent.add(device_id)
        if device_id in self.unreachable:
            return
        behaviour, rng = self.behaviour, self.rng
        at = self.now + rng.randint(*REPORT_DELAY_MS)
        if rng.random() < behaviour.reject_rate:
            self._report(device_id, row.attempt, "REJECTED", at)
            return
        self._report(device_id, row.attempt, "IN_PROGRESS", at)
        at += int(rng.uniform(*behaviour.download_delay_s) * 1000)
        version = str(self.action.payload.get("version"))
        failing = behaviour.fails_version(device_id, version) or rng.random() < behaviour.failure_rate
        self._report(device_id, row.attempt, "FAILED" if failing else "SUCCEEDED", at)

    def _report(self, device_id: str, attempt: int, state: str, device_ms: int) -> None:
        seq = self._device_seq[device_id] = self._device_seq.get(device_id, 0) + 1
        report = StatusReport(self.action.id, device_id, state, seq, device_ms, attempt=attempt)
        self._seq += 1
        heapq.heappush(self._reports, (device_ms + self.rng.randint(*REPORT_DELAY_MS), self._seq, report))
