"""Every telemetry transformation on small DataFrames with the source's schema, compared with chispa."""

from __future__ import annotations

from datetime import date, datetime

import cbor2
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipelines.telemetry import transforms as T
from pipelines.telemetry.config import DedupConfig, load_telemetry_config
from pipelines.telemetry.dedup import DUPLICATE, flag_duplicates
from pipelines.telemetry.quality import row_failure_conditions
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


def sorted_out(spark, sent, payload=PAYLOAD):
    """Each payload of ``sent`` (keyed by its device id) as a device's telemetry record, parsed and checked
    by ``payload``: the detail of each device quarantined, and the flagged rows."""
    rows = [record(f"devices/{name}/telemetry", n, p) for n, (name, p) in enumerate(sent.items())]
    flagged = T.flag_failures(T.parse_records(bronze(spark, rows), payload), {})
    quarantine = T.to_quarantine(flagged, payload, run_id="q", batch_id=0, quarantined_at=INGESTED)
    return {r["device_id"]: r["detail"] for r in quarantine.collect()}, flagged


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


def test_a_time_no_timestamp_can_hold_is_unparseable_and_the_batch_goes_on(spark):
    """A clock in nanoseconds, the largest 64-bit value, a year before 0001: in ANSI mode one conversion
    that overflows fails the whole micro-batch, every device's rows with it. Each is a row of its own,
    unparseable with where it broke, at the broker's time; the rows beside it are read as always."""
    rows = [
        record("devices/ns/telemetry", 0, reading("ns", 1, ts=1_796_000_000_000_000_000), seconds=5),
        record("devices/max/telemetry", 1, reading("max", 1, ts=2**63 - 1), seconds=6),
        record("devices/old/telemetry", 2, reading("old", 1, ts=-99_999_999_999_999), seconds=7),
        telemetry("good", 3, seq=1, seconds=8),
    ]
    parsed = T.parse_telemetry(bronze(spark, rows), PAYLOAD)
    actual = parsed.select("device_id", "event_time", "parse_error", "parse_detail", "temperature")
    never = "is not a time in epoch_ms (years 0001 to 9999)"
    expected = spark.createDataFrame(
        [
            ("ns", at(5), True, f"field ts: 1796000000000000000 {never}", 21.5),
            ("max", at(6), True, f"field ts: {2**63 - 1} {never}", 21.5),
            ("old", at(7), True, f"field ts: -99999999999999 {never}", 21.5),
            ("good", at(8), False, None, 21.5),
        ],
        "device_id string, event_time timestamp, parse_error boolean, parse_detail string, "
        "temperature double",
    )
    equal(actual, expected)


def test_a_time_in_seconds_out_of_range_or_an_iso_string_that_is_no_time_is_unparseable(spark):
    def config(unit: str, type_name: str):
        return load_telemetry_config(
            {
                "payload": {
                    "fields": {"t": type_name, "v": "double"},
                    "event_time_field": "t",
                    "event_time_unit": unit,
                },
                "dedup": {"message_id_fields": []},
                "gold": {"minute_metrics": ["v"], "devices": {"firmware_field": None, "group_field": None}},
                "quality": {"suites": []},
            }
        ).payload

    seconds = [
        record("devices/a/telemetry", 0, b'{"t": 1e30, "v": 1}', seconds=1),
        record("devices/b/telemetry", 1, b'{"t": 1763719242.5, "v": 2}', seconds=2),
    ]
    parsed = T.parse_telemetry(bronze(spark, seconds), config("epoch_s", "double"))
    assert [(r.device_id, r.parse_error, r.event_time) for r in parsed.orderBy("offset").collect()] == [
        ("a", True, at(1).replace(tzinfo=None)),
        ("b", False, datetime(2025, 11, 21, 10, 0, 42, 500000)),
    ]
    iso = [
        record("devices/a/telemetry", 0, b'{"t": "yesterday", "v": 1}', seconds=1),
        record("devices/b/telemetry", 1, b'{"t": "2026-11-21T10:00:42Z", "v": 2}', seconds=2),
        record("devices/c/telemetry", 2, b'{"v": 3}', seconds=3),  # no time: the broker's, not an error
    ]
    parsed = T.parse_telemetry(bronze(spark, iso), config("iso8601", "string"))
    assert [(r.device_id, r.parse_error, r.parse_detail) for r in parsed.orderBy("offset").collect()] == [
        ("a", True, "field t: yesterday is not a time in iso8601 (years 0001 to 9999)"),
        ("b", False, None),
        ("c", False, None),
    ]


