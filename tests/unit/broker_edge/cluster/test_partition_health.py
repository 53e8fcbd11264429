"""The partitions as a member reports them in /metrics: led, under-replicated, below min in-sync, none."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker_edge.cluster.partition_health import PartitionHealth, partition_health, register_partition_metrics
from broker_edge.cluster.view import ClusterView
from broker_edge.observe.metrics import BrokerMetrics
from broker_edge.placement import Member, PartitionState


def member(node: str) -> Member:
    return Member(node, f"127.0.0.1:{ord(node)}", f"http://127.0.0.1:{ord(node)}")


def view_of_a(*states: PartitionState, partitions: int = 6, live: str = "abc") -> ClusterView:
    view = ClusterView("a", partitions, members={node: member(node) for node in live}, fenced=False)
    view.states = {state.partition: state for state in states}
    return view


STATES = (
    PartitionState(0, "a", 1, ("a", "b", "c"), ("a", "b", "c")),  # led here, every copy in sync
    PartitionState(1, "a", 1, ("a", "b", "c"), ("a", "b")),  # led here, one copy behind
    PartitionState(2, "a", 2, ("a", "b", "c"), ("a",)),  # led here, alone in sync
    PartitionState(3, "b", 1, ("b", "c", "a"), ("b",)),  # another's problem: counted by its leader
    PartitionState(4, None, 3, ("c", "a", "b"), ()),  # offline
)


def test_a_leader_counts_its_own_partitions_short_of_copies_and_every_member_counts_the_leaderless():
    # partition 5 has no state yet: no leader known
    assert partition_health(view_of_a(*STATES), 3, 2) == PartitionHealth(
        led=3, under_replicated=2, below_min_insync=1, leaderless=2
    )
    assert partition_health(view_of_a(*STATES), 3, 3).below_min_insync == 2


def test_a_leader_that_is_no_live_member_leaves_its_partitions_leaderless():
    assert partition_health(view_of_a(*STATES, live="ac"), 3, 2).leaderless == 3


def test_a_partition_whose_copies_were_moved_to_fewer_members_than_the_factor_is_under_replicated():
    shrunk = PartitionState(0, "a", 2, ("a", "b"), ("a", "b"))  # c gone, no third member to take its copy
    assert partition_health(view_of_a(shrunk, partitions=1, live="ab"), 3, 2).under_replicated == 1
    assert partition_health(view_of_a(shrunk, partitions=1, live="ab"), 2, 2).under_replicated == 0


def test_a_fenced_member_leads_nothing():
    view = view_of_a(*STATES)
    view.fenced = True
    assert partition_health(view, 3, 2) == PartitionHealth(
        led=0, under_replicated=0, below_min_insync=0, leaderless=2
    )


def test_the_gauges_follow_the_view_at_each_scrape():
    metrics = BrokerMetrics()
    view = view_of_a(*STATES)
    register_partition_metrics(metrics, view, 3, 2)

    def scraped() -> dict[str, float]:
        text = generate_latest(metrics.registry).decode()
        return {
            sample.name.removeprefix("timestone_broker_partitions_"): sample.value
            for family in text_string_to_metric_families(text)
            if family.name.startswith("timestone_broker_partitions_")
            for sample in family.samples
        }

    assert scraped() == {"led": 3, "under_replicated": 2, "below_min_insync": 1, "leaderless": 2}
    view.states[2] = PartitionState(2, "a", 2, ("a", "b", "c"), ("a", "b", "c"))  # copies caught up
    assert scraped() == {"led": 3, "under_replicated": 1, "below_min_insync": 0, "leaderless": 2}


def test_a_scrape_reads_the_partitions_once_for_all_four_gauges():
    class CountedStates(dict):
        reads = 0

        def items(self):
            CountedStates.reads += 1
            return super().items()

    metrics = BrokerMetrics()
    view = view_of_a(*STATES)
    view.states = CountedStates(view.states)
    register_partition_metrics(metrics, view, 3, 2)
    before = CountedStates.reads
    generate_latest(metrics.registry)
    assert CountedStates.reads - before == 1
