"""CBOR, Protobuf and JSON payloads into the declared columns, and what a payload that cannot be read says."""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

import cbor2
import pyarrow as pa
import pytest

from pipelines.payloads.cbor import read_cbor
from pipelines.payloads.descriptors import MOST_NESTED, DescriptorSetError, message_class
from pipelines.payloads.fields import ARROW_TYPES, PayloadError, checked, decode_payloads
from pipelines.payloads.formats import FieldFormat
from pipelines.payloads.json_payloads import read_json
from pipelines.payloads.protobuf import EXAMPLE_MESSAGE, ProtobufReader, example_descriptor_set

from .test_descriptor_sets import compile_proto

FIELDS = {"ts": "bigint", "seq": "bigint", "temperature": "double", "firmware": "string"}
READING = {"ts": 1_700_000_000_123, "seq": 7, "temperature": 21.5, "firmware": "1.0.0"}


def telemetry_class():
    return message_class(example_descriptor_set(), EXAMPLE_MESSAGE)


def test_a_cbor_map_fills_the_declared_columns_in_their_types():
    payloads = [cbor2.dumps(READING), cbor2.dumps({**READING, "seq": 8, "temperature": 22})]
    decoded = decode_payloads(payloads, read_cbor, FIELDS)
    table = decoded.table()
    assert (
        table.schema.field("ts").type == pa.int64() and table.schema.field("temperature").type == pa.float64()
    )
    assert table.column("seq").to_pylist() == [7, 8]
    assert table.column("temperature").to_pylist() == [21.5, 22.0]  # an integer is a valid double
    assert table.column("decode_error").to_pylist() == [None, None]


def test_a_field_the_payload_lacks_is_null_and_extra_keys_are_ignored():
    decoded = decode_payloads([cbor2.dumps({"ts": 1, "other": [1, 2]})], read_cbor, FIELDS)
    assert decoded.table().to_pylist() == [
        {"ts": 1, "seq": None, "temperature": None, "firmware": None, "decode_error": None}
    ]


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (cbor2.dumps(READING)[:-3], "cbor: byte "),
        (cbor2.dumps(READING) + b"\x01", f"cbor: byte {len(cbor2.dumps(READING))}: 1 more bytes after"),
        (cbor2.dumps([1, 2]), "cbor: byte 0: the payload is a list, not a map"),
        (b"\xff", "cbor: byte 1: break code encountered"),
        (cbor2.dumps({**READING, "temperature": "hot"}), "field temperature: expected double, got str 'hot'"),
        (cbor2.dumps({**READING, "seq": True}), "field seq: expected bigint, got bool True"),
        (cbor2.dumps({**READING, "seq": 2**70}), "field seq: 1180591620717411303424 does not fit a bigint"),
        (None, "no payload"),
    ],
)
def test_a_cbor_payload_that_cannot_be_read_says_where(payload, error):
    decoded = decode_payloads([cbor2.dumps(READING), payload], read_cbor, FIELDS)
    first, second = decoded.table().to_pylist()
    assert first["decode_error"] is None and first["seq"] == 7  # the good neighbour is untouched
    assert second["decode_error"].startswith(error), second["decode_error"]
    assert second["ts"] is None and second["temperature"] is None  # a bad payload fills no column


def test_a_cbor_map_behind_the_self_described_cbor_tag_is_read():
    """RFC 8949, 3.4.6: tag 55799 may prefix any item and changes nothing; encoders put it first to mark a
    payload as CBOR. cbor2 hands the map under a tag over as a frozendict, which was refused as 'the
    payload is a frozendict, not a map': every reading of such a device was quarantined."""
    self_described = b"\xd9\xd9\xf7" + cbor2.dumps(READING)
    decoded = decode_payloads([self_described], read_cbor, FIELDS)
    assert decoded.errors.to_pylist() == [None]
    assert {name: column.to_pylist()[0] for name, column in decoded.columns.items()} == READING