def test_json_that_only_a_lenient_parser_reads_is_unparseable_saying_where(spark):
    """Single-quoted names and bytes that are no UTF-8 inside a string: read by Jackson's defaults (the
    latter as U+FFFD), refused by JSON and by the Python reader that says where."""
    rows = [
        record("devices/quotes/telemetry", 0, b"{'ts': 1795000000000, 'seq': 3}"),
        record("devices/bytes/telemetry", 1, b'{"ts": 1795000000000, "seq": 6, "firmware": "\xff\xfe"}'),
        telemetry("good", 2, seq=1),
    ]
    parsed = T.parse_telemetry(bronze(spark, rows), PAYLOAD).orderBy("offset").collect()
    assert [(r.device_id, r.parse_error, r.firmware) for r in parsed] == [
        ("quotes", True, None),
        ("bytes", True, None),
        ("good", False, "1.0.0"),
    ]


def test_a_payload_with_more_after_its_object_is_unparseable_and_none_of_it_lands(spark):
    """Spark's JSON parser stops at the end of the first object: two readings sent in one payload landed as
    the first alone (the second lost, silently), and text after the object was ignored. Such a payload is
    one that JSON does not read, quarantined whole; whitespace after it, nesting and braces in strings are
    not."""
    first = b'{"ts": 1795000000000, "seq": 1, "temperature": 20.5}'
    second = b'{"ts": 1795000001000, "seq": 2, "temperature": 21.5}'
    nested = b'{"seq": 4, "firmware": "}{", "extra": {"a": [{"b": 1}, {"c": NaN}]}}'
    payloads = {
        "two": first + second,
        "lines": first + b"\n" + second,
        "listed": first + b", " + second,
        "closed": first + b"]",
        "closed-two": first + b"] " + second,
        "braced": first + b"}",
        "text": first + b" sent by d7",
        "spaced": first + b" \r\n\t ",
        "nested": nested,
    }
    details, flagged = sorted_out(spark, payloads)
    assert details == {
        "two": "json: character 52: Extra data",
        "lines": "json: character 53: Extra data",
        "listed": "json: character 52: Extra data",
        "closed": "json: character 52: Extra data",
        "closed-two": "json: character 52: Extra data",
        "braced": "json: character 52: Extra data",
        "text": "json: character 53: Extra data",
    }
    passed = {r["device_id"]: (r["seq"], r["firmware"]) for r in T.passed_rows(flagged).collect()}
    assert passed == {"spaced": (1, None), "nested": (4, "}{")}


