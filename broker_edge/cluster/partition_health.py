"""The partitions as a member sees them, for ``/metrics``: those it leads, those of them short of in-sync
copies, and those no live member leads.

Read from the member's ``ClusterView`` when ``/metrics`` is scraped (nothing is counted on the publish path).
A leader reports its own partitions, as Kafka's brokers report under-replicated partitions, so summing a
figure over the members counts each partition once; ``leaderless`` is each member's own view (take the
maximum over members).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker_edge.cluster.view import ClusterView
from broker_edge.observe.metrics import BrokerMetrics

__all__ = ["PartitionHealth", "partition_health", "register_partition_metrics"]


@dataclass(frozen=True, slots=True)
class PartitionHealth:
    led: int
    """Partitions this member leads and may acknowledge for now (none while it is fenced)."""
    under_replicated: int
    """Of those, partitions with fewer in-sync copies than ``replication_factor`` (or their replica list): a
    copy fell behind, or its member is gone and no other took its place."""
    below_min_insync: int
    """Of those, partitions with fewer in-sync copies than ``min_insync_replicas``: their QoS 1/2 publishes
    are refused until a copy catches up."""
    leaderless: int
    """Partitions with no live leader as this member sees it (its leader gone, or none known yet)."""


def partition_health(view: ClusterView, replication_factor: int, min_insync_replicas: int) -> PartitionHealth:
    led = under_replicated = below_min_insync = 0
    leaderless = view.partitions - len(view.states)
    for partition, state in view.states.items():
        if state.leader is None or state.leader not in view.members:
            leaderless += 1
        elif view.leads(partition):
            led += 1
            under_replicated += len(state.isr) < max(replication_factor, len(state.replicas))
            below_min_insync += len(state.isr) < min_insync_replicas
    return PartitionHealth(led, under_replicated, below_min_insync, leaderless)


def register_partition_metrics(
    metrics: BrokerMetrics, view: ClusterView, replication_factor: int, min_insync_replicas: int
) -> None:
    """The ``partitions_*`` gauges of a cluster member, set from one reading of ``view`` before each scrape
    is collected (``BrokerMetrics.before_collect``)."""
    documented = {
        "led": "Partitions this member leads and may acknowledge for now.",
        "under_replicated": "Partitions this member leads with fewer in-sync copies than replication_factor.",
        "below_min_insync": "Partitions this member leads with fewer in-sync copies than min_insync_replicas "
        "(their QoS 1/2 publishes are refused).",
        "leaderless": "Partitions with no live leader, as this member sees them.",
    }
    gauges = {
        field_name: metrics.gauge(f"partitions_{field_name}", documentation)
        for field_name, documentation in documented.items()
    }

    def read_partitions() -> None:
        health = partition_health(view, replication_factor, min_insync_replicas)
        for field_name, gauge in gauges.items():
            gauge.set(getattr(health, field_name))

    read_partitions()
    metrics.before_collect.append(read_partitions)
