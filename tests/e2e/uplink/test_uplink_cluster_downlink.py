"""The downlink from a hub that is a cluster of three brokers with one replica a partition: the member a site
is connected to holds no copy of some downlinked topics, and sends them read from their leaders, at the
hub's offsets, byte for byte, before and after the site connected."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.placement import partition_of
from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.cluster_hub_harness import PARTITIONS, hub_cluster, member_store
from tests.e2e.uplink.uplink_harness import log_frames, pki_in, site_section
from tests.harness.local_cluster import ClusterState, EtcdTarget, cluster_state, wait_until

pytestmark = pytest.mark.timeout(120)

SITE = "plant-d"


def groups_led(target: EtcdTarget) -> list[tuple[str, str]]:
    """Two members, each with a downlinked topic (``actions/groups/<n>``) it leads and alone holds, from a
    state read with no copy moving and every partition led by its one replica (the same read: a member that
    missed a lease renewal on a loaded machine has its partitions moved between two reads)."""
    settled: list[ClusterState] = []

    def one_replica_each() -> bool:
        state = cluster_state(target)
        if all(p.leader is not None and p.replicas == (p.leader,) for p in state.partitions.values()):
            settled.append(state)
        return bool(settled)

    wait_until(one_replica_each, what="one replica per partition, its leader")
    state = settled[0]
    found: dict[str, str] = {}
    for n in range(1000):
        topic = f"actions/groups/line-{n}"
        leader = state.partitions[partition_of(topic, PARTITIONS)].leader
        assert leader is not None
        found.setdefault(leader, topic)
        if len(found) == 2:
            return sorted(found.items())
    raise AssertionError(f"no two members lead a topic: {found}")


def test_a_member_with_no_copy_of_a_downlinked_topic_sends_it_from_its_leader(
    brokers: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    pki = pki_in(tmp_path)
    etcd, target, ports, hubs = hub_cluster(tmp_path, pki, replication_factor=1, min_insync_replicas=1)
    try:
        # the connected member holds ``local`` and no copy of ``remote``, held by the ``elsewhere`` member
        (connected, local), (elsewhere, remote) = groups_led(target)
        publisher = PahoClient(hubs[connected].port)  # published through the connected member (forwarded)
        for n in range(3):
            publisher.publish(remote, f"remote {n}".encode(), qos=1)
            publisher.publish(local, f"local {n}".encode(), qos=1)
        site = brokers("site", uplink=site_section(pki, SITE, ports[connected]))
        store = site.broker.store
        assert store is not None

        def held(topic: str, count: int) -> bool:
            return site.call(lambda: topic in store and store.durable_end(topic) == count)

        assert wait_for(lambda: held(remote, 3) and held(local, 3), timeout=30)
        for n in range(3, 6):  # live, while the site is connected
            publisher.publish(remote, f"remote {n}".encode(), qos=1)
        assert wait_for(lambda: held(remote, 6), timeout=30)
        on_site = site.call(lambda: {topic: log_frames(store, topic) for topic in (remote, local)})
        records = site.call(lambda: [r.payload for r in store.read(remote, 0, 100, 1 << 20)])
        publisher.disconnect()
        for hub in hubs.values():
            hub.stop()
    finally:
        for hub in hubs.values():
            hub.kill()
        etcd.kill()

    assert records == [f"remote {n}".encode() for n in range(6)]
    with member_store(tmp_path, connected) as store_here:
        assert remote not in store_here  # the connected member never held a copy of it
        assert log_frames(store_here, local) == on_site[local]
    with member_store(tmp_path, elsewhere) as leader_store:
        assert log_frames(leader_store, remote) == on_site[remote]  # the hub's offsets, byte for byte
