"""A host's view of one edge node: births define aliases, data becomes one row per metric, deaths end it."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from pipelines.payloads.sparkplug.encode import MetricOut, bdseq_metric, encode, ndeath, rebirth_request
from pipelines.payloads.sparkplug.messages import read_payload
from pipelines.payloads.sparkplug.schema import payload_class
from pipelines.payloads.sparkplug.session import (
    METRIC,
    PRESENCE,
    REASON_MALFORMED,
    REASON_UNKNOWN_ALIAS,
    REJECTED,
    EdgeNodeSession,
    Record,
)
from pipelines.payloads.sparkplug.topics import parse_topic, state_topic

NODE = "spBv1.0/plant1/{}/gw1"
DEVICE = "spBv1.0/plant1/{}/gw1/{}"
_offsets = itertools.count()


def record(topic: str, payload: bytes | None, at_ms: int) -> Record:
    return Record("edge1", topic, next(_offsets), at_ms, payload)


def nbirth(at_ms: int, bdseq: int = 0, seq: int = 0) -> Record:
    metrics = [
        bdseq_metric(bdseq),
        MetricOut(False, "Boolean", name="Node Control/Rebirth"),
        MetricOut(230.5, "Double", name="Supply/Voltage", alias=1),
    ]
    return record(NODE.format("NBIRTH"), encode(metrics, timestamp_ms=at_ms, seq=seq), at_ms)


def first_alias(device: str) -> int:
    """The first of a device's three aliases (pump7's 10 to 12): unique across the node's metrics, as
    Sparkplug asks [tck-id-payloads-alias-uniqueness]."""
    return 10 if device == "pump7" else 1000 + 10 * int("".join(filter(str.isdigit, device)))


def dbirth(device: str, at_ms: int, seq: int) -> Record:
    alias = first_alias(device)
    metrics = [
        MetricOut(21.0, "Float", name="Temperature", alias=alias),
        MetricOut(-3, "Int16", name="Offset", alias=alias + 1),
        MetricOut("idle", "String", name="Mode", alias=alias + 2),
    ]
    return record(DEVICE.format("DBIRTH", device), encode(metrics, timestamp_ms=at_ms, seq=seq), at_ms)


def ddata(device: str, at_ms: int, seq: int, *metrics: MetricOut) -> Record:
    return record(DEVICE.format("DDATA", device), encode(metrics, timestamp_ms=at_ms, seq=seq), at_ms)


def temperature(value: float, device: str = "pump7") -> MetricOut:
    """The device's temperature (pump7's alias 10) as its data messages send it: alias and value only."""
    return MetricOut(value, "Float", alias=first_alias(device), with_datatype=False)


def kinds(rows, kind):
    return [row for row in rows if row["kind"] == kind]


def test_births_then_aliased_data_become_one_row_per_metric_with_names_and_datatypes():
    session = EdgeNodeSession()
    rows = session.process(
        [
            nbirth(1000),
            dbirth("pump7", 1001, seq=1),
            ddata(
                "pump7",
                1500,
                2,
                MetricOut(22.5, "Float", alias=10, timestamp_ms=1499),
                MetricOut("run", "String", alias=12),
            ),
        ]
    )
    metrics = kinds(rows, METRIC)
    data = [row for row in metrics if row["message_type"] == "DDATA"]
    assert [(r["metric"], r["datatype"], r["value_double"], r["value_string"]) for r in data] == [
        ("Temperature", "Float", 22.5, None),
        ("Mode", "String", None, "run"),
    ]
    assert [r["metric_time_ms"] for r in data] == [1499, 1500]  # the metric's own time, else the message's
    assert [r["metric_index"] for r in data] == [0, 1]  # with the record, what identifies a metric row
    assert {r["seq"] for r in data} == {2} and {r["seq_gap"] for r in data} == {False}
    assert {(r["group_id"], r["edge_node_id"], r["device_id"]) for r in data} == {("plant1", "gw1", "pump7")}
    births = [r for r in metrics if r["message_type"] in ("NBIRTH", "DBIRTH")]
    assert len(births) == 6  # a birth's values are readings too
    offset = next(r for r in births if r["metric"] == "Offset")
    assert (offset["value_long"], offset["value_double"]) == (-3, -3.0)  # two's complement read back
    assert [(r["device_id"], r["online"], r["birth_time_ms"]) for r in kinds(rows, PRESENCE)] == [
        (None, True, 1000),
        ("pump7", True, 1001),
    ]
    assert kinds(rows, REJECTED) == []


def test_data_whose_alias_no_birth_defines_is_quarantined_whole_with_the_reason():
    session = EdgeNodeSession()
    session.process([nbirth(1000), dbirth("pump7", 1001, seq=1)])
    rows = session.process(
        [ddata("pump7", 1100, 2, MetricOut(1.0, "Float", alias=10), MetricOut(5.0, "Float", alias=99))]
    )
    assert kinds(rows, METRIC) == []  # not half a message
    [rejected] = kinds(rows, REJECTED)
    assert rejected["reason"] == REASON_UNKNOWN_ALIAS
    assert (
        rejected["detail"] == "metric 1 (alias 99): alias 99 is not defined by the birth of plant1/gw1/pump7"
    )


def test_data_of_a_device_or_node_without_a_birth_is_quarantined_as_unknown_aliases():
    session = EdgeNodeSession()
    [orphan] = session.process([ddata("pump7", 900, 5, temperature(1.0))])
    assert orphan["reason"] == REASON_UNKNOWN_ALIAS
    assert orphan["detail"] == "DDATA: edge node plant1/gw1 has no NBIRTH in force"
    session.process([nbirth(1000)])
    [unborn] = session.process([ddata("pump8", 1100, 1, temperature(1.0))])
    assert unborn["detail"] == "DDATA: device plant1/gw1/pump8 has had no DBIRTH since the edge node's NBIRTH"


def test_a_sequence_number_that_does_not_follow_is_flagged_and_the_rows_kept():
    session = EdgeNodeSession()
    session.process([nbirth(1000), dbirth("pump7", 1001, seq=1)])
    rows = session.process(
        [ddata("pump7", 1100, 2, temperature(1.0)), ddata("pump7", 1200, 5, temperature(2.0))]
    )
    assert [(r["seq"], r["seq_gap"], r["value_double"]) for r in rows] == [(2, False, 1.0), (5, True, 2.0)]


def test_the_sequence_wraps_from_255_to_0_without_a_gap():
    session = EdgeNodeSession()
    session.process([nbirth(1000), dbirth("pump7", 1001, seq=1)])
    session.last_seq = 254
    rows = session.process(
        [ddata("pump7", 1100 + n, seq, temperature(1.0)) for n, seq in enumerate((255, 0, 1))]
    )
    assert [r["seq_gap"] for r in rows] == [False, False, False]


def test_messages_of_one_millisecond_on_several_topics_are_read_in_their_sequence_order():
    session = EdgeNodeSession()
    # the birth, the device's birth and its data land in the same millisecond, handed over in reverse
    batch = [nbirth(1000), dbirth("pump7", 1000, seq=1), ddata("pump7", 1000, 2, temperature(3.0))]
    rows = session.process(list(reversed(batch)))
    assert kinds(rows, REJECTED) == []
    assert [r["message_type"] for r in kinds(rows, METRIC)][-1] == "DDATA"


def test_a_millisecond_whose_numbers_straddle_the_wrap_is_read_255_first():
    session = EdgeNodeSession()
    session.process([nbirth(1000), dbirth("pump7", 1001, seq=1)])
    session.last_seq = 254
    batch = [  # on two topics (one topic's offsets are the order it was sent in), handed over 0 first
        ddata("pump8", 2000, 255, temperature(1.0, "pump8")),
        ddata("pump7", 2000, 0, temperature(2.0)),
    ]
    session.process([dbirth("pump8", 1002, seq=2)])
    session.last_seq = 254
    rows = session.process(list(reversed(batch)))
    assert [(r["seq"], r["seq_gap"]) for r in rows] == [(255, False), (0, False)]


def test_a_rebirth_in_the_millisecond_of_data_sent_before_it_is_read_after_that_data():
    """Within one millisecond, an NDATA the node sent just before the NBIRTH answering a rebirth request
    was read after it, by its lower sequence number (0 before 37): its alias was read by the new birth,
    silently naming another metric, and the numbers of both sessions were flagged as gaps. One topic's
    offsets are the order its messages were sent in, and a birth starts its sequence again."""
    session = EdgeNodeSession()
    session.process([nbirth(1000, bdseq=0)])
    session.last_seq = 36
    rebirth_metrics = [bdseq_metric(0), MetricOut(0.5, "Double", name="Supply/Current", alias=1)]
    rebirth = record(NODE.format("NBIRTH"), encode(rebirth_metrics, timestamp_ms=2000, seq=0), 2000)
    before = encode([MetricOut(231.0, "Double", alias=1, with_datatype=False)], timestamp_ms=2000, seq=37)
    after = encode([MetricOut(0.7, "Double", alias=1, with_datatype=False)], timestamp_ms=2000, seq=1)
    sent_before, sent_after = (
        record(NODE.format("NDATA"), before, 2000),
        record(NODE.format("NDATA"), after, 2000),
    )
    rows = kinds(session.process([rebirth, sent_after, sent_before]), METRIC)
    assert [(r["message_type"], r["seq"], r["metric"], r["value_double"], r["seq_gap"]) for r in rows] == [
        ("NDATA", 37, "Supply/Voltage", 231.0, False),
        ("NBIRTH", 0, "bdSeq", 0.0, False),
        ("NBIRTH", 0, "Supply/Current", 0.5, False),
        ("NDATA", 1, "Supply/Current", 0.7, False),
    ]


@pytest.mark.sparkplug(
    "tck-id-operational-behavior-edge-node-termination-host-action-ndeath-node-offline",
    "tck-id-operational-behavior-edge-node-termination-host-action-ndeath-devices-offline",
)
def test_the_will_ends_the_node_and_its_devices_and_a_stale_will_is_ignored():
    session = EdgeNodeSession()
    session.process([nbirth(1000, bdseq=3), dbirth("pump7", 1001, seq=1), dbirth("pump8", 1002, seq=2)])
    assert session.process([record(NODE.format("NDEATH"), ndeath(2), 1500)]) == []  # an older connection's
    rows = session.process([record(NODE.format("NDEATH"), ndeath(3), 1600)])
    assert [(r["device_id"], r["online"], r["timestamp_ms"]) for r in rows] == [
        ("pump7", False, 1600),
        ("pump8", False, 1600),
        (None, False, 1600),
    ]
    [late] = session.process([ddata("pump7", 1700, 3, temperature(1.0))])
    assert late["reason"] == REASON_UNKNOWN_ALIAS  # the aliases died with the session


def test_a_rebirth_redefines_the_aliases_and_voids_the_devices_births():
    session = EdgeNodeSession()
    session.process([nbirth(1000, bdseq=0), dbirth("pump7", 1001, seq=1)])
    rows = session.process([nbirth(2000, bdseq=0)])  # a rebirth on the same connection
    assert [(r["device_id"], r["online"]) for r in kinds(rows, PRESENCE)] == [("pump7", False), (None, True)]
    [rejected] = session.process([ddata("pump7", 2100, 1, temperature(1.0))])
    assert rejected["reason"] == REASON_UNKNOWN_ALIAS
    assert kinds(session.process([dbirth("pump7", 2200, seq=2)]), REJECTED) == []


@pytest.mark.sparkplug("tck-id-operational-behavior-edge-node-termination-host-action-ddeath-devices-offline")
def test_a_device_death_ends_that_device_only():
    session = EdgeNodeSession()
    session.process([nbirth(1000), dbirth("pump7", 1001, seq=1), dbirth("pump8", 1002, seq=2)])
    death = record(DEVICE.format("DDEATH", "pump7"), encode([], timestamp_ms=1100, seq=3), 1100)
    assert [(r["device_id"], r["online"]) for r in session.process([death])] == [("pump7", False)]
    rows = session.process([ddata("pump8", 1200, 4, temperature(1.0, "pump8"))])
    assert [(r["metric"], r["seq_gap"]) for r in rows] == [("Temperature", False)]


def test_the_state_survives_a_round_trip_between_micro_batches():
    session = EdgeNodeSession()
    session.process([nbirth(1000, bdseq=4), dbirth("pump7", 1001, seq=1)])
    restored = EdgeNodeSession.from_bytes(session.to_bytes())
    assert restored == session
    rows = restored.process([ddata("pump7", 1100, 2, MetricOut(-1, "Int16", alias=11, with_datatype=False))])
    assert [(r["metric"], r["value_long"], r["seq_gap"]) for r in rows] == [("Offset", -1, False)]


@pytest.mark.parametrize(
    ("topic", "payload", "detail"),
    [
        ("spBv1.0/plant1/NDATA", b"", "has 3 levels; Sparkplug B's have 4 or 5"),
        ("spBv1.0/plant1/DDATA/gw1", b"", "'DDATA' is not an edge node's message type"),
        (
            NODE.format("NDATA"),
            b"\x12\x05\x0a",
            "sparkplug_b: byte 0: field metrics (2): its length runs past",
        ),
        (
            DEVICE.format("DDATA", "pump7"),
            encode([MetricOut("hot", "String", alias=10)], timestamp_ms=1, seq=2),
            "sparkplug_b: metric 0 (alias 10): a Float in string_value, not in float_value",
        ),
        (  # a clock in nanoseconds: no timestamp column holds it, and converting it fails the whole batch
            DEVICE.format("DDATA", "pump7"),
            encode([temperature(20.0)], timestamp_ms=1_796_000_000_000_000_000, seq=2),
            "sparkplug_b: timestamp: 1796000000000000000 ms is not a time (after the year 9999)",
        ),
        (
            DEVICE.format("DDATA", "pump7"),
            encode([MetricOut(20.0, "Float", alias=10, timestamp_ms=2**64 - 1)], timestamp_ms=1, seq=2),
            f"sparkplug_b: metric 0: {2**64 - 1} ms is not a time (after the year 9999)",
        ),
    ],
)
def test_a_message_that_cannot_be_read_is_quarantined_saying_where(topic, payload, detail):
    session = EdgeNodeSession()
    session.process([nbirth(1000), dbirth("pump7", 1001, seq=1)])
    [rejected] = session.process([record(topic, payload, 1100)])
    assert rejected["reason"] == REASON_MALFORMED
    assert detail in rejected["detail"], rejected["detail"]


def test_a_birth_metric_without_a_name_is_malformed():
    session = EdgeNodeSession()
    bad = record(NODE.format("NBIRTH"), encode([MetricOut(1.0, "Double", alias=1)], timestamp_ms=1, seq=0), 1)
    [rejected] = session.process([bad])
    assert rejected["detail"] == "sparkplug_b: metric 0 (alias 1): a birth's metric must have a name"
    assert session.birth is None


def test_commands_and_the_hosts_state_topic():
    request = read_payload(rebirth_request(5))
    assert [(m.name, m.datatype, m.message.boolean_value) for m in request.metrics] == [
        ("Node Control/Rebirth", "Boolean", True)
    ]
    assert request.seq is None  # commands carry no sequence number
    assert EdgeNodeSession().process([record(NODE.format("NCMD"), rebirth_request(5), 5)]) == []
    assert state_topic("timestone") == "spBv1.0/STATE/timestone"
    with pytest.raises(ValueError, match="is a host application's STATE"):
        parse_topic("spBv1.0/STATE/timestone")


def test_integers_as_other_encoders_send_them_read_as_their_datatype():
    """Ignition and Eclipse Tahu send a UInt32 in ``long_value`` (the specification says ``int_value``), and
    an Int8 or Int16 as its own width's two's complement (-1 as 255) as well as sign-extended to 32 bits:
    every message of such a node was quarantined (``a UInt32 in long_value``) or read 255 for -1."""
    metrics = [
        MetricOut(7, "UInt32", name="Count", alias=1),
        MetricOut(-1, "Int8", name="Trim", alias=2),
        MetricOut(-2, "Int16", name="Offset", alias=3),
    ]
    birth = record(NODE.format("NBIRTH"), encode([bdseq_metric(0), *metrics], timestamp_ms=1, seq=0), 1)
    data: Any = payload_class()()
    data.timestamp, data.seq = 2, 1
    sent = [(1, "long_value", 4_000_000_000), (2, "int_value", 255), (3, "int_value", 65534)]
    for alias, field, value in sent:
        metric = data.metrics.add()
        metric.alias = alias
        setattr(metric, field, value)
    more = encode([MetricOut(-1, "Int8", alias=2, with_datatype=False)], timestamp_ms=3, seq=2)
    first = record(NODE.format("NDATA"), data.SerializeToString(), 2)
    rows = EdgeNodeSession().process([birth, first, record(NODE.format("NDATA"), more, 3)])
    assert not kinds(rows, REJECTED)
    values = [(r["metric"], r["value_long"]) for r in kinds(rows, METRIC) if r["metric"] != "bdSeq"]
    assert values == [
        ("Count", 7),
        ("Trim", -1),
        ("Offset", -2),  # the birth, as this project encodes it
        ("Count", 4_000_000_000),
        ("Trim", -1),
        ("Offset", -2),  # long_value, and 8- and 16-bit complements
        ("Trim", -1),  # sign-extended to 32 bits
    ]


@pytest.mark.parametrize(
    ("seq", "alias", "detail"),
    [
        (2**64 - 1, 1, f"sparkplug_b: seq: {2**64 - 1} is not a sequence number (0 to 255)"),
        (256, 1, "sparkplug_b: seq: 256 is not a sequence number (0 to 255)"),
        (0, 2**63, f"sparkplug_b: metric 1 ('Level'): alias {2**63} does not fit a bigint"),
    ],
)
def test_a_sequence_number_or_alias_no_column_holds_is_quarantined_not_a_failed_batch(seq, alias, detail):
    """A seq or an alias past 2**63 - 1 (both travel as uint64) became a row Spark could not take: the
    worker's conversion to bigint failed the whole micro-batch, at every restart again."""
    metrics = [bdseq_metric(0), MetricOut(1.5, "Double", name="Level", alias=alias)]
    birth = record(NODE.format("NBIRTH"), encode(metrics, timestamp_ms=1, seq=seq), 1)
    [rejected] = EdgeNodeSession().process([birth])
    assert (rejected["kind"], rejected["reason"], rejected["detail"]) == (REJECTED, REASON_MALFORMED, detail)
    assert rejected["seq"] is None or 0 <= rejected["seq"] < 2**63