def test_the_truncated_cbor_payload_names_the_byte_where_it_ran_out():
    payload = cbor2.dumps(READING)
    error = decode_payloads([payload[:-3]], read_cbor, FIELDS).errors.to_pylist()[0]
    assert error.startswith(f"cbor: byte {len(payload) - 3}: premature end of stream")


def test_cbor_tagged_times_fill_timestamp_and_date_columns():
    when = dt.datetime(2026, 11, 3, 12, 30, 1, 250_000, tzinfo=dt.UTC)
    payload = cbor2.dumps(
        {"at": when, "day": dt.date(2026, 11, 3)}, datetime_as_timestamp=True, date_as_datetime=False
    )
    decoded = decode_payloads([payload], read_cbor, {"at": "timestamp", "day": "date"}).table()
    assert decoded.to_pylist() == [{"at": when, "day": dt.date(2026, 11, 3), "decode_error": None}]
    assert decoded.schema.field("at").type == ARROW_TYPES["timestamp"]


def test_a_protobuf_message_fills_the_declared_columns_by_field_name():
    message = telemetry_class()(ts=READING["ts"], seq=7, temperature=21.5, firmware="1.0.0")
    reader = ProtobufReader(telemetry_class(), {**FIELDS, "humidity": "double"})
    rows = decode_payloads([message.SerializeToString()], reader, reader_fields(reader)).table().to_pylist()
    assert rows == [{**READING, "humidity": None, "decode_error": None}]  # optional and unset: null


def test_an_event_time_without_presence_left_at_its_default_reads_as_not_sent():
    """The example's ``ts`` is a proto3 ``int64`` without presence: a reading that does not send it (a
    device without a clock) read 0, a time of 1970. As the event time it reads null (the broker's time is
    then taken); another field without presence keeps its default, and an empty payload is refused."""
    telemetry = telemetry_class()
    reader = ProtobufReader(telemetry, FIELDS, unset_is_absent=["ts"])
    clockless = telemetry(seq=0, temperature=21.5).SerializeToString()
    assert reader(clockless) == {"ts": None, "seq": 0, "temperature": 21.5, "firmware": ""}
    assert reader(telemetry(ts=5, seq=1).SerializeToString())["ts"] == 5
    assert ProtobufReader(telemetry, FIELDS)(clockless)["ts"] == 0
    with pytest.raises(PayloadError) as refused:
        reader(b"")
    assert str(refused.value) == "protobuf: an empty payload sets no field of timestone.example.Telemetry"


def reader_fields(reader: ProtobufReader) -> dict[str, str]:
    return {name: type_name for name, (_, type_name) in reader.fields.items()}


def test_a_protobuf_payload_that_does_not_parse_names_the_byte_and_the_field():
    good = telemetry_class()(ts=1, seq=2, temperature=3.0, firmware="1.0.0").SerializeToString()
    at = good.index(b"\x32")  # field 6 (firmware), length-delimited: its tag
    cut = good[: at + 3]  # the string's length says 5 bytes, 1 follows
    reader = ProtobufReader(telemetry_class(), FIELDS)
    errors = decode_payloads([good, cut, b"\x07\x01"], reader, FIELDS).errors.to_pylist()
    assert errors[0] is None
    assert (
        errors[1] == f"protobuf: byte {at}: field firmware (6): its length runs past the end of the payload"
    )
    assert errors[2] == "protobuf: byte 0: field number 0 does not exist"


