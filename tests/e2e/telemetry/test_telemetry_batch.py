"""One micro-batch through every table, on real Delta tables (delta-rs) — without a stream around it.

The streaming tests (test_telemetry_stream.py) add the source and the checkpoint; here each batch is
called directly, which makes replays and injected failures exact and quick.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest

from pipelines.telemetry.config import load_telemetry_config
from pipelines.telemetry.job import BATCH_SQL_CONF, LARGE_BATCH_SQL_CONF, TelemetryBatch, open_store
from sinks import exactly_once
from tests.e2e.telemetry.telemetry_harness import at, record, records, telemetry

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
    return batch, store, exactly_once(store, batch, app_id=APP)


def rows_of(store, name, *columns, order=None):
    """Selected columns of a table's rows; timestamps as aware UTC datetimes (Spark hands back local time)."""
    frame = store.read(name)
    if order:
        frame = frame.orderBy(*order)
    return [tuple(_utc(r[c]) for c in columns) for r in frame.collect()]


def _utc(value):
    return value.astimezone(UTC) if isinstance(value, datetime) else value


@pytest.mark.parametrize("pipeline", ["every_batch"], indirect=True)
def test_one_batch_fills_every_table(spark, pipeline):
    batch, store, run = pipeline
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


def test_duplicates_are_dropped_and_late_data_recomputes_its_minute(spark, pipeline):
    _, store, run = pipeline
    run(records(spark, [telemetry("d", 0, seq=1, seconds=10, temperature=10.0)]), 0)
    run(
        records(
            spark,
            [
                telemetry(
                    "d", 0, seq=1, seconds=10, temperature=10.0, broker="edge2"
                ),  # same message, 2nd broker
                telemetry("d", 1, seq=2, seconds=20, temperature=30.0),  # late for minute 10:00
                telemetry("d", 2, seq=3, seconds=70, temperature=50.0),
            ],
        ),
        1,
    )
    assert rows_of(store, "silver_telemetry", "broker", "seq", order=["seq"]) == [
        ("edge1", 1),
        ("edge1", 2),
        ("edge1", 3),
    ]
    assert rows_of(store, "device_minute", "minute", "count", "temperature_avg", order=["minute"]) == [
        (at(0), 2, 20.0),
        (at(60), 1, 50.0),
    ]


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


def driver_dead_in_gold_part(spark, pipeline, monkeypatch, table: str):
    """Batch 0 written whole; batch 1, its gold part deferred, dies before its ``table`` merge once silver
    is in (what the next call would meet; the driver dies instead). Returns the dead instance and store."""
    first, store, run = pipeline
    first.defer_gold = True
    run(records(spark, [telemetry("d", 0, seq=1, seconds=0)]), 0)
    merge = store.merge

    def dying_merge(name, data, app_id, batch_id, **options):
        if name == table and batch_id == 1:
            raise Boom(f"the driver dies before the {table} merge")
        return merge(name, data, app_id, batch_id, **options)

    monkeypatch.setattr(store, "merge", dying_merge)
    run(records(spark, [telemetry("d", 1, seq=2, seconds=1), telemetry("e", 0, seq=1, seconds=2)]), 1)
    assert store.read("silver_telemetry").count() == 3  # visible before the gold part is done
    with pytest.raises(Boom):
        first.settle()
    first.close()
    monkeypatch.undo()
    return first, store


def test_gold_part_left_undone_by_a_dead_driver_is_redone_from_bronze_once(spark, pipeline, monkeypatch):
    """With the gold part deferred (a processing-time trigger), a call returns once silver is in.

    Spark then commits the batch; a driver dying while the gold part runs leaves some of device_minute,
    devices and dq_results without it. The next driver's first batch redoes the batch from its bronze rows:
    the tables that missed it get it, the others are not written twice.
    """
    first, store = driver_dead_in_gold_part(spark, pipeline, monkeypatch, "devices")
    assert rows_of(store, "devices", "device_id") == [("d",)]

    restarted = TelemetryBatch(first.config, store, clock=lambda: at(3600), defer_gold=True)
    rerun = exactly_once(store, restarted, app_id=APP)
    rerun(records(spark, [telemetry("e", 1, seq=2, seconds=3)]), 2)  # Spark had committed batch 1
    restarted.close()

    redone = restarted.reports[0]
    assert [report.batch_id for report in restarted.reports] == [1, 2]  # batch 1 redone first
    assert redone.written["devices"] and not redone.written["device_minute"]
    assert not redone.written["bronze_telemetry"] and not redone.written["dq_results"]
    assert store.read("bronze_telemetry").count() == 4
    assert store.read("silver_telemetry").count() == 4
    assert rows_of(store, "device_minute", "device_id", "count", order=["device_id"]) == [("d", 2), ("e", 2)]
    assert rows_of(store, "devices", "device_id", "last_seen", order=["device_id"]) == [
        ("d", at(1)),
        ("e", at(3)),
    ]
    parse_check = store.read("dq_results").where("expectation = 'payload_is_json_of_declared_types'")
    assert sorted(r["batch_id"] for r in parse_check.collect()) == [0, 1, 2]
    assert parse_check.groupBy().sum("element_count").first()[0] == 4