def test_a_birth_that_cannot_be_read_ends_the_birth_before_it_and_puts_none_in_force():
    """A rebirth whose metric carries its value in another field than its datatype's was quarantined, yet
    taken: the data after it were read by its aliases, while the devices table never heard of the rebirth
    (the node's devices stayed online from the birth before). A birth quarantined is none: the session in
    force ends, and what follows waits for a birth that can be read."""
    session = EdgeNodeSession()
    session.process([nbirth(1000, bdseq=0), dbirth("pump7", 1001, seq=1)])
    bad: Any = payload_class()()
    bad.timestamp, bad.seq = 2000, 0
    metric = bad.metrics.add()
    metric.name, metric.alias, metric.datatype, metric.double_value = "Supply/Voltage", 1, 9, 230.0  # a Float
    rows = session.process([record(NODE.format("NBIRTH"), bad.SerializeToString(), 2000)])
    assert [(r["kind"], r["device_id"], r["online"]) for r in rows] == [
        (PRESENCE, "pump7", False),
        (PRESENCE, None, False),
        (REJECTED, None, None),
    ]
    assert "a Float in double_value" in rows[-1]["detail"]
    data = encode([MetricOut(231.0, "Double", alias=1, with_datatype=False)], timestamp_ms=2001, seq=1)
    [late] = session.process([record(NODE.format("NDATA"), data, 2001)])
    assert (late["kind"], late["reason"]) == (REJECTED, REASON_UNKNOWN_ALIAS)
    [device] = session.process([ddata("pump7", 2002, 2, temperature(1.0))])
    assert (device["kind"], device["reason"]) == (REJECTED, REASON_UNKNOWN_ALIAS)
    bad_dbirth = encode([MetricOut(1, "Int32", name="Count", alias=20)], timestamp_ms=2003, seq=1)
    session.process([nbirth(2003, bdseq=0, seq=0), dbirth("pump7", 2003, seq=1)])
    broken: Any = payload_class().FromString(bad_dbirth)
    broken.metrics[0].ClearField("int_value")
    broken.metrics[0].string_value = "x"
    rows = session.process([record(DEVICE.format("DBIRTH", "pump7"), broken.SerializeToString(), 2004)])
    assert [(r["kind"], r["device_id"], r["online"]) for r in rows] == [
        (PRESENCE, "pump7", False),
        (REJECTED, "pump7", None),
    ]
    [device] = session.process([ddata("pump7", 2005, 2, temperature(1.0))])
    assert (device["kind"], device["reason"]) == (REJECTED, REASON_UNKNOWN_ALIAS)


