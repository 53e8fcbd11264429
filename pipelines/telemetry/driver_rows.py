"""A batch's records collected once to the driver as Arrow, and what is read straight off them there.

:func:`pipelines.telemetry.transforms.parse_records` gives every bronze row with the parsed and flagged
columns of the telemetry rows; collected in one Spark job, it holds bronze's rows, the profile's counts
(:func:`profile`, the same values as the Spark aggregation of ``profile_aggregates`` and
``quality.expression_aggregates``), quarantine's rows and the Great Expectations sample. Tests hold each to
its Spark counterpart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from . import quality as Q
from .config import SuiteConfig
from .transforms import IS_TELEMETRY, REASON_EXPECTATIONS, REASON_UNPARSEABLE


def bronze_rows(collected: pa.Table, bronze_columns: Sequence[str]) -> pa.Table:
    """Bronze's rows: every record, in bronze's columns."""
    return collected.select(list(bronze_columns))


def telemetry_rows(collected: pa.Table) -> pa.Table:
    """The rows on telemetry topics, parsed and flagged."""
    return collected.filter(pc.fill_null(collected.column(IS_TELEMETRY), False))


def quarantined(telemetry: pa.Table) -> pa.ChunkedArray | pa.Array:
    """Per telemetry row: unparseable, or failing an expectation."""
    failures = pc.fill_null(pc.list_value_length(telemetry.column("failed_expectations")), 0)
    return pc.or_(telemetry.column("parse_error"), pc.greater(failures, 0))


def passed_rows(telemetry: pa.Table) -> pa.Table:
    """Rows that parsed and met every expectation: the candidates for silver."""
    return telemetry.filter(pc.invert(quarantined(telemetry)))


def parsed_rows(telemetry: pa.Table) -> pa.Table:
    """Rows that parsed (whatever the expectations said): what Great Expectations validates."""
    return telemetry.filter(pc.invert(telemetry.column("parse_error")))


def supported(suites: Sequence[SuiteConfig]) -> bool:
    """Whether :func:`profile` can count these suites from the rows' failure lists: each expectation has a
    name of its own (a row names the expectations it failed)."""
    names = [Q.qualified_name(s, e) for s in suites for e in s.expectations]
    return len(names) == len(set(names))


def profile(
    telemetry: pa.Table, suites: Sequence[SuiteConfig], column_types: Mapping[str, str]
) -> dict[str, Any]:
    """The batch's counts, keyed as the Spark profile aggregation keys them: passed and quarantined rows,
    the passed rows' event-time range (epoch micros), and per expectation the failing and missing values
    among the rows that parsed (``dq_u<i>``, ``dq_m<i>``)."""
    rejected = quarantined(telemetry)
    passed_times = telemetry.column("event_time").filter(pc.invert(rejected))
    parsed = parsed_rows(telemetry)
    counts: dict[str, Any] = {
        "passed": len(passed_times),
        "quarantined": telemetry.num_rows - len(passed_times),
        "low_us": _micros(pc.min(passed_times)),
        "high_us": _micros(pc.max(passed_times)),
        "dq_rows": telemetry.num_rows,
        "dq_parsed": parsed.num_rows,
    }
    failed = pc.value_counts(pc.list_flatten(parsed.column("failed_expectations")))
    failures = {str(item["values"]): int(item["counts"]) for item in failed.to_pylist()}
    entries = [(suite, e) for suite in suites for e in suite.expectations]
    for i, (suite, expectation) in enumerate(entries):
        counts[f"dq_u{i}"] = failures.get(Q.qualified_name(suite, expectation), 0)
        floating = column_types.get(expectation.column, "") in Q.FLOATING
        missing = pc.is_null(parsed.column(expectation.column), nan_is_null=floating)
        counts[f"dq_m{i}"] = int(pc.sum(missing).as_py() or 0)
    return counts


def quarantine_rows(telemetry: pa.Table, run_id: str, batch_id: int, quarantined_at: datetime) -> pa.Table:
    """Quarantine's rows (as :func:`pipelines.telemetry.transforms.to_quarantine`): the raw record, the
    device, the failed expectations and the reason."""
    rows = telemetry.filter(quarantined(telemetry))
    unparseable = rows.column("parse_error")
    device = rows.column("device_id")
    count = rows.num_rows
    return pa.table(
        {
            **{c: rows.column(c) for c in ("broker", "topic", "offset", "timestamp", "client_id")},
            "properties": rows.column("properties"),
            "payload": rows.column("payload"),
            "device_id": pc.if_else(pc.not_equal(device, ""), device, pa.scalar(None, device.type)),
            "failed_expectations": pc.if_else(
                unparseable,
                pa.scalar(None, rows.schema.field("failed_expectations").type),
                rows.column("failed_expectations"),
            ),
            "reason": pc.if_else(unparseable, REASON_UNPARSEABLE, REASON_EXPECTATIONS),
            "run_id": pa.array([run_id] * count, pa.string()),
            "batch_id": pa.array([batch_id] * count, pa.int64()),
            "quarantine_date": pa.array([quarantined_at.astimezone(UTC).date()] * count, pa.date32()),
            "quarantined_at": pa.array([quarantined_at] * count, pa.timestamp("us", "UTC")),
        }
    )


def _micros(value: pa.Scalar) -> int | None:
    if not value.is_valid:
        return None
    return int(pc.cast(value.cast(pa.timestamp("us", "UTC")), pa.int64()).as_py())
