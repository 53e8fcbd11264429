"""Batch planning of the timestone source, without Spark: end offsets, limits, partitions, data loss."""

from __future__ import annotations

import json
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sources.offsets_planner import (
    MAX_SLICES_PER_PARTITION,
    MIN_RECORDS_PER_SPLIT,
    DataLossError,
    LogExtent,
    LostRange,
    PartitionPlan,
    Slice,
    _share,
    batch_topics,
    behind,
    plan_end_offsets,
    plan_partitions,
    starting_offsets,
)
from sources.options import StartingOffsets, StartKind

E1, E2 = "edge1", "edge2"


def listing(**topics: tuple[int, int]) -> dict[str, LogExtent]:
    return {topic.replace("_", "/"): LogExtent(*extent) for topic, extent in topics.items()}


def end_offsets(start, listings, *, max_records=None, fail=True, target=None):
    return plan_end_offsets(start, listings, max_records=max_records, fail_on_data_loss=fail, target=target)


def partitions(start, end, listings, *, size=1000, fail=True, min_partitions=1):
    return plan_partitions(
        start,
        end,
        listings,
        max_records_per_partition=size,
        fail_on_data_loss=fail,
        min_partitions=min_partitions,
    )


def covered(plan) -> list[tuple[str, str, int]]:
    """Every (broker, topic, offset) a plan reads, in plan order (duplicates kept)."""
    return [
        (part.broker, piece.topic, offset)
        for part in plan.partitions
        for piece in part.slices
        for offset in range(piece.start, piece.end)
    ]


# starting offsets


LISTINGS = {E1: listing(a=(3, 10), b=(0, 4)), E2: listing(a=(0, 7))}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (StartingOffsets(StartKind.EARLIEST), {E1: {"a": 3, "b": 0}, E2: {"a": 0}}),
        (StartingOffsets(StartKind.LATEST), {E1: {"a": 10, "b": 4}, E2: {"a": 7}}),
        (
            StartingOffsets(StartKind.SPECIFIC, specific={E1: {"a": 5, "b": -1, "later": 2}, E2: {"a": -2}}),
            {E1: {"a": 5, "b": 4, "later": 2}, E2: {"a": 0}},
        ),
        (
            StartingOffsets(StartKind.SPECIFIC, specific={E1: {"a": -1}}),
            {E1: {"a": 10, "b": 0}, E2: {"a": 0}},
        ),
    ],
)
def test_starting_offsets(spec: StartingOffsets, expected: dict) -> None:
    assert starting_offsets(spec, LISTINGS) == expected


def test_starting_offsets_by_time_are_clamped_to_the_logs() -> None:
    spec = StartingOffsets(StartKind.TIMESTAMP, timestamp_ms=1)
    resolved = {E1: {"a": 1, "b": 2}, E2: {"a": 99}}
    assert starting_offsets(spec, LISTINGS, resolved) == {E1: {"a": 3, "b": 2}, E2: {"a": 7}}


def test_a_broker_down_at_start_contributes_nothing_yet() -> None:
    assert starting_offsets(StartingOffsets(StartKind.LATEST), {E1: listing(a=(0, 5))}) == {E1: {"a": 5}}


# end offsets


def test_listed_topics_advance_to_their_log_end_and_unlisted_ones_are_kept() -> None:
    start = {E1: {"a": 4, "gone": 7}, E2: {"x": 1}}  # edge2 is down: no listing
    end = end_offsets(start, {E1: listing(a=(0, 9))})
    assert end == {E1: {"a": 9, "gone": 7}, E2: {"x": 1}}


def test_nothing_new_returns_the_same_json_as_start() -> None:
    start = json.loads(json.dumps({E1: {"a": 9, "b": 2}, E2: {"c": 0}}))
    end = end_offsets(start, {E1: listing(b=(0, 2), a=(0, 9)), E2: listing(c=(0, 0))})
    assert json.dumps(end) == json.dumps(start)


