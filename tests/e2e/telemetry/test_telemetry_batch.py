"""One micro-batch through every table, on real Delta tables (delta-rs) — without a stream around it.

The streaming tests (test_telemetry_stream.py, test_telemetry_dedup.py) add the source, the checkpoint and
the state store; here each batch is a batch query's rows handed to the job's ``foreachBatch`` step
(duplicates are then flagged within the batch only), which makes replays and injected failures exact and
quick.
"""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime

import pytest

from pipelines.telemetry.config import load_telemetry_config
from pipelines.telemetry.job import BATCH_SQL_CONF, ONE_TASK_ROWS, TelemetryBatch, open_store
from sinks import exactly_once
from tests.e2e.telemetry.telemetry_harness import at, record, records, telemetry, write_records

pytestmark = pytest.mark.spark

APP = "test-query"


class Boom(RuntimeError):
    pass


@pytest.fixture
def pipeline(spark, tmp_path, request):
    """A micro-batch writer on fresh tables; GX validates only where a test asks (indirect parameter)."""
    gx_schedule = getattr(request, "param", "never")
    config = load_telemetry_config(
        {
            "tables": {"root": str(tmp_path / "tables")},
            "gold": {"devices": {"status_topic_template": "devices/{device_id}/actions"}},
            "quality": {"gx": {"schedule": gx_schedule}},
        }
    )
    store = open_store(spark, config)
    batch = TelemetryBatch(config, store, clock=lambda: at(3600))
    batch.ensure_tables()
    return batch, store, exactly_once(store, write_records(batch), app_id=APP)


def rows_of(store, name, *columns, order=None):
    """Selected columns of a table's rows; timestamps as aware UTC datetimes (Spark hands back local time)."""
    frame = store.read(name)
    if order:
        frame = frame.orderBy(*order)
    return [tuple(_utc(r[c]) for c in columns) for r in frame.collect()]


def _utc(value):
    return value.astimezone(UTC) if isinstance(value, datetime) else value


@pytest.mark.parametrize("pipeline", ["every_batch"], indirect=True)
@pytest.mark.parametrize("one_task_rows", [ONE_TASK_ROWS, 0], ids=["small batch", "every partition"])
def test_one_batch_fills_every_table(spark, pipeline, one_task_rows):
    """A batch under ``ONE_TASK_ROWS`` is written from one partition: one file per table appended; a
    bigger one from each of its partitions; the tables hold the same rows either way."""
    batch, store, run = pipeline
    batch.one_task_rows = one_task_rows
    source = [
        telemetry("dev-1", 0, seq=1, seconds=1, temperature=20.0),
        telemetry("dev-1", 1, seq=2, seconds=2, temperature=30.0),
        telemetry("dev-2", 0, seq=1, seconds=3, temperature=500.0),  # out of range: quarantined
        record("devices/dev-3/telemetry", 0, b"garbage", seconds=4),  # unparseable: quarantined
        record("devices/dev-1/actions", 0, b'{"firmware": "1.1.0"}', seconds=5),  # status: devices only
    ]
    run(records(spark, source), 0)

    assert store.read("bronze_telemetry").count() == 5
    assert rows_of(store, "silver_telemetry", "device_id", "offset", "temperature", order=["offset"]) == [
        ("dev-1", 0, 20.0),
        ("dev-1", 1, 30.0),
    ]
    quarantine = rows_of(
        store, "telemetry_quarantine", "device_id", "reason", "failed_expectations", order=["device_id"]
    )
    assert quarantine == [
        ("dev-2", "failed_expectations", ["telemetry_basic.expect_column_values_to_be_between(temperature)"]),
        ("dev-3", "unparseable_payload", None),
    ]
    assert rows_of(store, "device_minute", "device_id", "count", "temperature_avg") == [("dev-1", 2, 25.0)]
    assert rows_of(store, "devices", "device_id", "last_seen", "firmware_version", "group") == [
        ("dev-1", at(5), "1.1.0", "blue")
    ]
    dq = {r["expectation"]: r for r in store.read("dq_results").collect()}
    assert dq["payload_is_json_of_declared_types"]["unexpected_count"] == 1
    between = dq["expect_column_values_to_be_between(temperature)"]
    assert (between["element_count"], between["unexpected_count"], between["success"]) == (3, 1, False)
    assert json.loads(between["observed_value"])["engine"] == "great_expectations"
    assert batch.reports[-1].gx_validated
    if one_task_rows:
        appended = ("bronze_telemetry", "silver_telemetry", "telemetry_quarantine")
        assert [store.data_files(name) for name in appended] == [1, 1, 1]


