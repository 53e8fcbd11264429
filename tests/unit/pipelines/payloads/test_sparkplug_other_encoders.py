"""Sparkplug B payloads as other vendors' encoders write them, read by a host's session.

Each payload is built field by field through the specification's schema, or byte by byte, the way an
encoder other than this project's writes it: a proto3 copy of the schema that leaves out every field equal
to its default, signed values inside DataSets and Templates, packed arrays.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

from pipelines.payloads.sparkplug.schema import DATATYPE_NUMBERS
from pipelines.payloads.sparkplug.session import METRIC, REASON_MALFORMED, REJECTED, EdgeNodeSession, Record
from tests.sparkplug_messages import metric, payload

NODE = "spBv1.0/plant1/{}/gw1"
_offsets = itertools.count()


def record(kind: str, payload: Any, at_ms: int) -> Record:
    return Record("edge1", NODE.format(kind), next(_offsets), at_ms, payload.SerializeToString())


def birth(at_ms: int = 1000, *more: tuple[str, int, str]) -> Record:
    message = payload(at_ms, 0)
    metric(message, "bdSeq", None, "Int64").long_value = 0
    metric(message, "Level", 1, "Int32").int_value = 1
    for name, alias, datatype in more:
        metric(message, name, alias, datatype)
    return record("NBIRTH", message, at_ms)


def level(at_ms: int, seq: int, value: int) -> Record:
    message = payload(at_ms, seq)
    metric(message, None, 1).int_value = value
    return record("NDATA", message, at_ms)


def rows_of(rows: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [row for row in rows if row["kind"] == kind]


def test_a_sequence_number_0_left_out_by_a_proto3_encoder_is_read_as_0_and_no_gap():
    """A proto3 encoder leaves ``seq`` out when it is 0 (the NBIRTH's, and each wrap's): the message after
    the wrap was flagged ``seq_gap`` (1 after 255) and the wrap's rows had no sequence number."""
    data = [level(1001 + n, (n + 1) % 256, n) for n in range(300)]
    rows = rows_of(EdgeNodeSession().process([birth(), *data]), METRIC)
    assert [row["seq"] for row in rows[:2]] == [0, 0]  # the NBIRTH's two metrics
    values = rows[2:]
    assert [row["seq"] for row in values] == [(n + 1) % 256 for n in range(300)]
    assert [row for row in values if row["seq_gap"]] == []


def test_signed_values_within_a_dataset_or_a_template_are_kept_signed():
    """A DataSet's cells and a Template's metrics and parameters carry signed integers as their two's
    complement (specification, 6.4.16), as a metric does: the JSON in ``value_string`` said -1 as
    4294967295 and -5 as 18446744073709551611, values the device never sent."""
    message = payload(1000, 0)
    metric(message, "bdSeq", None, "Int64").long_value = 0
    table = metric(message, "Runs", 1, "DataSet").dataset_value
    table.num_of_columns = 5
    table.columns.extend(["trim", "offset", "delta", "total", "count"])
    table.types.extend(DATATYPE_NUMBERS[t] for t in ("Int8", "Int16", "Int32", "Int64", "UInt32"))
    row = table.rows.add()
    for field, sent in [("int_value", 255), ("int_value", 2**32 - 2), ("int_value", 2**32 - 3)]:
        setattr(row.elements.add(), field, sent)
    row.elements.add().long_value = 2**64 - 5
    row.elements.add().int_value = 2**32 - 1  # a UInt32: no sign
    motor = metric(message, "Motor", 2, "Template").template_value
    motor.template_ref = "MotorType"
    parameter = motor.parameters.add()
    parameter.name, parameter.type, parameter.int_value = "trim", DATATYPE_NUMBERS["Int16"], 2**32 - 2
    speed = motor.metrics.add()
    speed.name, speed.datatype, speed.long_value = "speed", DATATYPE_NUMBERS["Int64"], 2**64 - 7
    inner = motor.metrics.add()
    inner.name, inner.datatype = "log", DATATYPE_NUMBERS["DataSet"]
    inner.dataset_value.columns.append("delta")
    inner.dataset_value.types.append(DATATYPE_NUMBERS["Int32"])
    inner.dataset_value.rows.add().elements.add().int_value = 2**32 - 9
    rows = rows_of(EdgeNodeSession().process([record("NBIRTH", message, 1000)]), METRIC)
    runs, motor_row = (json.loads(row["value_string"]) for row in rows[1:])
    assert runs["rows"] == [
        {
            "elements": [
                {"intValue": -1},
                {"intValue": -2},
                {"intValue": -3},
                {"longValue": "-5"},
                {"intValue": 2**32 - 1},
            ]
        }
    ]
    assert motor_row["parameters"][0]["intValue"] == -2
    assert motor_row["metrics"][0]["longValue"] == "-7"
    assert motor_row["metrics"][1]["datasetValue"]["rows"] == [{"elements": [{"intValue": -9}]}]


