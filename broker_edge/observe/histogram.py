"""A histogram of fixed buckets: observations counted where they fall, exposed as Prometheus' ``le`` buckets.

Kept as plain counts, one per bucket (``observe`` is a bisect and two additions), and turned into the
cumulative series of the exposition format only when ``/metrics`` is scraped
(``metrics.BrokerMetrics.histogram``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

__all__ = ["COMMIT_SECONDS", "Histogram"]

COMMIT_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Bucket bounds for a log commit's seconds: a local SSD's fdatasync (under a millisecond) to a disk in
trouble (seconds)."""


class Histogram:
    """Counts of observations at most each bound (``le``), and above the last; their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram bounds must be increasing and distinct, got {list(bounds)}")
        self.bounds = tuple(float(bound) for bound in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        """Observations per bucket (not cumulative); the last, those above every bound."""
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, observations at most le)`` for every bound, then ``("+Inf", count)``."""
        out: list[tuple[str, int]] = []
        total = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out
