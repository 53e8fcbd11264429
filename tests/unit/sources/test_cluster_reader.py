"""A task of a cluster whose every member is gone fails, naming the cluster, its members and the options."""

from __future__ import annotations

import pytest

from broker_edge.offsets_api.discovery import ClusterLayout
from broker_edge.placement import Member, PartitionState
from broker_edge.runtime.launcher import free_port
from sources.cluster_reader import ClusterFetch, ClusterReadError, read_cluster_slices
from sources.offsets_planner import Slice
from sources.slice_reader import FetchSettings


def test_a_task_gives_up_after_its_rounds_over_dead_members() -> None:
    urls = {node: f"http://127.0.0.1:{free_port()}" for node in ("a", "b")}  # nothing listens there
    layout = ClusterLayout(
        "a",
        False,
        1,
        {node: Member(node, "127.0.0.1:1", url) for node, url in urls.items()},
        {0: PartitionState(0, "a", 1, ("a", "b"), ("a", "b"))},
    )
    settings = FetchSettings("plant", urls["a"], None, 1000, 1, 10, 1 << 20, True)
    task = ClusterFetch("plant", layout, "a", (urls["a"],), settings)

    with pytest.raises(ClusterReadError) as caught:
        list(read_cluster_slices(task, [Slice("t", 0, 5)]))

    message = str(caught.value)
    assert "cluster 'plant'" in message and "members that failed: a, b" in message
    assert "fetchRetries" in message


def test_a_checkpoint_of_standalone_brokers_is_not_continued_as_a_clusters() -> None:
    from sources.options import parse_options
    from sources.stream_api import ReadAllAvailable
    from sources.timestone_source import TimestoneStreamReader

    options = {"bootstrapServers": "http://127.0.0.1:1", "topics": "a/+", "clusterName": "plant"}
    reader = TimestoneStreamReader(parse_options(options))
    with pytest.raises(
        ValueError, match=r"offsets of 'edge1', not of the cluster 'plant' \(option clusterName\)"
    ):
        reader.latestOffset({"edge1": {"a/b": 3}}, ReadAllAvailable())


def test_a_continuous_query_waits_for_a_cluster_that_is_down_as_for_a_standalone_broker() -> None:
    """Every member down: the planner keeps the offsets and plans no task (the query carries on and reads
    the cluster when it answers); only records it must read from a cluster it cannot reach fail."""
    from sources.options import parse_options
    from sources.slice_reader import BrokerUnreachableError
    from sources.stream_api import ReadAllAvailable
    from sources.timestone_source import TimestoneStreamReader

    dead = f"http://127.0.0.1:{free_port()}"
    options = {
        "bootstrapServers": dead,
        "topics": "a/+",
        "clusterName": "plant",
        "startingOffsets": "earliest",
        "fetchRetries": "0",
    }
    reader = TimestoneStreamReader(parse_options(options))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end.get("plant", {}) == start.get("plant", {})
    assert reader.partitions(start, end) == []
    reader._cluster = None  # a batch replayed after a restart, with records to read
    with pytest.raises(BrokerUnreachableError, match="broker 'plant'"):
        reader.partitions({"plant": {"a/b": 0}}, {"plant": {"a/b": 3}})
