"""Reading a cluster without Spark or network: the layout a member serves, discovery order, routing, lag.

The layout is built by the server's own ``layout_document`` from a ``ClusterView`` and read back by the
client's ``parse_layout``, so the two sides of ``GET /v1/cluster`` are checked against each other.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from broker_edge.cluster.cluster_info import layout_document
from broker_edge.cluster.view import ClusterView
from broker_edge.offsets_api.discovery import ClusterDiscovery, ClusterLayout, parse_layout
from broker_edge.offsets_api.errors import OffsetOutOfRangeError, UnknownTopicError
from broker_edge.offsets_api.results import BatchFetch, TopicResult
from broker_edge.placement import Member, PartitionState, partition_of
from sources.cluster_plan import by_reader, readers_for, route_topics
from sources.offsets_planner import DataLossError, LogExtent, Slice, plan_end_offsets
from sources.slice_reader import FetchSettings, SliceProgress, take_answer

PARTITIONS = 4


def member(node: str) -> Member:
    return Member(node, f"127.0.0.1:{1880 + ord(node[0])}", f"http://{node}.local:9884")


def view(members: str = "abc", fenced: bool = False) -> ClusterView:
    """Partition p led by members[p % 3], replicas in the order leader, next, next."""
    cluster = ClusterView("a", PARTITIONS, fenced=fenced)
    cluster.members = {node: member(node) for node in members}
    for p in range(PARTITIONS):
        replicas = tuple("abc"[(p + i) % 3] for i in range(3))
        cluster.states[p] = PartitionState(p, replicas[0], p + 1, replicas, replicas[:2])
    return cluster


def layout(members: str = "abc") -> ClusterLayout:
    return parse_layout(layout_document(view(members)))


def topic_in(partition: int) -> str:
    return next(
        t for t in (f"plant/{n}/temp" for n in range(1000)) if partition_of(t, PARTITIONS) == partition
    )


def test_the_layout_a_member_serves_reads_back_as_its_view() -> None:
    served = layout_document(view(fenced=True))
    read = parse_layout(served)
    assert read.answered_by == "a" and read.fenced and read.partition_count == PARTITIONS
    assert dict(read.members) == view().members
    assert dict(read.partitions) == view().states
    topic = topic_in(1)
    assert read.partition_of(topic) == 1 and read.leader_of(topic) == member("b")


@pytest.mark.parametrize("document", [{}, {"node_id": "a"}, {**layout_document(view()), "partitions": [{}]}])
def test_what_is_not_a_layout_is_refused(document: dict) -> None:
    with pytest.raises(ValueError, match="not a cluster layout"):
        parse_layout(document)


def test_readers_are_the_leader_then_in_sync_then_other_replicas_all_alive() -> None:
    topic = topic_in(1)  # led by b, replicas b c a, in sync b c
    assert layout().readers_of(topic) == ("b", "c", "a")
    assert layout("ac").readers_of(topic) == ("c", "a")  # b is no longer a member
    assert readers_for(layout(), topic, preferred="a") == ("a", "b", "c")
    assert readers_for(layout(), topic, preferred="z") == ("b", "c", "a")


def test_a_topic_is_routed_to_the_replica_with_the_longest_committed_log() -> None:
    lead, other = topic_in(0), topic_in(1)  # led by a, and by b
    listings = {
        "a": {lead: LogExtent(0, 10), other: LogExtent(0, 7)},
        "c": {lead: LogExtent(0, 9), other: LogExtent(2, 8)},  # b is down: c is ahead of a on `other`
    }
    routes = route_topics(layout(), listings)
    assert routes[lead].extent == LogExtent(0, 10) and routes[lead].readers == ("a", "b", "c")
    assert routes[other].extent == LogExtent(2, 8) and routes[other].readers == ("c", "b", "a")
    unlisted = topic_in(2)  # led by c, listed by nobody: its leader
    grouped = by_reader({lead: 4, other: 5, unlisted: 1}, routes, layout())
    assert grouped == {"a": {lead: 4}, "c": {other: 5, unlisted: 1}}


def test_a_listing_from_a_member_without_a_copy_is_ignored() -> None:
    cluster = view()
    cluster.states[0] = PartitionState(0, "a", 1, ("a", "b"), ("a", "b"))  # c's copy moved away
    topic = topic_in(0)
    routes = route_topics(parse_layout(layout_document(cluster)), {"c": {topic: LogExtent(0, 99)}})
    assert topic not in routes


def test_discovery_asks_known_members_first_then_the_bootstrap_list() -> None:
    discovery = ClusterDiscovery(["http://seed:9884/", "http://b.local:9884"])
    assert discovery.candidates() == ["http://seed:9884", "http://b.local:9884"]
    discovery.layout = layout("bc")
    assert discovery.candidates() == ["http://b.local:9884", "http://c.local:9884", "http://seed:9884"]
    assert discovery.candidates(avoid={"http://b.local:9884"}) == ["http://c.local:9884", "http://seed:9884"]
    with pytest.raises(ValueError):
        ClusterDiscovery([])


def test_a_replica_behind_the_checkpoint_is_lag_not_data_loss() -> None:
    listings = {"plant": {"t": LogExtent(0, 80)}}  # a new leader that has not committed 100 yet
    with pytest.raises(DataLossError):
        plan_end_offsets({"plant": {"t": 100}}, listings, max_records=None, fail_on_data_loss=True)
    end = plan_end_offsets(
        {"plant": {"t": 100}}, listings, max_records=None, fail_on_data_loss=True, end_may_lag=True
    )
    assert end == {"plant": {"t": 100}}


SETTINGS = FetchSettings("b", "http://b.local:9884", None, 1000, 0, 10, 1 << 20, True)


def answer(**results: TopicResult) -> BatchFetch:
    return BatchFetch(pa.table({"topic": pa.array([], pa.string())}), dict(results))


@pytest.mark.parametrize(
    "result",
    [
        TopicResult("t", 10, 0, 10, 0, None),  # committed up to 10 only
        TopicResult("t", None, None, None, 0, UnknownTopicError(404, "unknown_topic", "no log", "t")),
        TopicResult(
            "t", None, None, None, 0, OffsetOutOfRangeError(416, "offset_out_of_range", "", "t", 12, 0, 10)
        ),
    ],
    ids=["ends-before", "no-log-yet", "offset-past-end"],
)
def test_a_replica_that_has_not_committed_a_slice_yet_is_lagging_on_a_cluster_and_loss_alone(
    result: TopicResult,
) -> None:
    offset = result.error.offset if isinstance(result.error, OffsetOutOfRangeError) else 10
    pending = {"t": SliceProgress(Slice("t", offset, 20), offset)}
    taken = take_answer(SETTINGS, pending, {"t": offset}, answer(t=result), lag_is_loss=False)
    assert taken.lagging == ["t"] and pending["t"].offset == offset and taken.batch is None
    with pytest.raises(DataLossError):
        take_answer(SETTINGS, pending, {"t": offset}, answer(t=result))


def test_records_below_a_replicas_log_start_are_data_loss_on_a_cluster_too() -> None:
    error = OffsetOutOfRangeError(416, "offset_out_of_range", "", "t", 3, 5, 10)
    pending = {"t": SliceProgress(Slice("t", 3, 8), 3)}
    with pytest.raises(DataLossError, match="retention"):
        take_answer(SETTINGS, pending, {"t": 3}, answer(t=TopicResult("t", None, 5, 10, 0, error)), False)