@pytest.mark.parametrize("cut", [lambda payload: payload[:-3], lambda payload: b""])
def test_a_birth_that_does_not_parse_or_is_empty_ends_the_birth_before_it_too(cut):
    """A rebirth cut short (its bytes do not parse) was quarantined, and the birth before it stayed in
    force: the data after it, sent by the new birth's aliases, were read by the old birth's names and
    datatypes. An empty one (a retained message cleared on the birth's topic) was taken as a birth of no
    metrics. Either is a birth that cannot be read: none is in force after it."""
    session = EdgeNodeSession()
    session.process([nbirth(1000, bdseq=0), dbirth("pump7", 1001, seq=1)])
    broken = nbirth(2000, bdseq=1)
    rows = session.process([record(broken.topic, cut(broken.payload), 2000)])
    assert [(r["kind"], r["device_id"], r["online"], r["reason"]) for r in rows] == [
        (PRESENCE, "pump7", False, None),
        (PRESENCE, None, False, None),
        (REJECTED, None, None, REASON_MALFORMED),
    ]
    data = encode([MetricOut(231.0, "Double", alias=1, with_datatype=False)], timestamp_ms=2001, seq=1)
    [late] = session.process([record(NODE.format("NDATA"), data, 2001)])
    assert (late["kind"], late["reason"]) == (REJECTED, REASON_UNKNOWN_ALIAS)
    session.process([nbirth(3000, bdseq=1), dbirth("pump7", 3001, seq=1)])
    device_birth = dbirth("pump7", 3002, seq=2)
    rows = session.process([record(device_birth.topic, cut(device_birth.payload), 3002)])
    assert [(r["kind"], r["device_id"], r["online"]) for r in rows] == [
        (PRESENCE, "pump7", False),
        (REJECTED, "pump7", None),
    ]


