"""Tables the jobs write that another tool made first (delta-rs here) with rules of its own: a Spark batch
appended by the store keeps them, as delta-rs's own writer does."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from sinks.delta_rs import DeltaRsTableStore
from sinks.tables import DEFAULT_CATALOG
from tests.e2e.sinks.conftest import bronze_row, spark_rows

pytestmark = pytest.mark.spark


def made_by_hand(lake: DeltaRsTableStore, schema: pa.Schema) -> str:
    path = lake.location("bronze_telemetry")
    DeltaTable.create(path, schema, partition_by=list(DEFAULT_CATALOG["bronze_telemetry"].partition_by))
    return path


def test_a_check_constraint_of_a_table_made_by_hand_is_kept_by_a_spark_batch(spark, lake) -> None:
    """The tasks' files were committed whatever the constraint said: rows breaking it landed."""
    path = made_by_hand(lake, DEFAULT_CATALOG["bronze_telemetry"].arrow_schema)
    DeltaTable(path).alter.add_constraint({"offset_small": "offset < 3"})
    breaking = spark_rows(spark, "bronze_telemetry", [bronze_row(offset) for offset in range(6)])
    with pytest.raises(Exception, match="rows failed validation"):
        lake.append("bronze_telemetry", breaking, "q", 0)
    assert DeltaTable(path).to_pyarrow_table().num_rows == 0
    keeping = spark_rows(spark, "bronze_telemetry", [bronze_row(offset) for offset in range(3)])
    assert lake.append("bronze_telemetry", keeping, "q", 1) is True
    assert sorted(DeltaTable(path).to_pyarrow_table().column("offset").to_pylist()) == [0, 1, 2]


def test_a_generated_column_of_a_table_made_by_hand_is_computed_for_a_spark_batch(spark, lake) -> None:
    """The tasks wrote the column the job does not know as nulls."""
    generated = pa.field("next_offset", pa.int64(), metadata={"delta.generationExpression": "offset + 1"})
    path = made_by_hand(lake, DEFAULT_CATALOG["bronze_telemetry"].arrow_schema.append(generated))
    rows = spark_rows(spark, "bronze_telemetry", [bronze_row(offset) for offset in range(3)])
    assert lake.append("bronze_telemetry", rows, "q", 0) is True
    stored = DeltaTable(path).to_pyarrow_table().sort_by("offset")
    assert stored.column("next_offset").to_pylist() == [1, 2, 3]
