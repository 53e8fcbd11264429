"""The telemetry job over a backlog with duplicates and bad rows: each table checked with chispa.

Two real broker logs (LogStore + offsets API) hold the backlog; the streaming query reads it with
``availableNow`` in batches of three records, so duplicates meet both inside a batch and across batches
(against what silver already holds).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipelines.telemetry.config import load_telemetry_config
from tests.e2e.sources.conftest import EdgeBroker
from tests.e2e.telemetry.telemetry_harness import LogAppendPublisher, at, ms, reading, run_available_now

pytestmark = pytest.mark.spark

BETWEEN = "telemetry_basic.expect_column_values_to_be_between(temperature)"


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[dict[str, EdgeBroker]]:
    started = {name: EdgeBroker(tmp_path / name) for name in ("edge1", "edge2")}
    yield started
    for broker in started.values():
        broker.close()


def publish_backlog(brokers: dict[str, EdgeBroker]) -> list[tuple[str, str, int]]:
    """The backlog; returns every record's (broker, topic, offset)."""
    a, b, c = (f"devices/{d}/telemetry" for d in ("dev-a", "dev-b", "dev-c"))
    backlog: dict[str, list[tuple[str, bytes, float]]] = {
        "edge1": [
            (a, reading("dev-a", 1, 1, temperature=10.0), 1),
            (a, reading("dev-a", 2, 2, temperature=20.0), 2),
            (a, reading("dev-a", 3, 3, temperature=30.0), 3),
            (a, reading("dev-a", 4, 61, temperature=40.0), 61),
            (a, reading("dev-a", 2, 2, temperature=20.0), 62),  # re-sent after a reconnect: a duplicate
            (a, reading("dev-a", 5, 63, temperature="hot"), 63),  # wrong type: unparseable
            (c, b"not json", 4),  # unparseable
        ],
        "edge2": [
            (a, reading("dev-a", 3, 3, temperature=30.0), 3.5),  # the same message via another broker
            (b, reading("dev-b", 1, 5, temperature=15.0, group="red"), 5),
            (b, reading("dev-b", 2, 6, temperature=25.0, group="red"), 6),
            (b, reading("dev-b", 3, 7, temperature=500.0, group="red"), 7),  # out of range: quarantined
        ],
    }
    keys = []
    for name, messages in backlog.items():
        publisher = LogAppendPublisher(name, brokers[name])
        offsets: dict[str, int] = {}
        for topic, payload, seconds in messages:
            publisher.publish(topic, payload, ms(at(seconds)))
            keys.append((name, topic, offsets.setdefault(topic, 0)))
            offsets[topic] += 1
        publisher.flush()
    return keys


def test_backlog_with_duplicates_and_bad_rows_fills_every_table_exactly(spark, tmp_path, brokers):
    keys = publish_backlog(brokers)
    config = load_telemetry_config(
        {
            "source": {
                "brokers": [f"{name}={broker.url}" for name, broker in brokers.items()],
                "max_records_per_trigger": 3,
                # patient with brokers that answer slowly on a busy machine: the test is about the tables
                "options": {"fetchTimeoutMs": "30000", "fetchRetries": "6"},
            },
            "tables": {"root": str(tmp_path / "tables")},
            "stream": {"checkpoint": str(tmp_path / "checkpoint")},
            "quality": {"gx": {"schedule": "never"}},
        }
    )
    batch = run_available_now(spark, config, 300)
    assert len(batch.reports) >= 3  # the backlog took several batches
    store = batch.store

    def equal(actual, expected):
        assert_df_equality(
            actual, expected, ignore_row_order=True, ignore_nullable=True, ignore_metadata=True
        )

    bronze = spark.createDataFrame(keys, "broker string, topic string, offset bigint")
    equal(store.read("bronze_telemetry").select("broker", "topic", "offset"), bronze)

    silver = spark.createDataFrame(
        [
            ("dev-a", 1, at(1), 10.0, "blue"),
            ("dev-a", 2, at(2), 20.0, "blue"),
            ("dev-a", 3, at(3), 30.0, "blue"),
            ("dev-a", 4, at(61), 40.0, "blue"),
            ("dev-b", 1, at(5), 15.0, "red"),
            ("dev-b", 2, at(6), 25.0, "red"),
        ],
        "device_id string, seq bigint, event_time timestamp, temperature double, group string",
    )
    equal(store.read("silver_telemetry").select(*silver.columns), silver)

    quarantine = spark.createDataFrame(
        [
            ("edge1", "devices/dev-a/telemetry", 5, "dev-a", "unparseable_payload", None),
            ("edge1", "devices/dev-c/telemetry", 0, "dev-c", "unparseable_payload", None),
            ("edge2", "devices/dev-b/telemetry", 2, "dev-b", "failed_expectations", [BETWEEN]),
        ],
        "broker string, topic string, offset bigint, device_id string, reason string, "
        "failed_expectations array<string>",
    )
    equal(store.read("telemetry_quarantine").select(*quarantine.columns), quarantine)

    minutes = spark.createDataFrame(
        [
            ("dev-a", at(0), 3, 10.0, 30.0, 20.0),
            ("dev-a", at(60), 1, 40.0, 40.0, 40.0),
            ("dev-b", at(0), 2, 15.0, 25.0, 20.0),
        ],
        "device_id string, minute timestamp, count bigint, temperature_min double, temperature_max double, "
        "temperature_avg double",
    )
    equal(store.read("device_minute").select(*minutes.columns), minutes)

    devices = spark.createDataFrame(
        [("dev-a", at(62), "1.0.0", "blue"), ("dev-b", at(6), "1.0.0", "red")],
        "device_id string, last_seen timestamp, firmware_version string, group string",
    )
    equal(store.read("devices").select(*devices.columns), devices)

    dq = (
        store.read("dq_results")
        .groupBy("suite", "expectation")
        .agg(F.sum("element_count").alias("rows"), F.sum("unexpected_count").alias("unexpected"))
    )
    expected_dq = spark.createDataFrame(
        [
            ("pipeline", "payload_is_json_of_declared_types", 11, 2),
            ("telemetry_basic", "expect_column_values_to_not_be_null(device_id)", 9, 0),
            ("telemetry_basic", "expect_column_values_to_be_between(temperature)", 9, 1),
        ],
        "suite string, expectation string, rows bigint, unexpected bigint",
    )
    equal(dq, expected_dq)