def test_a_birth_that_cannot_be_read_in_the_millisecond_of_data_before_it_comes_after_that_data():
    """A message that cannot be read has no number to be ordered by, and was taken first in its
    millisecond: a rebirth cut short ended the session before the data sent under it were read, and
    they were quarantined. It now comes where a birth comes: after the data of the number expected."""
    session = EdgeNodeSession()
    session.process([nbirth(1000), dbirth("pump7", 1001, seq=1)])
    broken = nbirth(2000, bdseq=1)
    rows = session.process(
        [record(broken.topic, (broken.payload or b"")[:-3], 2000), ddata("pump7", 2000, 2, temperature(4.0))]
    )
    assert [(r["kind"], r["message_type"]) for r in rows if r["kind"] != PRESENCE] == [
        (METRIC, "DDATA"),
        (REJECTED, "NBIRTH"),
    ]


def test_an_empty_data_message_is_quarantined_and_breaks_no_sequence():
    session = EdgeNodeSession()
    session.process([nbirth(1000), dbirth("pump7", 1001, seq=1)])
    empty = record(DEVICE.format("DDATA", "pump7"), b"", 1002)
    rows = session.process([empty, ddata("pump7", 1003, 2, temperature(1.0))])
    assert [(r["kind"], r["seq_gap"], r["detail"]) for r in rows] == [
        (
            REJECTED,
            None,
            "sparkplug_b: an empty payload: no Sparkplug B message (a retained message cleared?)",
        ),
        (METRIC, False, None),
    ]


