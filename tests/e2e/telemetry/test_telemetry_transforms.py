"""Every telemetry transformation on small DataFrames with the source's schema, compared with chispa."""

from __future__ import annotations

from datetime import date

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipelines.telemetry import transforms as T
from pipelines.telemetry.config import load_telemetry_config
from tests.e2e.telemetry.telemetry_harness import T0, at, ms, reading, record, records, telemetry

pytestmark = pytest.mark.spark

CONFIG = load_telemetry_config(None)
PAYLOAD = CONFIG.payload
INGESTED = at(3600)


def equal(actual, expected):
    """Same schema (nullability aside) and rows; rows are ordered by every column a sort can use."""
    sortable = [f.name for f in expected.schema.fields if not f.dataType.simpleString().startswith("map")]
    assert_df_equality(actual, expected, ignore_nullable=True, transforms=[lambda df: df.orderBy(*sortable)])


def bronze(spark, rows):
    return T.to_bronze(records(spark, rows), INGESTED)


def test_to_bronze_keeps_the_record_and_adds_ingest_date(spark):
    raw = records(spark, [record("devices/a/telemetry", 7, b"{}", seconds=5)])
    expected = spark.createDataFrame(
        [("edge1", "devices/a/telemetry", 7, at(5), "c", 1, False, {}, b"{}", date(2026, 11, 21), INGESTED)],
        "broker string, topic string, offset bigint, timestamp timestamp, client_id string, qos tinyint, "
        "retain boolean, properties map<string,string>, payload binary, ingest_date date, "
        "ingested_at timestamp",
    )
    equal(T.to_bronze(raw, INGESTED), expected)


def test_parse_telemetry_takes_device_from_topic_and_typed_fields_from_payload(spark):
    rows = [
        telemetry("dev-1", 0, seq=1, seconds=10, temperature=22.25),
        record(
            "devices/dev-2/telemetry", 1, reading("dev-2", 2, 20, ts=None), seconds=30
        ),  # no ts: broker time
        record("devices/dev-3/status", 2, b'{"firmware": "2.0.0"}'),  # not telemetry: left out
        record("devices/dev-4/telemetry", 3, b"not json"),
        record("devices/dev-5/telemetry", 4, b'{"temperature": "hot"}'),  # wrong type
    ]
    parsed = T.parse_telemetry(bronze(spark, rows), PAYLOAD)
    actual = parsed.select(
        "device_id", "offset", "event_time", "seq", "temperature", "firmware", "parse_error"
    )
    expected = spark.createDataFrame(
        [
            ("dev-1", 0, at(10), 1, 22.25, "1.0.0", False),
            ("dev-2", 1, at(30), 2, 21.5, "1.0.0", False),
            ("dev-4", 3, at(0), None, None, None, True),
            ("dev-5", 4, at(0), None, None, None, True),
        ],
        "device_id string, offset bigint, event_time timestamp, seq bigint, temperature double, "
        "firmware string, parse_error boolean",
    )
    equal(actual, expected)


def test_parse_telemetry_other_placeholders_become_topic_tags_and_units_apply(spark):
    config = load_telemetry_config(
        {
            "payload": {
                "topic_template": "sites/{site}/devices/{device_id}/telemetry",
                "fields": {"time": "string", "value": "double"},
                "event_time_field": "time",
                "event_time_unit": "iso8601",
            },
            "dedup": {"message_id_fields": []},
            "gold": {"minute_metrics": ["value"], "devices": {"firmware_field": None, "group_field": None}},
            "quality": {"suites": []},
        }
    )
    rows = [record("sites/paris/devices/d9/telemetry", 0, b'{"time": "2026-11-21T10:00:42Z", "value": 1.5}')]
    parsed = T.parse_telemetry(bronze(spark, rows), config.payload)
    expected = spark.createDataFrame(
        [("d9", {"site": "paris"}, at(42), 1.5)],
        "device_id string, topic_tags map<string,string>, event_time timestamp, value double",
    )
    equal(parsed.select("device_id", "topic_tags", "event_time", "value"), expected)


def test_flag_failures_quarantines_with_reasons_and_passes_the_rest(spark):
    parsed = T.parse_telemetry(
        bronze(
            spark,
            [
                telemetry("ok", 0, seq=1),
                telemetry("hot", 1, seq=1, temperature=300.0),
                telemetry("both", 2, seq=1, temperature=300.0, humidity=-1.0),
                record("devices/bad/telemetry", 3, b"[1, 2]"),
            ],
        ),
        PAYLOAD,
    )
    conditions = {
        "s.temp": F.col("temperature") > 100,
        "s.humidity": F.col("humidity") < 0,
    }
    flagged = T.flag_failures(parsed, conditions)
    quarantine = T.to_quarantine(flagged, run_id="q-1", batch_id=4, quarantined_at=INGESTED)
    expected = spark.createDataFrame(
        [
            ("hot", 1, ["s.temp"], T.REASON_EXPECTATIONS, "q-1", 4, date(2026, 11, 21)),
            ("both", 2, ["s.temp", "s.humidity"], T.REASON_EXPECTATIONS, "q-1", 4, date(2026, 11, 21)),
            ("bad", 3, None, T.REASON_UNPARSEABLE, "q-1", 4, date(2026, 11, 21)),
        ],
        "device_id string, offset bigint, failed_expectations array<string>, reason string, run_id string, "
        "batch_id bigint, quarantine_date date",
    )
    equal(quarantine.select(*expected.columns), expected)
    quarantined = quarantine.where("offset = 3").first()
    assert quarantined is not None and quarantined["payload"] == b"[1, 2]"
    assert [r["device_id"] for r in T.passed_rows(flagged).collect()] == ["ok"]