def array_birth(*arrays: tuple[str, bytes]) -> Record:
    message = payload(1000, 0)
    metric(message, "bdSeq", None, "Int64").long_value = 0
    for alias, (datatype, packed) in enumerate(arrays, 1):
        metric(message, f"{datatype} {alias}", alias, datatype).bytes_value = packed
    return record("NBIRTH", message, 1000)


def test_packed_arrays_of_the_specifications_encoding_are_kept_as_sent():
    arrays = [
        ("Int16Array", b"\x01\x00\xff\xff"),
        ("DoubleArray", bytes(16)),
        ("BooleanArray", b"\x0c\x00\x00\x00\x34\xd0"),  # the specification's 12 booleans
        ("StringArray", b"ABC\x00hello\x00"),
        ("UInt8Array", b""),
    ]
    rows = rows_of(EdgeNodeSession().process([array_birth(*arrays)]), METRIC)
    assert [(row["datatype"], row["value_bytes"]) for row in rows[1:]] == arrays


@pytest.mark.parametrize(
    ("datatype", "packed", "detail"),
    [
        ("Int32Array", b"\x01\x02\x03", "an Int32Array of 3 bytes is no number of 4-byte values"),
        ("DateTimeArray", bytes(12), "a DateTimeArray of 12 bytes is no number of 8-byte values"),
        ("BooleanArray", b"\x14\x00\x00\x00\xff\xff", "a BooleanArray of 20 values takes 7 bytes, not 6"),
        ("BooleanArray", b"\x01\x00", "a BooleanArray of 2 bytes has no 4-byte count"),
        ("StringArray", b"ABC\x00hel", "a StringArray whose last string has no terminating 0 byte"),
        ("StringArray", b"\xff\xfe\x00", "a StringArray that is not UTF-8"),
    ],
)
def test_a_packed_array_its_datatype_cannot_hold_is_quarantined_saying_why(datatype, packed, detail):
    """A packed array cut short or padded (a length that is no number of its values, a BooleanArray whose
    count its bits do not match, a StringArray without its last terminator) was kept as if whole: a
    reader of ``value_bytes`` unpacked values the device never sent, or failed on the row."""
    [rejected] = EdgeNodeSession().process([array_birth((datatype, packed))])
    assert (rejected["kind"], rejected["reason"]) == (REJECTED, REASON_MALFORMED)
    assert rejected["detail"] == f"sparkplug_b: metric 1 ('{datatype} 1'): {detail}"


def test_a_value_left_out_is_its_datatypes_zero_as_the_reference_decoder_reads_it():
    """An encoder whose schema has no ``oneof`` around the value fields (a proto3 copy) leaves out a value
    equal to its default: 0, 0.0, false, an empty string. Eclipse Tahu's decoder reads a metric that is
    not ``is_null`` by its datatype's getter, which gives that default; such a metric's row had no value
    at all beside ``is_null`` false, and a reading of 0 was lost."""
    zeros = [("Int32", 3), ("Int64", 4), ("Double", 5), ("Boolean", 6), ("String", 7), ("Int16Array", 8)]
    data = payload(1001, 1)
    for _, alias in zeros:
        metric(data, None, alias)
    metric(data, None, 9).is_null = True
    rows = EdgeNodeSession().process(
        [birth(1000, *[(t, a, t) for t, a in zeros], ("Gone", 9, "Float")), record("NDATA", data, 1001)]
    )
    sent = [row for row in rows_of(rows, METRIC) if row["message_type"] == "NDATA"]
    values = [
        (
            r["metric"],
            r["is_null"],
            r["value_long"],
            r["value_double"],
            r["value_boolean"],
            r["value_string"],
            r["value_bytes"],
        )
        for r in sent
    ]
    assert values == [
        ("Int32", False, 0, 0.0, None, None, None),
        ("Int64", False, 0, 0.0, None, None, None),
        ("Double", False, None, 0.0, None, None, None),
        ("Boolean", False, None, None, False, None, None),
        ("String", False, None, None, None, "", None),
        ("Int16Array", False, None, None, None, None, b""),
        ("Gone", True, None, None, None, None, None),
    ]


