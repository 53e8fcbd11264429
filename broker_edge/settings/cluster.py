"""The ``cluster:`` section of a broker's configuration: how this node joins its cluster.

Only dataclasses and checks: loading this module loads nothing else of the cluster (no etcd client), so a
broker's configuration can name the section without a single broker paying for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from broker_edge.config.loader import ConfigError, expand_home
from broker_edge.security.limits import check_http_limits
from broker_edge.settings.bound_ports import check_bind_host

__all__ = [
    "AdvertiseConfig",
    "ClusterConfig",
    "EtcdAuthConfig",
    "EtcdTlsConfig",
    "MemberListenConfig",
    "MemberTlsConfig",
    "etcd_endpoint",
]

NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
"""The form of a node id: 1-63 letters, digits, ``_``, ``.`` or ``-``, starting with a letter or digit."""
MAX_PARTITIONS = 4096
"""Upper bound of ``partitions``: every partition is one etcd key that every node watches."""
MAX_LEASE_TTL_S = 3600
"""Upper bound of ``lease_ttl_s``: a dead member's partitions wait that long for a new leader, so a longer
lease is a slip of units, not a setting (etcd itself refuses a TTL past 9000000000 s, its MaxLeaseTTL)."""


def etcd_endpoint(url: str) -> tuple[str, int]:
    """``(host, port)`` of an etcd client URL ``http(s)://host:port``; ``ValueError`` saying why otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"expected https://host:port (or http:// on loopback), got {url!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"expected https://host:port without path, query or credentials, got {url!r}")
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
    """Base URL of this node's offsets API as readers (the Spark source, the OTA jobs) reach it
    (http(s)://host:port); unset = the offsets API's host and bound port."""
    peer: str | None = None
    """Base URL of this node's members' endpoint as the other members reach it (https://host:port, http://
    only on loopback without ``cluster.tls``); unset = ``cluster.listen``'s host and bound port."""

    def __post_init__(self) -> None:
        if self.mqtt is not None:
            try:
                _host_port(self.mqtt)
            except ValueError as exc:
                raise ConfigError("mqtt", str(exc)) from None
        for name in ("offsets_api", "peer"):
            url = getattr(self, name)
            if url is not None and _base_url_host(url) is None:
                raise ConfigError(name, f"expected http://host:port or https://host:port, got {url!r}")


