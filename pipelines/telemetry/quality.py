"""Data quality: the configured Great Expectations suites, used two ways.

A GX validation on a Spark DataFrame runs many Spark jobs, too slow to gate every micro-batch at a short
trigger (docs/telemetry-pipeline.md has the measured costs). So each declared expectation is *also* compiled
into a Spark column expression with GX's own semantics (nulls ignored except by ``not_null``, NaN counted as
missing as GX's pandas engine does). Those expressions route every row of every batch (quarantine or silver)
and count failures in one aggregation on the executors. The real GX validation runs on its schedule, on a
sample of at most ``quality.gx.max_rows`` of the batch's rows (by default collected to pandas, much cheaper
than GX on Spark), and its results are what ``dq_results`` records for the batches it validates. Tests
check that both engines agree on the same rows.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .config import ExpectationConfig, GxRunConfig, SuiteConfig

log = logging.getLogger(__name__)

ENGINE_SPARK_EXPRESSIONS = "spark_expressions"
ENGINE_GX = "great_expectations"

#: The check the pipeline itself makes before any expectation, reported in dq_results like one.
PIPELINE_SUITE = "pipeline"
PARSEABLE_PAYLOAD = "payload_is_json_of_declared_types"

#: Column types whose NaN counts as missing (as GX's pandas engine counts it).
FLOATING = frozenset({"float", "double"})


def qualified_name(suite: SuiteConfig, expectation: ExpectationConfig) -> str:
    """How quarantine rows name a failed expectation: ``suite.type(column)``."""
    return f"{suite.name}.{expectation.name}"


def _missing(expectation: ExpectationConfig, column_types: Mapping[str, str]) -> Column:
    value = F.col(expectation.column)
    if column_types.get(expectation.column, "") in FLOATING:
        return value.isNull() | F.isnan(value)
    return value.isNull()


def row_failure_condition(expectation: ExpectationConfig, column_types: Mapping[str, str]) -> Column:
    """A boolean column, never null, true when a row violates ``expectation`` as GX would count it."""
    value = F.col(expectation.column)
    missing = _missing(expectation, column_types)
    kind = expectation.type
    if kind == "expect_column_values_to_not_be_null":
        return missing
    if kind in ("expect_column_values_to_be_between", "expect_column_value_lengths_to_be_between"):
        measured = F.length(value) if kind == "expect_column_value_lengths_to_be_between" else value
        within = F.lit(True)
        if expectation.min_value is not None:
            low = F.lit(expectation.min_value)
            within = within & (measured > low if expectation.strict_min else measured >= low)
        if expectation.max_value is not None:
            high = F.lit(expectation.max_value)
            within = within & (measured < high if expectation.strict_max else measured <= high)
        ok = within
    elif kind == "expect_column_values_to_be_in_set":
        ok = value.isin(list(expectation.value_set or []))
    elif kind == "expect_column_values_to_not_be_in_set":
        ok = ~value.isin(list(expectation.value_set or []))
    elif kind == "expect_column_values_to_match_regex":
        ok = value.cast("string").rlike(expectation.regex or "")
    else:  # pragma: no cover - config.ExpectationType lists exactly the kinds above
        raise ValueError(f"no row expression for {kind}")
    return F.when(missing, F.lit(False)).otherwise(F.coalesce(~ok, F.lit(True)))


def row_failure_conditions(
    suites: Sequence[SuiteConfig], column_types: Mapping[str, str]
) -> dict[str, Column]:
    """Every expectation of every suite, by qualified name, as a row failure condition."""
    return {
        qualified_name(suite, expectation): row_failure_condition(expectation, column_types)
        for suite in suites
        for expectation in suite.expectations
    }


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation evaluated on one batch: a ``dq_results`` row without its run/batch identity."""

    suite: str
    expectation: str
    column: str | None
    success: bool
    element_count: int
    unexpected_count: int
    observed: dict[str, Any] = field(default_factory=dict)


def _success(unexpected: int, nonmissing: int, mostly: float) -> bool:
    """GX's rule: the share of non-missing values that meet the expectation is at least ``mostly``."""
    if nonmissing == 0:
        return True
    return (nonmissing - unexpected) / nonmissing >= mostly


