"""A batch whose rows all go to the driver: one Spark job, and the same tables as the Spark queries write.

With delta-rs and the default configuration a batch collects its records once, parsed and flagged, and
computes every table's rows from them with Arrow. Here its Spark jobs are counted (a step that went back to
Spark would fail the count), and the tables it writes over a few batches, a replay included, are compared
with those written the other way, each table's rows computed by Spark (silver written from the tasks).
"""

from __future__ import annotations

import math

import pytest

from pipelines.telemetry.config import load_telemetry_config
from pipelines.telemetry.job import TABLES, TelemetryBatch, open_store
from sinks import BatchWriter
from tests.e2e.telemetry.telemetry_harness import at, record, records, telemetry

pytestmark = pytest.mark.spark

APP = "test-query"


class Boom(RuntimeError):
    pass


def telemetry_batch(spark, tmp_path, label: str, **sections) -> TelemetryBatch:
    """A batch writer on fresh tables under ``tmp_path / label``; ``sections`` of its configuration."""
    tables = {"root": str(tmp_path / label), **sections.pop("tables", {})}
    config = load_telemetry_config({"tables": tables, **sections})
    batch = TelemetryBatch(config, open_store(spark, config), clock=lambda: at(3600))
    batch.ensure_tables()
    return batch


BATCHES = [
    [
        telemetry("d1", 0, seq=1, seconds=10, temperature=10.0),
        telemetry("d1", 0, seq=1, seconds=10, temperature=10.0),  # the same record read twice
        telemetry("d1", 1, seq=2, seconds=20, temperature=500.0),  # out of range: quarantined
        telemetry("d2", 0, seq=1, seconds=30, group="red"),
        record("devices/d3/telemetry", 0, b"garbage", seconds=31),  # unparseable: quarantined
    ],
    [
        telemetry("d1", 2, seq=1, seconds=10, broker="edge2"),  # a message silver already holds
        telemetry("d1", 3, seq=3, seconds=15, temperature=30.0),  # late for the stored minute
        telemetry("d2", 1, seq=2, seconds=70, firmware=None),  # no firmware: the stored one is kept
        telemetry("d4", 0, seq=None, seconds=75),  # no message id
        telemetry("d4", 1, seq=None, seconds=75),
    ],
    [
        telemetry("d1", 4, seq=1, seconds=900),  # the same seq past the window: a restarted counter
        telemetry("d2", 2, seq=3, seconds=80, temperature=float("nan")),
    ],
]


def run_batches(spark, batch: TelemetryBatch, fail_after: str | None = None) -> None:
    """Every batch, batch 1 failing after ``fail_after`` first and then replayed, as Spark would."""
    for batch_id, rows in enumerate(BATCHES):
        if fail_after is not None and batch_id == 1:

            def explode(step: str, failing: int) -> None:
                if step == fail_after and failing == 1:
                    raise Boom(f"injected after {step}")

            batch.after_step = explode
            with pytest.raises(Boom):
                batch(records(spark, rows), BatchWriter(batch.store, APP, batch_id))
            batch.after_step = lambda step, failing: None
        batch(records(spark, rows), BatchWriter(batch.store, APP, batch_id))
    batch.close()


def table_rows(batch: TelemetryBatch, name: str) -> list[tuple]:
    """A table's rows, sorted, NaN made comparable."""
    table = batch.store.read_arrow(name)
    rows = [tuple(_comparable(v) for v in row.values()) for row in table.to_pylist()]
    return sorted(rows, key=repr)


def _comparable(value):
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, list):
        return tuple(_comparable(v) for v in value)
    return value


def spark_jobs(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup())


def test_a_batch_in_the_driver_runs_one_spark_job(spark, tmp_path):
    batch = telemetry_batch(spark, tmp_path, "driver", quality={"gx": {"schedule": "every_batch"}})
    assert batch._rows_in_driver()
    jobs = []
    for batch_id, rows in enumerate(BATCHES):
        before = spark_jobs(spark)
        batch(records(spark, rows), BatchWriter(batch.store, APP, batch_id))
        jobs.append(spark_jobs(spark) - before)
        assert batch.reports[-1].gx_validated  # Great Expectations validated it, on the collected rows
    batch.close()
    assert jobs == [1, 1, 1]
    assert batch.store.read_arrow("silver_telemetry").num_rows == 8

    spark_path = telemetry_batch(spark, tmp_path, "spark", tables={"executor_writes": ["silver_telemetry"]})
    assert not spark_path._rows_in_driver()
    before = spark_jobs(spark)
    spark_path(records(spark, BATCHES[0]), BatchWriter(spark_path.store, APP, 0))
    spark_path.close()
    assert spark_jobs(spark) - before > 3  # the queries the driver's Arrow steps replace


@pytest.mark.parametrize("fail_after", [None, "silver_telemetry", "devices"])
def test_the_driver_writes_the_tables_spark_writes(spark, tmp_path, fail_after):
    in_driver = telemetry_batch(spark, tmp_path, "driver", quality={"gx": {"schedule": "never"}})
    in_spark = telemetry_batch(
        spark,
        tmp_path,
        "spark",
        quality={"gx": {"schedule": "never"}},
        tables={"executor_writes": ["silver_telemetry"]},
    )
    run_batches(spark, in_driver, fail_after)
    run_batches(spark, in_spark)
    for name in TABLES:
        assert table_rows(in_driver, name) == table_rows(in_spark, name), name
    assert len(table_rows(in_driver, "silver_telemetry")) == 8
    assert len(table_rows(in_driver, "telemetry_quarantine")) == 2
