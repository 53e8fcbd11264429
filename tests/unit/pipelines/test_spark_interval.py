"""Trigger intervals are read as Spark reads them: the same texts accepted, with the same length."""

from __future__ import annotations

import re

import pytest

from pipelines.spark_interval import interval_ms

TEXTS = [
    "1 second",
    "10 seconds",
    "500 milliseconds",
    "1 minute 30 seconds",
    "interval 2 SECONDS",
    " 1  Second ",
    "1.5 seconds",
    "0 seconds",
    "2 weeks",
    "1 hour",
    "5000000 microseconds",
    "1 microsecond",
    "+1 second",
    "1 seconds 1 seconds",
    "fast",
    "",
    "1",
    "1s",
    "1 sec",
    "1 min",
    "1 ms",
    "1 secon",
    "1 second,",
    "1.5 minutes",
    "1e3 milliseconds",
    "-1 second",
    "1 month",
    "1 year",
]


def spark_interval_ms(spark, text: str) -> int | None:
    """What Spark's own trigger makes of ``text``: its length in ms, or None when Spark refuses it."""
    trigger = spark._jvm.org.apache.spark.sql.streaming.Trigger
    try:
        return int(trigger.ProcessingTime(text).intervalMs())
    except Exception:
        return None


def ours(text: str) -> int | None:
    try:
        return interval_ms(text)
    except ValueError:
        return None


def test_the_same_texts_as_spark_and_the_same_lengths(spark):
    assert {text: ours(text) for text in TEXTS} == {text: spark_interval_ms(spark, text) for text in TEXTS}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("fast", "expected a number and a unit"),
        ("fast seconds", "'fast' is not a number"),
        ("1 min", "unknown unit 'min' (one of weeks, days, hours, minutes, seconds"),
        ("1 month", "months and years are not a fixed length"),
        ("-5 seconds", "cannot be negative"),
        ("1.5 minutes", "only seconds take a fraction"),
    ],
)
def test_a_refused_interval_says_why(text, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        interval_ms(text)
