"""The cluster's shared types: a stable partition hash, JSON round trips and the node's view."""

from __future__ import annotations

from broker_edge.cluster.view import ClusterView
from broker_edge.placement import Member, PartitionState, partition_of


def test_partition_of_is_stable_across_processes_and_in_range() -> None:
    # CRC32C of the UTF-8 bytes, not Python's salted hash(): every broker computes the same partition.
    # A changed function would move every topic to another partition of an existing cluster.
    assert partition_of("devices/d1/telemetry", 16) == 3707278623 % 16
    values = {partition_of(f"devices/d{i}/telemetry", 16) for i in range(1000)}
    assert values == set(range(16))
    assert partition_of("ä/topic", 7) == partition_of("ä/topic", 7)


def test_partition_state_and_member_round_trip_through_json() -> None:
    state = PartitionState(3, "b2", 7, ("b1", "b2", "b3"), ("b2", "b3"))
    assert PartitionState.from_json(state.to_json()) == state
    offline = PartitionState(0, None, 2, ("b1",), ())
    assert PartitionState.from_json(offline.to_json()) == offline
    member = Member("b1", "127.0.0.1:1883", "http://127.0.0.1:9884")
    assert Member.from_json(member.to_json()) == member


def test_view_leads_only_when_leader_and_not_fenced() -> None:
    view = ClusterView("b1", 4)
    view.members["b1"] = Member("b1", "127.0.0.1:1", "http://127.0.0.1:2")
    view.states[1] = PartitionState(1, "b1", 1, ("b1", "b2"), ("b1", "b2"))
    assert not view.leads(1)  # fenced until the lease is proven alive
    view.fenced = False
    assert view.leads(1)
    assert not view.leads(2)
    assert view.leader_of(1) == view.members["b1"]
    seen: list[int] = []
    view.on_change(lambda: seen.append(1))
    view.changed()
    assert seen == [1]