@pytest.mark.parametrize(
    ("sent", "error"),
    [
        (
            b"\x18\x05",
            "protobuf: field temperature (3) was sent as a varint, where the schema's type is double",
        ),
        (b"\x10\x00", None),  # seq 0 as its schema sends it: no error
        (b"\x32\x01x", None),  # firmware as bytes: its own wire type
        (b"\x21" + bytes(8), None),  # humidity (4), not a declared column, in another wire type: not read
        (
            b"\x0d\x00\x00\x80\x3f",
            "protobuf: field ts (1) was sent as 4 bytes, where the schema's type is int64",
        ),
    ],
)
def test_a_declared_field_sent_in_another_wire_type_is_refused_not_read_as_its_default(sent, error):
    """Another schema's field of the same number (a float where the schema has a double, a string where it
    has a number): protobuf keeps it as an unknown field, and the column would read 0, a value never sent."""
    reader = ProtobufReader(telemetry_class(), FIELDS)
    assert decode_payloads([sent], reader, FIELDS).errors.to_pylist() == [error]


def test_a_timestamps_seconds_sent_in_another_wire_type_is_refused_not_read_as_1970(tmp_path):
    (tmp_path / "stamp.proto").write_text(
        'syntax = "proto3"; package acme; import "google/protobuf/timestamp.proto";\n'
        "message Stamp { google.protobuf.Timestamp at = 1; }\n"
    )
    cls = message_class(compile_proto(tmp_path, "stamp.proto", tmp_path / "stamp.desc"), "acme.Stamp")
    fields = {"at": "timestamp"}
    seconds_as_text = b"\x0a\x06" + b"\x0a\x04" + b"1700"  # at { seconds: "1700" (length-delimited) }
    errors = decode_payloads([seconds_as_text], ProtobufReader(cls, fields), fields).errors.to_pylist()
    assert errors == [
        "protobuf: field at.seconds (1) was sent as length-delimited bytes, where the schema's type is int64"
    ]


def test_messages_nested_deeper_than_protobuf_reads_say_so_in_one_line(tmp_path):
    """101 messages deep (protobuf reads 100): the detail was the path of every level, about 6 KB, ending in
    'a value does not fit its field's type'."""
    (tmp_path / "node.proto").write_text(
        'syntax = "proto3"; package acme; message Node { Node child = 1; int64 v = 2; }'
    )
    cls = message_class(compile_proto(tmp_path, "node.proto", tmp_path / "node.desc"), "acme.Node")
    fields = {"v": "bigint"}
    payloads = [_nested(cls, MOST_NESTED), _nested(cls, MOST_NESTED + 1), _nested(cls, 5 * MOST_NESTED)]
    errors = decode_payloads(payloads, ProtobufReader(cls, fields), fields).errors.to_pylist()
    deep = "protobuf: messages nested more than 100 deep (protobuf reads none deeper)"
    assert errors == [None, deep, deep]


def _nested(cls: Any, depth: int) -> bytes:
    """A message holding ``depth`` messages, each in the one before."""
    message = cls()
    innermost = message
    for _ in range(depth):
        innermost = innermost.child
    innermost.v = 1
    return bytes(message.SerializeToString())


def test_a_declared_field_the_message_cannot_fill_is_refused_when_the_reader_is_made():
    with pytest.raises(ValueError, match=r"timestone.example.Telemetry has no field 'pressure'"):
        ProtobufReader(telemetry_class(), {"pressure": "double"})
    with pytest.raises(ValueError, match=r"Telemetry.firmware cannot be read as double"):
        ProtobufReader(telemetry_class(), {"firmware": "double"})


def test_a_message_name_the_set_lacks_lists_the_ones_it_has():
    with pytest.raises(DescriptorSetError, match=r"no message 'acme.Reading'; the set has timestone.example"):
        message_class(example_descriptor_set(), "acme.Reading")
    with pytest.raises(DescriptorSetError, match="not a protobuf FileDescriptorSet"):
        message_class(b"\xff\xff", EXAMPLE_MESSAGE)


