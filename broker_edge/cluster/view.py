"""What the parts of a cluster node share: members, partition states, and this node's view of them.

The coordination side (etcd: membership, elections, in-sync set changes) writes ``PartitionState`` records
and keeps a ``ClusterView`` current; the data side (the replicated log, forwarding, routing) only reads the
view and is told of changes. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from broker_edge.placement import Member, PartitionState, partition_of

__all__ = ["ClusterView"]


@dataclass
class ClusterView:
    """This node's current picture of the cluster, kept by the coordination side, read by everything else.

    ``changed()`` is called (on the broker's event loop) after every update, so the data side can react:
    start or stop fetching, become or stop being a leader, re-route forwarded publishes.
    """

    node_id: str
    partitions: int
    members: dict[str, Member] = field(default_factory=dict)
    registrations: dict[str, int] = field(default_factory=dict)
    """member -> the etcd revision its member record was written at: one registration of one process (a
    member back after its lease ended, or after a restart, has a newer one)."""
    states: dict[int, PartitionState] = field(default_factory=dict)
    fenced: bool = True
    """True while this node cannot prove its etcd lease is alive: it acknowledges nothing (and leads
    nothing) until it can again."""
    _listeners: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def partition_of(self, topic: str) -> int:
        """The partition ``topic`` belongs to."""
        return partition_of(topic, self.partitions)

    def state_of(self, topic: str) -> PartitionState | None:
        """The state of ``topic``'s partition (None before the first one is known)."""
        return self.states.get(partition_of(topic, self.partitions))

    def leads(self, partition: int) -> bool:
        """Whether this node is the partition's leader and may acknowledge for it now."""
        state = self.states.get(partition)
        return state is not None and state.leader == self.node_id and not self.fenced

    def leader_of(self, partition: int) -> Member | None:
        """The live member leading ``partition``, if any."""
        state = self.states.get(partition)
        if state is None or state.leader is None:
            return None
        return self.members.get(state.leader)

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every change of members, states or fencing."""
        self._listeners.append(listener)

    def changed(self) -> None:
        """Tell every listener that the view changed (the coordination side calls this)."""
        for listener in list(self._listeners):
            listener()
