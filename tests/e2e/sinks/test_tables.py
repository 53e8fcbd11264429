"""The table declarations: one place, consistent, extendable from configuration."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import ArrayType, DoubleType, MapType, StringType, StructField

from sinks.tables import (
    DEFAULT_CATALOG,
    DEFAULT_PAYLOAD_FIELDS,
    EXECUTION_STATES,
    UnknownTable,
    build_catalog,
    parse_fields,
    table_spec,
)

ALL_TABLES = {
    "bronze_telemetry",
    "silver_telemetry",
    "telemetry_quarantine",
    "dq_results",
    "device_minute",
    "devices",
    "actions",
    "action_executions",
    "action_summary",
    "fleet_compliance",
}


def test_the_default_catalog_declares_every_table():
    assert set(DEFAULT_CATALOG) == ALL_TABLES


@pytest.mark.parametrize("name", sorted(ALL_TABLES))
def test_arrow_schema_is_derived_from_the_spark_schema(name):
    spec = DEFAULT_CATALOG[name]
    arrow = spec.arrow_schema
    assert arrow.names == spec.column_names
    assert [f.nullable for f in arrow] == [f.nullable for f in spec.schema.fields]
    for field in arrow:
        if pa.types.is_timestamp(field.type):
            assert field.type == pa.timestamp("us", tz="UTC"), field.name
    assert spec.merge_keys, "every table declares the columns that identify a row"
    for key in (*spec.merge_keys, *spec.partition_by):
        assert not spec.schema[key].nullable, f"{name}.{key} must be NOT NULL"


def test_tables_streamed_downstream_have_the_change_data_feed():
    streamed = {n for n, spec in DEFAULT_CATALOG.items() if spec.change_data_feed}
    assert {"actions", "action_executions", "bronze_telemetry", "silver_telemetry"} <= streamed
    assert DEFAULT_CATALOG["actions"].properties["delta.enableChangeDataFeed"] == "true"


def test_bronze_matches_the_offsets_api_record_plus_ingest_columns():
    bronze = table_spec("bronze_telemetry")
    assert bronze.column_names == [
        "broker",
        "topic",
        "offset",
        "timestamp",
        "client_id",
        "qos",
        "retain",
        "properties",
        "payload",
        "ingest_date",
        "ingested_at",
    ]
    assert bronze.partition_by == ("ingest_date",)
    assert bronze.arrow_schema.field("qos").type == pa.int8()
    assert bronze.arrow_schema.field("payload").type == pa.binary()
    assert isinstance(bronze.schema["properties"].dataType, MapType)


def test_actions_nest_target_payload_rollout_and_abort_criteria():
    actions = table_spec("actions")
    assert actions.schema["target"].dataType.simpleString() == (
        "struct<device_ids:array<string>,group:string,all:boolean>"
    )
    assert actions.schema["payload"].dataType.simpleString() == (
        "struct<version:string,url:string,sha256:string,size:bigint,command:string,args:map<string,string>>"
    )
    assert actions.schema["rollout"].dataType.simpleString() == "struct<max_per_minute:int,broadcast:boolean>"
    assert actions.schema["abort_criteria"].dataType.simpleString() == (
        "struct<failure_pct:double,min_executed:int>"
    )
    assert actions.merge_keys == ("id",)


def test_action_summary_counts_every_execution_state():
    summary = table_spec("action_summary")
    assert [c for c in summary.column_names if c.endswith("_count")] == [
        "queued_count",
        "in_progress_count",
        "succeeded_count",
        "failed_count",
        "timed_out_count",
        "rejected_count",
        "canceled_count",
        "total_count",
        "retries_count",  # executions queued again by a retry rule, not a state
        "expired_count",  # a state added later: a nullable column at the end (LATER_STATES)
    ]
    assert len(EXECUTION_STATES) == 8
    assert table_spec("action_executions").merge_keys == ("action_id", "device_id")


def test_silver_payload_columns_come_from_configuration():
    catalog = build_catalog({"temperature": "double", "door_open": "boolean", "co2": "int"})
    silver = catalog["silver_telemetry"]
    assert silver.column_names[-3:] == ["temperature", "door_open", "co2"]
    assert silver.schema["co2"].nullable
    minute = catalog["device_minute"]
    assert {"temperature_avg", "co2_min", "co2_max"} <= set(minute.column_names)
    assert not any(c.startswith("door_open") for c in minute.column_names), "booleans are not metrics"
    default_silver = DEFAULT_CATALOG["silver_telemetry"]
    assert default_silver.column_names[-len(DEFAULT_PAYLOAD_FIELDS) :] == list(DEFAULT_PAYLOAD_FIELDS)


def test_payload_fields_accept_spark_types_for_nested_columns():
    fields = parse_fields({"readings": ArrayType(DoubleType())}, "payload_fields")
    assert fields == [StructField("readings", ArrayType(DoubleType()), True)]


def test_a_bad_payload_type_names_the_field():
    with pytest.raises(ValueError, match=r"payload_fields\.humidity: unknown type 'dbl'"):
        build_catalog({"temperature": "double", "humidity": "dbl"})


def test_a_payload_field_may_not_shadow_a_standard_column():
    with pytest.raises(ValueError, match=r"duplicate columns \['device_id'\]"):
        build_catalog({"device_id": "string"})


def test_with_columns_extends_a_spec_without_touching_the_original():
    silver = DEFAULT_CATALOG["silver_telemetry"]
    wider = silver.with_columns([StructField("firmware_build", StringType())])
    assert wider.column_names == [*silver.column_names, "firmware_build"]
    assert "firmware_build" not in silver.column_names
    catalog = DEFAULT_CATALOG.replace(wider)
    assert catalog["silver_telemetry"] is wider and len(catalog) == len(DEFAULT_CATALOG)


def test_unknown_table_lists_the_declared_ones():
    with pytest.raises(UnknownTable, match=r"unknown table 'bronze'.*'bronze_telemetry'"):
        DEFAULT_CATALOG["bronze"]


def test_locations_under_a_root_or_in_a_namespace():
    spec = DEFAULT_CATALOG["devices"]
    assert spec.location("/data/lake/") == "/data/lake/devices"
    assert spec.location("s3://bucket/lake") == "s3://bucket/lake/devices"
    assert DEFAULT_CATALOG.location("actions", "/x") == "/x/actions"
    assert spec.qualified_name("main.timestone") == "main.timestone.devices"


def test_read_schema_is_the_declared_schema_made_nullable():
    spec = DEFAULT_CATALOG["actions"]
    assert spec.read_schema.simpleString() == spec.schema.simpleString()
    assert all(f.nullable for f in spec.read_schema.fields)
    assert not spec.schema["id"].nullable