def test_new_topics_are_read_from_their_log_start() -> None:
    """A new log with nothing to read is recorded too: its offset says the query has seen it."""
    listings = {E1: listing(a=(0, 2), new=(5, 8), empty=(3, 3))}
    end = end_offsets({E1: {"a": 2}}, listings)
    assert end == {E1: {"a": 2, "empty": 3, "new": 8}}
    plan = partitions({E1: {"a": 2}}, end, listings)
    assert plan.partitions == (PartitionPlan(E1, (Slice("new", 5, 8),)),)


def test_a_new_topic_left_out_by_the_read_limit_is_recorded_at_its_log_start() -> None:
    listings = {E1: listing(hot=(0, 1000), quiet=(4, 5), other=(0, 1))}
    end = end_offsets({E1: {"hot": 0}}, listings, max_records=2)
    assert set(end[E1]) == {"hot", "quiet", "other"}
    assert sum(end[E1].values()) - 4 == 2
    assert end[E1]["quiet"] in (4, 5) and end[E1]["other"] in (0, 1)


def test_a_topic_that_appeared_since_the_last_listing_starts_at_zero() -> None:
    """Its log start above 0: retention removed its first records before they were read."""
    listings = {E1: listing(a=(0, 2), new=(5, 8), empty=(3, 3))}
    with pytest.raises(DataLossError, match=r"topic 'new': the log appeared after .*\[5, 8\)"):
        plan_end_offsets(
            {E1: {"a": 2}}, listings, max_records=None, fail_on_data_loss=True, appeared={E1: {"new"}}
        )
    end = plan_end_offsets(
        {E1: {"a": 2}}, listings, max_records=None, fail_on_data_loss=False, appeared={E1: {"new", "empty"}}
    )
    assert end == {E1: {"a": 2, "empty": 3, "new": 8}}
    plan = plan_partitions(
        {E1: {"a": 2}},
        end,
        listings,
        max_records_per_partition=1000,
        fail_on_data_loss=False,
        appeared={E1: {"new", "empty"}},
    )
    assert plan.partitions == (PartitionPlan(E1, (Slice("new", 5, 8),)),)
    assert plan.lost == (LostRange(E1, "empty", 0, 3), LostRange(E1, "new", 0, 5))
    down = plan_partitions(  # its broker down when the batch is planned: the reader checks from 0
        {E1: {"a": 2}},
        end,
        {},
        max_records_per_partition=1000,
        fail_on_data_loss=False,
        appeared={E1: {"new"}},
    )
    assert down.partitions == (PartitionPlan(E1, (Slice("empty", 0, 3, True), Slice("new", 0, 8))),)


def test_a_new_topic_whose_broker_is_down_at_planning_reads_from_the_log_start_it_finds() -> None:
    plan = partitions({}, {E1: {"new": 3}}, {})
    assert plan.partitions == (PartitionPlan(E1, (Slice("new", 0, 3, from_log_start=True),)),)


def test_max_records_is_shared_in_proportion_to_backlog_and_never_exceeded() -> None:
    start = {E1: {"big": 0, "small": 0}, E2: {"mid": 0}}
    listings = {E1: listing(big=(0, 600), small=(0, 100)), E2: listing(mid=(0, 300))}
    end = end_offsets(start, listings, max_records=100)
    assert end == {E1: {"big": 60, "small": 10}, E2: {"mid": 30}}