def _base_url_host(url: str) -> str | None:
    """The host of ``http(s)://host:port`` (None when ``url`` is not of that form)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return None
    return parts.hostname


def _is_loopback(host: str) -> bool:
    from broker_edge.security.auth import is_loopback_host

    return is_loopback_host(host)


@dataclass
class MemberTlsConfig:
    """How members prove who they are to each other: mutual TLS under the cluster's CA."""

    certfile: str
    """PEM certificate of this broker (then intermediates), naming its node id as the URI subject
    alternative name ``timestone://node/<node_id>``; used both to serve and to connect to members. With
    ``--workers``, member n reads its own, named as this with ``-<n>`` before the suffix (and ``keyfile``'s
    too)."""
    keyfile: str
    """PEM private key of ``certfile`` (unencrypted; keep it at mode 0600)."""
    cafile: str
    """PEM CA certificates that members' certificates chain to (the cluster CA; during a rotation, the old
    and the new one); re-read on SIGHUP with the certificate and key."""
    min_version: str = "TLSv1.3"
    """Oldest TLS version between members (TLSv1.2 or TLSv1.3)."""

    def __post_init__(self) -> None:
        expand_home(self, "certfile", "keyfile", "cafile")
        for name in ("certfile", "keyfile", "cafile"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(name, "must name a PEM file")
        if self.min_version not in ("TLSv1.2", "TLSv1.3"):
            raise ConfigError("min_version", f"expected TLSv1.2 or TLSv1.3, got {self.min_version!r}")


@dataclass
class MemberListenConfig:
    """The members' endpoint: the peer links, replica fetches and members' reads, apart from readers."""

    host: str | None = None
    """Address to bind; unset = the offsets API's host. Anything but loopback needs ``cluster.tls``."""
    port: int = 9885
    """TCP port; 0 picks a free one."""
    max_connections: int = 128
    """Open connections (members' only: a client without a member certificate never completes its TLS
    handshake); more are answered 503 and closed."""
    request_timeout_s: float = 10.0
    """Seconds for a TLS handshake, a request's headers and its body to arrive."""
    min_read_bytes_per_s: int = 65_536
    """Slowest rate a member may take an answer at: an answer of N bytes not taken within
    ``request_timeout_s`` + N / this seconds is abandoned and its connection closed (one WARNING naming
    the member); 0 = no minimum."""

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65_535:
            raise ConfigError("port", f"must be between 0 and 65535, got {self.port!r}")
        if self.host is not None:
            check_bind_host(self.host)
        check_http_limits(self.max_connections, self.request_timeout_s, self.min_read_bytes_per_s)


@dataclass
class EtcdTlsConfig:
    """TLS to etcd (its ``--cert-file``, ``--trusted-ca-file`` and ``--client-cert-auth``)."""

    cafile: str
    """PEM CA certificates the etcd servers' certificates chain to."""
    certfile: str | None = None
    """PEM client certificate presented to etcd (needed with etcd's ``--client-cert-auth``)."""
    keyfile: str | None = None
    """PEM private key of ``certfile``."""
    server_name: str | None = None
    """Name the etcd servers' certificates must carry, when it is not the host of the ``etcd`` URLs."""

    def __post_init__(self) -> None:
        expand_home(self, "cafile", "certfile", "keyfile")
        if not self.cafile:
            raise ConfigError("cafile", "must name a PEM file")
        if (self.certfile is None) != (self.keyfile is None):
            raise ConfigError("keyfile", "certfile and keyfile go together")


@dataclass
class EtcdAuthConfig:
    """etcd's own user authentication (``etcdctl auth enable``): this cluster's user, whose role reaches
    its key prefix only."""

    username: str
    """The etcd user (``etcdctl user add``)."""
    password_file: str
    """File holding the user's password (its first line); read at every authentication, so a changed
    password is taken without a restart."""

    def __post_init__(self) -> None:
        expand_home(self, "password_file")
        if not self.username:
            raise ConfigError("username", "must not be empty")
        if not self.password_file:
            raise ConfigError("password_file", "must name a file")

    def password(self) -> str:
        """The password as the file holds it now (``OSError`` when it cannot be read); a byte order mark an
        editor saved first is no part of it."""
        try:
            with open(self.password_file, encoding="utf-8-sig") as file:
                return file.readline().rstrip("\r\n")
        except UnicodeDecodeError as error:
            raise OSError(f"not UTF-8 text: {error}") from None


@dataclass
class ClusterConfig:
    """Membership of a broker cluster coordinated by etcd (see docs/cluster.md)."""

    node_id: str
    """This broker's name in the cluster: unique, and stable across restarts (letters, digits, ``_.-``)."""
    etcd: list[str]
    """Client URLs (https://host:port; http:// only on loopback) of the etcd cluster; give every member so
    any one may fail."""
    etcd_tls: EtcdTlsConfig | None = None
    """TLS to etcd (required for https:// URLs)."""
    etcd_auth: EtcdAuthConfig | None = None
    """etcd user authentication; unset = no user (etcd without ``auth enable``)."""
    tls: MemberTlsConfig | None = None
    """Mutual TLS between members (docs/security.md); unset = members on loopback only, trusted by the node
    id they claim (development)."""
    listen: MemberListenConfig = field(default_factory=MemberListenConfig)
    advertise: AdvertiseConfig = field(default_factory=AdvertiseConfig)
    replication_factor: int = 3
    """Copies of every persisted log, this node's included (capped at the live members)."""
    min_insync_replicas: int = 2
    """In-sync copies that must hold a QoS 1/2 publish before it is acknowledged; with fewer in sync such
    publishes are refused."""
    partitions: int = 16
    """Partitions of the topic space (each with one leader); fixed when the cluster is created, and the
    same on every broker: a broker configured with another count than the one its cluster was created with
    refuses to start (exit 2)."""
    lease_ttl_s: int = 3
    """Seconds of this node's etcd lease: a node that stops renewing it leaves the cluster after this long,
    and fences itself (acknowledges nothing) a little before (at least 2, at most 3600)."""
    fenced_clients_hold_ms: int = 3000
    """How long a member fenced without losing its lease (etcd slow, restarting or out of reach) keeps its
    MQTT clients before it sends them to the other members; one whose lease etcd says is gone sends them at
    once. 0: at the fence."""
    replica_lag_max_ms: int = 5000
    """A follower that has not caught up with the leader's log end for this long leaves the in-sync set."""
    unclean_election: bool = False
    """With no live in-sync replica, elect any live replica (may lose acknowledged records; logged at
    ERROR). Off: the partition stays offline until an in-sync replica returns."""
    forward_timeout_ms: int = 5000
    """How long a publish for a partition without a leader waits for one before it is refused."""
    redirect_publishers: bool = False
    """Send an MQTT 5 publisher to the member leading its topic's partition once a publish of it that this
    member forwarded there is acknowledged (DISCONNECT 0x9C with the leader's MQTT address as Server
    Reference), unless this member appended a publish of it on a topic it still leads: its next publishes
    are appended where it is connected, with no forwarding. A QoS 2 publisher is sent once its open QoS 2
    flows end (after the PUBCOMP)."""
    hand_over_connections: bool = True
    """Move a client's connection to the member leading its topic's partition when that member runs on the
    same host, once a publish of it that this member forwarded there is acknowledged: the TCP socket goes
    to that member (a Unix socket between them), and the client publishes on, on the same connection,
    where its topic is appended. Only plain TCP connections whose session holds nothing move (no Session
    Expiry Interval, no subscription, nothing in flight), and not when this member appended a publish of
    the client on a topic it still leads; one moved here moves on when its topic's leader moves. A QoS 2
    publisher moves once its open QoS 2 flows end (after the PUBCOMP)."""
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
    """No longer used: members prove who they are with ``cluster.tls``; a reader's token never makes its
    holder a member. Setting it is an error that says so."""
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
        self._check_etcd()
        for name, low in (
            ("replication_factor", 1),
            ("min_insync_replicas", 1),
            ("partitions", 1),
            ("lease_ttl_s", 2),
            ("fenced_clients_hold_ms", 0),
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
        if self.lease_ttl_s > MAX_LEASE_TTL_S:
            raise ConfigError(
                "lease_ttl_s", f"must be <= {MAX_LEASE_TTL_S} (an hour), got {self.lease_ttl_s}"
            )
        prefix = self.key_prefix
        if not prefix.startswith("/") or prefix.endswith("/") or "//" in prefix:
            raise ConfigError(
                "key_prefix", f"must start with '/' and not end with '/' (e.g. /timestone), got {prefix!r}"
            )
        if self.token is not None:
            raise ConfigError(
                "token",
                "members no longer share a token (a reader's token must never work between members): "
                "remove it and give each broker a certificate under cluster.tls (docs/security.md)",
            )

    def _check_etcd(self) -> None:
        schemes = set()
        for index, url in enumerate(self.etcd):
            try:
                host, _ = etcd_endpoint(url)
            except ValueError as exc:
                raise ConfigError(f"etcd[{index}]", str(exc)) from None
            scheme = urlsplit(url).scheme
            schemes.add(scheme)
            if scheme == "http" and not _is_loopback(host):
                raise ConfigError(
                    f"etcd[{index}]", f"an etcd beyond loopback is reached over https:// only, got {url!r}"
                )
        if len(schemes) > 1:
            raise ConfigError("etcd", "mixes http:// and https:// URLs")
        if "https" in schemes and self.etcd_tls is None:
            raise ConfigError("etcd_tls", "required for https:// etcd URLs (at least its cafile)")
        if "http" in schemes and self.etcd_tls is not None:
            raise ConfigError("etcd_tls", "set, but the etcd URLs are http://: use https://")

    def check_members_endpoint(self, host: str) -> None:
        """``ConfigError`` unless the members' endpoint, bound to ``host``, and its advertised URL are
        loopback or protected by ``tls``."""
        if self.tls is not None:
            if self.advertise.peer is not None and not self.advertise.peer.startswith("https://"):
                raise ConfigError("advertise.peer", "must be https:// with cluster.tls")
            return
        peer_host = _base_url_host(self.advertise.peer) if self.advertise.peer else host
        for name, where in (("listen.host", host), ("advertise.peer", peer_host or "")):
            if not _is_loopback(where):
                raise ConfigError(
                    "tls",
                    f"required: the members' endpoint ({name} {where!r}) is beyond loopback, where members "
                    "must prove who they are (docs/security.md)",
                )
        if self.advertise.peer is not None and self.advertise.peer.startswith("https://"):
            raise ConfigError("advertise.peer", "https:// needs cluster.tls")
