"""What the parts of a cluster node share: members, partition states, and this node's view of them.

The coordination side (etcd: membership, elections, in-sync set changes) writes ``PartitionState`` records
and keeps a ``ClusterView`` current; the data side (the replicated log, forwarding, routing) only reads the
view and is told of changes. Nothing here does I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from crc32c import crc32c

__all__ = ["ClusterView", "Member", "PartitionState", "partition_of"]


def partition_of(topic: str, partitions: int) -> int:
    """The partition of ``topic``: a stable hash (CRC32C of its UTF-8 bytes) modulo the partition count."""
    return crc32c(topic.encode("utf-8")) % partitions


@dataclass(frozen=True, slots=True)
class Member:
    """A live broker of the cluster, as registered under its etcd lease."""

    node_id: str
    mqtt: str
    """host:port devices and peers reach its MQTT listener at."""
    offsets_api: str
    """Base URL of its offsets API, where readers (the Spark source, the OTA jobs) read its logs."""
    peer: str | None = None
    """Base URL of its members' endpoint (``cluster.listen``): peer links, replica fetches and the other
    members' reads go there, and only members get in."""

    def to_json(self) -> str:
        document = {"node_id": self.node_id, "mqtt": self.mqtt, "offsets_api": self.offsets_api}
        if self.peer is not None:
            document["peer"] = self.peer
        return json.dumps(document)

    @classmethod
    def from_json(cls, text: str | bytes) -> Member:
        data = json.loads(text)
        peer = data.get("peer")
        return cls(str(data["node_id"]), str(data["mqtt"]), str(data["offsets_api"]), peer and str(peer))


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition of the topic space: its leader and epoch, its replicas and which of them are in sync.

    Written to etcd only by compare-and-swap on the key's revision, so two writers never both win.
    """

    partition: int
    leader: str | None
    """node_id of the leader; None while no in-sync replica is alive (the partition is offline)."""
    epoch: int
    """Leader epoch: +1 on every change of leader. Records appended under a leader carry its epoch in the
    replicas' epoch caches, which is how a replica finds where its log diverges from a new leader's."""
    replicas: tuple[str, ...]
    """The brokers assigned a copy (replication_factor of them, capped at the live members)."""
    isr: tuple[str, ...]
    """The in-sync replicas (the leader included): each holds every acknowledged record."""

    def to_json(self) -> str:
        return json.dumps(
            {
                "partition": self.partition,
                "leader": self.leader,
                "epoch": self.epoch,
                "replicas": list(self.replicas),
                "isr": list(self.isr),
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> PartitionState:
        data = json.loads(text)
        return cls(
            int(data["partition"]),
            None if data["leader"] is None else str(data["leader"]),
            int(data["epoch"]),
            tuple(str(node) for node in data["replicas"]),
            tuple(str(node) for node in data["isr"]),
        )


@dataclass
class ClusterView:
    """This node's current picture of the cluster, kept by the coordination side, read by everything else.

    ``changed()`` is called (on the broker's event loop) after every update, so the data side can react:
    start or stop fetching, become or stop being a leader, re-route forwarded publishes.
    """

    node_id: str
    partitions: int
    members: dict[str, Member] = field(default_factory=dict)
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
