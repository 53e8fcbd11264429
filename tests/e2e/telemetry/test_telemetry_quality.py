"""Data quality: the Spark expressions that route rows agree with Great Expectations on the same rows."""

from __future__ import annotations

import json

import pytest
from chispa import assert_column_equality
from pyspark.sql import functions as F

from pipelines.telemetry import quality as Q
from pipelines.telemetry import transforms as T
from pipelines.telemetry.config import (
    ExpectationConfig,
    GxRunConfig,
    SuiteConfig,
    load_telemetry_config,
)
from tests.e2e.telemetry.telemetry_harness import at, record, records, telemetry

pytestmark = pytest.mark.spark

CONFIG = load_telemetry_config(None)
TYPES = CONFIG.payload.fields

SUITES = [
    SuiteConfig(
        "ranges",
        [
            ExpectationConfig("expect_column_values_to_not_be_null", "temperature"),
            ExpectationConfig(
                "expect_column_values_to_be_between", "temperature", min_value=-40, max_value=125
            ),
            ExpectationConfig(
                "expect_column_values_to_be_between", "humidity", min_value=0, max_value=100, mostly=0.5
            ),
            ExpectationConfig(
                "expect_column_value_lengths_to_be_between", "firmware", min_value=5, max_value=8
            ),
        ],
    ),
    SuiteConfig(
        "sets",
        [
            ExpectationConfig("expect_column_values_to_be_in_set", "group", value_set=["blue", "red"]),
            ExpectationConfig("expect_column_values_to_not_be_in_set", "firmware", value_set=["0.0.0"]),
            ExpectationConfig("expect_column_values_to_match_regex", "device_id", regex="^dev-[0-9]+$"),
        ],
    ),
]


@pytest.fixture(scope="module")
def parsed(spark):
    rows = [
        telemetry("dev-1", 0, seq=1),
        telemetry("dev-2", 1, seq=1, temperature=None, group=None),
        telemetry("dev-3", 2, seq=1, temperature=200.0, humidity=101.0, group="green"),
        telemetry("dev-4", 3, seq=1, firmware="0.0.0", humidity=-1.0),
        telemetry("DEV_5", 4, seq=1, firmware="1.0.0-beta.1"),
        record("devices/dev-6/telemetry", 5, b"{oops"),
    ]
    frame = T.parse_telemetry(T.to_bronze(records(spark, rows), at(0)), CONFIG.payload)
    return frame.cache()


def test_row_failure_conditions_follow_gx_semantics(spark):
    frame = spark.createDataFrame(
        [(None, None, True), (float("nan"), None, True), (-41.0, "x", True), (125.0, "blue", False)],
        "temperature double, group string, expected boolean",
    )
    between = Q.row_failure_condition(
        ExpectationConfig("expect_column_values_to_be_between", "temperature", min_value=-40, max_value=125),
        TYPES,
    )
    strict = ExpectationConfig(
        "expect_column_values_to_be_between", "temperature", min_value=-40, max_value=125, strict_max=True
    )
    not_null = ExpectationConfig("expect_column_values_to_not_be_null", "temperature")
    out = frame.select(
        Q.row_failure_condition(not_null, TYPES).alias("not_null"),
        between.alias("between"),
        Q.row_failure_condition(strict, TYPES).alias("strict"),
        F.col("expected"),
    )
    # Null and NaN are "missing": only not_null fails them; 125 is in range unless strict_max.
    assert [tuple(r) for r in out.collect()] == [
        (True, False, False, True),
        (True, False, False, True),
        (False, True, True, True),
        (False, False, True, False),
    ]
    in_set = ExpectationConfig("expect_column_values_to_be_in_set", "group", value_set=["blue"])
    expected = F.col("group").isNotNull() & F.coalesce(F.col("group") != "blue", F.lit(False))
    flagged = frame.select(Q.row_failure_condition(in_set, TYPES).alias("actual"), expected.alias("expected"))
    assert_column_equality(flagged, "actual", "expected")


