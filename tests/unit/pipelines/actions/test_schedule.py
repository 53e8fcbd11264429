"""Schedules and maintenance windows: local times in IANA zones, across daylight saving, open time."""

from __future__ import annotations

from datetime import UTC, datetime

from pipelines.actions.schedule import MaintenanceWindow, Schedule


def ms(text: str) -> int:
    """Epoch ms of an ISO time in UTC."""
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def windows(*items: dict) -> Schedule:
    return Schedule(windows=tuple(MaintenanceWindow.from_row(item) for item in items))


def test_a_daily_window_keeps_its_local_time_across_a_daylight_saving_change():
    night = windows({"start": "02:00", "duration_min": 180, "time_zone": "Europe/Berlin"})
    # Saturday 28 March 2026 Berlin is UTC+1: 02:00-05:00 local is 01:00-04:00 UTC
    assert not night.in_window(ms("2026-03-28T00:59:59"))
    assert night.in_window(ms("2026-03-28T01:00:00"))
    assert night.in_window(ms("2026-03-28T03:59:59"))
    assert not night.in_window(ms("2026-03-28T04:00:00"))
    # Monday 30 March 2026, after the change to UTC+2: 02:00 local is 00:00 UTC
    assert night.in_window(ms("2026-03-30T00:00:00"))
    assert not night.in_window(ms("2026-03-30T03:00:00"))


def test_a_weekly_window_opens_on_its_days_only_and_may_run_past_midnight():
    weekend = windows({"days": ["sat", "sun"], "start": "22:00", "duration_min": 360, "time_zone": "UTC"})
    assert weekend.in_window(ms("2026-11-28T23:00:00"))  # Saturday night
    assert weekend.in_window(ms("2026-11-29T03:59:00"))  # Sunday early: Saturday's window
    assert weekend.in_window(ms("2026-11-30T03:00:00"))  # Monday early: Sunday's window
    assert not weekend.in_window(ms("2026-11-30T04:00:00"))
    assert not weekend.in_window(ms("2026-11-27T23:00:00"))  # a Friday
    assert weekend.next_opening(ms("2026-11-30T12:00:00")) == ms("2026-12-05T22:00:00")


def test_open_time_counts_only_the_windows_and_overlaps_once():
    hour = windows({"start": "10:00", "duration_min": 60, "time_zone": "UTC"})
    assert hour.open_ms(ms("2026-11-01T00:00:00"), ms("2026-11-03T00:00:00")) == 2 * 3600_000
    assert hour.open_ms(ms("2026-11-01T10:30:00"), ms("2026-11-01T12:00:00")) == 1800_000
    overlapping = windows(
        {"start": "10:00", "duration_min": 60, "time_zone": "UTC"},
        {"start": "10:30", "duration_min": 60, "time_zone": "UTC"},
    )
    assert overlapping.open_ms(ms("2026-11-01T00:00:00"), ms("2026-11-02T00:00:00")) == 90 * 60_000
    assert Schedule().open_ms(0, 5_000) == 5_000  # no windows: always open
    assert Schedule().next_opening(0) is None


def test_start_and_end():
    schedule = Schedule(start_at_ms=1_000, end_at_ms=5_000)
    assert not schedule.started(999) and schedule.started(1_000)
    assert not schedule.ended(4_999) and schedule.ended(5_000)
    assert [schedule.may_send(t) for t in (500, 1_000, 4_999, 5_000)] == [False, True, True, False]
    assert schedule.timed and not Schedule().timed
