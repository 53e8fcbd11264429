"""The controller's decisions, without etcd: initial assignment, elections, replica filling, spreading,
and replicas moved to a member that joined a cluster whose replication factor was already met."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_edge.cluster.coordination.assignment import (
    MOVES_AT_ONCE,
    Change,
    balance_leaders,
    elect_leaders,
    fill_replicas,
    initial_states,
    leader_counts,
    needs_election,
    plan,
    reassign_replicas,
    replica_counts,
    shrink_replicas,
)
from broker_edge.placement import PartitionState


def by_partition(states: list[PartitionState]) -> dict[int, PartitionState]:
    return {state.partition: state for state in states}


def apply(states: dict[int, PartitionState], changes: list[Change]) -> dict[int, PartitionState]:
    result = dict(states)
    for change in changes:
        assert result[change.partition] == change.before
        result[change.partition] = change.after
    return result


def full_isr(states: dict[int, PartitionState]) -> dict[int, PartitionState]:
    """Every replica caught up (what leaders do once followers have fetched everything)."""
    return {p: PartitionState(p, s.leader, s.epoch, s.replicas, s.replicas) for p, s in states.items()}


# -- initial assignment -----------------------------------------------------------------------------------


def test_initial_assignment_spreads_replicas_and_leaders_evenly() -> None:
    states = initial_states(range(16), ["b2", "b1", "b3"], 3)
    assert [s.partition for s in states] == list(range(16))
    assert states[0] == PartitionState(0, "b1", 0, ("b1", "b2", "b3"), ("b1", "b2", "b3"))
    assert states[1] == PartitionState(1, "b2", 0, ("b2", "b1", "b3"), ("b2", "b1", "b3"))
    assert sorted(leader_counts(states, ["b1", "b2", "b3"]).values()) == [5, 5, 6]


def test_initial_replication_factor_is_capped_at_the_live_members() -> None:
    states = initial_states(range(4), ["b1"], 3)
    assert {s.replicas for s in states} == {("b1",)}
    assert {s.leader for s in states} == {"b1"}


def test_initial_assignment_needs_a_member_and_a_positive_factor() -> None:
    with pytest.raises(ValueError, match="members"):
        initial_states(range(2), [], 3)
    with pytest.raises(ValueError, match="replication_factor"):
        initial_states(range(2), ["b1"], 0)


@given(
    partitions=st.integers(1, 64),
    members=st.sets(st.sampled_from([f"b{i}" for i in range(9)]), min_size=1),
    rf=st.integers(1, 5),
)
def test_initial_assignment_properties(partitions: int, members: set[str], rf: int) -> None:
    states = initial_states(range(partitions), members, rf)
    assert states == initial_states(range(partitions), sorted(members, reverse=True), rf)  # deterministic
    replica_load: Counter[str] = Counter()
    for state in states:
        assert len(state.replicas) == len(set(state.replicas)) == min(rf, len(members))
        assert set(state.replicas) <= members
        assert state.leader == state.replicas[0]
        assert state.isr == state.replicas
        assert state.epoch == 0
        replica_load.update(state.replicas)
    leaders = leader_counts(states, members)
    assert max(leaders.values()) - min(leaders.values()) <= 1
    loads = [replica_load[m] for m in members]
    assert max(loads) - min(loads) <= 1


# -- elections ----------------------------------------------------------------------------------------


def test_a_dead_leader_is_replaced_by_a_live_isr_member_with_the_next_epoch() -> None:
    states = {0: PartitionState(0, "b1", 4, ("b1", "b2", "b3"), ("b1", "b2", "b3"))}
    changes = plan(states, {"b2", "b3"}, 3)
    assert len(changes) == 1
    after = changes[0].after
    assert after.leader in {"b2", "b3"}
    assert after.epoch == 5
    assert after.isr == tuple(n for n in ("b2", "b3"))
    assert after.replicas == ("b2", "b3")  # the dead one leaves the replicas, whether or not one replaces it
    assert not changes[0].unclean


def test_the_candidate_with_the_highest_log_end_wins() -> None:
    states = {
        0: PartitionState(0, "b1", 0, ("b1", "b2", "b3"), ("b1", "b2", "b3")),
        1: PartitionState(1, "b3", 0, ("b3", "b1", "b2"), ("b3", "b1", "b2")),
    }
    log_ends = {"b2": {0: 10}, "b3": {0: 12, 1: 7}}
    changes = plan(states, {"b2", "b3"}, 3, log_ends)
    assert changes[0].after.leader == "b3"  # more records, although it already leads partition 1
    log_ends = {"b2": {0: 12}, "b3": {0: 10}}
    assert plan(states, {"b2", "b3"}, 3, log_ends)[0].after.leader == "b2"


def test_a_candidate_that_does_not_answer_is_ranked_last_but_still_eligible() -> None:
    states = {0: PartitionState(0, "b1", 0, ("b1", "b2", "b3"), ("b1", "b2", "b3"))}
    assert plan(states, {"b2", "b3"}, 3, {"b3": {}})[0].after.leader == "b3"  # answered: 0 records
    assert plan(states, {"b2", "b3"}, 3, {"b2": {0: 0}})[0].after.leader == "b2"
    only_silent = {0: PartitionState(0, "b1", 0, ("b1", "b2"), ("b1", "b2"))}
    assert plan(only_silent, {"b2"}, 2, {})[0].after.leader == "b2"


def test_ties_go_to_the_member_with_fewest_leaderships() -> None:
    states = {
        0: PartitionState(0, "b1", 0, ("b1", "b2", "b3"), ("b1", "b2", "b3")),
        1: PartitionState(1, "b1", 0, ("b1", "b2", "b3"), ("b1", "b2", "b3")),
        2: PartitionState(2, "b2", 0, ("b2", "b3", "b1"), ("b2", "b3", "b1")),
    }
    elected = elect_leaders(states, {"b2", "b3"})
    # b2 already leads partition 2: partition 0 goes to b3, partition 1 then to either (b2 and b3 lead 1)
    assert elected[0][0].leader == "b3"
    assert elected[1][0].leader == "b2"
    assert 2 not in elected or elected[2][0].leader == "b2"


def test_no_live_isr_member_leaves_the_partition_offline_with_its_isr_kept() -> None:
    states = {0: PartitionState(0, "b1", 3, ("b1", "b2", "b3"), ("b1",))}
    changes = plan(states, {"b2", "b3"}, 3)
    after = changes[0].after
    assert after.leader is None
    assert after.epoch == 4
    assert after.isr == ("b1",)  # b1 holds every acknowledged record: it may lead again when it returns
    assert plan({0: after}, {"b2", "b3"}, 3) == []  # nothing more to do while offline
    back = plan({0: after}, {"b1", "b2", "b3"}, 3)
    assert back[0].after.leader == "b1"
    assert back[0].after.epoch == 5


def test_unclean_election_picks_a_live_replica_and_says_so() -> None:
    states = {0: PartitionState(0, "b1", 3, ("b1", "b2", "b3"), ("b1",))}
    changes = plan(states, {"b2", "b3"}, 3, {"b2": {0: 1}, "b3": {0: 9}}, unclean_election=True)
    change = changes[0]
    assert change.unclean
    assert change.after.leader == "b3"
    assert change.after.isr == ("b3",)
    assert change.after.epoch == 4
    assert any("UNCLEAN" in reason for reason in change.reasons)


def test_unclean_election_with_no_live_replica_stays_offline() -> None:
    states = {0: PartitionState(0, "b1", 3, ("b1", "b2"), ("b1",))}
    changes = plan(states, {"b3"}, 2, unclean_election=True)
    assert changes[0].after.leader is None
    assert not changes[0].unclean


def test_dead_followers_leave_the_isr_without_an_epoch_change() -> None:
    states = {0: PartitionState(0, "b1", 2, ("b1", "b2", "b3"), ("b1", "b2", "b3"))}
    changes = plan(states, {"b1", "b3"}, 3)
    assert changes[0].after == PartitionState(0, "b1", 2, ("b1", "b3"), ("b1", "b3"))
    assert changes[0].reasons == ("dead b2 left the in-sync set", "dead b2 left the replicas")


def test_needs_election_lists_partitions_without_a_live_leader() -> None:
    states = [
        PartitionState(0, "b1", 0, ("b1",), ("b1",)),
        PartitionState(1, "b2", 0, ("b2",), ("b2",)),
        PartitionState(2, None, 1, ("b2",), ("b2",)),
    ]
    assert needs_election(states, {"b1"}) == [1, 2]


# -- filling and spreading ------------------------------------------------------------------------------


def test_a_new_member_fills_replica_sets_short_of_the_factor() -> None:
    states = by_partition(initial_states(range(6), ["b1", "b2"], 3))  # created with two members
    filled = fill_replicas(states, {"b1", "b2", "b3"}, 3)
    assert set(filled) == set(range(6))
    for state, _ in filled.values():
        assert state.replicas[-1] == "b3"
        assert "b3" not in state.isr  # it must catch up first
    assert fill_replicas(states, {"b1", "b2"}, 3) == {}


def test_a_dead_replica_out_of_sync_makes_room_for_a_spare_member() -> None:
    states = {0: PartitionState(0, "b1", 0, ("b1", "b2", "b3"), ("b1", "b2", "b3"))}
    after = apply(states, plan(states, {"b1", "b2", "b4"}, 3))
    assert after[0].replicas == ("b1", "b2", "b4")
    assert after[0].isr == ("b1", "b2")


def test_the_new_member_gets_its_share_of_leadership_once_in_sync() -> None:
    states = by_partition(initial_states(range(16), ["b1", "b2"], 3))
    live = {"b1", "b2", "b3"}
    states = apply(states, plan(states, live, 3))  # b3 added as a replica everywhere
    assert leader_counts(states.values(), live)["b3"] == 0
    states = full_isr(states)  # b3 caught up
    changes = plan(states, live, 3)
    after = apply(states, changes)
    counts = leader_counts(after.values(), live)
    assert sorted(counts.values()) == [5, 5, 6]
    for change in changes:
        assert change.after.leader == "b3"
        assert change.after.epoch == change.before.epoch + 1
    assert plan(after, live, 3) == []  # stable


def test_leadership_moves_only_to_in_sync_members() -> None:
    states = {p: PartitionState(p, "b1", 0, ("b1", "b2"), ("b1",)) for p in range(4)}
    assert balance_leaders(states, {"b1", "b2"}) == {}


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[int, PartitionState], set[str], int, dict[str, dict[int, int]]]:
    nodes = [f"b{i}" for i in range(6)]
    rf = draw(st.integers(1, 4))
    partitions = draw(st.integers(1, 24))
    states: dict[int, PartitionState] = {}
    for p in range(partitions):
        replicas = tuple(draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=rf, unique=True)))
        isr = tuple(n for n in replicas if draw(st.booleans()))
        leader = draw(st.sampled_from([None, *isr])) if isr else None
        if leader is not None and leader not in isr:
            isr = (leader, *isr)
        states[p] = PartitionState(p, leader, draw(st.integers(0, 9)), replicas, isr)
    live = draw(st.sets(st.sampled_from(nodes)))
    ends = {n: {p: draw(st.integers(0, 5)) for p in states} for n in nodes if draw(st.booleans())}
    return states, live, rf, ends


@given(clusters(), st.booleans())
def test_plan_invariants(
    cluster: tuple[dict[int, PartitionState], set[str], int, dict[str, dict[int, int]]], unclean: bool
) -> None:
    states, live, rf, ends = cluster
    changes = plan(states, live, rf, ends, unclean)
    after = apply(states, changes)
    assert len({c.partition for c in changes}) == len(changes)
    for change in changes:
        before, new = change.before, change.after
        assert new.partition == before.partition
        assert new.epoch == before.epoch + (1 if new.leader != before.leader else 0)
        if new.leader is not None and new.leader != before.leader:
            assert new.leader in live
            if change.unclean:
                assert new.leader in before.replicas and unclean
                assert new.isr == (new.leader,)
            else:
                assert new.leader in before.isr  # only in-sync replicas lead
    for p, state in after.items():
        if state.leader is not None:
            assert state.leader in live
            assert state.leader in state.isr
            assert set(state.isr) <= live  # dead members left the in-sync set
            assert set(state.isr) <= set(state.replicas)
        else:
            # offline only when no live in-sync replica (and no live replica at all for unclean)
            assert not (set(states[p].isr) & live)
            if unclean:
                assert not (set(states[p].replicas) & live)
        live_replicas = [n for n in state.replicas if n in live]
        if state.leader is not None and states[p].leader is not None:
            assert len(live_replicas) >= min(rf, len(live))  # filled up to the factor where members allow
            assert set(state.replicas) <= live  # dead members left the replicas
        else:  # offline, or elected back in this pass: filled in the next one, from its leader
            assert state.replicas == states[p].replicas
        assert len(set(state.replicas)) == len(state.replicas)
    # spreading: no live member could take over from one leading two more than it (partitions elected in
    # this pass excepted: they stay with their new leader for now)
    counts = leader_counts(after.values(), live)
    for p, state in after.items():
        if state.leader is not None and states[p].leader in live:
            for node in state.isr:
                leader_end = ends.get(state.leader, {}).get(p)
                behind = node in ends and leader_end is not None and ends[node].get(p, 0) < leader_end
                assert counts[node] + 1 >= counts[state.leader] or behind
        had = [n for n in states[p].replicas if n in live]
        assert len(live_replicas) <= max(min(rf, len(live)) + 1, len(had))  # one extra replica at most
    # a second pass only spreads the leadership of partitions elected in the first (and, unclean, may
    # elect a replica the first added), or moves replicas
    second = plan(after, live, rf, ends, unclean)
    for change in second:
        filled = states[change.partition].leader is None and change.before.leader is not None
        assert change.spreads or change.unclean or change.reassigns or filled
    # and the plan settles: a replica moves once leadership has settled, so later passes may still move
    # replicas (or spread the leadership they change), but within a few passes there is nothing left to do
    settled = apply(after, second)
    for _ in range(2 * len(states) + 2):
        more = plan(settled, live, rf, ends, unclean)
        if not more:
            break
        assert all(change.spreads or change.unclean or change.reassigns for change in more)
        settled = apply(settled, more)
    else:
        raise AssertionError(f"the plan did not settle: still {more}")


# -- moving replicas to a member that joined ----------------------------------------------------------


def settle(
    states: dict[int, PartitionState], live: set[str], rf: int, rounds: int = 200
) -> tuple[dict[int, PartitionState], int]:
    """Plan and apply, every replica catching up between passes, until a pass changes nothing; checks the
    invariants of every state on the way. The settled states and the passes taken."""
    target = min(rf, len(live))
    for round_ in range(rounds):
        changes = plan(states, live, rf, min_insync_replicas=min(2, target))
        if not changes:
            return states, round_
        for change in changes:
            assert not (change.after.leader != change.before.leader and change.reassigns and change.spreads)
        states = apply(states, changes)
        for state in states.values():
            have = [n for n in state.replicas if n in live]
            assert target <= len(have) <= target + 1, state
            assert state.leader in state.isr
            assert set(state.isr) <= set(state.replicas)
        states = full_isr(states)
    raise AssertionError(f"not settled after {rounds} passes")


def test_a_member_joining_a_full_cluster_gets_extra_replicas_a_few_at_a_time() -> None:
    states = by_partition(initial_states(range(16), ["b1", "b2", "b3"], 3))
    live = {"b1", "b2", "b3", "b4"}
    changes = plan(states, live, 3)
    assert len(changes) == MOVES_AT_ONCE
    for change in changes:
        assert change.reassigns and not change.spreads
        assert change.after.replicas == (*change.before.replicas, "b4")
        assert change.after.isr == change.before.isr  # it must catch up first
        assert change.after.leader == change.before.leader
    after = apply(states, changes)
    assert plan(after, live, 3) == []  # nothing more until the extra replicas are in sync


def test_a_joined_member_ends_with_its_share_of_replicas_and_leadership() -> None:
    states = by_partition(initial_states(range(16), ["b1", "b2", "b3"], 3))
    live = {"b1", "b2", "b3", "b4"}
    settled, _ = settle(states, live, 3)
    assert dict(replica_counts(settled.values(), live)) == {"b1": 12, "b2": 12, "b3": 12, "b4": 12}
    assert dict(leader_counts(settled.values(), live)) == {"b1": 4, "b2": 4, "b3": 4, "b4": 4}
    assert all(len(state.replicas) == 3 for state in settled.values())
    leadership_moves = sum(settled[p].epoch != states[p].epoch for p in settled)
    assert leadership_moves == 4  # only what b4 takes over


def test_a_surplus_replica_is_not_dropped_before_the_extra_one_is_in_sync() -> None:
    states = {0: PartitionState(0, "b1", 3, ("b1", "b2", "b3", "b4"), ("b1", "b2", "b3"))}
    live = {"b1", "b2", "b3", "b4"}
    assert shrink_replicas(states, live, 3) == {}
    caught_up = full_isr(states)
    state, reason = shrink_replicas(caught_up, live, 3)[0]
    assert state.leader == "b1" and len(state.replicas) == 3 and state.isr == state.replicas
    assert "b4" in state.replicas  # among equally loaded members the one added last stays
    assert reason.startswith("replica moving: dropped")


def test_the_leader_and_the_members_the_isr_needs_are_never_dropped() -> None:
    live = {"b1", "b2", "b3", "b4"}
    # b1 leads and holds most: another replica goes
    states = {
        0: PartitionState(0, "b1", 0, ("b1", "b2", "b3", "b4"), ("b1", "b2", "b3", "b4")),
        1: PartitionState(1, "b1", 0, ("b1", "b2"), ("b1", "b2")),
    }
    state, _ = shrink_replicas(states, live, 3)[0]
    assert state.leader == "b1" and "b1" in state.replicas
    # the in-sync set would fall to min_insync_replicas' limit: nothing is dropped
    assert shrink_replicas(states, live, 3, min_insync_replicas=4) == {}
    # a dead leader: no drop until it is replaced
    assert shrink_replicas(states, {"b2", "b3", "b4"}, 3) == {}


def test_replicas_move_from_the_most_loaded_member() -> None:
    states = {
        p: PartitionState(
            p, "b1", 0, ("b1", "b2") if p < 4 else ("b1", "b3"), ("b1", "b2") if p < 4 else ("b1", "b3")
        )
        for p in range(6)
    }
    live = {"b1", "b2", "b3", "b4"}
    moved = reassign_replicas(states, live, 2, moves_at_once=1)
    assert len(moved) == 1
    ((partition, (state, reason)),) = moved.items()
    assert partition == 0 and state.replicas == ("b1", "b2", "b4")
    assert "from b1" in reason
    with pytest.raises(ValueError, match="moves_at_once"):
        reassign_replicas(states, live, 2, moves_at_once=0)


@given(
    st.integers(1, 24),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 3),
)
def test_replica_counts_converge_within_one_of_the_fair_share(
    partitions: int, rf: int, before: int, joining: int
) -> None:
    members = {f"b{i}" for i in range(before)}
    live = members | {f"n{i}" for i in range(joining)}
    states = by_partition(initial_states(range(partitions), members, rf))
    settled, _ = settle(states, live, rf)
    target = min(rf, len(live))
    counts = replica_counts(settled.values(), live)
    fair = partitions * target / len(live)
    assert all(abs(count - fair) < 1 for count in counts.values()), counts
    for state in settled.values():
        assert len([n for n in state.replicas if n in live]) == target
        assert state.leader in state.isr


def test_a_leader_holding_the_most_copies_hands_its_leadership_over_before_its_copy_is_dropped() -> None:
    # b holds one copy more than c and d and leads partition 0, which d was added to: dropping c's copy
    # instead would only swap c's and d's counts, and the move would start again, for ever
    live = {"a", "b", "c", "d"}
    states = {
        0: PartitionState(0, "b", 1, ("b", "c", "d"), ("b", "c", "d")),
        1: PartitionState(1, "b", 1, ("b", "a"), ("b", "a")),
        2: PartitionState(2, "c", 1, ("c", "a"), ("c", "a")),
        3: PartitionState(3, "a", 1, ("a", "b"), ("a", "b")),
        4: PartitionState(4, "d", 1, ("d", "a"), ("d", "a")),
        5: PartitionState(5, "c", 1, ("c", "b"), ("c", "b")),
    }
    ends = {node: {0: 7} for node in live}
    first = {change.partition: change for change in plan(states, live, 2, ends, min_insync_replicas=2)}
    handed = first[0].after
    assert handed.leader in ("c", "d") and handed.epoch == 2  # an orderly leader change, next epoch
    assert handed.replicas == states[0].replicas and handed.isr == states[0].isr  # nothing dropped yet
    assert first[0].reassigns and not first[0].spreads
    after = apply(states, list(first.values()))
    second = {change.partition: change for change in plan(after, live, 2, ends, min_insync_replicas=2)}
    assert set(second[0].after.replicas) == {"c", "d"} and second[0].after.leader == handed.leader
    settled, passes = settle(apply(after, list(second.values())), live, 2)
    assert passes < 10
    assert sorted(replica_counts(settled.values(), live).values()) == [3, 3, 3, 4]  # 13 copies


def test_leadership_is_not_handed_to_a_copy_behind_the_leader_nor_back_to_the_copy_being_dropped() -> None:
    live = {"a", "b", "c", "d"}
    states = {
        0: PartitionState(0, "b", 1, ("b", "c", "d"), ("b", "c", "d")),
        1: PartitionState(1, "a", 1, ("b", "a"), ("b", "a")),
        2: PartitionState(2, "c", 1, ("c", "a"), ("c", "a")),
        3: PartitionState(3, "a", 1, ("a", "b"), ("a", "b")),
    }
    behind = {"b": {0: 7}, "c": {0: 5}, "d": {0: 6}}
    assert shrink_replicas(states, live, 2, 2, log_ends=behind) == {}  # both behind b: b keeps leading
    # handed to c, partition 0's leadership may spread (a and c lead two, b and d none), but never back to
    # b, whose copy goes next
    handed = {**states, 0: PartitionState(0, "c", 2, ("b", "c", "d"), ("b", "c", "d"))}
    spread = balance_leaders(handed, live, None, (), 2, 2)
    assert all(state.leader != "b" for p, (state, _) in spread.items() if p == 0)
    assert shrink_replicas(handed, live, 2, 2)[0][0].replicas == ("c", "d")


def test_the_oscillating_placement_settles() -> None:
    # every member holds its share except b (one more) and d (one less), and b leads everything it holds
    states = {
        0: PartitionState(0, "b", 1, ("b", "c"), ("b", "c")),
        1: PartitionState(1, "b", 1, ("b", "d"), ("b", "d")),
        2: PartitionState(2, "b", 1, ("b", "c"), ("b", "c")),
    }
    live = {"b", "c", "d"}
    settled, passes = settle(states, live, 2)
    assert passes < 10
    assert sorted(replica_counts(settled.values(), live).values()) == [2, 2, 2]


# -- no copies while offline ----------------------------------------------------------------------------


def test_an_offline_partition_gets_no_new_copies_until_the_pass_after_its_election() -> None:
    """Every replica of partition 0 is dead: no live member is given an empty copy of it (its brokers go on
    observing it); b1 returns and leads it again, and only the next pass fills it up to the factor."""
    states = {0: PartitionState(0, "b1", 3, ("b1", "b2"), ("b1", "b2"))}
    offline = apply(states, plan(states, {"b3", "b4"}, 2))
    assert offline[0].leader is None
    assert offline[0].replicas == ("b1", "b2")
    assert plan(offline, {"b3", "b4"}, 2) == []

    back = plan(offline, {"b1", "b3", "b4"}, 2)
    assert [(c.after.leader, c.after.replicas) for c in back] == [("b1", ("b1", "b2"))]

    filled = plan(apply(offline, back), {"b1", "b3", "b4"}, 2)
    assert [c.after.replicas for c in filled] == [("b1", "b3")]  # b2, dead and out of sync, makes room
    assert filled[0].after.leader == "b1"


def test_a_member_that_has_not_proven_its_node_id_is_given_no_copy_and_no_leadership() -> None:
    # "evil" is registered in etcd (live) but never proved it is "evil": nothing is given to it, however
    # the loads compare; the proven members carry on as if it were not there.
    states = by_partition(initial_states(range(8), ["a", "b", "c"], 3))
    live, proven = {"a", "b", "c", "evil"}, {"a", "b", "c"}
    for _ in range(20):  # passes until nothing changes
        changes = plan(states, live, 3, eligible=proven)
        if not changes:
            break
        states = apply(states, changes)
    assert changes == []
    assert not any("evil" in state.replicas for state in states.values())
    # a leader dies: only proven in-sync replicas are elected, and a copy goes to a proven member only
    dead_a = {n: s for n, s in states.items()}
    changes = plan(dead_a, {"b", "c", "evil"}, 3, eligible={"b", "c"})
    after = apply(dead_a, changes)
    assert all(state.leader in ("b", "c") for state in after.values())
    assert not any("evil" in state.replicas for state in after.values())
    # an unproven in-sync replica does not lead: the partition waits offline for a proven one
    lone = {0: PartitionState(0, "a", 4, ("a", "b"), ("a", "b"))}
    (offline,) = plan(lone, {"b"}, 2, eligible=set())
    assert offline.after.leader is None and offline.after.epoch == 5
