"""Failover loses nothing: a leader dies (kill -9) or loses etcd while four devices publish QoS 1 through
every broker; devices move to the survivors; every PUBACKed message is then readable from every survivor
exactly once, in the order it was acknowledged to its publisher, at the same offset on each.

Devices never resend (each message is new), so "exactly once" is checked strictly: an acknowledged payload
appears once in its topic's log, and the acknowledged payloads of a device appear in acknowledgement order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from broker_edge.placement import partition_of
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.cluster.conftest import EtcdTarget, cluster_broker
from tests.e2e.cluster.proof import (
    Device,
    EtcdProxy,
    check_nothing_acknowledged_was_lost,
    cluster_state,
    started,
    wait_settled,
    wait_until,
)

NODES = ("a", "b", "c")
DEVICES = 4
PUBLISH_S = 2.0


def _topics_led_by(target: EtcdTarget, leader: str, count: int) -> list[str]:
    """``count`` device topics: the first and the third led by ``leader``, the others by other brokers."""
    state = cluster_state(target)
    partitions = len(state.partitions)
    candidates = [f"fleet/dev-{n}" for n in range(1000)]
    led = [t for t in candidates if state.partitions[partition_of(t, partitions)].leader == leader]
    others = [t for t in candidates if t not in led]
    return [led[0], others[0], led[1], *others[1 : count - 2]]


def _run_failover(
    brokers: dict[str, BrokerProcess],
    target: EtcdTarget,
    victim: str,
    fail: Callable[[], None],
    moved: Callable[[list[Device]], bool] = lambda _devices: True,
) -> tuple[list[Device], float]:
    """Four devices publish through all brokers; ``fail()`` takes ``victim`` down mid-way; they publish on
    until ``moved(devices)``. Returns the devices and the seconds from the failure to the first
    acknowledgement of a publish on the victim's partition."""
    order = [brokers[node] for node in NODES]
    wait_until(  # leadership spreads a few partitions at a time: the victim may lead none yet
        lambda: cluster_state(target).leaders().get(victim, 0) >= 2,
        30,
        f"{victim} leading two partitions",
        lambda: cluster_state(target),
    )
    topics = _topics_led_by(target, victim, DEVICES)
    devices = [Device(f"device-{n}", topic, order, start_at=n) for n, topic in enumerate(topics)]
    for device in devices:
        device.start()
    time.sleep(PUBLISH_S)
    acked_before = len(devices[0].acked)
    assert acked_before > 0
    failed_at = time.monotonic()
    fail()
    survivors = [brokers[node] for node in NODES if node != victim]
    wait_until(
        lambda: len(devices[0].acked) > acked_before + 20,
        what="publishes acknowledged again",
        state=lambda: (
            [(d.client_id, len(d.acked), d.refused, d.moves) for d in devices],
            cluster_state(target),
        ),
    )
    recovered = next(t for t in devices[0].ack_times if t > failed_at) - failed_at
    time.sleep(PUBLISH_S)
    wait_until(lambda: moved(devices), 30, "devices moved")
    for device in devices:
        device.stop()
    check_nothing_acknowledged_was_lost(devices, survivors)
    return devices, recovered


def test_kill_9_of_a_leader_loses_no_acknowledged_message(cluster_brokers, etcd):
    brokers = {node: cluster_brokers(node, replica_lag_max_ms=2000) for node in NODES}
    wait_settled(etcd, set(NODES), 3)

    devices, recovered = _run_failover(brokers, etcd, "b", brokers["b"].kill)

    assert sum(device.moves for device in devices) >= 1  # somebody was connected to the dead broker
    wait_settled(etcd, {"a", "c"}, 2)
    assert recovered < 15


def test_a_leader_that_loses_etcd_stops_acknowledging_and_loses_nothing(tmp_path, etcd):
    proxy = EtcdProxy(etcd.url)
    brokers: dict[str, BrokerProcess] = {}
    try:
        for node in NODES:
            urls = [proxy.url] if node == "b" else [etcd.url]
            section = {"etcd": urls, "replica_lag_max_ms": 2000}
            brokers[node] = started(partial(cluster_broker, tmp_path, etcd, node, section))
        wait_settled(etcd, set(NODES), 3)

        # device-1 started on b: b sends it away once it has been fenced for fenced_clients_hold_ms
        devices, recovered = _run_failover(brokers, etcd, "b", proxy.cut, lambda d: d[1].moves >= 1)

        assert brokers["b"].process is not None and brokers["b"].process.poll() is None  # it still runs
        assert devices[1].moves >= 1
        state = cluster_state(etcd)
        assert "b" not in state.members
        assert all(p.leader in ("a", "c") for p in state.partitions.values())
        assert recovered < 15
    finally:
        proxy.close()
        for broker in brokers.values():
            broker.stop()


def test_a_member_cut_from_etcd_past_its_lease_leads_its_partitions_again_once_back(tmp_path, etcd):
    """Replication factor 1: a member cut off from etcd for longer than its lease, its peer links up all
    along, registers again as it was; the partitions it holds the only copy of, offline meanwhile, are led
    by it again. The controller had dropped its proof with its record and took it for a member that never
    proved who it is (no new link came up to prove it again): they stayed offline until it restarted."""
    proxy = EtcdProxy(etcd.url)
    brokers: dict[str, BrokerProcess] = {}
    try:
        for node in ("a", "b"):
            section: dict[str, object] = {"replication_factor": 1, "min_insync_replicas": 1}
            if node == "a":
                section["etcd"] = [proxy.url]
            brokers[node] = started(partial(cluster_broker, tmp_path, etcd, node, section))
        wait_settled(etcd, {"a", "b"}, 1)
        wait_until(lambda: cluster_state(etcd).leaders().get("a", 0) > 0, what="a leading partitions")
        proxy.cut()
        wait_until(
            lambda: (
                "a" not in cluster_state(etcd).members
                and any(p.leader is None for p in cluster_state(etcd).partitions.values())
            ),
            what="a's lease ended and its partitions offline",
        )
        proxy.mend()
        wait_settled(etcd, {"a", "b"}, 1, 60, brokers)
    finally:
        proxy.close()
        for broker in brokers.values():
            broker.stop()
