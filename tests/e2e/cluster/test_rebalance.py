"""Replicas moved to less loaded members settle: four broker processes, replication factor 2, real etcd.

Brokers join one after another, so the controller moves copies (an extra replica added, caught up, then
one dropped) until every broker holds its share. Once the copies are spread, nothing moves any more: no
partition changes its replicas, leader or epoch while the cluster stays as it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from broker_edge.placement import PartitionState
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.cluster.proof import cluster_state, copies_spread, wait_settled
from tests.harness.local_cluster import EtcdTarget

pytestmark = pytest.mark.timeout(180)

NODES = ("a", "b", "c", "d")
PARTITIONS = 16
QUIET_S = 5.0
"""How long nothing may change once copies are spread."""


def placement(etcd: EtcdTarget) -> dict[int, tuple[str | None, int, tuple[str, ...]]]:
    """partition → (leader, epoch, replicas as a sorted tuple)."""
    states: dict[int, PartitionState] = cluster_state(etcd).partitions
    return {p: (s.leader, s.epoch, tuple(sorted(s.replicas))) for p, s in states.items()}


def test_once_copies_are_spread_no_replica_or_leadership_moves_any_more(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> None:
    """a starts alone, b, c and d join: the controller spreads copies over the four, then nothing changes
    for several seconds. Where the most loaded broker led the partition it gave a copy of, another copy
    was dropped instead of its own: the counts only swapped, and the move started again about every
    250 ms, for ever (its partition's epoch rising with it)."""
    brokers = {}
    for node in NODES:
        brokers[node] = cluster_brokers(node, replication_factor=2)
        wait_settled(etcd, set(brokers), min(2, len(brokers)), 60)
    deadline = time.monotonic() + 90
    last = placement(etcd)
    quiet_since = time.monotonic()
    changes: list[tuple[float, int, tuple[str | None, int, tuple[str, ...]]]] = []
    while True:
        now = time.monotonic()
        where = placement(etcd)
        for partition, placed in where.items():
            if last.get(partition) != placed:
                changes.append((now, partition, placed))
                quiet_since = now
        last = where
        if now - quiet_since >= QUIET_S and copies_spread(etcd, NODES, PARTITIONS):
            break
        recent = [(p, placed) for at, p, placed in changes if at > now - 10]
        assert now < deadline, (
            f"copies not spread and still for {QUIET_S} s: {len(recent)} changes in the last 10 s "
            f"(partition, (leader, epoch, replicas)): {recent[-12:]}"
        )
        time.sleep(0.05)
    state = cluster_state(etcd)
    assert all(len(partition.replicas) == 2 for partition in state.partitions.values())