def test_a_json_number_or_a_time_out_of_the_years_0001_9999_in_a_time_field_is_unparseable(spark):
    """Spark's JSON parser reads a number in a timestamp field as epoch seconds, silently: a clock counting
    milliseconds landed in the year 58851 (which Python readers of silver cannot even hold) and one
    counting nanoseconds wrapped around to a date in range (1e17 became 8319-09-05); a time string past
    9999 or before 0001 was kept too. Such a row is unparseable, as the CBOR and Protobuf readers have it;
    ISO-8601 strings read as before."""
    fields = {**PAYLOAD.fields, "when": "timestamp", "day": "date"}
    payload = load_telemetry_config({"payload": {"fields": fields}}).payload
    sent = {
        "ms": b'{"seq": 1, "when": 1795000000000}',
        "ns": b'{"seq": 1, "when": 1795000000000000000}',
        "wraps": b'{"seq": 1, "when": 100000000000000000}',
        "seconds": b'{"seq": 1, "when": 1795000000}',
        "late": b'{"seq": 1, "when": "+10000-01-01T00:00:00Z"}',
        "early": b'{"seq": 1, "when": "0000-01-01T00:00:00Z"}',
        "late-day": b'{"seq": 1, "day": "+99999-01-01"}',
        "object": b'{"seq": 1, "when": {"s": 1}}',
        "iso": b'{"seq": 1, "when": "2026-11-30T10:00:00.123456+01:00", "day": "2026-11-30"}',
        "spaced": b'{"seq": 1, "when": "2026-11-30 10:00:00"}',
        "none": b'{"seq": 1, "when": null}',
    }
    details, flagged = sorted_out(spark, sent, payload)
    assert details == {
        "ms": "field when: expected timestamp, got int 1795000000000",
        "ns": "field when: expected timestamp, got int 1795000000000000000",
        "wraps": "field when: expected timestamp, got int 100000000000000000",
        "seconds": "field when: expected timestamp, got int 1795000000",
        "late": "field when: '+10000-01-01T00:00:00Z' is not an ISO-8601 timestamp",
        "early": "field when: '0000-01-01T00:00:00Z' is not an ISO-8601 timestamp",
        "late-day": "field day: '+99999-01-01' is not an ISO-8601 date",
        "object": "field when: expected timestamp, got dict {'s': 1}",
    }
    passed = T.passed_rows(flagged).select(
        "device_id", F.col("when").cast("string").alias("when"), F.col("day").cast("string").alias("day")
    )
    assert sorted(tuple(r) for r in passed.collect()) == [
        ("iso", "2026-11-30 09:00:00.123456", "2026-11-30"),
        ("none", None, None),
        ("spaced", "2026-11-30 10:00:00", None),
    ]


def test_a_json_number_past_a_float_fields_range_is_unparseable_not_infinity(spark):
    """Spark's parser turned 1e300 in a float field into Infinity, silently, where the CBOR and Protobuf
    readers refuse it. Such a number is unparseable; Infinity and NaN written as such, and a number past
    any double (read as Infinity by both parsers), are kept as the leniency they are."""
    payload = load_telemetry_config({"payload": {"fields": {**PAYLOAD.fields, "f": "float"}}}).payload
    sent = {
        "wide": b'{"seq": 1, "f": 1e300}',
        "negative": b'{"seq": 1, "f": -3.5e38}',
        "fits": b'{"seq": 1, "f": 1.5}',
        "largest": b'{"seq": 1, "f": 3.4028234663852886e38}',
        "infinity": b'{"seq": 1, "f": -Infinity}',
        "nan": b'{"seq": 1, "f": NaN}',
        "past-doubles": b'{"seq": 1, "f": 1e400}',
    }
    details, flagged = sorted_out(spark, sent, payload)
    assert details == {
        "wide": "field f: 1e+300 does not fit a float",
        "negative": "field f: -3.5e+38 does not fit a float",
    }
    passed = {r["device_id"]: r["f"] for r in T.passed_rows(flagged).collect()}
    assert flagged.schema["f"].dataType.simpleString() == "float"
    assert {name: repr(value) for name, value in passed.items()} == {
        "fits": "1.5",
        "largest": "3.4028234663852886e+38",
        "infinity": "-inf",
        "nan": "nan",
        "past-doubles": "inf",
    }