def test_protobuf_enums_timestamps_and_imports_of_a_users_own_schema(tmp_path):
    (tmp_path / "meter.proto").write_text(
        'syntax = "proto3"; package acme; import "google/protobuf/timestamp.proto";\n'
        "enum Phase { PHASE_UNSET = 0; L1 = 1; L2 = 2; }\n"
        "message Reading { google.protobuf.Timestamp at = 1; Phase phase = 2; uint32 watts = 3; }\n"
    )
    cls = message_class(compile_proto(tmp_path, "meter.proto", tmp_path / "meter.desc"), "acme.Reading")
    reading: Any = cls(phase=2, watts=1500)
    reading.at.seconds, reading.at.nanos = 1_700_000_000, 250_000_000
    payload = reading.SerializeToString()
    fields = {"at": "timestamp", "phase": "string", "watts": "int"}
    rows = decode_payloads([payload], ProtobufReader(cls, fields), fields).table().to_pylist()
    assert rows == [
        {
            "at": dt.datetime(2023, 11, 14, 22, 13, 20, 250_000, tzinfo=dt.UTC),
            "phase": "L2",
            "watts": 1500,
            "decode_error": None,
        }
    ]


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (b'{"ts": 1, "seq": ', "json: character 17: Expecting value"),
        (b"[1]", "json: byte 0: the payload is a list, not an object"),
        (b'{"ts": "x"}', "field ts: expected bigint, got str 'x'"),
        (b'{"firmware": "\xff"}', "json: byte 14: not UTF-8"),
        (  # ten kilobytes of nesting: once a RecursionError out of the batch, which failed on every replay
            b'{"ts": 1, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
            "nested too deeply to read (more levels than Python's recursion limit)",
        ),
    ],
)
def test_why_a_json_payload_was_quarantined(payload, error):
    assert decode_payloads([payload], read_json, FIELDS).errors.to_pylist() == [error]


def test_checked_values_keep_their_meaning():
    assert checked(2**31 - 1, "int") == 2**31 - 1
    with pytest.raises(TypeError, match="does not fit a int"):
        checked(2**31, "int")
    with pytest.raises(TypeError, match="does not fit a float"):
        checked(1e300, "float")
    assert math.isnan(checked(float("nan"), "double"))
    assert checked("2026-11-03", "date") == dt.date(2026, 11, 3)
    assert checked("2026-11-03T12:00:00", "timestamp") == dt.datetime(2026, 11, 3, 12, tzinfo=dt.UTC)
    assert json.loads(json.dumps(READING)) == READING


@pytest.mark.parametrize(
    ("seconds", "nanos", "error"),
    [
        (10**15, 0, "field at: 1000000000000000 s, 0 ns is not a time a timestamp column holds"),
        (-(10**15), 0, "field at: -1000000000000000 s, 0 ns is not a time a timestamp column holds"),
        (253_402_300_800, 0, "field at: 253402300800 s, 0 ns is not a time a timestamp column holds"),
        (0, -5, "field at: 0 s, -5 ns is not a time a timestamp column holds"),
        (0, 1_000_000_000, "field at: 0 s, 1000000000 ns is not a time a timestamp column holds"),
    ],
)
def test_a_protobuf_timestamp_no_column_holds_is_quarantined(tmp_path, seconds, nanos, error):
    """Once an OverflowError out of the batch (which failed on every replay); nanos out of 0..999999999
    (google.protobuf.Timestamp's range) moved the time by whole seconds."""
    (tmp_path / "meter.proto").write_text(
        'syntax = "proto3"; package acme; import "google/protobuf/timestamp.proto";\n'
        "message Reading { google.protobuf.Timestamp at = 1; uint32 watts = 3; }\n"
    )
    cls = message_class(compile_proto(tmp_path, "meter.proto", tmp_path / "meter.desc"), "acme.Reading")
    fields = {"at": "timestamp", "watts": "int"}
    late: Any = cls(watts=1)
    late.at.seconds, late.at.nanos = 253_402_300_799, 999_999_999  # the last microsecond of 9999
    wrong: Any = cls(watts=2)
    wrong.at.seconds, wrong.at.nanos = seconds, nanos
    payloads = [late.SerializeToString(), wrong.SerializeToString()]
    decoded = decode_payloads(payloads, ProtobufReader(cls, fields), fields)
    assert decoded.errors.to_pylist() == [None, f"protobuf: {error}"]
    last = dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC)
    assert decoded.columns["at"].to_pylist()[0] == last


