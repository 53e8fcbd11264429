"""The ``cluster:`` section of a broker's configuration: how this node joins its cluster.

Only dataclasses and checks: loading this module loads nothing else of the cluster (no etcd client), so a
broker's configuration can name the section without a single broker paying for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from broker_edge.config.loader import ConfigError

__all__ = ["AdvertiseConfig", "ClusterConfig", "etcd_endpoint"]

NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
"""The form of a node id: 1-63 letters, digits, ``_``, ``.`` or ``-``, starting with a letter or digit."""
MAX_PARTITIONS = 4096
"""Upper bound of ``partitions``: every partition is one etcd key that every node watches."""


def etcd_endpoint(url: str) -> tuple[str, int]:
    """``(host, port)`` of an etcd client URL ``http://host:port``; ``ValueError`` saying why otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"expected http://host:port, got {url!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"expected http://host:port without path, query or credentials, got {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"bad port in {url!r}") from None
    if not parts.hostname or port is None:
        raise ValueError(f"expected http://host:port, got {url!r}")
    return parts.hostname, port


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65_535:
        raise ValueError(f"expected host:port, got {value!r}")
    return host, int(port)


@dataclass
class AdvertiseConfig:
    """How peers and clients reach this node (what it registers in etcd)."""

    mqtt: str | None = None
    """host:port of this node's MQTT listener as others reach it; unset = the first listener's host and
    bound port."""
    offsets_api: str | None = None
    """Base URL of this node's offsets API as peers reach it (http://host:port); unset = the offsets API's
    host and bound port."""

    def __post_init__(self) -> None:
        if self.mqtt is not None:
            try:
                _host_port(self.mqtt)
            except ValueError as exc:
                raise ConfigError("mqtt", str(exc)) from None
        if self.offsets_api is not None:
            parts = urlsplit(self.offsets_api)
            try:
                port = parts.port
            except ValueError:
                port = None
            if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
                raise ConfigError(
                    "offsets_api", f"expected http://host:port or https://host:port, got {self.offsets_api!r}"
                )


@dataclass
class ClusterConfig:
    """Membership of a broker cluster coordinated by etcd (see docs/cluster.md)."""

    node_id: str
    """This broker's name in the cluster: unique, and stable across restarts (letters, digits, ``_.-``)."""
    etcd: list[str]
    """Client URLs (http://host:port) of the etcd cluster; give every member so any one may fail."""
    advertise: AdvertiseConfig = field(default_factory=AdvertiseConfig)
    replication_factor: int = 3
    """Copies of every persisted log, this node's included (capped at the live members)."""
    min_insync_replicas: int = 2
    """In-sync copies that must hold a QoS 1/2 publish before it is acknowledged; with fewer in sync such
    publishes are refused."""
    partitions: int = 16
    """Partitions of the topic space (each with one leader); fixed when the cluster is created: the count
    stored in etcd wins over a differing one here."""
    lease_ttl_s: int = 3
    """Seconds of this node's etcd lease: a node that stops renewing it leaves the cluster after this long,
    and fences itself (acknowledges nothing) a little before (at least 2)."""
    replica_lag_max_ms: int = 5000
    """A follower that has not caught up with the leader's log end for this long leaves the in-sync set."""
    unclean_election: bool = False
    """With no live in-sync replica, elect any live replica (may lose acknowledged records; logged at
    ERROR). Off: the partition stays offline until an in-sync replica returns."""
    forward_timeout_ms: int = 5000
    """How long a publish for a partition without a leader waits for one before it is refused."""
    hw_checkpoint_interval_ms: int = 5000
    """How often the logs' committed ends are saved (and at stop), so that a restart shows no record that
    was not committed."""
    session_save_interval_ms: int = 1000
    """How often the state of the persistent sessions held here (subscriptions, log positions) is saved to
    etcd when it changed: a broker taking over the sessions of one that died redelivers at most what was
    acknowledged in this interval before the death."""
    session_handover_timeout_ms: int = 5000
    """How long a CONNECT waits for the broker holding its client id's session to hand it over before it
    is refused (v5 0x88 server unavailable, 3.1.1 return code 3)."""
    key_prefix: str = "/timestone"
    """Prefix of every etcd key of this cluster (several clusters may share one etcd)."""
    token: str | None = None
    """Bearer token between peers; unset = ``offsets_api.token``."""
    retained_snapshot_timeout_ms: int = 5000
    """How long a starting broker waits for a peer's retained messages before it serves the retained
    messages of new subscriptions with what it holds."""
    shared_resend_ms: int = 10000
    """A shared-subscription delivery given to another broker and not finished after this long is sent to
    it again (the broker ignores it if it is delivering it)."""
    shared_finished_remembered: int = 65536
    """Finished shared-subscription deliveries each broker remembers, so that a late message about one
    (a leadership change, a reordering between peers) never gives it to a second member."""

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str) or not NODE_ID.match(self.node_id):
            raise ConfigError(
                "node_id", f"must be 1-63 letters, digits, '_', '.' or '-' (not first), got {self.node_id!r}"
            )
        if not self.etcd:
            raise ConfigError("etcd", "at least one etcd URL is required")
        for index, url in enumerate(self.etcd):
            try:
                etcd_endpoint(url)
            except ValueError as exc:
                raise ConfigError(f"etcd[{index}]", str(exc)) from None
        for name, low in (
            ("replication_factor", 1),
            ("min_insync_replicas", 1),
            ("partitions", 1),
            ("lease_ttl_s", 2),
            ("replica_lag_max_ms", 1),
            ("forward_timeout_ms", 0),
            ("retained_snapshot_timeout_ms", 0),
            ("shared_finished_remembered", 1),
            ("shared_resend_ms", 1),
            ("hw_checkpoint_interval_ms", 1),
            ("session_save_interval_ms", 10),
            ("session_handover_timeout_ms", 100),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(name, f"must be an integer >= {low}, got {value!r}")
        if self.min_insync_replicas > self.replication_factor:
            raise ConfigError(
                "min_insync_replicas",
                f"must be <= replication_factor ({self.replication_factor}), got {self.min_insync_replicas}",
            )
        if self.partitions > MAX_PARTITIONS:
            raise ConfigError("partitions", f"must be <= {MAX_PARTITIONS}, got {self.partitions}")
        prefix = self.key_prefix
        if not prefix.startswith("/") or prefix.endswith("/") or "//" in prefix:
            raise ConfigError(
                "key_prefix", f"must start with '/' and not end with '/' (e.g. /timestone), got {prefix!r}"
            )
        if self.token is not None and not self.token:
            raise ConfigError("token", "must not be empty (leave it unset to use offsets_api.token)")
