"""The ``timestone`` source reading a cluster of three broker processes (real etcd), given one member.

- Every member describes the cluster (``GET /v1/cluster``) as etcd records it, so any one is a bootstrap;
  the source's offsets of a new query are keyed by topic and its tasks go to each topic's leader.
- A streaming query given only one member's URL reads every record the devices had acknowledged, once,
  with the cluster's name in the ``broker`` column and its checkpoint keyed by topic.
- A task whose member is killed (SIGKILL), or hangs (SIGSTOP), reads the very same range from another
  replica, byte for byte.
"""

from __future__ import annotations

import json
import signal
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.offsets_api.discovery import ClusterDiscovery
from broker_edge.runtime.launcher import BrokerProcess
from sources.cluster_reader import ClusterFetch, read_cluster_slices
from sources.offsets_planner import DataLossError, Slice
from sources.options import parse_options
from sources.slice_reader import FetchSettings
from sources.stream_api import ReadAllAvailable
from sources.timestone_source import TimestonePartition, TimestoneStreamReader
from tests.e2e.cluster.conftest import EtcdTarget
from tests.e2e.cluster.proof import Device, cluster_state, read_log, wait_settled, wait_until
from tests.e2e.sources.conftest import timestone_spark  # noqa: F401  (the shared session, source registered)

NODES = ("a", "b", "c")


