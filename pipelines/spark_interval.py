"""Spark interval strings (a processing-time trigger such as ``10 seconds``), read the way Spark reads them.

``DataStreamWriter.trigger(processingTime=...)`` hands the text to the JVM, which refuses a bad one only
when the query starts: after the session is up and the tables are opened, as a Java stack. Checking the
text here lets a configuration error name its key before anything starts. The grammar is Spark's
(``IntervalUtils.stringToInterval``, checked against it in ``tests/unit/pipelines/test_spark_interval.py``):
an optional ``interval``, then one or more ``<number> <unit>``; units from microseconds to weeks, singular or
plural, in any case; a fraction only for seconds; no months or years; not negative in total.
"""

from __future__ import annotations

import re

__all__ = ["interval_ms"]

_MICROS = {
    "week": 7 * 86_400_000_000,
    "day": 86_400_000_000,
    "hour": 3_600_000_000,
    "minute": 60_000_000,
    "second": 1_000_000,
    "millisecond": 1_000,
    "microsecond": 1,
}
_NUMBER = re.compile(r"^[+-]?\d+(\.\d+)?$")


def interval_ms(text: str) -> int:
    """The interval in milliseconds (microseconds truncated, as Spark does); ValueError saying what is
    wrong otherwise."""
    words = text.split()
    if words and words[0].lower() == "interval":
        words = words[1:]
    if not words:
        raise ValueError("empty interval; expected e.g. '10 seconds' or '1 minute 30 seconds'")
    if len(words) % 2:
        raise ValueError(
            f"{text!r}: expected a number and a unit, e.g. '10 seconds' or '1 minute 30 seconds'"
        )
    total = 0
    for number, unit in zip(words[::2], words[1::2], strict=True):
        if not _NUMBER.match(number):
            raise ValueError(f"{text!r}: {number!r} is not a number")
        name = unit.lower().removesuffix("s")
        if name in ("month", "year"):
            raise ValueError(f"{text!r}: months and years are not a fixed length, not a trigger interval")
        if name not in _MICROS:
            units = ", ".join(f"{u}s" for u in _MICROS)
            raise ValueError(f"{text!r}: unknown unit {unit!r} (one of {units})")
        whole, _, fraction = number.partition(".")
        if fraction and name != "second":
            raise ValueError(f"{text!r}: only seconds take a fraction ({number} {unit})")
        sign = -1 if whole.startswith("-") else 1
        micros = abs(int(whole)) * _MICROS[name] + int((fraction + "000000")[:6]) * (name == "second")
        total += sign * micros
    if total < 0:
        raise ValueError(f"{text!r}: a trigger interval cannot be negative")
    return total // 1000
