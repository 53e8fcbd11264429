"""A partition whose every replica died, then came back: three broker processes, replication factor 1 (one
death takes a partition offline at once), a real etcd, real clients.

While the partition is offline no live broker is given an empty copy of it: the brokers whose subscribers
want it go on observing it. A device that subscribes there from an offset meanwhile is read from that offset
once the replica returns; subscribers that were there before, or came meanwhile without an offset, get only
what is published after the return, never the records from before their SUBSCRIBE. (A copy given to an
observer right after the partition is led again is covered in process by
``tests/unit/broker_edge/cluster/test_new_copies.py``.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from functools import partial

import pytest

from broker_edge.placement import partition_of
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, close_all
from tests.e2e.cluster.proof import cluster_state, copies_spread, metric, wait_settled, wait_until
from tests.e2e.cluster.test_device_offsets import device_from, numbered
from tests.harness.local_cluster import EtcdServer, EtcdTarget, cluster_broker

NODES = ("a", "b", "c")
PARTITIONS = 16


@pytest.fixture
def rf1(tmp_path, etcd_server: EtcdServer) -> Iterator[tuple[dict[str, BrokerProcess], EtcdTarget]]:
    target = EtcdTarget(etcd_server, f"/offline-{os.getpid()}-{tmp_path.name}")
    brokers: dict[str, BrokerProcess] = {}
    try:
        for node in NODES:
            section = {"replication_factor": 1, "min_insync_replicas": 1}
            brokers[node] = cluster_broker(tmp_path, target, node, section)
            brokers[node].start()
        wait_settled(target, set(NODES), 1, 60)
        wait_until(
            lambda: copies_spread(target, NODES, PARTITIONS, replicas=1),
            90,
            "copies spread over a, b, c",
            lambda: cluster_state(target),
        )
        yield brokers, target
    finally:
        close_all()
        for broker in brokers.values():
            broker.stop()


def _payloads(messages: list) -> list[bytes]:
    return [message.payload for message in messages]


def _left(client: PahoClient) -> list[bytes]:
    """What ``client`` was sent that the test has not taken yet."""
    left = []
    while not client.messages.empty():
        left.append(client.messages.get_nowait().payload)
    return left


def _offline(etcd: EtcdTarget) -> int:
    return sum(state.leader is None for state in cluster_state(etcd).partitions.values())


def _leaderless_shown(broker: BrokerProcess, etcd: EtcdTarget) -> bool:
    """The member's ``partitions_leaderless`` gauge agrees with etcd's count of offline partitions."""
    return metric(broker, "timestone_broker_partitions_leaderless") == _offline(etcd)


@pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])
def test_a_partition_back_from_offline_sends_its_past_to_no_subscriber_and_serves_offsets_asked_meanwhile(
    rf1, version
):
    """Ten records on a topic whose one copy is on `holder`; a subscriber on `observer`; `holder` is killed
    (SIGKILL). Meanwhile a device subscribes on `observer` from offset 4, and a subscriber on `other`, which
    had not observed the partition. `holder` comes back: the device gets 4-9, once, in order; no subscriber
    gets anything of 0-9; then a new record reaches all of them once."""
    brokers, etcd = rf1
    topic = f"offline/{version}"
    number = partition_of(topic, PARTITIONS)
    (holder,) = cluster_state(etcd).partitions[number].replicas
    observer, other = sorted(set(NODES) - {holder})
    publisher = PahoClient(brokers[observer].port, f"offline-pub-{version}", version=version)
    numbered(publisher, topic, 0, 10)
    before = PahoClient(brokers[observer].port, f"offline-before-{version}", version=version)
    assert before.subscribe(topic, 1) == [1]  # observed there from here on; not on `other` yet
    publisher.disconnect()

    brokers[holder].kill()
    wait_until(
        lambda: cluster_state(etcd).partitions[number].leader is None,
        30,
        f"partition {number} offline",
        lambda: cluster_state(etcd),
    )
    state = cluster_state(etcd).partitions[number]
    assert state.replicas == (holder,)  # no live broker was given an empty copy of it
    wait_until(partial(_leaderless_shown, brokers[observer], etcd), what="the offline partitions in /metrics")
    assert _offline(etcd) >= 1

    device = device_from(brokers[observer].port, f"offline-device-{version}", topic, "4", version)
    meanwhile = PahoClient(brokers[other].port, f"offline-meanwhile-{version}", version=version)
    assert meanwhile.subscribe(topic, 1) == [1]
    brokers[holder].start()
    wait_until(
        lambda: cluster_state(etcd).partitions[number].leader == holder,
        60,
        f"partition {number} led by {holder} again",
        lambda: cluster_state(etcd),
    )

    assert _payloads(device.expect(6, timeout=20)) == [str(n).encode() for n in range(4, 10)]
    wait_until(partial(_leaderless_shown, brokers[observer], etcd), what="no partition offline in /metrics")
    assert _offline(etcd) == 0
    clients = {"device": device, "meanwhile": meanwhile, "before": before}
    time.sleep(1.0)
    assert {name: _left(client) for name, client in clients.items()} == {name: [] for name in clients}
    survivor = PahoClient(brokers[other].port, f"offline-pub2-{version}", version=version)
    survivor.publish(topic, b"10", 1)
    for client in (device, meanwhile, before):
        assert _payloads(client.expect(1, timeout=15)) == [b"10"]
        client.expect_none(0.5)
