"""How many per-device publishes a rate-limited rollout may make by now."""

from __future__ import annotations


def rollout_allowance(max_per_minute: int, started_at_ms: int, now_ms: int, already_published: int) -> int:
    """Devices that may be published to now so that the rollout never runs ahead of ``max_per_minute``.

    The first publish of a rollout may go at once; after that the rate is a straight line from the start,
    so a slow tick catches up but never bursts beyond what the rate allows since the start.
    """
    if max_per_minute <= 0:
        raise ValueError("max_per_minute must be positive")
    elapsed_ms = max(0, now_ms - started_at_ms)
    allowed_total = 1 + (max_per_minute * elapsed_ms) // 60_000
    return max(0, int(allowed_total) - already_published)