def test_a_uint64_past_what_a_bigint_holds_is_kept_exact_in_decimal():
    """A UInt64 from 2**63 (a counter, an id, a bit mask) was left out of ``value_long`` and kept only
    rounded in ``value_double`` (2**64 - 1 read as 2**64): the value sent was nowhere."""
    metrics = [MetricOut(2**64 - 1, "UInt64", name="Mask", alias=1), MetricOut(7, "UInt64", name="Small")]
    birth = record(NODE.format("NBIRTH"), encode([bdseq_metric(0), *metrics], timestamp_ms=1, seq=0), 1)
    rows = {r["metric"]: r for r in kinds(EdgeNodeSession().process([birth]), METRIC)}
    mask, small = rows["Mask"], rows["Small"]
    assert (mask["value_long"], mask["value_string"], mask["value_double"]) == (None, str(2**64 - 1), 2.0**64)
    assert (small["value_long"], small["value_string"]) == (7, None)


def test_strings_that_are_not_utf8_are_quarantined_saying_where():
    """Protobuf hands a Sparkplug B string that is not UTF-8 over as bytes: a metric name so became a key
    the session's state could not be written with, a value one Arrow refused as a string, and either failed
    the Sparkplug B query at every restart; in a DataSet it came out as the text "b'...'"."""
    session = EdgeNodeSession()
    declared = [MetricOut("x", "String", name="Mode", alias=1), MetricOut(None, "DataSet", name="T")]
    birth = encode([bdseq_metric(0), *declared], timestamp_ms=1, seq=0)
    [bad_name] = session.process([record(NODE.format("NBIRTH"), birth.replace(b"Mode", b"Mo\xffe"), 1)])
    assert bad_name["detail"] == "sparkplug_b: metric 1: its name is not UTF-8"
    session.process([record(NODE.format("NBIRTH"), birth, 2)])
    session.to_bytes()
    value = encode([MetricOut("zzzz", "String", alias=1, with_datatype=False)], timestamp_ms=3, seq=1)
    [bad_value] = session.process([record(NODE.format("NDATA"), value.replace(b"zzzz", b"z\xffzz"), 3)])
    assert bad_value["detail"] == "sparkplug_b: metric 0 (alias 1): a String that is not UTF-8"
    table: Any = payload_class()()
    table.seq = 2
    metric = table.metrics.add()
    metric.name, metric.dataset_value.num_of_columns = "T", 1
    metric.dataset_value.columns.append("cccc")
    data = table.SerializeToString().replace(b"cccc", b"c\xffcc")
    [bad_table] = session.process([record(NODE.format("NDATA"), data, 4)])
    assert bad_table["detail"] == "sparkplug_b: metric 0 ('T'): a DataSet that is not UTF-8 at columns"
    assert bad_table["reason"] == REASON_MALFORMED
    EdgeNodeSession.from_bytes(session.to_bytes())


