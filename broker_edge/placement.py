"""Where topics live in a cluster: a topic's partition, the members, and each partition's leader and replicas.

``partition_of`` is the one hash that places a topic: the store files a new topic in that partition's log, a
cluster member leads or follows it by that number, and a reader of ``GET /v1/cluster`` finds its replicas
with it. ``Member`` and ``PartitionState`` are what a cluster writes to etcd and shows its readers. They sit
at the bottom of the layers (as ``log_info`` does) so that storage and the offsets API's clients use them
without loading the cluster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HANDOFF_NAME", "Member", "PartitionState", "partition_of"]

HANDOFF_NAME = re.compile(r"timestone-handoff-[0-9a-f]{32}")
"""What a member's handoff socket is named (``Member.handoff``): a fixed prefix and 128 random bits."""


def partition_of(topic: str, partitions: int) -> int:
    """The partition of ``topic``: a stable hash (CRC32C of its UTF-8 bytes) modulo the partition count."""
    if partitions == 1:
        return 0
    return _crc32c(topic.encode("utf-8")) % partitions


def _load_crc32c(data: bytes) -> int:
    """The first hash imports the `crc32c` package (a broker alone with one partition never needs it)."""
    global _crc32c
    from crc32c import crc32c

    _crc32c = crc32c
    return crc32c(data)


_crc32c: Callable[[bytes], int] = _load_crc32c


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
    handoff: str | None = None
    """The name of the abstract Unix socket where it takes in clients' connections from members on its
    host (``cluster.links.handoff``); None: it takes none."""

    def to_json(self) -> str:
        document = {"node_id": self.node_id, "mqtt": self.mqtt, "offsets_api": self.offsets_api}
        if self.peer is not None:
            document["peer"] = self.peer
        if self.handoff is not None:
            document["handoff"] = self.handoff
        return json.dumps(document)

    @classmethod
    def from_json(cls, text: str | bytes) -> Member:
        data = json.loads(text)
        peer = data.get("peer")
        handoff = data.get("handoff")
        return cls(
            str(data["node_id"]),
            str(data["mqtt"]),
            str(data["offsets_api"]),
            peer and str(peer),
            handoff and str(handoff),
        )


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
