"""When an action may send anything new to devices: its scheduled start and end, and maintenance windows.

Windows recur daily or on given days of the week, at a local time of day in an IANA time zone
(``zoneinfo``), so a window at 02:00 Europe/Berlin stays at 02:00 local time across daylight saving changes.
Outside every window nothing new goes out (no first message, no retry); stopping (a cancel) always may.
A paced rollout earns its rate only while a window is open: :meth:`Schedule.open_ms` is the time in windows
between two instants, so a window that opens after a night closed does not start with a burst.

Everything here is a function of the times handed in (epoch milliseconds): no clock is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from pipelines.actions.checks import WEEKDAYS

__all__ = ["END_CANCEL", "END_STOP", "MaintenanceWindow", "Schedule"]

END_STOP = "stop"
"""At the end: devices not sent to are canceled, devices working on it finish."""
END_CANCEL = "cancel"
"""At the end: devices working on it are told to stop as well."""
_DAY_MS = 24 * 3600 * 1000


def to_ms(value: datetime | int | None) -> int | None:
    """Epoch milliseconds of a table timestamp (timezone-aware datetimes from Arrow)."""
    if value is None or isinstance(value, int):
        return value
    return int(value.timestamp() * 1000)


@dataclass(frozen=True)
class MaintenanceWindow:
    """``duration_min`` minutes from ``start`` (minutes after local midnight), every day or on ``days``."""

    start_minute: int
    duration_min: int
    zone: ZoneInfo
    days: frozenset[int] | None = None
    """Weekdays (0 = Monday) the window opens on; None: every day."""

    @classmethod
    def from_row(cls, item: Mapping[str, Any]) -> MaintenanceWindow:
        """An item of ``maintenance_windows`` (checked by ``validation.py``)."""
        hours, minutes = (int(part) for part in str(item["start"]).split(":"))
        days = item.get("days")
        return cls(
            start_minute=hours * 60 + minutes,
            duration_min=int(item["duration_min"]),
            zone=ZoneInfo(item.get("time_zone") or "UTC"),
            days=None if days is None else frozenset(WEEKDAYS.index(day) for day in days),
        )

    def occurrences(self, start_ms: int, end_ms: int) -> Iterator[tuple[int, int]]:
        """Every opening of this window, as (open, close) in epoch ms, that overlaps [start_ms, end_ms)."""
        span = timedelta(minutes=self.duration_min)
        first = _local_date(start_ms, self.zone) - timedelta(days=self.duration_min // (24 * 60) + 1)
        last = _local_date(end_ms, self.zone)
        at = time(self.start_minute // 60, self.start_minute % 60)
        day = first
        while day <= last:
            if self.days is None or day.weekday() in self.days:
                opens = datetime.combine(day, at, tzinfo=self.zone)
                open_ms = int(opens.timestamp() * 1000)
                close_ms = open_ms + int(span.total_seconds() * 1000)
                if close_ms > start_ms and open_ms < end_ms:
                    yield open_ms, close_ms
            day += timedelta(days=1)


def _local_date(ms: int, zone: ZoneInfo) -> date:
    return datetime.fromtimestamp(ms / 1000, zone).date()


@dataclass(frozen=True)
class Schedule:
    """An action's time rules: not before ``start_at``, nothing new after ``end_at``, only in windows."""

    start_at_ms: int | None = None
    end_at_ms: int | None = None
    end_behavior: str = END_STOP
    windows: tuple[MaintenanceWindow, ...] = ()

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Schedule:
        schedule = row.get("schedule") or {}
        windows = row.get("maintenance_windows") or ()
        return cls(
            start_at_ms=to_ms(schedule.get("start_at")),
            end_at_ms=to_ms(schedule.get("end_at")),
            end_behavior=schedule.get("end_behavior") or END_STOP,
            windows=tuple(MaintenanceWindow.from_row(item) for item in windows),
        )

    @property
    def timed(self) -> bool:
        """Whether anything here depends on the time (the ticker must look at the action)."""
        return self.start_at_ms is not None or self.end_at_ms is not None or bool(self.windows)

    def started(self, now_ms: int) -> bool:
        return self.start_at_ms is None or now_ms >= self.start_at_ms

    def ended(self, now_ms: int) -> bool:
        return self.end_at_ms is not None and now_ms >= self.end_at_ms

    def may_send(self, now_ms: int) -> bool:
        """Whether something new may go out to devices now."""
        return self.started(now_ms) and not self.ended(now_ms) and self.in_window(now_ms)

    def in_window(self, now_ms: int) -> bool:
        return not self.windows or self.open_ms(now_ms, now_ms + 1) > 0

    def open_ms(self, start_ms: int, end_ms: int) -> int:
        """Milliseconds of [start_ms, end_ms) inside a window (all of it when there are no windows)."""
        if end_ms <= start_ms:
            return 0
        if not self.windows:
            return end_ms - start_ms
        spans = sorted(
            (max(opens, start_ms), min(closes, end_ms))
            for window in self.windows
            for opens, closes in window.occurrences(start_ms, end_ms)
        )
        return _covered(spans)

    def next_opening(self, now_ms: int, horizon_days: int = 8) -> int | None:
        """When the next window opens after ``now_ms`` (None: no windows, or none within the horizon)."""
        if not self.windows:
            return None
        horizon = now_ms + horizon_days * _DAY_MS
        openings = [
            opens
            for window in self.windows
            for opens, _ in window.occurrences(now_ms, horizon)
            if opens > now_ms
        ]
        return min(openings, default=None)


def _covered(spans: Sequence[tuple[int, int]]) -> int:
    """Total length of sorted (start, end) spans, overlaps counted once."""
    total = 0
    reach = None
    for start, end in spans:
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total