def test_gold_part_left_undone_is_redone_by_a_restart_that_does_not_defer_it(spark, pipeline, monkeypatch):
    """The same dead driver, restarted with ``--available-now`` (its gold part not deferred): the first
    batch of the new instance still redoes the committed batch whose gold part is missing."""
    first, store = driver_dead_in_gold_part(spark, pipeline, monkeypatch, "device_minute")
    assert rows_of(store, "device_minute", "device_id", "count") == [("d", 1)]

    restarted = TelemetryBatch(first.config, store, clock=lambda: at(3600))  # availableNow: not deferred
    rerun = exactly_once(store, restarted, app_id=APP)
    rerun(records(spark, [telemetry("e", 1, seq=2, seconds=3)]), 2)
    restarted.close()

    assert [report.batch_id for report in restarted.reports] == [1, 2]
    redone = restarted.reports[0]
    assert redone.written["device_minute"] and not redone.written["silver_telemetry"]
    assert store.read("bronze_telemetry").count() == 4
    assert store.read("silver_telemetry").count() == 4
    assert rows_of(store, "device_minute", "device_id", "count", order=["device_id"]) == [("d", 2), ("e", 2)]
    assert rows_of(store, "devices", "device_id", "last_seen", order=["device_id"]) == [
        ("d", at(1)),
        ("e", at(3)),
    ]
    parse_check = store.read("dq_results").where("expectation = 'payload_is_json_of_declared_types'")
    assert sorted(r["batch_id"] for r in parse_check.collect()) == [0, 1, 2]


@pytest.mark.parametrize("defer_gold", [False, True], ids=["all-steps-at-once", "gold-deferred"])
def test_a_failing_step_fails_the_batch_only_once_its_sibling_steps_have_ended(spark, pipeline, defer_gold):
    """Silver fails at once while quarantine (and, not deferred, the gold steps) still runs: the batch
    raises that failure only after every sibling has ended, so none writes after the batch failed or reads
    a cached DataFrame already released; the replay then writes each table once."""
    batch, store, run = pipeline
    batch.defer_gold = defer_gold
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
    assert "telemetry_quarantine" in ended
    if not defer_gold:
        assert {"device_minute", "devices", "dq_results"} <= set(ended)

    batch.after_step = lambda step, batch_id: None
    run(records(spark, source), 0)
    batch.close()
    assert store.read("bronze_telemetry").count() == 2
    assert rows_of(store, "silver_telemetry", "device_id") == [("d",)]
    assert rows_of(store, "telemetry_quarantine", "device_id") == [("e",)]
    assert rows_of(store, "device_minute", "device_id", "count") == [("d", 1)]
    assert rows_of(store, "devices", "device_id") == [("d",)]
    assert store.read("dq_results").where("expectation = 'payload_is_json_of_declared_types'").count() == 1


def test_batch_settings_follow_the_batch_size_and_close_sets_the_session_back(spark, pipeline):
    batch, _, run = pipeline
    keys = [*BATCH_SQL_CONF, *LARGE_BATCH_SQL_CONF]
    before = {key: spark.conf.get(key, None) for key in keys}
    seen: list[dict[str, str | None]] = []
    batch.after_step = lambda step, batch_id: seen.append({key: spark.conf.get(key, None) for key in keys})
    run(records(spark, [telemetry("dev-1", 0, seq=1, seconds=1)]), 0)  # a first batch: not expected small
    run(records(spark, [telemetry("dev-1", 1, seq=2, seconds=2)]), 1)  # after a small one: small
    large, small = seen[0], seen[-1]
    assert all(large[key] == value for key, value in {**BATCH_SQL_CONF, **LARGE_BATCH_SQL_CONF}.items())
    assert all(small[key] == value for key, value in BATCH_SQL_CONF.items())
    assert all(small[key] == before[key] for key in LARGE_BATCH_SQL_CONF)
    batch.close()
    assert {key: spark.conf.get(key, None) for key in keys} == before
