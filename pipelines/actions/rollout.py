"""How many devices a rollout may have sent its action to by now: constant or exponential rates.

A constant rate (``rollout.max_per_minute``) is a straight line from the start. An exponential rate
(``exponential_rate``, as AWS IoT Jobs has it) starts at ``base_per_minute`` and is multiplied by
``increment_factor`` each time ``notified_devices`` more devices have been sent the action, or each time
``succeeded_devices`` more have succeeded, never above ``rollout.max_per_minute`` (or
:data:`MAX_RATE_PER_MINUTE`). In both the first device goes at once, and the count is a function of the
start, the time elapsed in which sending was allowed (maintenance windows, ``schedule.py``) and what the
executions table says: the job keeps no pacing state of its own, so a slow tick or a restart catches up to
the line and never bursts beyond it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_RATE_PER_MINUTE", "Pace"]

MAX_RATE_PER_MINUTE = 1_000_000
"""The ceiling of an exponential rate without ``rollout.max_per_minute``."""
_MINUTE_MS = 60_000

OpenMs = Callable[[int, int], int]
"""Milliseconds between two instants in which sending was allowed (``Schedule.open_ms``)."""


@dataclass(frozen=True)
class Pace:
    """The rate of a paced rollout; neither a rate nor a base: unpaced (everyone at once)."""

    max_per_minute: int | None = None
    base_per_minute: int | None = None
    increment_factor: float = 1.0
    notified_devices: int | None = None
    """Grow the rate each time this many more devices have been sent the action."""
    succeeded_devices: int | None = None
    """Grow the rate each time this many more devices have succeeded."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Pace:
        rollout = row.get("rollout") or {}
        growth = row.get("exponential_rate") or {}
        rate = None if rollout.get("broadcast") else rollout.get("max_per_minute")
        return cls(
            max_per_minute=int(rate) if rate else None,
            base_per_minute=growth.get("base_per_minute"),
            increment_factor=float(growth.get("increment_factor") or 1.0),
            notified_devices=growth.get("notified_devices"),
            succeeded_devices=growth.get("succeeded_devices"),
        )

    @property
    def paced(self) -> bool:
        return self.max_per_minute is not None or self.base_per_minute is not None

    @property
    def exponential(self) -> bool:
        return self.base_per_minute is not None

    @property
    def ceiling(self) -> int:
        return self.max_per_minute or MAX_RATE_PER_MINUTE

    def rate(self, step: int) -> float:
        """Devices per minute after the rate has grown ``step`` times."""
        if self.base_per_minute is None:
            return float(self.ceiling)
        exponent = min(step, 10_000)
        try:
            grown = self.base_per_minute * self.increment_factor**exponent
        except OverflowError:
            grown = math.inf
        return float(min(grown, self.ceiling))

    def allowed(
        self,
        start_ms: int,
        now_ms: int,
        open_ms: OpenMs,
        sent_before: int,
        limit: int,
        successes_ms: Sequence[int] = (),
    ) -> int:
        """Devices that may have been sent since ``start_ms`` by ``now_ms`` (the first at once), at most
        ``limit``.

        ``sent_before``: devices of the action sent before ``start_ms`` (an earlier phase), which count
        towards an exponential rate's growth by devices notified; ``successes_ms``: when the action's
        devices succeeded, sorted, for growth by devices succeeded.
        """
        if limit <= 0 or now_ms < start_ms:
            return 0
        if not self.paced:
            return limit
        if self.succeeded_devices:
            minutes = self._minutes_by_success(start_ms, now_ms, open_ms, successes_ms)
            return min(limit, 1 + int(minutes))
        elapsed = open_ms(start_ms, now_ms)
        if not self.exponential or not self.notified_devices:
            return min(limit, 1 + (self.ceiling * elapsed) // _MINUTE_MS)
        return min(limit, self._by_notified(elapsed, sent_before, limit))

    def _by_notified(self, elapsed_ms: int, sent_before: int, limit: int) -> int:
        """Walk the rate's steps: each lasts until ``notified_devices`` more devices went out."""
        step_size = self.notified_devices or 1
        sent = sent_before + 1  # the first device goes at once
        credit = float(elapsed_ms)
        while sent - sent_before < limit:
            step = sent // step_size
            rate = self.rate(step)
            if rate >= self.ceiling:  # no more growth: a straight line from here
                sent += int(credit * rate // _MINUTE_MS)
                break
            boundary = (step + 1) * step_size
            cost = (boundary - sent) * _MINUTE_MS / rate
            if credit < cost:
                sent += int(credit * rate // _MINUTE_MS)
                break
            credit -= cost
            sent = boundary
        return sent - sent_before

    def _minutes_by_success(
        self, start_ms: int, now_ms: int, open_ms: OpenMs, successes_ms: Sequence[int]
    ) -> float:
        """Devices earned since the start: each stretch between the rate's growths, at its rate."""
        step_size = self.succeeded_devices or 1
        growths = [successes_ms[i - 1] for i in range(step_size, len(successes_ms) + 1, step_size)]
        earned = 0.0
        at, step = start_ms, 0
        for grown_at in growths:
            if grown_at > at:
                if grown_at >= now_ms:
                    break
                earned += open_ms(at, grown_at) * self.rate(step) / _MINUTE_MS
                at = grown_at
            step += 1
            if self.rate(step) >= self.ceiling:
                break
        return earned + open_ms(at, now_ms) * self.rate(step) / _MINUTE_MS
