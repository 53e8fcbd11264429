"""A fresh table store under tmp_path per test, and builders for rows of the declared tables."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest

from sinks.delta_rs import DeltaRsTableStore
from sinks.tables import DEFAULT_CATALOG

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def lake(spark, tmp_path) -> DeltaRsTableStore:
    return DeltaRsTableStore(spark, str(tmp_path / "lake"))


def bronze_row(offset: int, day: int = 1, topic: str = "devices/d1/telemetry", broker: str = "b1") -> dict:
    ingested = T0 + timedelta(days=day - 1, seconds=offset)
    return {
        "broker": broker,
        "topic": topic,
        "offset": offset,
        "timestamp": ingested - timedelta(milliseconds=5),
        "client_id": "d1",
        "qos": 1,
        "retain": False,
        "properties": [("content-type", "json")],
        "payload": b'{"temperature": 21.5}',
        "ingest_date": date(2026, 3, day),
        "ingested_at": ingested,
    }


def execution_row(device_id: str, state: str, version: int, action_id: str = "a1") -> dict:
    return {
        "action_id": action_id,
        "device_id": device_id,
        "state": state,
        "version": version,
        "report_seq": version,
        "status_details": f"{state} v{version}",
        "queued_at": T0,
        "updated_at": T0 + timedelta(seconds=version),
        "started_at": None,
        "finished_at": None,
    }


def arrow_rows(table: str, rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=DEFAULT_CATALOG[table].arrow_schema)


def spark_rows(spark, table: str, rows: list[dict[str, Any]]):
    """A Spark DataFrame of ``rows`` with the table's declared schema (maps given as key/value lists)."""
    return spark.createDataFrame(arrow_rows(table, rows))


def expected(spark, table: str, rows: list[dict[str, Any]]):
    """What read() returns for ``rows``: the declared columns and types, nullable like any file read."""
    return spark.createDataFrame(spark_rows(spark, table, rows).rdd, DEFAULT_CATALOG[table].read_schema)
