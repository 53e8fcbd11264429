"""The decoders as the telemetry job runs them: in Spark's Python workers, over Arrow batches of records."""

from __future__ import annotations

import datetime as dt
import math

import cbor2
import pytest
from pyspark.sql import functions as F

from pipelines.payloads.descriptors import message_class
from pipelines.payloads.formats import FieldFormat
from pipelines.payloads.protobuf import EXAMPLE_MESSAGE, example_descriptor_set
from pipelines.payloads.spark_fields import decoded_struct as with_format_struct
from pipelines.payloads.spark_fields import with_decoded_fields
from pipelines.payloads.spark_sparkplug import sparkplug_rows, with_times
from pipelines.payloads.sparkplug.encode import MetricOut, bdseq_metric, encode, ndeath

pytestmark = pytest.mark.spark

FIELDS = {"ts": "bigint", "seq": "bigint", "temperature": "double", "firmware": "string"}
RECORDS = "broker string, topic string, offset bigint, timestamp timestamp, payload binary"
T0 = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)


def records(spark, payloads, topic="devices/d1/telemetry"):
    rows = [("edge1", topic, n, T0 + dt.timedelta(milliseconds=n), p) for n, p in enumerate(payloads)]
    return spark.createDataFrame(rows, RECORDS)


def test_cbor_payloads_are_read_into_typed_columns_by_the_workers(spark):
    good = cbor2.dumps({"ts": 1, "seq": 2, "temperature": 21.5, "firmware": "1.0.0"})
    frame = with_decoded_fields(records(spark, [good, good[:-2], None]), FieldFormat("cbor"), FIELDS)
    assert dict(frame.dtypes)["temperature"] == "double" and dict(frame.dtypes)["seq"] == "bigint"
    rows = frame.orderBy("offset").collect()
    assert (rows[0]["seq"], rows[0]["temperature"], rows[0]["decode_error"]) == (2, 21.5, None)
    assert rows[1]["decode_error"].startswith(f"cbor: byte {len(good) - 2}: premature end of stream")
    assert rows[2]["decode_error"] == "no payload"
    assert rows[1]["topic"] == "devices/d1/telemetry"  # the record's own columns pass through


def test_protobuf_payloads_are_read_with_the_descriptor_set_shipped_to_the_workers(spark):
    cls = message_class(example_descriptor_set(), EXAMPLE_MESSAGE)
    payloads = [cls(ts=5, seq=n, temperature=20.0 + n, firmware="2.0").SerializeToString() for n in range(50)]
    protobuf = FieldFormat("protobuf", example_descriptor_set(), EXAMPLE_MESSAGE)
    frame = with_decoded_fields(records(spark, payloads).repartition(3), protobuf, FIELDS)
    [summary] = frame.agg(F.count("*"), F.sum("seq"), F.max("temperature"), F.count("decode_error")).collect()
    assert tuple(summary) == (50, sum(range(50)), 69.0, 0)


def test_a_field_the_message_lacks_fails_before_any_task(spark):
    protobuf = FieldFormat("protobuf", example_descriptor_set(), EXAMPLE_MESSAGE)
    with pytest.raises(ValueError, match="has no field 'pressure'"):
        with_decoded_fields(records(spark, []), protobuf, {"pressure": "double"})


