"""The soak's verdict on growth: where its warm window starts and the trend it judges.

Samples are built as a soak records them; the rules are what the footprint report states: warm once the
tail caches are full and the sessions steady, growth judged on the RSS right after each trim by the medians
of the first and last third of the warm window, not by a line through the raw RSS's sawtooth.
"""

from __future__ import annotations

from bench.soak_bench import MAX_HOURLY_GROWTH, SoakResult, SoakSample, robust_trend
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
    )


def soak(samples: list[SoakSample]) -> SoakResult:
    return SoakResult(SoakLoad(port=1), duration_s=samples[-1].at_s, warmup_s=0.0, samples=samples)


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


def test_warm_waits_for_pythons_blocks_to_reach_the_level_they_keep():
    """Bounded maps of untracked objects fill in steps (a step of 4.6 % at 250 s here): warm from the level
    they keep to the end, not from the first quiet minute."""
    samples = [
        sample(t, 170 * MIB, 168 * MIB, blocks=330_000 if t < 250 else 345_000 + (t % 7) * 500)
        for t in range(0, 691, 5)
    ]
    result = soak(samples)
    assert result.sessions_steady_at == 60
    assert result.blocks_steady_at == 250
    assert result.warm_from_s == 250


def test_a_leak_of_python_objects_leaves_no_warm_window_to_judge():
    samples = [sample(t, 170 * MIB, 168 * MIB, blocks=300_000 + 100 * t) for t in range(0, 691, 5)]
    result = soak(samples)
    assert result.warm[0].at_s > 600 and result.growth is None, "the last minute only: no trend"