def test_a_json_number_past_a_tinyint_fields_range_is_unparseable_not_wrapped(spark):
    """Spark's parser takes 128 to 255 into a tinyint as a byte's bits: 200 was written as -56, silently,
    where the CBOR and Protobuf readers refuse it (256 and up were refused)."""
    payload = load_telemetry_config({"payload": {"fields": {**PAYLOAD.fields, "b": "tinyint"}}}).payload
    sent = {"wraps": b'{"seq": 1, "b": 200}', "top": b'{"seq": 1, "b": 255}', "low": b'{"seq": 1, "b": -128}'}
    sent |= {"high": b'{"seq": 1, "b": 127}', "none": b'{"seq": 1}'}
    details, flagged = sorted_out(spark, sent, payload)
    assert details == {
        "wraps": "field b: 200 does not fit a tinyint",
        "top": "field b: 255 does not fit a tinyint",
    }
    assert flagged.schema["b"].dataType.simpleString() == "tinyint"
    passed = {r["device_id"]: r["b"] for r in T.passed_rows(flagged).collect()}
    assert passed == {"low": -128, "high": 127, "none": None}


def test_a_declared_field_given_twice_in_a_json_object_is_unparseable_not_its_last_value(spark):
    """``{"seq": 1, "temperature": 20.5, "temperature": 99.0}`` landed in silver as 99.0, the 20.5 gone
    without a word (Spark's parser, like Python's, keeps the last value of a name). Which value the device
    meant is unknown: such a payload is unparseable, saying the field. A name twice inside a nested value,
    an undeclared name twice, or a declared name inside a string are not that."""
    sent = {
        "twice": b'{"seq": 1, "temperature": 20.5, "temperature": 99.0}',
        "same": b'{"seq": 7, "seq": 7}',
        "pretty": b'{\n  "seq": 1,\n  "battery": 50.0,\n  "seq" : 2\n}',
        "nested": b'{"seq": 1, "extra": {"seq": 2, "seq": 3}}',
        "undeclared": b'{"seq": 2, "x": 1, "x": 2}',
        "in-string": b'{"seq": 3, "firmware": "\\"seq\\": 2"}',
    }
    details, flagged = sorted_out(spark, sent)
    assert details == {
        "twice": "field temperature: given 2 times in the object",
        "same": "field seq: given 2 times in the object",
        "pretty": "field seq: given 2 times in the object",
    }
    passed = {r["device_id"]: (r["seq"], r["firmware"]) for r in T.passed_rows(flagged).collect()}
    assert passed == {"nested": (1, None), "undeclared": (2, None), "in-string": (3, '"seq": 2')}


def test_a_json_value_of_another_kind_in_a_string_or_double_field_is_unparseable(spark):
    """Spark's parser gives a string field any JSON value as its text: ``"firmware": {"a": 1}`` landed in
    silver as the firmware '{"a":1}', ``"group": true`` as the group 'true', and a double field the string
    "NaN" as NaN, where the CBOR and Protobuf readers refuse a value of another type. Such a payload is
    unparseable, saying the field and the value; strings, nulls, NaN written as such and a field of that
    name inside a nested value are read as before."""
    sent = {
        "number": b'{"seq": 1, "firmware": 123}',
        "object": b'{"seq": 1, "firmware": {"a": 1}}',
        "boolean": b'{"seq": 1, "group": true}',
        "list": b'{"seq": 1, "group" :\n [1, 2]}',
        "null": b'{"seq": 2, "firmware": null}',
        "string": b'{"seq": 3, "firmware" :  "2.0"}',
        "nested": b'{"seq": 4, "meta": {"firmware": 2}, "firmware": "1.0"}',
        "in-string": b'{"seq": 5, "note": "\\"firmware\\": 5", "firmware": "x"}',
        "nan-text": b'{"seq": 6, "temperature": "NaN"}',
        "infinity-text": b'{"seq": 6, "battery": "-Infinity"}',
        "nan": b'{"seq": 7, "temperature": NaN}',
    }
    details, flagged = sorted_out(spark, sent)
    assert details == {
        "number": "field firmware: expected string, got int 123",
        "object": "field firmware: expected string, got dict {'a': 1}",
        "boolean": "field group: expected string, got bool True",
        "list": "field group: expected string, got list [1, 2]",
        "nan-text": "field temperature: expected double, got str 'NaN'",
        "infinity-text": "field battery: expected double, got str '-Infinity'",
    }
    passed = {r["device_id"]: (r["seq"], r["firmware"]) for r in T.passed_rows(flagged).collect()}
    assert passed == {
        "null": (2, None),
        "string": (3, "2.0"),
        "nested": (4, "1.0"),
        "in-string": (5, "x"),
        "nan": (7, None),
    }


