"""Spark and Arrow schemas and rows converted the same way on every supported pyspark (4.0 to 4.3): the
suite runs on 4.3, and `make test` runs this file again on 4.0."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.types import (
    DateType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from sinks.spark_arrow import to_arrow, to_pandas, to_spark

pytestmark = pytest.mark.spark

SCHEMA = StructType(
    [
        StructField("device_id", StringType(), False),
        StructField("at", TimestampType()),
        StructField("local", TimestampNTZType()),
        StructField("day", DateType()),
        StructField("value", DoubleType()),
        StructField("count", LongType()),
        StructField("tags", MapType(StringType(), StringType())),
    ]
)


def test_a_schema_goes_to_arrow_and_back_unchanged():
    arrow = to_arrow(SCHEMA)
    assert arrow.field("at").type == pa.timestamp("us", tz="UTC")
    assert arrow.field("local").type == pa.timestamp("us")
    assert arrow.field("day").type == pa.date32()
    assert not arrow.field("device_id").nullable
    assert to_spark(arrow) == SCHEMA


def test_arrow_rows_become_the_frame_to_pandas_gives(spark):
    rows = [
        (
            "d1",
            datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
            datetime(2026, 3, 1, 13, 0),
            date(2026, 3, 1),
            1.5,
            7,
            {"k": "v"},
        ),
        ("d2", None, None, None, None, None, None),
    ]
    frame = spark.createDataFrame(rows, SCHEMA)
    timezone = spark.conf.get("spark.sql.session.timeZone")
    converted = to_pandas(frame.toArrow(), frame.schema, timezone)
    pd.testing.assert_frame_equal(converted, frame.toPandas())
    assert converted["day"][0] == date(2026, 3, 1)
