"""Tables the jobs write that another tool made first (delta-rs here) with rules for their writers: a Spark
batch appended by the store keeps them, evaluated by Spark in the tasks that write its files (the rows never
reach the driver), as delta-rs's own writer keeps them."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from sinks.delta_rs import AppendReport, DeltaRsTableStore
from sinks.tables import DEFAULT_CATALOG
from tests.e2e.sinks.conftest import bronze_row, spark_rows

pytestmark = pytest.mark.spark


def made_by_hand(lake: DeltaRsTableStore, schema: pa.Schema) -> str:
    path = lake.location("bronze_telemetry")
    DeltaTable.create(path, schema, partition_by=list(DEFAULT_CATALOG["bronze_telemetry"].partition_by))
    return path


def appends(lake: DeltaRsTableStore) -> list[AppendReport]:
    reports: list[AppendReport] = []
    lake.on_append = reports.append
    return reports


def test_a_check_constraint_of_a_table_made_by_hand_is_kept_by_a_spark_batch(spark, lake) -> None:
    """The tasks' files were committed whatever the constraint said: rows breaking it landed. A null the
    expression cannot judge passes, as in delta-rs."""
    path = made_by_hand(lake, DEFAULT_CATALOG["bronze_telemetry"].arrow_schema)
    DeltaTable(path).alter.add_constraint({"offset_small": "offset < 3"})
    reports = appends(lake)
    breaking = spark_rows(spark, "bronze_telemetry", [bronze_row(offset) for offset in range(6)])
    with pytest.raises(Exception, match=r"rows failed validation check of its CHECK constraint offset_small"):
        lake.append("bronze_telemetry", breaking, "q", 0)
    assert DeltaTable(path).to_pyarrow_table().num_rows == 0
    keeping = spark_rows(spark, "bronze_telemetry", [bronze_row(offset) for offset in range(3)])
    assert lake.append("bronze_telemetry", keeping, "q", 1) is True
    assert sorted(DeltaTable(path).to_pyarrow_table().column("offset").to_pylist()) == [0, 1, 2]
    assert [(r.on_executors, r.rows) for r in reports] == [(True, 3)], "written by the tasks"


def test_an_invariant_of_a_table_made_by_hand_is_kept_by_a_spark_batch(spark, lake) -> None:
    schema = DEFAULT_CATALOG["bronze_telemetry"].arrow_schema
    index = schema.get_field_index("offset")
    invariant = {"delta.invariants": json.dumps({"expression": {"expression": "offset >= 2"}})}
    path = made_by_hand(lake, schema.set(index, schema.field(index).with_metadata(invariant)))
    rows = spark_rows(spark, "bronze_telemetry", [bronze_row(offset) for offset in range(4)])
    with pytest.raises(Exception, match=r"2 rows failed validation check of its invariant of offset"):
        lake.append("bronze_telemetry", rows, "q", 0)
    assert DeltaTable(path).to_pyarrow_table().num_rows == 0


def test_a_generated_column_of_a_table_made_by_hand_is_computed_for_a_spark_batch(spark, lake) -> None:
    """The tasks wrote the column the job does not know as nulls."""
    generated = pa.field("next_offset", pa.int64(), metadata={"delta.generationExpression": "offset + 1"})
    path = made_by_hand(lake, DEFAULT_CATALOG["bronze_telemetry"].arrow_schema.append(generated))
    reports = appends(lake)
    rows = spark_rows(spark, "bronze_telemetry", [bronze_row(offset) for offset in range(3)])
    assert lake.append("bronze_telemetry", rows, "q", 0) is True
    stored = DeltaTable(path).to_pyarrow_table().sort_by("offset")
    assert stored.column("next_offset").to_pylist() == [1, 2, 3]
    assert [(r.on_executors, r.rows) for r in reports] == [(True, 3)]