def test_sparkplug_sessions_live_in_the_state_store_across_micro_batches(spark, tmp_path):
    """Three micro-batches: births; data by alias; the death. Each batch only makes sense with the state
    the one before left in the state store."""
    node, device = "spBv1.0/plant1/{}/gw1", "spBv1.0/plant1/{}/gw1/pump7"
    birth = encode(
        [bdseq_metric(0), MetricOut(230.0, "Double", name="Voltage", alias=1)], timestamp_ms=1, seq=0
    )
    dbirth = encode([MetricOut(20.0, "Float", name="Temperature", alias=10)], timestamp_ms=2, seq=1)
    data = encode([MetricOut(21.5, "Float", alias=10, with_datatype=False)], timestamp_ms=3, seq=2)
    batches = [
        [(node.format("NBIRTH"), 0, 1, birth), (device.format("DBIRTH"), 0, 2, dbirth)],
        [(device.format("DDATA"), 0, 3, data), ("spBv1.0/STATE/host", 0, 3, b'{"online":true}')],
        [(node.format("NDEATH"), 0, 4, ndeath(0))],
    ]
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    for number, batch in enumerate(batches):
        rows = [
            ("edge1", topic, offset, T0 + dt.timedelta(milliseconds=ms), p) for topic, offset, ms, p in batch
        ]
        spark.createDataFrame(rows, RECORDS).coalesce(1).write.parquet(str(incoming / f"batch{number}"))
    seen: list[list] = []
    stream = spark.readStream.schema(RECORDS).option("maxFilesPerTrigger", 1).parquet(str(incoming / "*"))
    query = (
        with_times(sparkplug_rows(stream))
        .writeStream.option("checkpointLocation", str(tmp_path / "checkpoint"))
        .foreachBatch(lambda frame, batch_id: seen.append(frame.orderBy("kind", "metric").collect()))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    first, second, third = seen
    assert sorted((r["kind"], r["metric"] or r["device_id"]) for r in first if r["kind"] == "metric") == [
        ("metric", "Temperature"),
        ("metric", "Voltage"),
        ("metric", "bdSeq"),
    ]
    [reading] = second  # the STATE message is not an edge node's
    assert (reading["metric"], reading["value_double"], reading["seq_gap"]) == ("Temperature", 21.5, False)
    assert reading["metric_time"] == dt.datetime(1970, 1, 1, 0, 0, 0, 3000)
    assert sorted((r["kind"], r["device_id"] or "", r["online"]) for r in third) == [
        ("presence", "", False),  # the edge node
        ("presence", "pump7", False),
    ]


def test_the_decoded_struct_takes_the_place_of_from_jsons_in_an_expression(spark):
    """As the telemetry job uses ``from_json``: a struct column whose corrupt-record field flags the row."""
    good = cbor2.dumps({"ts": 1, "seq": 2, "temperature": 21.5, "firmware": "1.0.0"})
    sparse = cbor2.dumps({"ts": 3})  # fields it lacks are null, and it is not an error
    frame = records(spark, [good, sparse, b"\xff", None])
    parsed = frame.withColumn(
        "_json", with_format_struct(F.col("payload"), FieldFormat("cbor"), FIELDS, "_corrupt_record")
    ).select(
        "offset",
        F.col("_json").getField("seq").alias("seq"),
        F.col("_json").getField("temperature").alias("temperature"),
        F.col("_json").getField("_corrupt_record").alias("error"),
    )
    assert dict(parsed.dtypes) == {
        "offset": "bigint",
        "seq": "bigint",
        "temperature": "double",
        "error": "string",
    }
    rows = [tuple(row) for row in parsed.orderBy("offset").collect()]
    assert rows[:2] == [(0, 2, 21.5, None), (1, None, None, None)]
    assert rows[2][3].startswith("cbor: byte 1: break code") and rows[3][3] == "no payload"


def test_sparkplug_values_leave_the_workers_exact_wide_integers_and_nan_included(spark, tmp_path):
    """An Int64 beyond 2**53 beside a metric with no integer (a Boolean) reached Spark through a float64
    pandas column: Arrow refused the cast and the whole query failed, every restart again at that batch.
    A NaN Float came out null, and is_null false: a value neither sent nor null."""
    metrics = [
        bdseq_metric(0),
        MetricOut(2**62 + 1, "Int64", name="Counter", alias=1),
        MetricOut(-(2**63), "Int64", name="Low", alias=2),
        MetricOut(2**63 - 1, "UInt64", name="High", alias=3),
        MetricOut(True, "Boolean", name="Running", alias=4),
        MetricOut(float("nan"), "Float", name="Flow", alias=5),
        MetricOut(float("-inf"), "Double", name="Level", alias=6),
        MetricOut(None, "Double", name="Spare", alias=7),
    ]
    birth = encode(metrics, timestamp_ms=1, seq=0)
    incoming = tmp_path / "incoming"
    spark.createDataFrame([("edge1", "spBv1.0/plant1/NBIRTH/gw1", 0, T0, birth)], RECORDS).write.parquet(
        str(incoming / "batch0")
    )
    seen: list[list] = []
    stream = spark.readStream.schema(RECORDS).parquet(str(incoming / "*"))
    query = (
        sparkplug_rows(stream)
        .writeStream.option("checkpointLocation", str(tmp_path / "checkpoint"))
        .foreachBatch(lambda frame, batch_id: seen.append(frame.where("kind = 'metric'").collect()))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    values = {r["metric"]: (r["value_long"], r["value_double"], r["is_null"]) for r in seen[0]}
    assert values["Counter"][0] == 2**62 + 1
    assert values["Low"][0] == -(2**63)
    assert values["High"][0] == 2**63 - 1
    assert values["Running"] == (None, None, False)
    assert math.isnan(values["Flow"][1]) and values["Flow"][2] is False
    assert values["Level"] == (None, float("-inf"), False)
    assert values["Spare"] == (None, None, True)


def test_the_decoded_struct_keeps_wide_integers_and_nan_beside_a_payload_that_failed(spark):
    """The struct's frame left the worker in NumPy columns: a payload that failed (its fields null) made
    the bigint column float64, which rounded 2**62 + 1 to 2**62 in silver, silently; and a NaN reading
    came out null, where JSON's keeps it."""
    cls = message_class(example_descriptor_set(), EXAMPLE_MESSAGE)
    wide = cls(ts=2**62 + 1, seq=-(2**63), temperature=float("nan"), firmware="2.0").SerializeToString()
    protobuf = FieldFormat("protobuf", example_descriptor_set(), EXAMPLE_MESSAGE)
    frame = records(spark, [wide, wide[:-2]]).coalesce(1)
    parsed = frame.select(
        "offset", with_format_struct(F.col("payload"), protobuf, FIELDS, "_corrupt_record").alias("_pb")
    ).select("offset", "_pb.*")
    rows = [row.asDict() for row in parsed.orderBy("offset").collect()]
    assert (rows[0]["ts"], rows[0]["seq"], rows[0]["_corrupt_record"]) == (2**62 + 1, -(2**63), None)
    assert math.isnan(rows[0]["temperature"])
    assert rows[1]["ts"] is None and rows[1]["_corrupt_record"].startswith("protobuf: byte")
