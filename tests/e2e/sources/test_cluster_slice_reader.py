"""A task reading a cluster's replicas when one is behind: real offsets APIs on 127.0.0.1, no Spark.

Two stores play a partition's replicas; one of them has committed fewer records. A replica behind a slice
is long-polled, then passed over for one that holds the range; when none ever does, the task fails naming
the topic and where it stood. (A cluster's replicas hold the same bytes at the same offsets; here the ahead
replica's records past the other's end differ on purpose, so each row tells which replica served it.)
"""

from __future__ import annotations

import threading

import pytest

from broker_edge.offsets_api.discovery import ClusterDiscovery, ClusterLayout, ClusterUnreachableError
from broker_edge.placement import Member, PartitionState
from sources.cluster_reader import ClusterFetch, ClusterReadError, read_cluster_slices
from sources.offsets_planner import Slice
from sources.slice_reader import FetchSettings
from tests.e2e.sources.conftest import EdgeBroker

TOPIC = "plant/1/temp"


def task(replicas: dict[str, EdgeBroker], preferred: str, timeout_ms: int, retries: int = 1) -> ClusterFetch:
    """A task of a one-partition cluster of ``replicas`` (node id -> store), led by the first."""
    nodes = tuple(replicas)
    layout = ClusterLayout(
        nodes[0],
        False,
        1,
        {node: Member(node, "127.0.0.1:1", broker.url) for node, broker in replicas.items()},
        {0: PartitionState(0, nodes[0], 1, nodes, nodes)},
    )
    settings = FetchSettings("plant", replicas[preferred].url, None, timeout_ms, retries, 10, 1 << 20, True)
    return ClusterFetch("plant", layout, preferred, (replicas[preferred].url,), settings)


def read(fetch: ClusterFetch, end: int) -> list[tuple[int, bytes]]:
    batches = read_cluster_slices(fetch, [Slice(TOPIC, 0, end)])
    return [(row["offset"], row["payload"]) for batch in batches for row in batch.to_pylist()]


def payloads(first: int, count: int) -> list[bytes]:
    return [f'{{"n":{n}}}'.encode() for n in range(first, first + count)]


def ahead(broker: EdgeBroker) -> None:
    """Ten records, then ten more marked as this replica's (n = 100...)."""
    broker.fill(TOPIC, 10)
    broker.fill(TOPIC, 10, first=100)


def test_a_replica_a_moment_behind_is_waited_for(edge: EdgeBroker, second_edge: EdgeBroker) -> None:
    edge.fill(TOPIC, 10)
    ahead(second_edge)
    catch_up = threading.Timer(0.3, lambda: edge.fill(TOPIC, 10, first=10))
    catch_up.start()
    try:
        rows = read(task({"a": edge, "b": second_edge}, "a", timeout_ms=10_000), 20)
    finally:
        catch_up.join()
    assert rows == list(enumerate(payloads(0, 20)))  # all from a, which caught up


def test_a_replica_that_stays_behind_is_passed_over(edge: EdgeBroker, second_edge: EdgeBroker) -> None:
    edge.fill(TOPIC, 10)
    ahead(second_edge)
    rows = read(task({"a": edge, "b": second_edge}, "a", timeout_ms=500), 20)
    assert rows == list(enumerate(payloads(0, 10) + payloads(100, 10)))  # the rest from b


def test_a_range_no_replica_ever_commits_fails_naming_topic_and_offset(
    edge: EdgeBroker, second_edge: EdgeBroker
) -> None:
    edge.fill(TOPIC, 10)
    second_edge.fill(TOPIC, 10)
    with pytest.raises(ClusterReadError, match=r"served topic 'plant/1/temp' from offset 10"):
        read(task({"a": edge, "b": second_edge}, "b", timeout_ms=200, retries=0), 20)


def test_discovery_from_a_standalone_broker_says_it_is_not_a_cluster_member(edge: EdgeBroker) -> None:
    with pytest.raises(ClusterUnreachableError, match="not a cluster member"):
        ClusterDiscovery([edge.url]).discover()