def test_max_records_rounding_adds_up_to_the_limit_and_always_progresses() -> None:
    start = {E1: {f"t{i}": 0 for i in range(7)}}
    listings = {E1: {f"t{i}": LogExtent(0, 1 + i) for i in range(7)}}
    seen = start
    total = sum(extent.end for extent in listings[E1].values())
    batches = 0
    while True:
        end = end_offsets(seen, listings, max_records=3)
        taken = sum(end[E1].values()) - sum(seen[E1].values())
        if taken == 0:
            break
        assert taken == min(3, total - sum(seen[E1].values()))
        seen, batches = end, batches + 1
    assert seen == {E1: {f"t{i}": 1 + i for i in range(7)}}
    assert batches == -(-total // 3)


def test_quiet_topics_behind_a_hot_one_are_all_read_within_a_few_batches() -> None:
    """Fifty device topics with a record each behind a hot topic bringing more than the limit every batch:
    the leftover of the rounding (often one record) fed one of them a batch, the last read after about
    fifty batches. Half the limit goes to them first, a record each: ten a batch."""
    quiet = {f"dev/{i}": LogExtent(0, 1) for i in range(50)}
    seen: dict[str, dict[str, int]] = {E1: {"hot": 0, **dict.fromkeys(quiet, 0)}}
    hot_end, batches = 0, 0
    while any(seen[E1][topic] == 0 for topic in quiet):
        hot_end += 175
        listings = {E1: {"hot": LogExtent(0, hot_end), **quiet}}
        end = end_offsets(seen, listings, max_records=20)
        assert sum(end[E1].values()) - sum(seen[E1].values()) == 20
        assert end[E1]["hot"] > seen[E1]["hot"], "the hot topic is read every batch too"
        seen, batches = end, batches + 1
    assert batches == 5, batches  # ten a batch: half the limit


@given(
    available=st.lists(st.integers(0, 1_000), min_size=1, max_size=60),
    limit=st.integers(1, 500),
    seed=st.integers(0, 2**32 - 1),
)
def test_shares_add_up_to_the_limit_and_none_passes_its_backlog(available, limit, seed) -> None:
    tie_breaks = [zlib.crc32(f"{seed}/{index}".encode()) for index in range(len(available))]
    shares = _share(limit, available, tie_breaks)
    assert sum(shares) == min(limit, sum(available))
    assert all(0 <= share <= size for share, size in zip(shares, available, strict=True))


def test_available_now_target_caps_topics_and_ignores_what_came_after() -> None:
    start = {E1: {"a": 0}}
    listings = {E1: listing(a=(0, 50), late=(0, 5)), E2: listing(x=(0, 9))}
    target = {E1: {"a": 20}}  # edge2 was down and "late" did not exist when the query started
    end = end_offsets(start, listings, target=target)
    assert end == {E1: {"a": 20}}
    assert end_offsets(end, listings, target=target) == end


# partitions


def test_partitions_split_big_ranges_and_pack_small_ones_per_broker() -> None:
    start = {E1: {"a": 0, "b": 10, "c": 0}, E2: {"d": 0}}
    end = {E1: {"a": 250, "b": 20, "c": 30}, E2: {"d": 5}}
    listings = {E1: listing(a=(0, 250), b=(0, 20), c=(0, 30)), E2: listing(d=(0, 5))}
    plan = partitions(start, end, listings, size=100)
    assert plan.partitions == (
        PartitionPlan(E1, (Slice("a", 0, 100),)),
        PartitionPlan(E1, (Slice("a", 100, 200),)),
        PartitionPlan(E1, (Slice("a", 200, 250), Slice("b", 10, 20), Slice("c", 0, 30))),
        PartitionPlan(E2, (Slice("d", 0, 5),)),
    )
    assert plan.records == 295
    assert all(partition.records <= 100 for partition in plan.partitions)


def test_many_quiet_topics_do_not_make_one_task_each_nor_one_huge_request() -> None:
    count = MAX_SLICES_PER_PARTITION * 2 + 1
    end = {E1: {f"device/{i:05}": 1 for i in range(count)}}
    plan = partitions({}, end, {E1: {topic: LogExtent(0, 1) for topic in end[E1]}}, size=10**6)
    assert [len(partition.slices) for partition in plan.partitions] == [
        MAX_SLICES_PER_PARTITION,
        MAX_SLICES_PER_PARTITION,
        1,
    ]


def test_max_slices_per_partition_sets_how_many_quiet_topics_one_task_reads() -> None:
    end = {E1: {f"device/{i:05}": 1 for i in range(2_500)}}
    listings = {E1: {topic: LogExtent(0, 1) for topic in end[E1]}}
    plan = plan_partitions(
        {},
        end,
        listings,
        max_records_per_partition=10**6,
        fail_on_data_loss=True,
        max_slices_per_partition=1_000,
    )
    assert [len(partition.slices) for partition in plan.partitions] == [1_000, 1_000, 500]


def test_min_partitions_splits_one_big_topic_evenly() -> None:
    plan = partitions(
        {E1: {"a": 0}}, {E1: {"a": 10_000}}, {E1: listing(a=(0, 10_000))}, size=10**6, min_partitions=4
    )
    assert plan.partitions == tuple(
        PartitionPlan(E1, (Slice("a", first, first + 2_500),)) for first in range(0, 10_000, 2_500)
    )


def test_min_partitions_packs_many_topics_into_that_many_tasks_each_topic_read_once() -> None:
    end = {E1: {f"d/{i:03}": 1_000 for i in range(100)}}  # the benchmark's shape: 100 topics x 1,000
    listings = {E1: {topic: LogExtent(0, 1_000) for topic in end[E1]}}
    plan = partitions({}, end, listings, size=200_000, min_partitions=2)
    assert [len(part.slices) for part in plan.partitions] == [50, 50]
    assert sorted(covered(plan)) == sorted((E1, t, o) for t in end[E1] for o in range(1_000))
    for part in plan.partitions:  # the reader tracks progress per topic: one slice of a topic per task
        assert len({piece.topic for piece in part.slices}) == len(part.slices)


def test_min_partitions_gives_at_least_that_many_tasks_across_brokers_without_loss_or_overlap() -> None:
    start = {E1: {"a": 7, "b": 0}, E2: {"c": 100}}
    end = {E1: {"a": 30_007, "b": 4_321}, E2: {"c": 9_100}}
    listings = {E1: listing(a=(0, 30_007), b=(0, 4_321)), E2: listing(c=(0, 9_100))}
    for wanted in (1, 2, 3, 5, 8, 13):
        plan = partitions(start, end, listings, size=200_000, min_partitions=wanted)
        assert len(plan.partitions) >= min(wanted, plan.records // MIN_RECORDS_PER_SPLIT)
        reads = covered(plan)
        assert len(reads) == len(set(reads)) == 30_000 + 4_321 + 9_000
        assert sorted(reads) == sorted(
            [(E1, "a", o) for o in range(7, 30_007)]
            + [(E1, "b", o) for o in range(4_321)]
            + [(E2, "c", o) for o in range(100, 9_100)]
        )
        assert all(part.records <= -(-plan.records // wanted) for part in plan.partitions) or wanted == 1


def test_min_partitions_still_honours_max_records_per_partition() -> None:
    plan = partitions(
        {E1: {"a": 0}}, {E1: {"a": 9_000}}, {E1: listing(a=(0, 9_000))}, size=2_000, min_partitions=2
    )
    assert [part.records for part in plan.partitions] == [2_000, 2_000, 2_000, 2_000, 1_000]


def test_min_partitions_does_not_cut_small_batches_into_tiny_tasks() -> None:
    end = {E1: {f"d/{i}": 20 for i in range(50)}}  # a quiet 1 s batch: 1,000 records
    listings = {E1: {topic: LogExtent(0, 20) for topic in end[E1]}}
    assert len(partitions({}, end, listings, size=200_000, min_partitions=8).partitions) == 1
    plan = partitions(
        {E1: {"a": 0}}, {E1: {"a": 2_500}}, {E1: listing(a=(0, 2_500))}, min_partitions=8, size=10**6
    )
    assert [part.records for part in plan.partitions] == [MIN_RECORDS_PER_SPLIT] * 2 + [500]


def test_the_same_batch_is_planned_the_same_way_every_time() -> None:
    start = {E2: {"z": 0, "y": 5}, E1: {"b": 3, "a": 0}}
    end = {E2: {"y": 12_345, "z": 777}, E1: {"b": 40_003, "a": 1}}
    listings = {E1: listing(a=(0, 1), b=(0, 40_003)), E2: listing(y=(0, 12_345), z=(0, 777))}
    first = partitions(start, end, listings, size=200_000, min_partitions=3)
    reordered = partitions(
        dict(reversed(list(start.items()))),
        {b: dict(reversed(list(t.items()))) for b, t in end.items()},
        listings,
        size=200_000,
        min_partitions=3,
    )
    assert first == reordered
    assert len(first.partitions) >= 3


def test_empty_batch_has_no_partitions() -> None:
    assert partitions({E1: {"a": 5}}, {E1: {"a": 5}}, {E1: listing(a=(0, 5))}).partitions == ()


# data loss


def test_retention_gap_fails_naming_broker_topic_and_offsets() -> None:
    with pytest.raises(DataLossError) as caught:
        end_offsets({E1: {"plant/a": 4}}, {E1: listing(plant_a=(10, 12))})
    message = str(caught.value)
    assert "'edge1'" in message and "'plant/a'" in message and "4" in message and "[10, 12)" in message
    assert "failOnDataLoss=false" in message
    with pytest.raises(DataLossError):
        partitions({E1: {"plant/a": 4}}, {E1: {"plant/a": 12}}, {E1: listing(plant_a=(10, 12))})


def test_retention_gap_is_skipped_and_counted_without_fail_on_data_loss() -> None:
    start = {E1: {"a": 4, "b": 0}}
    listings = {E1: listing(a=(10, 12), b=(0, 3))}
    end = end_offsets(start, listings, fail=False)
    assert end == {E1: {"a": 12, "b": 3}}
    plan = partitions(start, end, listings, fail=False)
    assert plan.partitions == (PartitionPlan(E1, (Slice("a", 10, 12), Slice("b", 0, 3))),)
    assert plan.lost == (LostRange(E1, "a", 4, 10),)
    assert plan.lost_records == 6


def test_a_gap_with_nothing_after_it_still_moves_the_offset_past_it() -> None:
    start = {E1: {"a": 4}}
    end = end_offsets(start, {E1: listing(a=(10, 10))}, fail=False)
    assert end == {E1: {"a": 10}}
    assert partitions(start, end, {E1: listing(a=(10, 10))}, fail=False).lost_records == 6


def test_a_recreated_log_fails_or_restarts_from_its_start() -> None:
    start = {E1: {"a": 100}}
    listings = {E1: listing(a=(0, 5))}
    with pytest.raises(DataLossError, match="ends before the offset to read next"):
        end_offsets(start, listings)
    end = end_offsets(start, listings, fail=False)
    assert end == {E1: {"a": 5}}
    assert partitions(start, end, listings, fail=False).partitions == (
        PartitionPlan(E1, (Slice("a", 0, 5),)),
    )


def test_the_latest_offsets_behind_a_batch_name_the_logs_it_does_not_read_to_their_end() -> None:
    listings = {E1: listing(a=(0, 5), b=(0, 9), c=(0, 3), d=(0, 0)), "e2": listing(x=(0, 4))}
    end = {E1: {"a": 5, "b": 7, "c": 8}, "e2": {"x": 4}}  # c: recreated shorter; d: empty, not named yet
    assert behind(listings, end) == {E1: {"b": 9}}
    assert behind(listings, {E1: {"a": 5, "b": 9, "c": 3}}) == {"e2": {"x": 4}}, "a broker not in the end"
    assert behind(listings, {**end, E1: end[E1] | {"b": 9}}) == {}


def test_a_batch_is_planned_the_same_from_the_topics_it_moves_alone() -> None:
    own = {"#sabc": 0, "#fdev/+": 0}
    start = {E1: own | {"a": 5, "b": 3, "c": 7, "d": 2, "gone": 4}, E2: {"#sold": 0, "x": 1}}
    end = {E1: own | {"a": 5, "b": 9, "c": 7, "d": 2, "gone": 4, "new": 1}, E2: {"#snew": 0, "x": 1}}
    # c: retention went past its offset; d: recreated, shorter; gone: not listed
    listings = {E1: listing(a=(0, 5), b=(0, 9), c=(8, 12), d=(0, 1), new=(0, 1)), E2: listing(x=(0, 1))}
    narrow_start, narrow_end = batch_topics(start, end, listings)
    assert narrow_end == {E1: own | {"b": 9, "c": 7, "d": 2, "new": 1}, E2: end[E2]}
    assert narrow_start == {E1: own | {"b": 3, "c": 7, "d": 2}, E2: start[E2]}, "another store: kept whole"
    assert partitions(narrow_start, narrow_end, listings, fail=False) == partitions(
        start, end, listings, fail=False
    )
    with pytest.raises(DataLossError, match="'c'"):
        partitions(narrow_start, narrow_end, listings)
    assert batch_topics({E2: {"x": 1}}, {}, listings) == ({E2: {"x": 1}}, {})