def test_a_death_whose_bdseq_0_was_left_out_is_the_will_of_the_connection_with_bdseq_0():
    """A proto3 encoder leaves ``bdSeq`` 0 out of an NDEATH: it was read as no ``bdSeq`` at all, which ends
    whatever birth is in force, so an earlier connection's will, arriving late, took the node offline."""
    reborn = payload(2000, 0)
    metric(reborn, "bdSeq", None, "Int64").long_value = 1
    late = payload(2001, None)
    metric(late, "bdSeq", None, "Int64")  # bdSeq 0, left out
    session = EdgeNodeSession()
    rows = session.process([record("NBIRTH", reborn, 2000), record("NDEATH", late, 2001)])
    assert [(row["kind"], row["online"]) for row in rows if row["kind"] != METRIC] == [("presence", True)]
    assert session.birth is not None


def runs_birth(shape: Callable[[Any], None]) -> Record:
    """An NBIRTH whose DataSet ``Runs`` (columns trim Int8, label String) ``shape`` fills."""
    message = payload(1000, 0)
    metric(message, "bdSeq", None, "Int64").long_value = 0
    table = metric(message, "Runs", 1, "DataSet").dataset_value
    table.num_of_columns = 2
    table.columns.extend(["trim", "label"])
    table.types.extend([DATATYPE_NUMBERS["Int8"], DATATYPE_NUMBERS["String"]])
    shape(table)
    return record("NBIRTH", message, 1000)


def row(*cells: tuple[str, Any]) -> Callable[[Any], None]:
    def add(table: Any) -> None:
        added = table.rows.add()
        for field, value in cells:
            setattr(added.elements.add(), field, value)

    return add


@pytest.mark.parametrize(
    ("shape", "detail"),
    [
        (row(("int_value", 3)), "a DataSet's row 0 has 1 values for its 2 columns"),
        (
            row(("int_value", 3), ("string_value", "a"), ("int_value", 1)),
            "a DataSet's row 0 has 3 values for its 2 columns",
        ),
        (
            row(("int_value", 300), ("string_value", "a")),
            "a DataSet's row 0, column 'trim': an Int8 of 300 is past its width",
        ),
        (
            row(("string_value", "3"), ("string_value", "a")),
            "a DataSet's row 0, column 'trim': an Int8 in string_value, not in int_value",
        ),
        (lambda table: table.types.append(3), "a DataSet's 2 columns have 3 types"),
        (lambda table: setattr(table, "num_of_columns", 3), "a DataSet's num_of_columns is 3, for 2 columns"),
    ],
)
def test_a_dataset_whose_rows_do_not_fit_its_columns_is_quarantined_saying_where(shape, detail):
    """A DataSet whose rows, types and columns do not agree, or whose cell is not of its column's type, was
    kept as JSON as if whole (Eclipse Tahu's decoder fails on it): a reader of ``value_string`` took a value
    for another column, or an Int8 of 300."""
    [rejected] = EdgeNodeSession().process([runs_birth(shape)])
    assert (rejected["kind"], rejected["reason"]) == (REJECTED, REASON_MALFORMED)
    assert rejected["detail"] == f"sparkplug_b: metric 1 ('Runs'): {detail}"


def test_a_dataset_whose_rows_fit_its_columns_is_kept():
    rows = EdgeNodeSession().process([runs_birth(row(("int_value", 2**32 - 1), ("string_value", "a")))])
    [runs] = [r for r in rows_of(rows, METRIC) if r["metric"] == "Runs"]
    assert json.loads(runs["value_string"])["rows"] == [
        {"elements": [{"intValue": -1}, {"stringValue": "a"}]}
    ]


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, wire_type: int, value: bytes | int) -> bytes:
    tag = varint(number << 3 | wire_type)
    if isinstance(value, int):
        return tag + varint(value)
    return tag + varint(len(value)) + value


