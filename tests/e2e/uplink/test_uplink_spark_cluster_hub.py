"""The ``timestone`` source reads every site from a hub that is a cluster (three members on etcd, each
partition on two of them), given one member: each site's topics as that site's, at the site's offsets,
each record once, before and after the leader of a site's log is killed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from broker_edge.placement import partition_of
from broker_edge.runtime.local_pki import LocalPki
from broker_edge.settings.uplink import site_topic
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.cluster_hub_harness import NODES, PARTITIONS, hub_cluster, hub_url
from tests.e2e.uplink.spark_reads import Row, read_sites
from tests.e2e.uplink.uplink_harness import pki_in, site_section
from tests.harness.local_cluster import EtcdTarget, cluster_state

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

TOPICS = ("plant/line-1/temp", "plant/line-2/temp")


def start_site(
    brokers: Callable[..., RunningBroker], pki: LocalPki, ports: dict[str, int], site_id: str
) -> RunningBroker:
    uplink = site_section(pki, site_id, ports[NODES[0]])
    uplink["hubs"] = [hub_url(ports[node]) for node in NODES]
    return brokers(site_id, uplink=uplink)


def publish(site: RunningBroker, site_id: str, first: int, count: int) -> None:
    """``count`` records on each of TOPICS, then wait until the hub acknowledged them (replicated)."""

    def send() -> None:
        for n in range(first, first + count):
            for topic in TOPICS:
                site.broker.publish(topic, f"{site_id} {topic} {n}".encode(), qos=1)

    site.call(send)
    link = site.broker.site_link
    assert link is not None
    assert wait_for(
        lambda: site.call(
            lambda: (
                link.connected
                and link.unsent.lag()[0] == 0
                and all(link.hub_ends.get(topic) == first + count for topic in TOPICS)
            )
        ),
        timeout=60,
    )


def rows_of(site_id: str, offsets: range) -> list[Row]:
    return sorted((site_id, topic, n, f"{site_id} {topic} {n}".encode()) for topic in TOPICS for n in offsets)


def read_hub(spark: SparkSession, member_url: str, checkpoint: Path) -> list[Row]:
    options = {"bootstrapServers": member_url, "clusterName": "hub", "fetchTimeoutMs": "5000"}
    return read_sites(spark, checkpoint, options)


def leader_of(target: EtcdTarget, topic: str) -> str | None:
    return cluster_state(target).partitions[partition_of(topic, PARTITIONS)].leader


def test_the_source_reads_every_site_from_a_cluster_hub_once_across_a_leader_change(
    timestone_spark: SparkSession, brokers: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    pki = pki_in(tmp_path)
    etcd, target, ports, hubs = hub_cluster(tmp_path, pki, replication_factor=2, min_insync_replicas=1)
    try:
        sites = {site_id: start_site(brokers, pki, ports, site_id) for site_id in ("plant-a", "plant-b")}
        for site_id, site in sites.items():
            publish(site, site_id, 0, 5)
        # Some member holds no copy of a site's log: the source reads it from the members that do. A member
        # that registered late makes the controller even out the replicas, through factor + 1 copies of a
        # partition for a while: wait until the placement is back at the factor.
        hub_topic = site_topic("plant-a", TOPICS[0])

        def copies() -> int:
            return len(cluster_state(target).partitions[partition_of(hub_topic, PARTITIONS)].replicas)

        assert wait_for(lambda: copies() == 2, timeout=30), copies()
        victim = leader_of(target, hub_topic)
        assert victim is not None
        survivor = next(node for node in NODES if node != victim)
        checkpoint = tmp_path / "checkpoint"

        first = read_hub(timestone_spark, hubs[victim].offsets_url, checkpoint)
        assert first == rows_of("plant-a", range(5)) + rows_of("plant-b", range(5))

        hubs[victim].kill()  # the leader of plant-a's first log: another replica takes it over
        assert wait_for(lambda: leader_of(target, hub_topic) not in (None, victim), timeout=30)
        for site_id, site in sites.items():
            publish(site, site_id, 5, 5)

        second = read_hub(timestone_spark, hubs[survivor].offsets_url, checkpoint)
        assert second == rows_of("plant-a", range(5, 10)) + rows_of("plant-b", range(5, 10))
    finally:
        for hub in hubs.values():
            hub.kill()
        etcd.kill()