def test_a_string_longer_than_jacksons_default_limit_is_read_not_quarantined_as_misread(spark):
    """A payload whose string field held more than 20,000,000 characters (Jackson's default limit, which
    Spark's parser keeps: a broker taking packets past 20 MB lets devices send it) was quarantined with the
    detail 'json: not an object of the declared fields and types', which it is. Strings are read whatever
    their length, as the CBOR and Protobuf readers read them."""
    note = "n" * 20_000_100
    rows = [record("devices/long/telemetry", 0, b'{"seq": 1, "firmware": "' + note.encode() + b'"}')]
    flagged = T.flag_failures(T.parse_records(bronze(spark, rows), PAYLOAD), {})
    passed = T.passed_rows(flagged).select("seq", F.length("firmware").alias("length")).collect()
    assert [tuple(r) for r in passed] == [(1, len(note))]


def test_a_json_payload_is_parsed_once_whatever_its_fields(spark):
    """The check for more after the object, added to from_json's struct, had Spark take each declared
    field from a copy of from_json of its own: 11 in the plan, each payload parsed once per field. One
    parse of the payload, and the two of the check (run only on payloads with more after a '}')."""
    parsed = T.parse_records(bronze(spark, [telemetry("d", 0, seq=1)]), PAYLOAD)
    plan = parsed._jdf.queryExecution().optimizedPlan().toString()
    assert plan.count("from_json(") == 3, plan


def test_flag_failures_quarantines_with_reasons_and_passes_the_rest(spark):
    parsed = T.parse_records(
        bronze(
            spark,
            [
                telemetry("ok", 0, seq=1),
                telemetry("hot", 1, seq=1, temperature=300.0),
                telemetry("both", 2, seq=1, temperature=300.0, humidity=-1.0),
                record("devices/bad/telemetry", 3, b"[1, 2]"),
                record("devices/x/status", 4, b"[1, 2]"),  # not telemetry: neither passed nor quarantined
            ],
        ),
        PAYLOAD,
    )
    conditions = {
        "s.temp": F.col("temperature") > 100,
        "s.humidity": F.col("humidity") < 0,
    }
    flagged = T.flag_failures(parsed, conditions)
    quarantine = T.to_quarantine(flagged, PAYLOAD, run_id="q-1", batch_id=4, quarantined_at=INGESTED)
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
    assert quarantined["detail"] == "json: byte 0: the payload is a list, not an object"
    details = {r["offset"]: r["detail"] for r in quarantine.collect()}
    assert details[1] is None  # an expectation failed: nothing to point at
    assert [r["device_id"] for r in T.passed_rows(flagged).collect()] == ["ok"]


