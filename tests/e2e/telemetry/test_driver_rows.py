"""A batch's rows computed in the driver with Arrow equal the Spark queries' results on the same records.

Each Arrow step (:mod:`pipelines.telemetry.driver_rows`, ``driver_silver``, ``driver_devices``) is run on
the collected output of ``parse_records`` and compared with its Spark counterpart run on the same bronze
rows: the profile counts, silver's rows after deduplication against a batch and stored silver, quarantine's
rows, the devices updates and Great Expectations' outcomes.
"""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipelines.telemetry import driver_devices, driver_rows, driver_silver
from pipelines.telemetry import quality as Q
from pipelines.telemetry import transforms as T
from pipelines.telemetry.config import ExpectationConfig, SuiteConfig, load_telemetry_config
from tests.e2e.telemetry.telemetry_harness import at, record, records, telemetry

pytestmark = pytest.mark.spark

CONFIG = load_telemetry_config(None)
PAYLOAD = CONFIG.payload
TYPES = {name: t.strip().lower() for name, t in PAYLOAD.fields.items()}
INGESTED = at(3600)
SUITES = [
    SuiteConfig(
        "ranges",
        [
            ExpectationConfig("expect_column_values_to_not_be_null", "temperature"),
            ExpectationConfig(
                "expect_column_values_to_be_between", "temperature", min_value=-40, max_value=125
            ),
            ExpectationConfig(
                "expect_column_values_to_be_between", "humidity", min_value=0, max_value=100, mostly=0.5
            ),
        ],
    ),
    SuiteConfig(
        "sets",
        [
            ExpectationConfig("expect_column_values_to_be_in_set", "group", value_set=["blue", "red"]),
            ExpectationConfig("expect_column_values_to_match_regex", "device_id", regex="^d[0-9]+$"),
        ],
    ),
]


def batch_records(seed: int, count: int = 400) -> list[tuple]:
    """A batch with what deduplication and validation meet: the same record twice, the same message via a
    second broker, a counter that restarts, message ids with a part missing, pairs exactly at the
    window's edge, out-of-range and missing values, NaN, unparseable payloads and a status message."""
    rng = random.Random(seed)
    rows = []
    for offset in range(count):
        device = f"d{rng.randrange(6)}"
        seq = rng.choice([None, *range(1, 40)])
        seconds = rng.choice([0, 1, 2, 600, 601, 1200, rng.uniform(0, 1800)])
        fields: dict[str, object] = {}
        if rng.random() < 0.1:
            fields["temperature"] = rng.choice([None, 500.0, float("nan"), -41.0])
        if rng.random() < 0.1:
            fields["humidity"] = rng.choice([None, 101.0])
        if rng.random() < 0.1:
            fields["group"] = rng.choice([None, "green", "red"])
        broker = rng.choice(["edge1", "edge1", "edge2"])
        rows.append(telemetry(device, offset, seq, seconds, broker, **fields))
    rows += [rows[3], rows[7]]  # records read twice
    rows.append(record("devices/d1/telemetry", count, b"not json"))
    rows.append(record("devices/d2/telemetry", count + 1, b'{"temperature": "hot"}'))
    rows.append(record("devices/d1/actions", 0, b'{"firmware": "2.0.0"}'))
    return rows


def collected(spark, rows, suites=SUITES):
    """The Spark frame of the batch's bronze rows and its parsed, flagged rows; the latter collected."""
    bronze = T.to_bronze(records(spark, rows), INGESTED).cache()
    conditions = Q.row_failure_conditions(suites, TYPES)
    flagged = T.flag_failures(T.parse_telemetry(bronze, PAYLOAD), conditions).cache()
    table = T.flag_failures(T.parse_records(bronze, PAYLOAD), conditions).toArrow()
    return bronze, flagged, table


def equal(actual: pa.Table, expected, spark):
    """The Arrow rows equal the Spark rows (as Spark reads both), in any order."""
    sortable = [f.name for f in expected.schema.fields if not f.dataType.simpleString().startswith("map")]
    assert_df_equality(
        spark.createDataFrame(actual).select(*expected.columns),
        expected,
        ignore_nullable=True,
        allow_nan_equality=True,
        transforms=[lambda df: df.orderBy(*sortable)],
    )


def test_parse_records_gives_bronze_and_the_parsed_rows_in_one_frame(spark):
    bronze, flagged, table = collected(spark, batch_records(1))
    equal(driver_rows.bronze_rows(table, bronze.columns), bronze, spark)
    equal(driver_rows.telemetry_rows(table), flagged, spark)


@pytest.mark.parametrize("seed", [1, 2])
def test_profile_counts_equal_the_spark_aggregation(spark, seed):
    _, flagged, table = collected(spark, batch_records(seed))
    aggregates = [*T.profile_aggregates(), *Q.expression_aggregates(SUITES, TYPES)]
    expected = flagged.agg(*aggregates).first().asDict()
    assert driver_rows.profile(driver_rows.telemetry_rows(table), SUITES, TYPES) == expected
    assert expected["quarantined"] > 0 and expected["dq_m0"] > 0  # the batch has what is counted


def test_profile_of_a_batch_without_telemetry(spark):
    _, flagged, table = collected(spark, [record("devices/d1/actions", 0, b"{}")])
    aggregates = [*T.profile_aggregates(), *Q.expression_aggregates(SUITES, TYPES)]
    expected = flagged.agg(*aggregates).first().asDict()
    assert driver_rows.profile(driver_rows.telemetry_rows(table), SUITES, TYPES) == expected


