"""How many devices a rollout may have reached: constant and exponential rates, windows, the ceiling."""

from __future__ import annotations

from pipelines.actions.rollout import Pace


def always(start: int, end: int) -> int:
    return max(0, end - start)


def test_a_constant_rate_counts_only_open_time():
    pace = Pace(max_per_minute=60)
    in_two_windows = lambda start, end: sum(  # noqa: E731
        max(0, min(end, hi) - max(start, lo)) for lo, hi in ((0, 10_000), (20_000, 30_000))
    )
    assert pace.allowed(0, 25_000, always, 0, 1_000) == 26
    assert pace.allowed(0, 25_000, in_two_windows, 0, 1_000) == 16  # 15 s open: no burst at reopening


def test_exponential_growth_by_devices_notified_up_to_the_ceiling():
    pace = Pace(max_per_minute=240, base_per_minute=60, increment_factor=2.0, notified_devices=10)
    allowed = [pace.allowed(0, s * 1000, always, 0, 10_000) for s in (0, 9, 14, 29)]
    # 1/s until 10 devices (9 s after the first), 2/s until 20 (5 s more), then the ceiling 4/s
    assert allowed == [1, 10, 20, 80]
    # devices sent in an earlier phase count towards growth: 15 sent before, so the rate is 2/s at once
    assert pace.allowed(0, 2_000, always, sent_before=15, limit=10_000) == 5


def test_exponential_growth_by_devices_succeeded():
    pace = Pace(base_per_minute=60, increment_factor=2.0, succeeded_devices=2)
    # two successes by 6 s: 1/s for 6 s, then 2/s for 4 s, and the first device at once
    assert pace.allowed(0, 10_000, always, 0, 10_000, successes_ms=[5_000, 6_000]) == 15
    assert pace.allowed(0, 10_000, always, 0, 10_000, successes_ms=[5_000]) == 11


def test_limits_and_the_rate_without_a_ceiling():
    pace = Pace(base_per_minute=60, increment_factor=5.0, notified_devices=1)
    assert pace.allowed(0, 3_600_000, always, 0, limit=500) == 500
    assert pace.allowed(5_000, 1_000, always, 0, limit=500) == 0  # not started
    assert pace.rate(100) == 1_000_000  # the default ceiling
    assert not Pace().paced and Pace(max_per_minute=1).paced