def test_quarantine_from_rows_without_raw_columns_takes_them_from_bronze(spark):
    rows = [
        telemetry("ok", 0, seq=1),
        telemetry("hot", 1, seq=1, temperature=300.0),
        record("devices/bad/telemetry", 2, b"{not json"),
        record("devices/bad/telemetry", 2, b"{not json"),  # the same record read twice: two rows, as before
        record("devices/x/status", 3, b"online"),  # not telemetry: in bronze only
    ]
    raw = bronze(spark, rows)
    conditions = {"s.temp": F.col("temperature") > 100}
    parsed = T.parse_telemetry(raw, PAYLOAD)
    whole = T.to_quarantine(T.flag_failures(parsed, conditions), "q-1", 4, INGESTED)
    slim = T.flag_failures(T.without_raw_columns(parsed), conditions)
    assert not set(T.RAW_COLUMNS) & set(slim.columns)
    rejoined = T.with_raw_columns(slim.where(T.is_quarantined()), raw)
    assert whole.count() == 3
    equal(T.to_quarantine(rejoined, "q-1", 4, INGESTED).select(*whole.columns), whole)


def test_drop_duplicates_in_batch_by_offset_and_message_id_within_window(spark):
    rows = [
        telemetry("d", 0, seq=1, seconds=0),
        telemetry("d", 0, seq=1, seconds=0),  # the same record twice
        telemetry("d", 5, seq=1, seconds=0, broker="edge2"),  # the same message via another broker
        telemetry("d", 1, seq=2, seconds=1),
        telemetry("d", 2, seq=1, seconds=900),  # same seq, far later: the device's counter restarted
        telemetry("e", 3, seq=1, seconds=0),  # same seq, other device
        telemetry("d", 4, seq=None, seconds=2),  # no message id: never merged
        telemetry("d", 6, seq=None, seconds=2),
    ]
    parsed = T.parse_telemetry(bronze(spark, rows), PAYLOAD)
    kept = T.drop_duplicates_in_batch(parsed, ["seq"], window_seconds=600)
    expected = spark.createDataFrame(
        [
            ("edge1", "d", 0),
            ("edge1", "d", 1),
            ("edge1", "d", 2),
            ("edge1", "e", 3),
            ("edge1", "d", 4),
            ("edge1", "d", 6),
        ],
        "broker string, device_id string, offset bigint",
    )
    equal(kept.select("broker", "device_id", "offset"), expected)
    assert T.drop_duplicates_in_batch(parsed, [], 600).count() == 7


def test_drop_already_stored_removes_messages_silver_has_within_window(spark):
    parsed = T.parse_telemetry(
        bronze(spark, [telemetry("d", 10, seq=1, seconds=0), telemetry("d", 11, seq=2, seconds=0)]), PAYLOAD
    )
    stored = spark.createDataFrame(
        [("d", at(30), 1), ("d", at(-3600), 2)], "device_id string, event_time timestamp, seq bigint"
    )
    kept = T.drop_already_stored(parsed, stored, ["seq"], window_seconds=600)
    assert [(r["offset"], r["seq"]) for r in kept.collect()] == [(11, 2)]
    assert T.drop_already_stored(parsed, stored, [], 600).count() == 2


def test_a_message_id_with_a_part_missing_matches_nothing(spark):
    """Neither within the batch nor against silver: a null part is equal to no other value, not even null."""
    rows = [telemetry("d", 20, seq=None, seconds=0), telemetry("d", 21, seq=None, seconds=0)]
    parsed = T.parse_telemetry(bronze(spark, rows), PAYLOAD)
    stored = spark.createDataFrame([("d", at(0), None)], "device_id string, event_time timestamp, seq bigint")
    assert T.drop_duplicates_in_batch(parsed, ["seq"], 600).count() == 2
    assert T.drop_already_stored(parsed, stored, ["seq"], 600).count() == 2


def test_to_silver_selects_the_declared_columns(spark):
    parsed = T.parse_telemetry(bronze(spark, [telemetry("d", 0, seq=3, seconds=61)]), PAYLOAD)
    silver = T.to_silver(parsed, list(PAYLOAD.silver_fields))
    expected = spark.createDataFrame(
        [
            (
                "d",
                at(61),
                date(2026, 11, 21),
                "devices/d/telemetry",
                "edge1",
                0,
                INGESTED,
                3,
                21.5,
                40.0,
                80.0,
                "1.0.0",
                "blue",
            )
        ],
        "device_id string, event_time timestamp, event_date date, topic string, broker string, "
        "offset bigint, ingested_at timestamp, seq bigint, temperature double, humidity double, "
        "battery double, firmware string, group string",
    )
    equal(silver, expected)


