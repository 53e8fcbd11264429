"""device_minute computed in the driver (Arrow) equals the Spark query's result on the same rows."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from pipelines.telemetry import driver_minutes
from pipelines.telemetry import transforms as T
from pipelines.telemetry.config import load_telemetry_config
from pipelines.telemetry.job import telemetry_catalog

pytestmark = pytest.mark.spark

METRICS = ["temperature", "humidity", "battery"]
START = datetime(2026, 3, 1, 23, 58, tzinfo=UTC)  # the rows cross midnight: two event dates
UPDATED = datetime(2026, 3, 2, 1, 0, tzinfo=UTC)


def silver_rows(rng: random.Random, count: int, first_offset: int, seconds: range) -> pa.Table:
    """Silver rows of four devices at random seconds, some metrics null, one metric a whole minute null."""
    schema = telemetry_catalog(load_telemetry_config({}))["silver_telemetry"].arrow_schema
    rows = []
    for i in range(count):
        moment = START + timedelta(seconds=rng.choice(seconds), microseconds=rng.randrange(1_000_000))
        rows.append(
            {
                "device_id": f"d{rng.randrange(4)}",
                "event_time": moment,
                "event_date": moment.date(),
                "topic": "devices/d/telemetry",
                "broker": "b1",
                "offset": first_offset + i,
                "ingested_at": moment,
                "temperature": None if rng.random() < 0.2 else round(rng.gauss(21, 3), 3),
                "humidity": None if moment.minute == 59 else rng.uniform(0, 100),
                "battery": rng.uniform(20, 100),
            }
        )
    return pa.Table.from_pylist(rows, schema=schema)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_driver_minutes_equal_the_spark_query(spark, seed):
    rng = random.Random(seed)
    stored = silver_rows(rng, 300, 0, range(0, 240))  # four minutes stored
    new = silver_rows(rng, 40, 1000, range(60, 150))  # the batch touches two of them (and late data)
    in_driver = driver_minutes.touched_minute_aggregates(stored, new, METRICS, UPDATED)
    in_spark = T.touched_minute_aggregates(
        spark.createDataFrame(stored), spark.createDataFrame(new), METRICS, UPDATED
    ).toArrow()

    def by_key(table: pa.Table) -> dict[tuple, dict]:
        return {(row["device_id"], row["minute"]): row for row in table.to_pylist()}

    driver, expected = by_key(in_driver), by_key(in_spark)
    assert in_driver.column_names == in_spark.column_names
    assert driver.keys() == expected.keys()
    assert {minute.minute for _, minute in driver} == {59, 0}, "only the touched minutes"
    for key, row in expected.items():
        for column, value in row.items():
            if isinstance(value, float):
                assert driver[key][column] == pytest.approx(value, rel=1e-12), (key, column)
            else:
                assert driver[key][column] == value, (key, column)


def test_without_records_of_drops_the_batch_own_records():
    rng = random.Random(7)
    stored = silver_rows(rng, 10, 0, range(60))
    batch = stored.slice(3, 4)
    left = driver_minutes.without_records_of(stored, batch)
    assert left.column("offset").to_pylist() == [0, 1, 2, 7, 8, 9]
    assert driver_minutes.without_records_of(stored, batch.slice(0, 0)) == stored


def test_a_nan_metric_orders_as_spark_orders_it(spark):
    """Spark's max of a minute holding NaN is NaN, its min the smallest number; NaN alone is NaN."""
    rows = silver_rows(random.Random(8), 6, 0, range(0, 1)).to_pylist()
    rows[0]["temperature"], rows[1]["temperature"] = float("nan"), 20.0
    rows[2]["humidity"] = rows[3]["humidity"] = rows[4]["humidity"] = rows[5]["humidity"] = float("nan")
    rows[0]["humidity"] = rows[1]["humidity"] = float("nan")
    for row in rows:
        row["device_id"] = "d0"
    schema = silver_rows(random.Random(8), 0, 0, range(1)).schema
    new = pa.Table.from_pylist(rows, schema=schema)
    empty = new.slice(0, 0)
    in_driver = driver_minutes.touched_minute_aggregates(empty, new, METRICS, UPDATED).to_pylist()
    in_spark = (
        T.touched_minute_aggregates(
            spark.createDataFrame(empty), spark.createDataFrame(new), METRICS, UPDATED
        )
        .toArrow()
        .to_pylist()
    )
    [driver], [expected] = in_driver, in_spark
    assert math.isnan(expected["temperature_max"]) and expected["temperature_min"] < 100
    assert math.isnan(expected["humidity_min"]) and math.isnan(expected["humidity_max"])
    for column, value in expected.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(driver[column]), column
        elif isinstance(value, float):
            assert driver[column] == pytest.approx(value, rel=1e-12), column
        else:
            assert driver[column] == value, column
