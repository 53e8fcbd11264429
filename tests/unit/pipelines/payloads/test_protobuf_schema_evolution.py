"""Protobuf payloads from devices on another version of the schema than the one the job reads with.

Each payload is written by a message class of the other version, compiled from its own ``.proto``: fields
added (unknown to the reader: ignored) and widened (an ``int32`` that became an ``int64``), and a proto2
message without a field its schema requires.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipelines.payloads.descriptors import message_class
from pipelines.payloads.fields import decode_payloads
from pipelines.payloads.protobuf import ProtobufReader

from .test_descriptor_sets import compile_proto

READER = """syntax = "proto3"; package acme;
message Reading { int64 ts = 1; int32 watts = 2; uint32 count = 3; sint32 trim = 4; Phase phase = 5; }
enum Phase { PHASE_UNSET = 0; L1 = 1; }
"""
NEWER = """syntax = "proto3"; package acme;
message Reading { int64 ts = 1; int64 watts = 2; uint64 count = 3; sint64 trim = 4; int64 phase = 5;
                  string site = 6; }
"""
FIELDS = {"ts": "bigint", "watts": "bigint", "count": "bigint", "trim": "bigint", "phase": "string"}


def compiled(tmp_path: Path, name: str, text: str, message: str = "acme.Reading") -> Any:
    folder = tmp_path / name
    folder.mkdir()
    (folder / f"{name}.proto").write_text(text)
    return message_class(compile_proto(folder, f"{name}.proto", folder / f"{name}.desc"), message)


def read(reader_class: Any, payloads: list[bytes], fields: dict[str, str] = FIELDS) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = (
        decode_payloads(payloads, ProtobufReader(reader_class, fields), fields).table().to_pylist()
    )
    return rows


def test_a_newer_schemas_added_field_is_ignored_and_values_that_still_fit_are_read(tmp_path):
    newer = compiled(tmp_path, "newer", NEWER)
    sent = newer(ts=1, watts=-1500, count=7, trim=-3, phase=1, site="north").SerializeToString()
    [row] = read(compiled(tmp_path, "reader", READER), [sent])
    assert row == {"ts": 1, "watts": -1500, "count": 7, "trim": -3, "phase": "L1", "decode_error": None}


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("watts", 5_000_000_000, "protobuf: field watts (2): 5000000000 does not fit its type, int32"),
        ("watts", -(2**40), f"protobuf: field watts (2): {-(2**40)} does not fit its type, int32"),
        ("count", 2**32, f"protobuf: field count (3): {2**32} does not fit its type, uint32"),
        ("trim", -(2**31) - 1, f"protobuf: field trim (4): {-(2**31) - 1} does not fit its type, sint32"),
        ("phase", 2**33 + 1, f"protobuf: field phase (5): {2**33 + 1} does not fit its type, enum"),
    ],
)
def test_a_value_a_widened_field_sent_past_the_readers_width_is_quarantined(tmp_path, field, value, error):
    """Protobuf reads an ``int64`` varint into an ``int32`` field by keeping its low 32 bits (a field widened
    from ``int32`` to ``int64`` is a change its guide calls compatible): 5,000,000,000 watts became
    705,032,704 and 2**32 became 0, readings the device never sent, in silver."""
    newer = compiled(tmp_path, "newer", NEWER)
    [row] = read(compiled(tmp_path, "reader", READER), [newer(ts=1, **{field: value}).SerializeToString()])
    assert row["decode_error"] == error
    assert row[field] is None


def test_a_proto2_message_without_a_required_field_is_quarantined_naming_it(tmp_path):
    """Protobuf's Python parser takes a proto2 message that lacks a ``required`` field (C++ and Java refuse
    it): the column read null, as if the field were optional, for a payload that is no such message
    (another message's, or cut at a field boundary)."""
    schema = (
        'syntax = "proto2"; package acme; message Reading { required int64 ts = 1; optional double t = 2; }'
    )
    cls = compiled(tmp_path, "old", schema)
    fields = {"ts": "bigint", "t": "double"}
    complete = cls(ts=5, t=1.5).SerializeToString()
    rows = read(cls, [complete, cls(t=1.5).SerializePartialToString()], fields)
    assert [row["decode_error"] for row in rows] == [
        None,
        "protobuf: acme.Reading lacks its required field ts",
    ]


def test_a_proto2_enum_value_a_newer_schema_added_reads_as_its_number(tmp_path):
    """A proto2 enum is closed: protobuf keeps a value its schema does not name among the unknown fields,
    and the payload was quarantined as 'sent as a varint, where the schema's type is enum' (an enum is a
    varint). A proto3 enum's such value reads as its number; a proto2 one's now does too."""
    reader = 'syntax = "proto2"; package acme; enum Phase { L1 = 1; L2 = 2; }\n'
    reader += "message Reading { optional Phase phase = 1; optional int64 ts = 2; }"
    newer = reader.replace("L2 = 2;", "L2 = 2; L3 = 3;")
    newer_class = compiled(tmp_path, "newer", newer)
    sent = [newer_class(phase=phase, ts=5).SerializeToString() for phase in (2, 3)]
    cls = compiled(tmp_path, "reader", reader)
    as_text = read(cls, sent, {"phase": "string", "ts": "bigint"})
    assert as_text == [
        {"phase": "L2", "ts": 5, "decode_error": None},
        {"phase": "3", "ts": 5, "decode_error": None},
    ]
    as_number = read(cls, sent, {"phase": "int", "ts": "bigint"})
    assert [row["phase"] for row in as_number] == [2, 3]