@pytest.mark.parametrize(
    ("datatype", "field", "sent", "detail"),
    [
        ("Int8", "int_value", 300, "an Int8 of 300 in int_value is past its width"),
        ("Int32", "long_value", 2**40, f"an Int32 of {2**40} in long_value is past its width"),
        ("UInt8", "int_value", 256, "a UInt8 of 256 in int_value is past its width"),
        ("UInt16", "long_value", 2**32 - 1, f"a UInt16 of {2**32 - 1} in long_value is past its width"),
    ],
)
def test_an_integer_past_its_datatypes_width_is_quarantined_not_cut_to_it(datatype, field, sent, detail):
    """An Int8 of 300 was read as 44 and an Int32 of 2**40 as 0 (their low bits), a UInt8 of 256 as 256: a
    value neither sent as such nor one its datatype holds. Such a message is quarantined, naming it."""
    metrics = [bdseq_metric(0), MetricOut(0, datatype, name="Level", alias=1)]
    birth = record(NODE.format("NBIRTH"), encode(metrics, timestamp_ms=1, seq=0), 1)
    data: Any = payload_class()()
    data.timestamp, data.seq = 2, 1
    metric = data.metrics.add()
    metric.alias = 1
    setattr(metric, field, sent)
    rows = EdgeNodeSession().process([birth, record(NODE.format("NDATA"), data.SerializeToString(), 2)])
    [rejected] = kinds(rows, REJECTED)
    assert (rejected["reason"], rejected["detail"]) == (
        REASON_MALFORMED,
        f"sparkplug_b: metric 0 (alias 1): {detail}",
    )


@pytest.mark.parametrize("last_seq", [None, 36])
def test_the_births_of_a_node_with_many_devices_in_one_millisecond_are_read_birth_first(last_seq):
    """A gateway of 200 devices publishes its NBIRTH and their DBIRTHs in a tight loop, one millisecond at
    the broker: their numbers (0 to 200) spread more than half the range, so they were taken as wrapping
    and the DBIRTHs numbered 129 to 200 were read before the NBIRTH (quarantined, no birth in force), the
    devices' data after them too. An NBIRTH starts its millisecond's sequence; a DBIRTH follows it."""
    session = EdgeNodeSession()
    if last_seq is not None:  # a rebirth: the session before it ended with data numbered 36
        session.process([nbirth(500)])
        session.last_seq, session.after_birth = last_seq, False
    devices = [f"d{n:03}" for n in range(200)]
    batch = [nbirth(1000)] + [dbirth(device, 1000, n + 1) for n, device in enumerate(devices)]
    batch += [
        ddata(device, 1001, (201 + n) % 256, temperature(1.0, device)) for n, device in enumerate(devices)
    ]
    rows = session.process(list(reversed(batch)))
    assert kinds(rows, REJECTED) == []
    assert len([r for r in kinds(rows, METRIC) if r["message_type"] == "DDATA"]) == 200
    assert not any(r["seq_gap"] for r in kinds(rows, METRIC))


