"""A hub that is a cluster, for the uplink tests: etcd and three members on free ports, each taking sites."""

from __future__ import annotations

from pathlib import Path

from broker_edge.runtime.launcher import BrokerProcess, free_port
from broker_edge.runtime.local_pki import LocalPki
from broker_edge.storage import LogStore, StorageConfig
from tests.e2e.uplink.uplink_harness import hub_section
from tests.harness.local_cluster import (
    EtcdServer,
    EtcdTarget,
    cluster_broker,
    cluster_state,
    wait_settled,
    wait_until,
)

NODES = ("h1", "h2", "h3")
PARTITIONS = 16


def hub_cluster(
    tmp_path: Path, pki: LocalPki, replication_factor: int = 3, min_insync_replicas: int = 2
) -> tuple[EtcdServer, EtcdTarget, dict[str, int], dict[str, BrokerProcess]]:
    """etcd and the hub's members, started and settled (every partition with ``replication_factor`` replicas,
    all in sync), each with its ``uplink_hub`` port; the caller kills them."""
    etcd = EtcdServer(tmp_path / "etcd").start()
    target = EtcdTarget(etcd, "/timestone")
    ports = {node: free_port() for node in NODES}
    cluster = {
        "lease_ttl_s": 2,
        "replication_factor": replication_factor,
        "min_insync_replicas": min_insync_replicas,
    }
    hubs = {
        node: cluster_broker(tmp_path, target, node, cluster, uplink_hub=hub_section(pki, port=ports[node]))
        for node in NODES
    }
    try:
        for hub in hubs.values():
            hub.start()
        wait_settled(target, set(NODES), replication_factor, processes=hubs)
        wait_until(  # copies moved while members joined are dropped from the old replicas
            lambda: all(
                len(state.replicas) == replication_factor
                for state in cluster_state(target).partitions.values()
            ),
            what=f"{replication_factor} replicas per partition",
        )
    except BaseException:
        for hub in hubs.values():
            hub.kill()
        etcd.kill()
        raise
    return etcd, target, ports, hubs


def hub_url(port: int) -> str:
    return f"wss://127.0.0.1:{port}/v1/uplink"


def member_store(tmp_path: Path, node: str) -> LogStore:
    """A stopped member's store, opened as the member lays it out (a storage partition per cluster one)."""
    return LogStore(tmp_path / node / "data", StorageConfig(partitions=PARTITIONS))