def test_a_protobuf_string_that_is_not_utf8_names_its_field():
    """Protobuf refuses a proto3 string that is not UTF-8 without saying which; the walk found nothing cut
    off and the quarantine said only "15 bytes: a value does not fit its field's type"."""
    good = telemetry_class()(ts=1, seq=2, firmware="abcd").SerializeToString()
    at = good.index(b"\x32")  # field 6 (firmware): its tag
    reader = ProtobufReader(telemetry_class(), FIELDS)
    [error] = decode_payloads([good.replace(b"abcd", b"ab\xffd")], reader, FIELDS).errors.to_pylist()
    assert error == f"protobuf: byte {at}: field firmware (6): not UTF-8"


@pytest.mark.parametrize(
    ("payload", "read", "error"),
    [
        (  # from_json refuses a number of 1,000+ digits; its detail is read here
            b'{"temperature": 1' + b"0" * 2000 + b"}",
            read_json,
            "field temperature: an integer of 2001 digits does not fit a double",
        ),
        (b'{"seq": ' + b"1" * 5000 + b"}", read_json, "field seq: an integer of 5000 digits does not fit"),
        (cbor2.dumps({"temperature": 10**400}), read_cbor, "field temperature: an integer of 401 digits"),
        (cbor2.dumps({"seq": 10**5000}), read_cbor, "field seq: an integer of 5001 digits does not fit"),
        (cbor2.dumps({"small": -(10**400)}), read_cbor, "field small: an integer of 401 digits does not fit"),
    ],
)
def test_an_integer_no_column_holds_is_an_error_of_its_payload_not_of_the_batch(payload, read, error):
    """float() of such an integer raised OverflowError, and Python's str() refuses an integer of more than
    4,300 digits (ValueError): the reader failed its task, so every replay of the micro-batch failed again
    and one device's payload stopped the telemetry of all of them."""
    fields = {**FIELDS, "small": "float"}
    first = json.dumps(READING).encode() if read is read_json else cbor2.dumps(READING)
    decoded = decode_payloads([first, payload], read, fields)
    assert decoded.errors.to_pylist()[0] is None
    assert decoded.errors.to_pylist()[1].startswith(error)


def test_a_declared_field_given_twice_is_an_error_of_its_payload_not_its_last_value():
    """cbor2 (as Python's json) keeps the last value of a key a map gives twice: ``{"seq": 1, "seq": 2}``
    was read as seq 2, the 1 dropped without a word. A declared field given twice is the payload's error in
    either format (RFC 8949 calls such a map invalid); an undeclared key twice is left alone."""
    twice = b"\xa3\x63seq\x01\x63seq\x02\x62ts\x01"  # a map of 3 pairs, "seq" in two
    indefinite = b"\xbf\x63seq\x01\x62ts\x01\x63seq\x02\xff"
    described = b"\xd9\xd9\xf7" + twice  # under the self-described CBOR tag
    undeclared = b"\xa3\x61x\x01\x61x\x02\x63seq\x05"
    cbor = FieldFormat("cbor").reader(FIELDS)
    decoded = decode_payloads([twice, indefinite, described, undeclared], cbor, FIELDS)
    assert decoded.errors.to_pylist() == [*["field seq: given 2 times in the map"] * 3, None]
    assert decoded.columns["seq"].to_pylist() == [None, None, None, 5]
    json_payloads = [b'{"seq": 1, "ts": 1, "seq": 2}', b'{"x": 1, "x": 2, "seq": 5}']
    decoded = decode_payloads(json_payloads, FieldFormat("json").reader(FIELDS), FIELDS)
    assert decoded.errors.to_pylist() == ["field seq: given 2 times in the object", None]