def test_a_payload_written_byte_by_byte_with_packed_types_and_unknown_fields_is_read():
    """Another encoder's bytes: a DataSet's ``types`` packed (proto3's default; the schema's proto2 does
    not pack them), fields this schema does not have in the payload and in a metric, no ``seq`` (0)."""
    cell = field(1, 0, 2**32 - 2)  # int_value -2
    table = (
        field(1, 0, 1)
        + field(2, 2, b"trim")
        + field(3, 2, varint(DATATYPE_NUMBERS["Int32"]))  # types, packed
        + field(4, 2, field(1, 2, cell))
    )
    runs = field(1, 2, b"Runs") + field(2, 0, 1) + field(4, 0, DATATYPE_NUMBERS["DataSet"])
    runs += field(99, 0, 7) + field(17, 2, table)  # an unknown field 99 before the value
    bdseq = field(1, 2, b"bdSeq") + field(4, 0, DATATYPE_NUMBERS["Int64"]) + field(11, 0, 3)
    raw = field(1, 0, 1000) + field(2, 2, bdseq) + field(2, 2, runs) + field(6, 2, b"vendor")
    rows = EdgeNodeSession().process([Record("edge1", NODE.format("NBIRTH"), 0, 1000, raw)])
    metrics = rows_of(rows, METRIC)
    assert [(r["metric"], r["seq"], r["value_long"]) for r in metrics] == [("bdSeq", 0, 3), ("Runs", 0, None)]
    assert json.loads(metrics[1]["value_string"])["rows"] == [{"elements": [{"intValue": -2}]}]


def motor_birth(datatype: str | None, field_name: str, value: Any) -> Record:
    """An NBIRTH whose Template ``Motor`` has one metric, ``trim``, sent in ``field_name``."""
    message = payload(1000, 0)
    metric(message, "bdSeq", None, "Int64").long_value = 0
    motor = metric(message, "Motor", 1, "Template").template_value
    motor.template_ref = "MotorType"
    trim = motor.metrics.add()
    trim.name = "trim"
    if datatype is not None:
        trim.datatype = DATATYPE_NUMBERS[datatype]
    setattr(trim, field_name, value)
    return record("NBIRTH", message, 1000)


@pytest.mark.parametrize(
    ("datatype", "field_name", "value", "detail"),
    [
        ("Int8", "int_value", 300, "a Template's metric 'trim': an Int8 of 300 is past its width"),
        (
            "Double",
            "string_value",
            "1.5",
            "a Template's metric 'trim': a Double in string_value, not in double_value",
        ),
    ],
)
def test_a_template_metric_not_of_its_datatype_is_quarantined(datatype, field_name, value, detail):
    """A Template's metric is read by its datatype as a metric is: an Int8 of 300 was kept as 44 (its low
    8 bits, read signed) and a Double sent as a string was kept, both as if whole."""
    [rejected] = EdgeNodeSession().process([motor_birth(datatype, field_name, value)])
    assert (rejected["kind"], rejected["reason"]) == (REJECTED, REASON_MALFORMED)
    assert rejected["detail"] == f"sparkplug_b: metric 1 ('Motor'): {detail}"


def test_a_template_metric_without_a_datatype_is_kept_as_sent():
    """An instance's metric may leave its datatype to the definition: nothing to check it by."""
    rows = EdgeNodeSession().process([motor_birth(None, "int_value", 300)])
    [motor] = [r for r in rows_of(rows, METRIC) if r["metric"] == "Motor"]
    assert json.loads(motor["value_string"])["metrics"] == [{"name": "trim", "intValue": 300}]


@pytest.mark.parametrize("datatype", ["PropertySet", "PropertySetList"])
def test_a_metric_of_a_datatype_only_properties_have_is_quarantined(datatype):
    """PropertySet and PropertySetList are the datatypes of a metric's properties; a metric has no value
    field for them. Such a metric's row had no value beside ``is_null`` false (one with a value said
    ``not in None``)."""
    message = payload(1000, 0)
    metric(message, "bdSeq", None, "Int64").long_value = 0
    metric(message, "Props", 1, datatype)
    [rejected] = EdgeNodeSession().process([record("NBIRTH", message, 1000)])
    assert (rejected["kind"], rejected["reason"]) == (REJECTED, REASON_MALFORMED)
    detail = f"sparkplug_b: metric 1 ('Props'): a {datatype} is a property's datatype, no metric's"
    assert rejected["detail"] == detail
