"""The soak's verdict on growth: where its warm window starts and the trend it judges.

Samples are built as a soak records them; the rules are what the footprint report states: warm past the
warm-up fixed before the run, once the tail caches are full, the sessions steady and the devices back once,
growth judged on the RSS right after each trim by the medians of the first and last third of the warm
window, not by a line through the raw RSS's sawtooth.
"""

from __future__ import annotations

from bench.soak_bench import MAX_HOURLY_GROWTH, RETURNED_SHARE, SoakResult, SoakSample, robust_trend
from bench.soak_load import SoakLoad

MIB = 2**20


def sample(
    at_s: float,
    rss: float,
    after_trim: float,
    *,
    sessions: int = 5000,
    full: bool = True,
    blocks: int = 1_000_000,
    returned: int = 5000,
) -> SoakSample:
    return SoakSample(
        at_s=at_s,
        rss=int(rss),
        open_files=6000,
        rss_anon=int(rss) - 15 * MIB,
        rss_file=15 * MIB,
        threads=15,
        cpu_s=at_s,
        published=int(at_s) * 5000,
        acked=int(at_s) * 5000,
        delivered=int(at_s) * 10_000,
        reconnects=int(at_s) * 25,
        devices_connected=4960,
        tail_cache_bytes=32 * MIB if full else MIB,
        tail_cache_max_bytes=32 * MIB,
        sessions=sessions,
        heap_trims=int(at_s // 30),
        rss_after_trim=int(after_trim),
        heap_in_use=100 * MIB,
        python_blocks=blocks,
        devices_returned=returned,
    )


def soak(samples: list[SoakSample], warmup_s: float = 0.0) -> SoakResult:
    return SoakResult(SoakLoad(port=1), duration_s=samples[-1].at_s, warmup_s=warmup_s, samples=samples)


def sawtooth(at_s: float) -> float:
    """Free pages building up between trims (every 30 s) and given back at each: up to 8 MiB."""
    return 8 * MIB * ((at_s % 30) / 30)


def test_the_median_trend_is_the_change_between_the_thirds_over_the_time_between_them():
    points = [(float(t), 100.0 + (10.0 if t >= 60 else 0.0)) for t in range(0, 90, 10)]
    trend = robust_trend(points)
    assert trend is not None
    assert (trend.first, trend.last, trend.spread, trend.points) == (100.0, 110.0, 0.0, 9)
    assert trend.per_hour == 10.0 / 60 * 3600  # the thirds' middles are 10 s and 70 s
    assert robust_trend(points[:5]) is None


def test_a_sawtooth_over_a_flat_heap_is_not_growth_though_its_least_squares_line_rises():
    samples = [
        sample(t, 170 * MIB + sawtooth(t) + (6 * MIB if t > 600 else 0), 168 * MIB) for t in range(0, 691, 5)
    ]
    result = soak(samples)
    assert (
        result.rss_least_squares_per_hour > MAX_HOURLY_GROWTH * result.warm_rss
    )  # the old rule said NOT met
    growth = result.growth
    assert growth is not None and growth.per_hour == 0.0
    assert not result.rss_grows


def test_a_heap_growing_after_each_trim_is_growth():
    samples = [sample(t, 170 * MIB + sawtooth(t) + t * 4000, 168 * MIB + t * 4000) for t in range(0, 691, 5)]
    result = soak(samples)
    growth = result.growth
    assert growth is not None and 13 * MIB < growth.per_hour < 14.5 * MIB  # 4,000 bytes/s
    assert result.rss_grows, (growth.per_hour / MIB, result.allowed_per_hour / MIB)


def test_one_point_per_trim_is_judged():
    samples = [sample(t, 170 * MIB, 168 * MIB) for t in range(0, 691, 5)]
    result = soak(samples)
    trend = result.trend("rss_after_trim")
    assert trend is not None and trend.points == len({s.heap_trims for s in result.warm}) < len(result.warm)


def test_warm_starts_once_the_caches_are_full_and_the_sessions_steady():
    samples = [
        sample(t, 170 * MIB, 168 * MIB, sessions=min(5000, 50 * t), full=t >= 50) for t in range(0, 300, 5)
    ]
    result = soak(samples)
    assert result.caches_full_at == 50
    assert result.sessions_steady_at == 160  # 5,000 sessions from 100 s on, and 60 s later still
    assert result.warm_from_s == 160 and result.warm[0].at_s == 160


def test_without_full_caches_there_is_no_warm_window_and_no_verdict():
    result = soak([sample(t, 170 * MIB, 168 * MIB, full=False) for t in range(0, 300, 5)])
    assert result.warm_from_s is None and result.warm == [] and result.growth is None
    assert not result.rss_grows


def test_warm_waits_for_the_devices_to_have_come_back_once():
    """The heaps settle while the connections of the start are replaced: warm once nearly every device has
    dropped its connection and resumed its session."""
    samples = [sample(t, 170 * MIB, 168 * MIB, returned=min(5000, 25 * t)) for t in range(0, 400, 5)]
    result = soak(samples)
    assert result.sessions_steady_at == 60
    assert result.returned_at == 200 == min(t for t in range(0, 400, 5) if 25 * t >= RETURNED_SHARE * 5000)
    assert result.warm_from_s == 200


def test_warm_starts_no_earlier_than_the_warm_up_fixed_before_the_run():
    samples = [sample(t, 170 * MIB, 168 * MIB) for t in range(0, 691, 5)]
    assert soak(samples).warm_from_s == 60
    assert soak(samples, warmup_s=345.0).warm_from_s == 345


def test_too_few_devices_back_leaves_no_warm_window():
    samples = [sample(t, 170 * MIB, 168 * MIB, returned=4900) for t in range(0, 400, 5)]
    result = soak(samples)
    assert result.returned_at is None and result.warm == [] and result.growth is None


def test_a_load_that_does_not_count_returning_devices_is_not_waited_for():
    samples = [sample(t, 170 * MIB, 168 * MIB, returned=-1) for t in range(0, 400, 5)]
    assert soak(samples).returned_at == 0.0 and soak(samples).warm_from_s == 60


def test_memory_that_never_settles_is_judged_and_fails():
    """The warm window is not chosen from the series it judges: a leak of Python objects, its blocks and RSS
    rising from start to end, gets a verdict of growth, not a window too short to judge."""
    samples = [
        sample(t, 170 * MIB + t * 4000, 168 * MIB + t * 4000, blocks=300_000 + 100 * t)
        for t in range(0, 691, 5)
    ]
    result = soak(samples, warmup_s=345.0)
    assert result.warm_from_s == 345
    growth = result.growth
    assert growth is not None and growth.points >= 6
    assert result.rss_grows
