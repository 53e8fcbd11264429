"""Offsets of brokers read by storage partition: keys that never mix with topics, query-start marks, and the
planner's rules applied to positions as to topic offsets."""

from __future__ import annotations

import pytest

from sources.offsets_planner import DataLossError, LogExtent, plan_end_offsets, plan_partitions
from sources.partition_offsets import (
    describe,
    drop_passed_marks,
    filter_keys,
    filters_of,
    marks_of,
    query_start_marks,
    reads_partitions,
    uncovered,
)


def test_a_brokers_offsets_say_how_it_is_read() -> None:
    assert reads_partitions({"#e0": 5, "#p0": 0}) is True
    assert reads_partitions({"plant/1/temp": 3}) is False
    assert reads_partitions({}) is None
    assert describe("#p3") == "partition 3 (positions)"
    assert describe("plant/1/temp") == "topic 'plant/1/temp'"


def test_marks_cover_what_the_partitions_held_when_the_query_began_and_go_once_passed() -> None:
    extents = {"#p0": LogExtent(0, 50), "#p1": LogExtent(7, 7)}

    marks = query_start_marks({"#p0": 10, "#p1": 7}, extents)

    assert marks == {"#e0": 50}  # partition 1 held nothing past the start
    assert marks_of({"#p0": 10, **marks}) == {0: 50}
    assert drop_passed_marks({"#e0": 50, "#p0": 49}) == {"#e0": 50, "#p0": 49}
    assert drop_passed_marks({"#e0": 50, "#p0": 50}) == {"#p0": 50}


def test_positions_are_planned_like_offsets_marks_carried_along() -> None:
    listings = {"b": {"#p0": LogExtent(0, 1000), "#p1": LogExtent(0, 300)}}
    start = {"b": {"#e0": 1000, "#p0": 0, "#p1": 300}}

    end = plan_end_offsets(start, listings, max_records=400, fail_on_data_loss=True)
    plan = plan_partitions(start, end, listings, max_records_per_partition=250, fail_on_data_loss=True)

    assert end == {"b": {"#e0": 1000, "#p0": 400, "#p1": 300}}
    assert [[(s.topic, s.start, s.end) for s in p.slices] for p in plan.partitions] == [
        [("#p0", 0, 250)],
        [("#p0", 250, 400)],
    ]


def test_a_partition_start_past_the_checkpoint_is_loss_named_by_partition() -> None:
    listings = {"b": {"#p0": LogExtent(120, 300)}}

    with pytest.raises(DataLossError, match=r"partition 0 \(positions\).*next position to read 100"):
        plan_end_offsets({"b": {"#p0": 100}}, listings, max_records=None, fail_on_data_loss=True)
    end = plan_end_offsets({"b": {"#p0": 100}}, listings, max_records=None, fail_on_data_loss=False)
    plan = plan_partitions(
        {"b": {"#p0": 100}}, end, listings, max_records_per_partition=1000, fail_on_data_loss=False
    )
    assert [(gap.topic, gap.start, gap.end) for gap in plan.lost] == [("#p0", 100, 120)]


def test_the_filters_read_are_kept_and_a_filter_they_do_not_cover_is_told() -> None:
    keys = {"#p0": 7, **filter_keys(["plant/+/temp", "alarms/#"])}
    assert reads_partitions({"#tplant/+/temp": 0}) is True
    assert filters_of(keys) == {"plant/+/temp", "alarms/#"}
    assert filters_of({"#p0": 7}) is None  # written before filters were kept
    assert filter_keys([f"devices/{n}/telemetry" for n in range(65)]) == {}  # too many to keep
    read = {"plant/+/temp", "alarms/#"}
    assert uncovered(["plant/1/temp", "alarms", "alarms/+/x", "plant/+/temp"], read) == []
    assert uncovered(["plant/+/alarm", "plant/#", "plant/+", "+/1/temp", "#"], read) == [
        "plant/+/alarm",
        "plant/#",
        "plant/+",
        "+/1/temp",
        "#",
    ]
    assert uncovered(["$SYS/x"], {"#"}) == ["$SYS/x"]  # a filter starting with a wildcard skips $ topics