def test_each_template_reads_its_format_and_a_payload_that_breaks_says_where(spark):
    cbor_payload = cbor2.dumps({"ts": ms(T0), "seq": 3, "temperature": 21.5, "firmware": "1.0.0"})
    payload = load_telemetry_config(
        {"payload": {"formats": [{"topic_template": "cbor/{device_id}", "format": "cbor"}]}}
    ).payload
    parsed = T.parse_records(
        bronze(
            spark,
            [
                telemetry("json-1", 0, seq=1, temperature=20.0),
                record("cbor/cb-1", 1, cbor_payload),
                record("cbor/cb-2", 2, cbor_payload[:-3]),  # cut short
                record("devices/json-2/telemetry", 3, b'{"seq": 1, "temperature": "hot"}'),
                record("other/x", 4, cbor_payload),  # no template: bronze only
            ],
        ),
        payload,
    )
    flagged = T.flag_failures(parsed, {})
    rows = {r["offset"]: r for r in flagged.collect()}
    assert [rows[o]["is_telemetry"] for o in range(5)] == [True, True, True, True, False]
    assert (rows[1]["device_id"], rows[1]["seq"], rows[1]["temperature"]) == ("cb-1", 3, 21.5)
    assert rows[1]["event_time"] == at(0).replace(tzinfo=None) and not rows[1]["parse_error"]
    assert rows[0]["temperature"] == 20.0 and rows[0]["parse_detail"] is None
    assert rows[2]["parse_error"] and rows[2]["parse_detail"].startswith("cbor: byte ")
    quarantine = T.to_quarantine(flagged, payload, run_id="q", batch_id=0, quarantined_at=INGESTED)
    details = {r["device_id"]: r["detail"] for r in quarantine.collect()}
    assert details == {
        "cb-2": rows[2]["parse_detail"],
        "json-2": "field temperature: expected double, got str 'hot'",
    }


def duplicate_flags(spark, rows, id_fields=("seq",), window_seconds=600):
    """(broker, device_id, offset, duplicate) of ``rows`` flagged by the job's dedup in a batch query."""
    dedup = DedupConfig(message_id_fields=list(id_fields), window_seconds=window_seconds)
    types = {name: kind.lower() for name, kind in PAYLOAD.fields.items()}
    conditions = row_failure_conditions(CONFIG.quality.suites, types)
    parsed = T.flag_failures(T.parse_records(bronze(spark, rows), PAYLOAD), conditions)
    flagged = flag_duplicates(parsed, dedup, F.col(T.IS_TELEMETRY) & ~T.is_quarantined())
    return sorted(
        ((r["broker"], r["device_id"], r["offset"], r[DUPLICATE]) for r in flagged.collect()),
        key=lambda row: (row[0], row[1] or "", row[2]),
    )


def test_duplicates_in_a_batch_by_message_id_within_the_window(spark):
    rows = [
        telemetry("d", 0, seq=1, seconds=0),
        telemetry("d", 5, seq=1, seconds=0, broker="edge2"),  # the same message via another broker
        telemetry("d", 1, seq=2, seconds=1),
        telemetry("d", 2, seq=1, seconds=900),  # same seq, far later: the device's counter restarted
        telemetry("e", 3, seq=1, seconds=0),  # same seq, other device
        telemetry("d", 4, seq=None, seconds=2),  # no message id: never a duplicate
        telemetry("d", 6, seq=None, seconds=2),
        record("devices/x/status", 7, b"online"),  # not telemetry: in bronze only
    ]
    assert duplicate_flags(spark, rows) == [
        ("edge1", None, 7, False),
        ("edge1", "d", 0, False),
        ("edge1", "d", 1, False),
        ("edge1", "d", 2, False),
        ("edge1", "d", 4, False),
        ("edge1", "d", 6, False),
        ("edge1", "e", 3, False),
        ("edge2", "d", 5, True),  # edge1's copy comes first: same event time, earlier broker name
    ]
    assert not any(flag for *_, flag in duplicate_flags(spark, rows, id_fields=()))


def test_the_first_copy_by_event_time_is_kept_and_a_chain_of_copies_is_all_duplicates(spark):
    """Copies whose event time is the broker's (a payload without its own) differ by when each arrived."""
    rows = [
        telemetry("d", 0, seq=1, seconds=600, ts=None),
        telemetry("d", 1, seq=1, seconds=0, ts=None),  # same message, earlier event time: the one kept
        telemetry("d", 2, seq=1, seconds=1200, ts=None),  # 600 s after the copy before it: a duplicate too
        telemetry("d", 3, seq=1, seconds=1801, ts=None),  # 601 s after that: a new message
        telemetry("d", 4, seq=1, seconds=90, temperature=500.0, ts=None),  # quarantined: not a candidate
    ]
    flags = {offset: flag for _, _, offset, flag in duplicate_flags(spark, rows)}
    assert flags == {0: True, 1: False, 2: True, 3: False, 4: False}