def test_expressions_and_gx_pandas_agree_on_every_expectation(parsed):
    expressions = Q.expression_outcomes(parsed, SUITES, TYPES)
    columns = ["device_id", "event_time", "temperature", "humidity", "group", "firmware"]
    gx, rows_validated = Q.gx_outcomes(Q.GxValidator(SUITES, "pandas"), parsed, columns, max_rows=1000)
    assert rows_validated == 5  # the unparseable row is the pipeline's own check, not GX's
    by_key = {(o.suite, o.expectation): o for o in gx}
    assert len(by_key) == 7
    for outcome in expressions[1:]:
        validated = by_key[(outcome.suite, outcome.expectation)]
        assert (validated.element_count, validated.unexpected_count, validated.success) == (
            outcome.element_count,
            outcome.unexpected_count,
            outcome.success,
        ), outcome.expectation
    counts = {o.expectation: (o.unexpected_count, o.success) for o in expressions}
    assert counts == {
        Q.PARSEABLE_PAYLOAD: (1, False),
        "expect_column_values_to_not_be_null(temperature)": (1, False),
        "expect_column_values_to_be_between(temperature)": (1, False),
        "expect_column_values_to_be_between(humidity)": (2, True),  # mostly=0.5: 3 of 5 pass
        "expect_column_value_lengths_to_be_between(firmware)": (1, False),
        "expect_column_values_to_be_in_set(group)": (1, False),
        "expect_column_values_to_not_be_in_set(firmware)": (1, False),
        "expect_column_values_to_match_regex(device_id)": (1, False),
    }


def test_gx_spark_engine_validates_the_batch_dataframe(parsed):
    suites = [SUITES[0]]
    gx, rows_validated = Q.gx_outcomes(
        Q.GxValidator(suites, "spark"), parsed, ["temperature", "humidity", "firmware"], 3
    )
    assert rows_validated == 3
    assert {o.expectation for o in gx} == {e.name for e in suites[0].expectations}
    assert all(o.element_count == 3 and o.observed["gx_engine"] == "spark" for o in gx)


def test_merge_outcomes_prefers_gx_and_keeps_the_batch_counts(parsed):
    expressions = Q.expression_outcomes(parsed, SUITES, TYPES)
    gx, n = Q.gx_outcomes(
        Q.GxValidator(SUITES, "pandas"),
        parsed,
        ["device_id", "temperature", "humidity", "group", "firmware"],
        2,
    )
    merged = Q.merge_outcomes(expressions, gx, n)
    assert len(merged) == len(expressions)
    first = merged[0]
    assert first.observed["engine"] == Q.ENGINE_SPARK_EXPRESSIONS  # the pipeline's own parse check
    between = next(o for o in merged if o.expectation == "expect_column_values_to_be_between(temperature)")
    assert between.observed["engine"] == Q.ENGINE_GX and between.element_count == 2
    assert between.observed["rows_in_batch"] == 5 and between.observed["batch_unexpected_count"] == 1
    assert Q.merge_outcomes(expressions, None) == expressions
    rows = Q.outcome_rows(merged, "run", 3, at(0))
    assert [rows[1][k] for k in ("run_id", "batch_id", "suite", "expectation")] == [
        "run",
        3,
        "ranges",
        "expect_column_values_to_not_be_null(temperature)",
    ]
    assert json.loads(rows[1]["observed_value"])["engine"] == Q.ENGINE_GX


def test_gx_schedule():
    now = [100.0]
    interval = Q.GxSchedule(GxRunConfig(schedule="interval", interval_seconds=60), clock=lambda: now[0])
    assert interval.due(0)
    interval.ran()
    now[0] = 159.0
    assert not interval.due(1)
    now[0] = 160.0
    assert interval.due(2)
    every_3 = Q.GxSchedule(GxRunConfig(schedule="every_n_batches", every_n_batches=3))
    assert [b for b in range(7) if every_3.due(b)] == [0, 3, 6]
    assert Q.GxSchedule(GxRunConfig()).due(5)
    assert not Q.GxSchedule(GxRunConfig(schedule="never")).due(0)