def test_expectations_sharing_a_name_stay_with_spark():
    twice = ExpectationConfig("expect_column_values_to_be_between", "temperature", min_value=0)
    assert driver_rows.supported(SUITES)
    assert not driver_rows.supported([SuiteConfig("s", [twice, twice])])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_silver_rows_equal_the_spark_query(spark, seed):
    _, flagged, table = collected(spark, batch_records(seed))
    passed = T.passed_rows(flagged)
    stored_records = [telemetry(f"d{i % 6}", 5000 + i, i % 40, -300 + 7 * i) for i in range(150)]
    stored_records.append(telemetry("d1", 6000, None, 0))
    stored = T.to_silver(T.parse_telemetry(T.to_bronze(records(spark, stored_records), at(0)), PAYLOAD), [])
    fields = list(PAYLOAD.silver_fields)
    for window in (600, 0):
        rows = T.drop_duplicates_in_batch(passed, ["seq"], window)
        rows = T.drop_already_stored(rows, stored.withColumn("seq", F.col("offset") % 40), ["seq"], window)
        expected = T.to_silver(rows, fields)
        stored_arrow = stored.withColumn("seq", F.col("offset") % 40).toArrow()
        actual = driver_silver.silver_rows(
            driver_rows.passed_rows(driver_rows.telemetry_rows(table)), stored_arrow, ["seq"], window, fields
        )
        assert 0 < actual.num_rows < passed.count()
        equal(actual, expected, spark)
    without_ids = driver_silver.silver_rows(
        driver_rows.passed_rows(driver_rows.telemetry_rows(table)), stored.toArrow(), [], 600, fields
    )
    equal(without_ids, T.to_silver(T.drop_duplicates_in_batch(passed, [], 600), fields), spark)


def test_quarantine_rows_equal_the_spark_query(spark):
    bronze, flagged, table = collected(spark, batch_records(4))
    rejected = T.with_raw_columns(T.without_raw_columns(flagged).where(T.is_quarantined()), bronze)
    expected = T.to_quarantine(rejected, "q-1", 7, INGESTED)
    actual = driver_rows.quarantine_rows(driver_rows.telemetry_rows(table), "q-1", 7, INGESTED)
    assert actual.num_rows > 2
    equal(actual, expected, spark)


@pytest.mark.parametrize(
    "template", ["devices/{device_id}/telemetry", "sites/{site}/devices/{device_id}/telemetry"]
)
def test_device_updates_equal_the_spark_query(spark, template):
    config = load_telemetry_config({"payload": {"topic_template": template}})
    rows = [r for r in batch_records(5) if r[1].endswith("/telemetry")]
    if "{site}" in template:  # two sites; a device's latest reading decides its tags
        rows = [(r[0], f"sites/s{r[2] % 2}/{r[1]}", *r[2:]) for r in rows]
    bronze = T.to_bronze(records(spark, rows), INGESTED)
    flagged = T.flag_failures(T.parse_telemetry(bronze, config.payload), {})
    table = T.flag_failures(T.parse_records(bronze, config.payload), {}).toArrow()
    devices = config.gold.devices
    expected = T.device_updates(T.telemetry_sightings(T.passed_rows(flagged), devices), INGESTED)
    passed = driver_rows.passed_rows(driver_rows.telemetry_rows(table))
    actual = driver_devices.device_updates(passed, devices, INGESTED)
    assert actual.num_rows == 6
    equal(actual, expected, spark)


def test_devices_with_status_topics_or_tag_fields_stay_with_spark():
    devices = CONFIG.gold.devices
    assert driver_devices.supported(devices, TYPES)
    status = load_telemetry_config(
        {"gold": {"devices": {"status_topic_template": "devices/{device_id}/actions"}}}
    )
    tagged = load_telemetry_config({"gold": {"devices": {"tag_fields": ["group"]}}})
    assert not driver_devices.supported(status.gold.devices, TYPES)
    assert not driver_devices.supported(tagged.gold.devices, TYPES)
    assert not driver_devices.supported(devices, {**TYPES, "firmware": "double"})


def test_gx_on_the_collected_rows_equals_gx_on_a_spark_sample(spark):
    _, flagged, table = collected(spark, batch_records(6, count=60))
    columns = ["device_id", "event_time", "broker", "offset", "temperature", "humidity", "group", "seq"]
    validator = Q.GxValidator(SUITES, "pandas")
    expected, expected_rows = Q.gx_outcomes(validator, flagged, columns, max_rows=1000)
    parsed = driver_rows.parsed_rows(driver_rows.telemetry_rows(table))
    schema = flagged.select(*columns).schema
    actual, rows = Q.gx_outcomes_of_arrow(validator, parsed, schema, "UTC", max_rows=1000)
    assert rows == expected_rows == 62  # 60 readings and two read twice (not the unparseable ones)

    def comparable(outcomes):
        return [
            (o.suite, o.expectation, o.success, o.element_count, o.unexpected_count, _result(o))
            for o in outcomes
        ]

    assert comparable(actual) == comparable(expected)
    assert any(not o.success for o in actual)
    _, sampled = Q.gx_outcomes_of_arrow(validator, parsed, schema, "UTC", max_rows=10)
    assert sampled == 10


def _result(outcome: Q.ExpectationOutcome) -> str:
    return json.dumps(outcome.observed["result"], sort_keys=True)