def test_minute_aggregates_and_touched_minutes(spark):
    parsed = T.parse_telemetry(
        bronze(
            spark,
            [
                telemetry("d", 0, seq=1, seconds=1, temperature=20.0),
                telemetry("d", 1, seq=2, seconds=59, temperature=30.0, humidity=None),
                telemetry("d", 2, seq=3, seconds=60, temperature=10.0),
            ],
        ),
        PAYLOAD,
    )
    gold = T.minute_aggregates(parsed, ["temperature", "humidity"], updated_at=INGESTED)
    minute = T0.replace(second=0)
    expected = spark.createDataFrame(
        [
            ("d", minute, date(2026, 11, 21), 2, 20.0, 30.0, 25.0, 40.0, 40.0, 40.0, INGESTED),
            ("d", at(60), date(2026, 11, 21), 1, 10.0, 10.0, 10.0, 40.0, 40.0, 40.0, INGESTED),
        ],
        "device_id string, minute timestamp, event_date date, count bigint, temperature_min double, "
        "temperature_max double, temperature_avg double, humidity_min double, humidity_max double, "
        "humidity_avg double, updated_at timestamp",
    )
    equal(gold, expected)
    touched = spark.createDataFrame([("d", minute), ("d", at(60))], "device_id string, minute timestamp")
    equal(T.touched_minutes(parsed), touched)


def test_device_updates_take_latest_values_by_broker_time(spark):
    rows = [
        telemetry("d", 0, seq=1, seconds=10, firmware="1.0.0"),
        telemetry("d", 1, seq=2, seconds=20, broker="edge2", firmware=None),  # latest, but no firmware
        telemetry("e", 2, seq=1, seconds=5, group=None),
    ]
    parsed = T.parse_telemetry(bronze(spark, rows), PAYLOAD)
    devices = CONFIG.gold.devices
    updates = T.device_updates(T.telemetry_sightings(parsed, devices), updated_at=INGESTED)
    expected = spark.createDataFrame(
        [
            ("d", at(20), "edge2", "1.0.0", None, "blue", INGESTED),
            ("e", at(5), "edge1", "1.0.0", None, None, INGESTED),
        ],
        "device_id string, last_seen timestamp, broker string, firmware_version string, "
        "tags map<string,string>, group string, updated_at timestamp",
    )
    equal(updates, expected)


def test_status_topic_feeds_device_firmware(spark):
    config = load_telemetry_config(
        {
            "gold": {
                "devices": {"status_topic_template": "devices/{device_id}/actions", "tag_fields": ["group"]}
            }
        }
    )
    devices = config.gold.devices
    raw = bronze(
        spark,
        [
            telemetry("d", 0, seq=1, seconds=10, firmware="1.0.0"),
            record("devices/d/actions", 0, b'{"state": "SUCCEEDED", "firmware": "2.0.0"}', seconds=30),
        ],
    )
    parsed = T.parse_telemetry(raw, config.payload)
    sightings = T.telemetry_sightings(parsed, devices).unionByName(T.parse_status(raw, devices))
    updates = T.device_updates(sightings, updated_at=INGESTED)
    expected = spark.createDataFrame(
        [("d", at(30), "edge1", "2.0.0", {"group": "blue"}, "blue", INGESTED)],
        "device_id string, last_seen timestamp, broker string, firmware_version string, "
        "tags map<string,string>, group string, updated_at timestamp",
    )
    equal(updates, expected)


def test_event_time_bounds(spark):
    parsed = T.parse_telemetry(
        bronze(spark, [telemetry("d", 0, seq=1, seconds=5), telemetry("d", 1, seq=2, seconds=-5)]), PAYLOAD
    )
    low, high = T.event_time_bounds(parsed)
    assert low is not None and high is not None
    assert (ms(low), ms(high)) == (ms(at(-5)), ms(at(5)))
    assert T.event_time_bounds(parsed.limit(0)) == (None, None)


def test_without_records_of_drops_the_batch_own_records(spark):
    stored = spark.createDataFrame(
        [
            ("edge1", "devices/d/telemetry", 0, 1),
            ("edge1", "devices/d/telemetry", 1, 2),
            ("edge2", "t", 0, 3),
        ],
        "broker string, topic string, offset bigint, seq bigint",
    )
    batch = records(spark, [telemetry("d", 1, seq=2), record("t", 0, b"{}")])  # edge1's offset 1 and t@edge1
    expected = spark.createDataFrame(
        [("edge1", "devices/d/telemetry", 0, 1), ("edge2", "t", 0, 3)],
        "broker string, topic string, offset bigint, seq bigint",
    )
    equal(T.without_records_of(stored, batch), expected)