def _start_cluster(cluster_brokers, etcd: EtcdTarget) -> dict[str, BrokerProcess]:
    brokers = {node: cluster_brokers(node) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    return brokers


def _publish(brokers: dict[str, BrokerProcess], devices: int, messages: int) -> list[Device]:
    """``devices`` devices publish QoS 1 through every broker until each has ``messages`` acknowledged."""
    order = [brokers[node] for node in NODES]
    fleet = [Device(f"dev-{n}", f"fleet/dev-{n}", order, start_at=n) for n in range(devices)]
    for device in fleet:
        device.start()
    wait_until(lambda: all(len(d.acked) >= messages for d in fleet), what=f"{messages} PUBACKs per device")
    for device in fleet:
        device.stop()
    wait_until(
        lambda: all(len({len(read_log(b, d.topic)) for b in order}) == 1 for d in fleet),
        what="every replica committed the same records",
    )
    return fleet


def _layout_matches_etcd(url: str, etcd: EtcdTarget) -> bool:
    layout = ClusterDiscovery([url]).discover()
    recorded = cluster_state(etcd)
    return (
        not layout.fenced
        and dict(layout.members) == {node: replace(m, peer=None) for node, m in recorded.members.items()}
        and dict(layout.partitions) == recorded.partitions
        and layout.partition_count == len(recorded.partitions)
    )


def test_discovery_from_any_member_tasks_at_leaders_and_a_dead_members_range_read_elsewhere(
    cluster_brokers, etcd
):
    brokers = _start_cluster(cluster_brokers, etcd)
    for node, broker in brokers.items():
        wait_until(partial(_layout_matches_etcd, broker.offsets_url, etcd), what=f"{node}'s /v1/cluster")
    fleet = _publish(brokers, devices=3, messages=30)
    layout = ClusterDiscovery([brokers["a"].offsets_url]).discover()
    options = {"bootstrapServers": brokers["a"].offsets_url, "topics": "fleet/+", "clusterName": "plant"}
    planner = TimestoneStreamReader(parse_options({**options, "startingOffsets": "time:0"}))
    start = planner.initialOffset()
    listed = {"#ffleet/+": 0}  # every member listed its logs: the filter is named (sources.listed_filters)
    assert start == {"plant": {**listed, **{device.topic: 0 for device in fleet}}}
    end = planner.latestOffset(start, ReadAllAvailable())
    assert end == {"plant": {**listed, **{d.topic: len(read_log(brokers["a"], d.topic)) for d in fleet}}}
    for task in planner.partitions(start, end):
        assert isinstance(task, TimestonePartition)
        for piece in task.plan.slices:
            assert task.plan.broker == layout.partitions[layout.partition_of(piece.topic)].leader
    topic = fleet[0].topic
    leader = layout.leader_of(topic)
    assert leader is not None
    survivor = next(node for node in NODES if node != leader.node_id)
    wanted = read_log(brokers[survivor], topic)
    assert {payload for _, payload in wanted} >= set(fleet[0].acked)

    brokers[leader.node_id].kill()
    settings = FetchSettings("plant", leader.offsets_api, None, 5000, 1, 50, 1 << 20, True)
    fetch = ClusterFetch("plant", layout, leader.node_id, (leader.offsets_api,), settings)
    rows = [
        row
        for batch in read_cluster_slices(fetch, [Slice(topic, 0, len(wanted))])
        for row in batch.to_pylist()
    ]

    assert [(row["offset"], row["payload"]) for row in rows] == wanted
    assert {row["broker"] for row in rows} == {"plant"}

    # A member that hangs (SIGSTOP) is passed over after fetchTimeoutMs; the dead leader refuses at once.
    paused, last = (node for node in NODES if node != leader.node_id)
    other = fleet[1].topic
    wanted = read_log(brokers[last], other)
    brokers[paused].process.send_signal(signal.SIGSTOP)
    try:
        hung = ClusterFetch(
            "plant", layout, paused, (leader.offsets_api,), replace(settings, timeout_ms=1000)
        )
        rows = [
            row
            for batch in read_cluster_slices(hung, [Slice(other, 0, len(wanted))])
            for row in batch.to_pylist()
        ]
    finally:
        brokers[paused].process.send_signal(signal.SIGCONT)
    assert [(row["offset"], row["payload"]) for row in rows] == wanted


@pytest.mark.spark
def test_source_given_one_member_reads_every_acknowledged_record_once(
    timestone_spark: SparkSession,  # noqa: F811
    cluster_brokers,
    etcd,
    tmp_path: Path,
):
    brokers = _start_cluster(cluster_brokers, etcd)
    fleet = _publish(brokers, devices=4, messages=25)
    rows: list[tuple[str, str, int, bytes]] = []

    def collect(frame: DataFrame, _batch_id: int) -> None:
        rows.extend(tuple(row) for row in frame.select("broker", "topic", "offset", "payload").collect())

    checkpoint = tmp_path / "checkpoint"
    query = (
        timestone_spark.readStream.format("timestone")
        .option("bootstrapServers", brokers["c"].offsets_url)
        .option("clusterName", "plant")
        .option("topics", "fleet/+")
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(90)
    assert not query.isActive and query.exception() is None

    assert {broker for broker, *_ in rows} == {"plant"}
    keys = [(topic, offset) for _, topic, offset, _ in rows]
    assert len(keys) == len(set(keys)), "a record read twice"
    for device in fleet:
        read = [payload for _, topic, _, payload in rows if topic == device.topic]
        assert sorted(read) == sorted({payload for _, payload in read_log(brokers["a"], device.topic)})
        assert all(read.count(payload) == 1 for payload in device.acked), f"{device.client_id}: not once"
    logged = [path for path in (checkpoint / "offsets").iterdir() if path.name.isdigit()]
    last = max(logged, key=lambda path: int(path.name))
    offsets = json.loads(last.read_text().splitlines()[-1])
    ends = {d.topic: len(read_log(brokers["b"], d.topic)) for d in fleet}
    assert offsets == {"plant": {"#ffleet/+": 0, **ends}}


def _log_start(broker: BrokerProcess, topic: str) -> int:
    with OffsetsClient(broker.offsets_url) as client:
        return client.log_info(topic).start_offset


def test_a_topic_new_to_the_query_that_lost_its_first_records_on_every_replica_is_data_loss(
    cluster_brokers, etcd
):
    """A topic created after the query listed every member starts at 0; retention (here 1 s for
    ``fleet/trim/+``) removing its first records before they were read is data loss, as standalone."""
    storage = {
        "segment_bytes": 1024,
        "retention_interval_s": 0.5,
        "persist": [{"pattern": "fleet/trim/+", "qos": [1, 2], "retention_ms": 1000}, {"pattern": "#"}],
    }
    brokers = {node: cluster_brokers(node, sections={"storage": storage}) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    fleet = _publish(brokers, devices=1, messages=5)
    options = {"bootstrapServers": brokers["a"].offsets_url, "topics": "fleet/#", "clusterName": "plant"}
    planner = TimestoneStreamReader(parse_options({**options, "startingOffsets": "earliest"}))
    start = json.loads(json.dumps(planner.initialOffset()))
    assert start["plant"]["#ffleet/#"] == 0  # every member listed: the filter is named
    read = json.loads(json.dumps(planner.latestOffset(start, ReadAllAvailable())))
    assert read["plant"][fleet[0].topic] == len(read_log(brokers["a"], fleet[0].topic))

    trim = Device("trim", "fleet/trim/1", [brokers[node] for node in NODES])
    trim.start()
    wait_until(lambda: len(trim.acked) >= 60, what="60 PUBACKs")
    trim.stop()
    wait_until(
        lambda: all(_log_start(broker, "fleet/trim/1") > 0 for broker in brokers.values()),
        what="retention trimmed the new topic on every replica",
    )
    fresh = TimestoneStreamReader(parse_options(options))  # the query restarted
    with pytest.raises(DataLossError, match=r"'plant' topic 'fleet/trim/1': the log appeared"):
        fresh.latestOffset(read, ReadAllAvailable())
    skipping = TimestoneStreamReader(parse_options({**options, "failOnDataLoss": "false"}))
    end = json.loads(json.dumps(skipping.latestOffset(read, ReadAllAvailable())))
    tasks = skipping.partitions(read, end)
    partitions = [task for task in tasks if isinstance(task, TimestonePartition)]
    assert len(partitions) == len(tasks)
    pieces = [piece for task in partitions for piece in task.plan.slices]
    assert [piece.topic for piece in pieces] == ["fleet/trim/1"] and pieces[0].start > 0