def test_every_value_crosses_the_duplicate_flags_unchanged(spark):
    """The rows cross a Python worker as pandas, which cannot tell NaN from null nor hold a 64-bit integer
    beside a null: NaN, nulls, integers past 2^53, maps and any bytes come out as they went in."""
    rows = [
        record("devices/d/telemetry", 2**62 + 1, reading("d", seq=2**62 + 3, temperature=float("nan"))),
        record("devices/d/telemetry", 1, reading("d", seq=None, temperature=None, humidity=1e308)),
        ("edge1", "devices/x/status", 2, None, None, None, None, {"k": "v", "e": ""}, bytes(range(256))),
    ]
    parsed = T.flag_failures(T.parse_records(bronze(spark, rows), PAYLOAD), {})
    flagged = flag_duplicates(parsed, CONFIG.dedup, F.col(T.IS_TELEMETRY) & ~T.is_quarantined())
    assert flagged.drop(DUPLICATE).schema == parsed.schema
    before = sorted(parsed.collect(), key=lambda row: row["offset"])
    after = sorted(flagged.drop(DUPLICATE).collect(), key=lambda row: row["offset"])
    assert [repr(row) for row in after] == [repr(row) for row in before]  # repr: NaN equals itself
    assert after[2]["seq"] == 2**62 + 3 and after[2]["offset"] == 2**62 + 1


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


def test_minute_increments_count_values_and_aggregate_each_metric(spark):
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
    gold = T.minute_increments(parsed, ["temperature", "humidity"], updated_at=INGESTED)
    minute = T0.replace(second=0)
    expected = spark.createDataFrame(
        [
            ("d", minute, date(2026, 11, 21), 2, 20.0, 30.0, 25.0, 40.0, 40.0, 40.0, INGESTED, 2, 1),
            ("d", at(60), date(2026, 11, 21), 1, 10.0, 10.0, 10.0, 40.0, 40.0, 40.0, INGESTED, 1, 1),
        ],
        "device_id string, minute timestamp, event_date date, count bigint, temperature_min double, "
        "temperature_max double, temperature_avg double, humidity_min double, humidity_max double, "
        "humidity_avg double, updated_at timestamp, temperature_count bigint, humidity_count bigint",
    )
    equal(gold, expected)


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


def test_a_status_firmware_that_is_no_string_is_no_version(spark):
    """A status report's firmware was taken as whatever JSON it held: ``"firmware": {"v": 2}`` became the
    device's firmware_version '{"v":2}' and ``"firmware": 2`` the version '2' in the registry (and the fleet's
    compliance). Only a string is a version; anything else is none (the stored one is kept)."""
    status_topics = {"status_topic_template": "devices/{device_id}/actions"}
    config = load_telemetry_config({"gold": {"devices": status_topics}})
    sent = {
        "string": b'{"state": "SUCCEEDED", "firmware": "2.0.0"}',
        "object": b'{"state": "SUCCEEDED", "firmware": {"v": 2}}',
        "number": b'{"state": "SUCCEEDED", "firmware": 2}',
        "list": b'{"state": "SUCCEEDED", "firmware": ["2.0.0"]}',
        "nested": b'{"state": "SUCCEEDED", "report": {"firmware": "9.9.9"}}',
        "no-json": b"SUCCEEDED",
    }
    rows = [record(f"devices/{name}/actions", n, p) for n, (name, p) in enumerate(sent.items())]
    status = T.parse_status(bronze(spark, rows), config.gold.devices).collect()
    assert {r["device_id"]: r["firmware_version"] for r in status} == {
        "string": "2.0.0",
        "object": None,
        "number": None,
        "list": None,
        "nested": None,
        "no-json": None,
    }