def sent_by_a_gateway(seed: int) -> list[Record]:
    """A gateway's messages as sent: its births, data of it and its devices, now and then a rebirth; about
    fifty to a millisecond at the broker, each topic's offsets counted apart."""
    rng = random.Random(seed)
    devices = [f"d{n}" for n in range(rng.randint(1, 30))]
    offsets: dict[str, int] = {}
    sent: list[Record] = []
    clock, seq, born = 1000, 0, 0

    def send(topic: str, metrics: list[MetricOut]) -> None:
        nonlocal clock, seq
        offsets[topic] = offsets.get(topic, -1) + 1
        payload = encode(metrics, timestamp_ms=clock, seq=seq % 256)
        sent.append(Record("edge1", topic, offsets[topic], clock, payload))
        seq += 1
        clock += rng.random() < 0.02

    def births() -> None:
        nonlocal seq, born
        seq, born = 0, born + 1  # a rebirth is another message than the birth before, in any millisecond
        level = MetricOut(float(born), "Double", name="Level", alias=1)
        send(NODE.format("NBIRTH"), [bdseq_metric(0), level])
        for device in devices:
            temperature_of = MetricOut(1.0, "Float", name="Temperature", alias=first_alias(device))
            send(DEVICE.format("DBIRTH", device), [temperature_of])

    births()
    for _ in range(rng.randint(1, 400)):
        if rng.random() < 0.01:
            births()
            clock += 1
        elif (device := rng.choice([None, *devices])) is None:
            send(NODE.format("NDATA"), [MetricOut(2.0, "Double", alias=1, with_datatype=False)])
        else:
            send(DEVICE.format("DDATA", device), [temperature(2.0, device)])
    return sent


@pytest.mark.parametrize("seed", range(40))
def test_a_gateways_messages_handed_over_in_any_order_and_split_anywhere_are_read_as_sent(seed):
    """Births, data and rebirths of a gateway with devices, handed over shuffled in two micro-batches
    split anywhere in the order sent: none is quarantined, none flagged as a gap. Sorted by number within
    a millisecond, most were (a device's data before its birth, the data before a rebirth after it)."""
    sent = sent_by_a_gateway(seed)
    rng = random.Random(seed)
    cut = rng.randrange(len(sent) + 1)
    session = EdgeNodeSession()
    rows = session.process(rng.sample(sent[:cut], cut))
    rows += EdgeNodeSession.from_bytes(session.to_bytes()).process(rng.sample(sent[cut:], len(sent) - cut))
    assert kinds(rows, REJECTED) == []
    assert not any(row["seq_gap"] for row in rows)


def test_alias_0_is_an_alias_and_a_birth_giving_one_alias_to_two_metrics_puts_none_in_force():
    """[tck-id-payloads-alias-uniqueness] Alias 0 is a number like any other (not "no alias"): data by it
    read by the birth's name for it. A birth giving one alias to two metrics would make data by it ambiguous:
    it is quarantined, no birth is in force, and the data after it are quarantined too."""
    level = MetricOut(1.5, "Double", name="Level", alias=0)
    flow = MetricOut(2.5, "Double", name="Flow", alias=0)
    by_alias_0 = encode([MetricOut(9.5, "Double", alias=0, with_datatype=False)], timestamp_ms=2, seq=1)
    good = EdgeNodeSession().process(
        [
            record(NODE.format("NBIRTH"), encode([bdseq_metric(0), level], timestamp_ms=1, seq=0), 1),
            record(NODE.format("NDATA"), by_alias_0, 2),
        ]
    )
    read = [(r["metric"], r["alias"], r["value_double"]) for r in kinds(good, METRIC)]
    assert read[-1] == ("Level", 0, 9.5)
    session = EdgeNodeSession()
    rows = session.process(
        [
            record(NODE.format("NBIRTH"), encode([bdseq_metric(0), level, flow], timestamp_ms=1, seq=0), 1),
            record(NODE.format("NDATA"), by_alias_0, 2),
        ]
    )
    assert [(r["reason"], r["detail"]) for r in kinds(rows, REJECTED)] == [
        (REASON_MALFORMED, "sparkplug_b: metric 2 ('Flow'): alias 0 is 'Level''s too"),
        (REASON_UNKNOWN_ALIAS, "NDATA: edge node plant1/gw1 has no NBIRTH in force"),
    ]
    assert kinds(rows, METRIC) == [] and session.birth is None


