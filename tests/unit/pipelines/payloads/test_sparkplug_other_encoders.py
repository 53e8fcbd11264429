"""Sparkplug B payloads as other vendors' encoders write them, read by a host's session.

Each payload is built field by field through the specification's schema, or byte by byte, the way an
encoder other than this project's writes it: a proto3 copy of the schema that leaves out every field equal
to its default, signed values inside DataSets and Templates, packed arrays.
"""

from __future__ import annotations

import itertools
from typing import Any

from pipelines.payloads.sparkplug.schema import DATATYPE_NUMBERS, payload_class
from pipelines.payloads.sparkplug.session import METRIC, EdgeNodeSession, Record

NODE = "spBv1.0/plant1/{}/gw1"
_offsets = itertools.count()


def record(kind: str, payload: Any, at_ms: int) -> Record:
    return Record("edge1", NODE.format(kind), next(_offsets), at_ms, payload.SerializeToString())


def payload(timestamp_ms: int, seq: int | None) -> Any:
    """A payload as a proto3 encoder writes it: a ``seq`` of 0 is left out (no presence in proto3)."""
    message: Any = payload_class()()
    message.timestamp = timestamp_ms
    if seq:
        message.seq = seq
    return message


def metric(message: Any, name: str | None, alias: int | None, datatype: str | None = None) -> Any:
    added = message.metrics.add()
    if name is not None:
        added.name = name
    if alias is not None:
        added.alias = alias
    if datatype is not None:
        added.datatype = DATATYPE_NUMBERS[datatype]
    return added


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