def expression_aggregates(suites: Sequence[SuiteConfig], column_types: Mapping[str, str]) -> list[Column]:
    """Aggregate columns counting, per expectation, failing and missing values among the parsed rows.

    Kept separate from :func:`outcomes_from_counts` so the job can fold them into the one aggregation it
    runs over a batch anyway (every Spark job adds a fixed overhead, large at micro-batch scale).
    """
    ok = ~F.col("parse_error")
    aggregates = [F.count(F.lit(1)).alias("dq_rows"), F.count(F.when(ok, 1)).alias("dq_parsed")]
    entries = [e for suite in suites for e in suite.expectations]
    for i, expectation in enumerate(entries):
        failing = ok & row_failure_condition(expectation, column_types)
        aggregates.append(F.count(F.when(failing, 1)).alias(f"dq_u{i}"))
        aggregates.append(F.count(F.when(ok & _missing(expectation, column_types), 1)).alias(f"dq_m{i}"))
    return aggregates


def outcomes_from_counts(
    counts: Mapping[str, Any], suites: Sequence[SuiteConfig]
) -> list[ExpectationOutcome]:
    """Turn the counts of :func:`expression_aggregates` into outcomes, with GX's success rule."""
    rows, parsed_rows = int(counts["dq_rows"]), int(counts["dq_parsed"])
    outcomes = [
        ExpectationOutcome(
            PIPELINE_SUITE,
            PARSEABLE_PAYLOAD,
            None,
            parsed_rows == rows,
            rows,
            rows - parsed_rows,
            {"engine": ENGINE_SPARK_EXPRESSIONS, "rows_in_batch": rows},
        )
    ]
    entries = [(suite, e) for suite in suites for e in suite.expectations]
    for i, (suite, expectation) in enumerate(entries):
        unexpected, missing = int(counts[f"dq_u{i}"]), int(counts[f"dq_m{i}"])
        not_null = expectation.type == "expect_column_values_to_not_be_null"
        nonmissing = parsed_rows if not_null else parsed_rows - missing
        outcomes.append(
            ExpectationOutcome(
                suite.name,
                expectation.name,
                expectation.column,
                _success(unexpected, nonmissing, expectation.mostly),
                parsed_rows,
                unexpected,
                {
                    "engine": ENGINE_SPARK_EXPRESSIONS,
                    "rows_in_batch": parsed_rows,
                    "missing_count": missing,
                    "unexpected_percent": 100.0 * unexpected / nonmissing if nonmissing else 0.0,
                    "mostly": expectation.mostly,
                },
            )
        )
    return outcomes


def expression_outcomes(
    parsed: DataFrame, suites: Sequence[SuiteConfig], column_types: Mapping[str, str]
) -> list[ExpectationOutcome]:
    """Evaluate every expectation with the Spark expressions over ``parsed`` (all telemetry rows of a batch).

    Unparseable rows count against ``PARSEABLE_PAYLOAD`` only; the expectations are evaluated on the rows
    that parsed, which are exactly the rows GX validates.
    """
    counts = parsed.agg(*expression_aggregates(suites, column_types)).first()
    assert counts is not None, "an aggregate without grouping has one row"
    return outcomes_from_counts(counts.asDict(), suites)


class GxValidator:
    """Runs the declared suites through Great Expectations, on pandas or Spark data.

    The ephemeral context, data source and validation definitions are built once (on first use) and
    reused for every batch; only the data changes between runs.
    """

    def __init__(self, suites: Sequence[SuiteConfig], engine: str = "pandas") -> None:
        self.suites = list(suites)
        self.engine = engine
        self._definitions: list[tuple[SuiteConfig, Any]] | None = None

    def _build(self) -> list[tuple[SuiteConfig, Any]]:
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
        import great_expectations as gx
        import great_expectations.expectations as gxe
        from great_expectations.data_context.types.base import ProgressBarsConfig

        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        if self.engine == "spark":
            spark_asset = context.data_sources.add_spark("telemetry_spark").add_dataframe_asset(
                "telemetry_batch"
            )
            batch = spark_asset.add_batch_definition_whole_dataframe("batch")
        else:
            pandas_asset = context.data_sources.add_pandas("telemetry_pandas").add_dataframe_asset(
                "telemetry_batch"
            )
            batch = pandas_asset.add_batch_definition_whole_dataframe("batch")
        definitions = []
        for suite_config in self.suites:
            suite = context.suites.add(gx.ExpectationSuite(name=suite_config.name))
            for expectation in suite_config.expectations:
                cls = getattr(gxe, _gx_class_name(expectation.type))
                suite.add_expectation(cls(**expectation.gx_kwargs(), meta={"name": expectation.name}))
            definition = gx.ValidationDefinition(name=f"{suite_config.name}_batch", data=batch, suite=suite)
            definitions.append((suite_config, context.validation_definitions.add(definition)))
        return definitions

    def validate(self, data: Any) -> list[ExpectationOutcome]:
        """Validate ``data`` (pandas, or Spark with the spark engine) against every suite."""
        if self._definitions is None:
            self._definitions = self._build()
        outcomes = []
        for suite_config, definition in self._definitions:
            started = time.perf_counter()
            result = definition.run(batch_parameters={"dataframe": data}, result_format="SUMMARY")
            elapsed_ms = round(1000 * (time.perf_counter() - started), 1)
            by_name = {e.name: e for e in suite_config.expectations}
            for item in result.results:
                name = str((item.expectation_config.meta or {}).get("name"))
                expectation = by_name[name]
                summary = dict(item.result or {})
                observed = {
                    "engine": ENGINE_GX,
                    "gx_engine": self.engine,
                    "validation_ms": elapsed_ms,
                    "result": _jsonable(summary),
                }
                if item.exception_info and item.exception_info.get("raised_exception"):
                    observed["exception"] = str(item.exception_info.get("exception_message"))
                outcomes.append(
                    ExpectationOutcome(
                        suite_config.name,
                        expectation.name,
                        expectation.column,
                        bool(item.success),
                        int(summary.get("element_count") or 0),
                        int(summary.get("unexpected_count") or 0),
                        observed,
                    )
                )
        return outcomes