def test_a_dbirth_giving_an_alias_the_nbirth_or_another_devices_birth_gives_puts_none_in_force():
    """[tck-id-payloads-alias-uniqueness] An alias is unique across the edge node's metrics, its own and all
    its devices'. A DBIRTH reusing one of the NBIRTH's or of another device's DBIRTH in force was taken, and
    its device's data by that alias read by it, whichever metric the node meant. It is quarantined as a
    birth giving one alias to two metrics is: its device has no birth in force, the others keep theirs."""
    pressure = MetricOut(1.2, "Float", name="Pressure", alias=10)
    current = MetricOut(0.5, "Float", name="Current", alias=1)
    session = EdgeNodeSession()
    rows = session.process(
        [
            nbirth(1000),
            dbirth("pump7", 1001, seq=1),
            record(DEVICE.format("DBIRTH", "pump8"), encode([pressure], timestamp_ms=1002, seq=2), 1002),
            ddata("pump8", 1003, 3, MetricOut(1.5, "Float", alias=10, with_datatype=False)),
            record(DEVICE.format("DBIRTH", "pump9"), encode([current], timestamp_ms=1004, seq=4), 1004),
            ddata("pump7", 1005, 5, temperature(22.0)),
        ]
    )
    assert [(r["reason"], r["detail"]) for r in kinds(rows, REJECTED)] == [
        (
            REASON_MALFORMED,
            "sparkplug_b: metric 0 ('Pressure'): "
            "alias 10 is 'Temperature''s in the birth of plant1/gw1/pump7 too",
        ),
        (
            REASON_UNKNOWN_ALIAS,
            "DDATA: device plant1/gw1/pump8 has had no DBIRTH since the edge node's NBIRTH",
        ),
        (
            REASON_MALFORMED,
            "sparkplug_b: metric 0 ('Current'): alias 1 is 'Supply/Voltage''s in the birth of plant1/gw1 too",
        ),
    ]
    assert sorted(session.devices) == ["pump7"]
    data = [(r["device_id"], r["metric"], r["value_double"]) for r in kinds(rows, METRIC) if r["seq"] == 5]
    assert data == [("pump7", "Temperature", 22.0)]


def test_a_device_born_again_keeps_its_own_aliases_and_a_dead_devices_aliases_are_free_again():
    """A DBIRTH of a device already born replaces its birth (its aliases are its own); once a device's
    birth ends (DDEATH), another device may give its aliases."""
    session = EdgeNodeSession()
    rows = session.process([nbirth(1000), dbirth("pump7", 1001, seq=1), dbirth("pump7", 1002, seq=2)])
    rows += session.process(
        [record(DEVICE.format("DDEATH", "pump7"), encode([], timestamp_ms=1003, seq=3), 1003)]
    )
    rows += EdgeNodeSession.from_bytes(session.to_bytes()).process([dbirth("pump8", 1004, seq=4)])
    assert kinds(rows, REJECTED) == []


def test_a_message_delivered_again_is_a_duplicate_not_a_gap_and_leaves_the_sequence_as_it_was():
    """An edge node's MQTT client sending a QoS 0 message again, or a bridge passing it on twice, put the
    same message in the logs twice: its metrics were read twice, both copies flagged seq_gap with the
    message after it, and a birth delivered again voided its devices' births, their data quarantined. A
    copy (same topic, same bytes as the last message of its number, which is not the number expected) is
    one duplicate row, read by nothing; the session goes on as if it had not come."""
    birth, device_birth = nbirth(1000), dbirth("pump7", 1001, seq=1)
    first = ddata("pump7", 1002, 2, temperature(1.0))

    def again(sent: Record, at_ms: int, broker: str = "edge1") -> Record:
        return Record(broker, sent.topic, next(_offsets), at_ms, sent.payload)

    session = EdgeNodeSession()
    rows = session.process([birth, device_birth, first, again(first, 1002, "edge2")])
    rows += EdgeNodeSession.from_bytes(session.to_bytes()).process(
        [again(first, 1003), again(birth, 1003), ddata("pump7", 1004, 3, temperature(2.0))]
    )
    assert kinds(rows, REJECTED) == []
    data = [(r["seq"], r["seq_gap"], r["value_double"]) for r in kinds(rows, METRIC) if r["seq"] >= 2]
    assert data == [(2, False, 1.0), (3, False, 2.0)]
    assert sorted((r["message_type"], r["seq"]) for r in kinds(rows, "duplicate")) == [
        ("DDATA", 2),
        ("DDATA", 2),
        ("NBIRTH", 0),
    ]


def test_a_number_repeated_with_other_bytes_or_one_lap_later_is_no_duplicate():
    """Only a copy is a duplicate: a node numbering again without a birth sends other bytes (a gap, its
    rows kept), and a node without timestamps sending the same values one lap of the sequence later sends
    the number expected."""
    session = EdgeNodeSession()
    session.process([nbirth(1000), dbirth("pump7", 1001, seq=1)])
    rows = session.process(
        [ddata("pump7", 1002, 2, temperature(1.0)), ddata("pump7", 1003, 2, temperature(5.0))]
    )
    assert [(r["seq"], r["seq_gap"], r["value_double"]) for r in rows] == [(2, False, 1.0), (2, True, 5.0)]
    constant = encode([temperature(1.0)], timestamp_ms=None, seq=3)
    laps = [record(DEVICE.format("DDATA", "pump7"), constant, 1004)]
    laps += [ddata("pump7", 1005 + n, seq % 256, temperature(2.0)) for n, seq in enumerate(range(4, 259))]
    laps.append(record(DEVICE.format("DDATA", "pump7"), constant, 2000))
    rows = session.process(laps)
    assert kinds(rows, "duplicate") == [] and not any(r["seq_gap"] for r in rows)
    assert [r["timestamp_ms"] for r in rows if r["seq"] == 3] == [1004, 2000]