def test_late_data_adds_to_its_minute_and_nan_tops_the_maximum(spark, pipeline):
    """``device_minute`` takes each batch's share of a minute: a late reading joins the minute's count and
    average, a NaN is the minute's maximum and average from then on (Spark orders NaN above every number),
    never its minimum."""
    _, store, run = pipeline
    run(records(spark, [telemetry("d", 0, seq=1, seconds=10, temperature=10.0, humidity=None)]), 0)
    run(
        records(
            spark,
            [
                telemetry("d", 1, seq=2, seconds=20, temperature=30.0),  # late for minute 10:00
                telemetry("d", 2, seq=3, seconds=70, temperature=50.0),
            ],
        ),
        1,
    )
    columns = ("minute", "count", "temperature_avg", "temperature_count", "humidity_avg", "humidity_count")
    assert rows_of(store, "device_minute", *columns, order=["minute"]) == [
        (at(0), 2, 20.0, 2, 40.0, 1),
        (at(60), 1, 50.0, 1, 40.0, 1),
    ]
    run(records(spark, [telemetry("d", 3, seq=4, seconds=30, temperature=float("nan"))]), 2)
    (minute,) = [
        r for r in store.read("device_minute").collect() if r["minute"].second == 0 and r["count"] == 3
    ]
    assert minute["temperature_min"] == 10.0
    assert math.isnan(minute["temperature_max"]) and math.isnan(minute["temperature_avg"])
    assert minute["temperature_count"] == 3


def test_failure_after_silver_then_replay_writes_each_table_once(spark, pipeline):
    """Silver is in, gold is not: the replay must not deduplicate silver's rows against themselves."""
    batch, store, run = pipeline
    run(records(spark, [telemetry("d", 0, seq=1, seconds=0)]), 0)
    second = records(spark, [telemetry("d", 1, seq=2, seconds=1), telemetry("e", 0, seq=1, seconds=2)])

    def explode(step, batch_id):
        if step == "silver_telemetry" and batch_id == 1:
            raise Boom(f"injected after {step}")

    batch.after_step = explode
    with pytest.raises(Boom):
        run(second, 1)
    batch.after_step = lambda step, batch_id: None
    run(second, 1)  # what Spark does after a restart from the checkpoint: the same batch again
    run(second, 1)  # and once more: a replay of a finished batch writes nothing

    assert store.read("bronze_telemetry").count() == 3
    assert store.read("silver_telemetry").count() == 3
    assert rows_of(store, "device_minute", "device_id", "count", order=["device_id"]) == [("d", 2), ("e", 1)]
    assert store.read("devices").count() == 2
    assert store.read("dq_results").where("expectation = 'payload_is_json_of_declared_types'").count() == 2
    assert batch.reports[-1].written == {
        "bronze_telemetry": False,
        "silver_telemetry": False,
        "device_minute": False,
        "devices": False,
        "dq_results": False,
    }


def test_devices_last_seen_only_moves_forward_and_keeps_known_firmware(spark, pipeline):
    _, store, run = pipeline
    run(records(spark, [record("devices/d/actions", 0, b'{"firmware": "2.0.0"}', seconds=100)]), 0)
    run(records(spark, [telemetry("d", 0, seq=1, seconds=50, firmware="1.0.0")]), 1)  # older than last_seen
    assert rows_of(store, "devices", "last_seen", "firmware_version") == [(at(100), "2.0.0")]
    run(records(spark, [telemetry("d", 1, seq=2, seconds=200, firmware=None, group="red")]), 2)
    assert rows_of(store, "devices", "last_seen", "firmware_version", "group") == [(at(200), "2.0.0", "red")]


def test_a_failing_step_fails_the_batch_only_once_its_sibling_steps_have_ended(spark, pipeline):
    """Silver fails at once while quarantine and the gold steps still run: the batch raises that failure
    only after every sibling has ended, so none writes after the batch failed or reads a cached DataFrame
    already released; the replay then writes each table once."""
    batch, store, run = pipeline
    ended: list[str] = []

    def failing_silver_and_slow_quarantine(step, batch_id):
        if step == "silver_telemetry":
            raise Boom("silver failed")
        if step == "telemetry_quarantine":
            time.sleep(1.5)  # still running when silver fails
        ended.append(step)

    batch.after_step = failing_silver_and_slow_quarantine
    source = [telemetry("d", 0, seq=1, seconds=0), telemetry("e", 0, seq=1, seconds=1, temperature=500.0)]
    with pytest.raises(Boom, match="silver failed"):
        run(records(spark, source), 0)
    assert {"telemetry_quarantine", "device_minute", "devices", "dq_results"} <= set(ended)

    batch.after_step = lambda step, batch_id: None
    run(records(spark, source), 0)
    batch.close()
    assert store.read("bronze_telemetry").count() == 2
    assert rows_of(store, "silver_telemetry", "device_id") == [("d",)]
    assert rows_of(store, "telemetry_quarantine", "device_id") == [("e",)]
    assert rows_of(store, "device_minute", "device_id", "count") == [("d", 1)]
    assert rows_of(store, "devices", "device_id") == [("d",)]
    assert store.read("dq_results").where("expectation = 'payload_is_json_of_declared_types'").count() == 1


def test_batch_settings_hold_in_every_batch_and_close_sets_the_session_back(spark, pipeline):
    batch, _, run = pipeline
    keys = list(BATCH_SQL_CONF)
    before = {key: spark.conf.get(key, None) for key in keys}
    seen: list[dict[str, str | None]] = []
    batch.after_step = lambda step, batch_id: seen.append({key: spark.conf.get(key, None) for key in keys})
    run(records(spark, [telemetry("dev-1", 0, seq=1, seconds=1)]), 0)
    run(records(spark, [telemetry("dev-1", 1, seq=2, seconds=2)]), 1)
    assert seen and all(settings == BATCH_SQL_CONF for settings in seen)
    batch.close()
    assert {key: spark.conf.get(key, None) for key in keys} == before