def _gx_class_name(expectation_type: str) -> str:
    return "".join(part.capitalize() for part in expectation_type.split("_"))


def _jsonable(value: Any) -> Any:
    """GX results hold numpy scalars and timestamps; make them plain JSON values."""
    return json.loads(json.dumps(value, default=str))


class GxSchedule:
    """Decides which micro-batches get a real GX validation (``quality.gx.schedule``)."""

    def __init__(self, config: GxRunConfig, clock=time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self._last_run: float | None = None

    def due(self, batch_id: int) -> bool:
        schedule = self.config.schedule
        if schedule == "every_batch":
            return True
        if schedule == "every_n_batches":
            return batch_id % self.config.every_n_batches == 0
        if schedule == "interval":
            return self._last_run is None or self.clock() - self._last_run >= self.config.interval_seconds
        return False

    def ran(self) -> None:
        self._last_run = self.clock()


def gx_outcomes(
    validator: GxValidator, parsed: DataFrame, columns: Sequence[str], max_rows: int
) -> tuple[list[ExpectationOutcome], int]:
    """Run GX on up to ``max_rows`` parsed rows of a batch; returns the outcomes and how many rows it saw."""
    rows = parsed.where(~F.col("parse_error")).select(*columns).limit(max_rows)
    if validator.engine == "pandas":
        frame = rows.toPandas()
        return validator.validate(frame), len(frame)
    cached = rows.cache()
    try:
        return validator.validate(cached), cached.count()
    finally:
        cached.unpersist()


def merge_outcomes(
    expression: Sequence[ExpectationOutcome], gx: Sequence[ExpectationOutcome] | None, rows_validated: int = 0
) -> list[ExpectationOutcome]:
    """What dq_results records for a batch: GX's outcome where GX ran, the expressions' otherwise.

    The expression outcome's counts cover the whole batch; they are kept in the observed value next to
    GX's so a sampled validation still shows the batch's true failure count.
    """
    if not gx:
        return list(expression)
    by_key = {(o.suite, o.expectation): o for o in gx}
    merged = []
    for outcome in expression:
        validated = by_key.get((outcome.suite, outcome.expectation))
        if validated is None:
            merged.append(outcome)
            continue
        observed = dict(validated.observed)
        observed["rows_validated"] = rows_validated
        observed["rows_in_batch"] = outcome.element_count
        observed["batch_unexpected_count"] = outcome.unexpected_count
        merged.append(
            ExpectationOutcome(
                validated.suite,
                validated.expectation,
                validated.column,
                validated.success,
                validated.element_count,
                validated.unexpected_count,
                observed,
            )
        )
    return merged


def outcome_rows(
    outcomes: Sequence[ExpectationOutcome], run_id: str, batch_id: int, observed_at: datetime
) -> list[dict[str, Any]]:
    """``dq_results`` rows for one batch's outcomes (built in Python: no Spark job for a dozen rows)."""
    return [
        {
            "run_id": run_id,
            "batch_id": batch_id,
            "suite": o.suite,
            "expectation": o.expectation,
            "column": o.column,
            "success": o.success,
            "element_count": o.element_count,
            "unexpected_count": o.unexpected_count,
            "observed_value": json.dumps(o.observed, sort_keys=True),
            "observed_at": observed_at,
        }
        for o in outcomes
    ]
