"""The times a timestamp column holds: the years 0001 to 9999, what Spark's ``TimestampType`` and Python's
``datetime`` hold. A device's clock or a row written by another tool may say a time outside them (a clock
counting nanoseconds, microseconds written as seconds); converting it fails (Spark's ``DATETIME_OVERFLOW``,
Python's ``OverflowError``), and a job that converts every value of a batch would fail on that one again
and again. Telemetry, Sparkplug B and the ``actions`` table compare against these before converting.
"""

from __future__ import annotations

__all__ = ["FIRST_SECOND", "LAST_SECOND", "first_tick", "last_tick"]

FIRST_SECOND = -62_135_596_800
"""0001-01-01T00:00:00Z in seconds since 1970: the first second a timestamp holds."""
LAST_SECOND = 253_402_300_799
"""9999-12-31T23:59:59Z in seconds since 1970: the last second a timestamp holds."""


def first_tick(per_second: int) -> int:
    """The first time a timestamp holds, in ticks of ``1 / per_second`` s since 1970 (1000: milliseconds)."""
    return FIRST_SECOND * per_second


def last_tick(per_second: int) -> int:
    """The last time a timestamp holds, in ticks of ``1 / per_second`` s since 1970 (the last tick of its
    last second)."""
    return (LAST_SECOND + 1) * per_second - 1
