"""The broker's configuration schema: one dataclass tree, loaded from YAML by ``load_broker_config``.

Every section embeds the dataclass of the module that uses it (``LimitsConfig`` from ``limits``,
``TlsConfig`` from ``tls``, ...), so a key is documented once, next to the code that reads it; the
commented ``conf/broker.yaml`` lists every key with its default. No file at all gives a broker that works at
once: one plain TCP listener on 127.0.0.1:1883 that accepts anonymous clients because only this machine can
reach it (the Mosquitto 2 rule). A listener on any other address requires authentication unless it says
``allow_anonymous: true``; one that would accept nobody (no password file, no client certificates, anonymous
refused) is a configuration error naming that listener.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from broker_edge.config.loader import ConfigError, expand_home, load_dataclass, load_yaml_file
from broker_edge.observe.logs import LoggingConfig
from broker_edge.observe.sys_topics import SysTopicsConfig
from broker_edge.process.gc_tuning import RuntimeConfig
from broker_edge.security.acl import AclConfig
from broker_edge.security.auth import AuthConfig, anonymous_allowed, is_loopback_host
from broker_edge.security.limits import LimitsConfig, check_http_limits
from broker_edge.security.reader_tokens import ReaderToken, ReaderTokens
from broker_edge.security.tls import TlsConfig, client_ssl_context
from broker_edge.settings.bound_ports import (
    WILDCARD_HOSTS,
    BoundEndpoint,
    check_bind_host,
    check_distinct_ports,
)
from broker_edge.settings.cluster import ClusterConfig
from broker_edge.settings.named_files import check_named_files, check_server_tls
from broker_edge.settings.uplink import UplinkConfig, UplinkHubConfig
from broker_edge.storage.config import StorageConfig
from broker_edge.storage.file_pool import check_max_open
from broker_edge.storage.persistence import RuleError, check_rules
from broker_edge.storage.record import MIN_BODY_SIZE, U16

__all__ = [
    "DEFAULT_ADMIN_PORT",
    "WORKERS_DIRECTORY",
    "AdminHttpConfig",
    "BrokerConfig",
    "BrokerStorageConfig",
    "ListenerConfig",
    "MqttConfig",
    "OffsetsApiConfig",
    "RetainConfig",
    "SessionsConfig",
    "check_files_of",
    "load_broker_config",
    "load_broker_document",
    "read_broker_settings",
    "workers_cluster",
]

ListenerType = Literal["tcp", "tls", "websocket", "wss"]
ListenerTransport = Literal["native", "asyncio"]


@dataclass
class ListenerConfig:
    """One address the broker accepts MQTT clients on."""

    name: str = "default"
    """Unique name; it labels metrics and log lines."""
    type: ListenerType = "tcp"
    """``tcp`` (plain MQTT), ``tls`` (MQTT over TLS), ``websocket`` or ``wss`` (MQTT over WebSocket)."""
    host: str = "127.0.0.1"
    """Address to bind; ``0.0.0.0`` / ``::`` accept from every interface (then authentication is required)."""
    port: int = 1883
    """TCP port; 0 picks a free one (tests read it back from ``Broker.ports``)."""
    path: str = "/mqtt"
    """HTTP path of a WebSocket listener (subprotocol ``mqtt``)."""
    tls: TlsConfig | None = None
    """Certificate and key of a ``tls`` or ``wss`` listener (optionally client certificates)."""
    allow_anonymous: bool | None = None
    """Accept clients without a username here; unset = ``auth.allow_anonymous``, else only on loopback."""
    client_id_must_match_login: bool | None = None
    """Refuse a client id that is not the login on this listener (``auth.client_id_free_logins`` stay free);
    unset = ``auth.client_id_must_match_login``."""
    transport: ListenerTransport = "asyncio"
    """The transport of a ``tcp`` listener's connections: ``asyncio`` (the event loop's own, uvloop's when it
    runs) or ``native`` (the broker's own, on the event loop's socket watches: less memory per idle
    connection, more CPU per write). ``tls``, ``websocket`` and ``wss``
    listeners always use the event loop's."""
    reuse_port: bool = False
    """Share this address with other processes that set it too (``SO_REUSEPORT``): the kernel spreads new
    connections over them. ``timestone broker --workers N`` sets it on every member's listeners."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("name", "must not be empty")
        if self.type not in ("tcp", "tls", "websocket", "wss"):
            raise ConfigError("type", f"expected tcp, tls, websocket or wss, got {self.type!r}")
        check_bind_host(self.host)
        if isinstance(self.port, bool) or not 0 <= self.port <= 65_535:
            raise ConfigError("port", f"must be between 0 and 65535, got {self.port!r}")
        if self.type in ("tls", "wss") and self.tls is None:
            raise ConfigError("tls", f"a {self.type} listener needs tls.certfile and tls.keyfile")
        if self.type in ("tcp", "websocket") and self.tls is not None:
            raise ConfigError("tls", f"a {self.type} listener does not use TLS (use type tls or wss)")
        if not self.path.startswith("/"):
            raise ConfigError("path", f"must start with '/', got {self.path!r}")
        if self.transport not in ("native", "asyncio"):
            raise ConfigError("transport", f"expected native or asyncio, got {self.transport!r}")

    @property
    def websocket(self) -> bool:
        return self.type in ("websocket", "wss")


@dataclass
class SessionsConfig:
    """How long sessions of disconnected clients are kept, and whether they survive a restart."""

    max_session_expiry_s: int = 7 * 24 * 3600
    """Upper bound of any session's expiry (v5 Session Expiry Interval is capped to it); also how long an
    MQTT 3.1.1 session with clean session 0 lives after its client disconnects."""
    persist: bool = True
    """Keep persistent sessions (subscriptions, log cursors, expiry) across a broker restart: written to
    sessions.json in the storage directory at stop and every persist_interval_s, read back at start (needs
    storage.enabled; see docs/broker.md, What survives a restart)."""
    persist_interval_s: float = 60.0
    """Seconds between two snapshots of the persistent sessions while the broker runs (a crash loses at
    most what changed since the last one)."""
    max_persistent: int = 20_000
    """Persistent sessions (expiry > 0) kept, online or not; a CONNECT that would add one more is refused
    (v5 0x97, v3 0x03); 0 = unlimited."""

    def __post_init__(self) -> None:
        if isinstance(self.max_session_expiry_s, bool) or not 0 <= self.max_session_expiry_s <= 0xFFFFFFFF:
            raise ConfigError(
                "max_session_expiry_s", f"must be between 0 and 4294967295, got {self.max_session_expiry_s!r}"
            )
        if (
            isinstance(self.max_persistent, bool)
            or not isinstance(self.max_persistent, int)
            or self.max_persistent < 0
        ):
            raise ConfigError("max_persistent", f"must be an integer >= 0, got {self.max_persistent!r}")
        if not self.persist_interval_s > 0:
            raise ConfigError("persist_interval_s", f"must be > 0, got {self.persist_interval_s!r}")


@dataclass
class RetainConfig:
    """Retained messages."""

    enabled: bool = True
    """Keep retained messages (when false, v5 CONNACK says Retain Available = 0 and RETAIN is refused)."""
    max_retained: int = 100_000
    """Topics holding a retained message; a new one beyond it is not retained (0 = unlimited)."""
    max_retained_bytes: int = 268_435_456
    """Bytes (topic and payload) of all retained messages together; a message that would pass it is not
    retained (delivered live all the same; 0 = unlimited)."""
    max_retained_bytes_per_client: int = 16_777_216
    """Bytes of the retained messages one client id published that are still retained; a message that would
    pass it is not retained (0 = unlimited)."""

    def __post_init__(self) -> None:
        for name in ("max_retained", "max_retained_bytes", "max_retained_bytes_per_client"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(name, f"must be an integer >= 0, got {value!r}")


@dataclass
class MqttConfig:
    """Protocol features the broker offers to MQTT 5 clients."""

    topic_alias_maximum: int = 64
    """Topic aliases a client may use towards the broker (advertised in CONNACK; 0 = none)."""
    outgoing_topic_aliases: int = 64
    """Topic aliases the broker assigns per connection towards a client (at most the client's own Topic
    Alias Maximum; least recently used reassigned first); 0 = always send topic names."""

    def __post_init__(self) -> None:
        for name in ("topic_alias_maximum", "outgoing_topic_aliases"):
            value = getattr(self, name)
            if not 0 <= value <= 0xFFFF:
                raise ConfigError(name, f"must be between 0 and 65535, got {value}")


MAX_STORAGE_PARTITIONS = 9999
"""Most storage partitions (a directory each under ``<data>/log/``)."""

MAX_GROUP_COMMIT_WAIT_MS = 1000
"""Most a group-commit window may wait (``group_commit_ms``, ``group_commit_min_interval_ms``): every QoS 1/2
acknowledgement waits for its window, and one held longer than a second is a slip of units, not a setting
(a value past any time, 1e300, never acknowledged again)."""


MAX_RETENTION_INTERVAL_S = 86_400
"""Most time between two retention passes (``retention_interval_s``): a pass is also what frees a full disk
through the disk reserve and makes the seals a full disk held, so a longer one is a slip of units, not a
setting (1e300 never ran one)."""


@dataclass(slots=True)
class BrokerStorageConfig(StorageConfig):
    """The commitlog: ``StorageConfig`` (persistence rules, durability, retention) plus where it lives."""

    enabled: bool = True
    """Append QoS 1/2 publishes (per ``persist`` rules) to their topics' logs before acknowledging them."""
    directory: str = "timestone-data"
    """Directory of the logs (created if missing); relative paths are relative to the working directory."""
    retention_interval_s: float = 60.0
    """Seconds between two retention passes (each topic's start moves past its records past retention;
    segments nothing is kept of are deleted). At most 86400 (a day)."""
    record_format: int = 2
    """The newest record version a broker alone writes: 2 keeps a QoS 2 publisher's packet id in its record
    (a resend after a crash is not logged again); 1 writes version 1 records only, which brokers before
    version 2 read: to keep the way back to such a broker open, upgrade with 1 and raise it once the
    upgrade stays (QoS 2 is at least once across a crash meanwhile; a log holding version 2 records is for
    this version on, docs/operations.md)."""

    def __post_init__(self) -> None:
        expand_home(self, "directory")
        if isinstance(self.record_format, bool) or self.record_format not in (1, 2):
            raise ConfigError("record_format", f"must be 1 or 2, got {self.record_format!r}")
        if self.enabled and not self.directory:
            raise ConfigError("directory", "must name a directory when storage is enabled")
        if not 0 < self.retention_interval_s <= MAX_RETENTION_INTERVAL_S:
            raise ConfigError(
                "retention_interval_s",
                f"must be within (0, {MAX_RETENTION_INTERVAL_S}] (a day), got {self.retention_interval_s}",
            )
        for key in ("group_commit_ms", "group_commit_min_interval_ms"):
            if not 0 <= getattr(self, key) <= MAX_GROUP_COMMIT_WAIT_MS:
                raise ConfigError(
                    key, f"must be within [0, {MAX_GROUP_COMMIT_WAIT_MS}], got {getattr(self, key)}"
                )
        for name in (
            "group_commit_max_bytes",
            "segment_bytes",
            "max_record_bytes",
            "max_topics",
            "index_checkpoint_bytes",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.partitions <= MAX_STORAGE_PARTITIONS:
            raise ConfigError(
                "partitions", f"must be within [1, {MAX_STORAGE_PARTITIONS}], got {self.partitions}"
            )
        if self.segment_bytes >= 2**32:
            raise ConfigError("segment_bytes", f"must be below 4 GiB (4294967296), got {self.segment_bytes}")
        for name in (
            "tail_cache_total_bytes",
            "read_cache_bytes",
            "sealed_cache_bytes",
            "disk_reserve_bytes",
            "inline_sync_max_bytes",
            "syncfs_min_segments",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")
        if self.disk_reserve_bytes >= 2**63:  # posix_fallocate's length is a signed 64-bit off_t
            raise ConfigError(
                "disk_reserve_bytes",
                "must be below 2**63 (9223372036854775808), a file's largest length, "
                f"got {self.disk_reserve_bytes}",
            )
        if not self.refusal_log_interval_s > 0:
            raise ConfigError("refusal_log_interval_s", f"must be > 0, got {self.refusal_log_interval_s}")
        for name in ("segment_ms", "retention_bytes", "retention_ms"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(name, f"must be >= 1 (or null for no limit), got {value}")
        try:  # the checks the store makes when it opens, made here to name the key
            check_max_open(self.max_open_files)
        except ValueError as error:
            raise ConfigError("max_open_files", str(error)) from None
        try:
            check_rules(self.persist)
        except RuleError as error:
            raise ConfigError(f"persist{error.key}", error.detail) from None


@dataclass
class OffsetsApiConfig:
    """The HTTP offsets API over the commitlog (Spark source, peers, tools), on its own port."""

    enabled: bool = True
    """Serve the API (needs ``storage.enabled``)."""
    host: str = "127.0.0.1"
    """Address to bind; a non-loopback address requires a reader token (``token``, ``tokens`` or
    ``tokens_file``)."""
    port: int = 9884
    """TCP port; 0 picks a free one."""
    token: str | None = None
    """A bearer token that reads every topic (as a ``tokens`` entry named ``token`` with ``#``); unset and
    no ``tokens`` nor ``tokens_file`` = no authentication (loopback only)."""
    tokens: list[ReaderToken] = field(default_factory=list)
    """Readers' tokens, each with a name and the topic filters it may read (docs/offsets-api.md)."""
    tokens_file: str | None = None
    """YAML file with a ``tokens:`` list (same layout), re-read on SIGHUP: how tokens rotate without a
    restart."""
    tls: TlsConfig | None = None
    """Serve HTTPS with this certificate."""
    max_connections: int = 256
    """Open connections; at the cap, a new one takes the place of an idle one (one that never authenticated,
    else the kept-alive one idle the longest, else the long poll waiting the longest, answered at once),
    else it is answered 503 and closed."""
    request_timeout_s: float = 10.0
    """Seconds for a request's headers, and for its body, to arrive; a connection still sending is closed."""
    min_read_bytes_per_s: int = 65_536
    """Slowest rate a reader may take an answer at: an answer of N bytes not taken within
    ``request_timeout_s`` + N / this seconds is abandoned, its connection closed and its share of
    ``limits.http_buffer_bytes`` freed (one WARNING naming the reader); 0 = no minimum."""
    reader_connection_share: float = 0.5
    """Of ``max_connections``, what one token may hold open (every executor of a Spark job sharing it
    shares this); a request beyond it closes the token's own idle connection, else answers its own
    longest long poll, else is answered 503 (Retry-After); 1.0 = no bound of its own."""

    def __post_init__(self) -> None:
        expand_home(self, "tokens_file")
        share = self.reader_connection_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ConfigError("reader_connection_share", f"must be above 0 and at most 1, got {share!r}")
        if isinstance(self.port, bool) or not 0 <= self.port <= 65_535:
            raise ConfigError("port", f"must be between 0 and 65535, got {self.port!r}")
        check_bind_host(self.host)
        check_http_limits(self.max_connections, self.request_timeout_s, self.min_read_bytes_per_s)
        if self.enabled and not self.authenticates and not is_loopback_host(self.host):
            raise ConfigError(
                "token",
                f"required (or tokens, or tokens_file) when the offsets API listens on non-loopback "
                f"{self.host!r}",
            )
        if self.token is not None:
            try:  # the checks of every reader's token, made here to name the key
                ReaderToken("token", self.token)
            except ConfigError as error:
                raise ConfigError("token", error.detail) from None

    @property
    def connections_per_reader(self) -> int | None:
        """Open connections one token may hold (``reader_connection_share`` of ``max_connections``, at least
        one); None: no bound of its own."""
        if self.reader_connection_share >= 1:
            return None
        return max(1, int(self.max_connections * self.reader_connection_share))

    @property
    def authenticates(self) -> bool:
        """Whether readers must present a token."""
        return bool(self.token or self.tokens or self.tokens_file)

    def reader_tokens(self) -> ReaderTokens | None:
        """The tokens this configuration sets (None: readers are not asked for one); ``ConfigError`` when
        ``tokens_file`` does not load."""
        if not self.authenticates:
            return None
        inline = list(self.tokens)
        if self.token:
            inline.insert(0, ReaderToken("token", self.token))
        try:
            return ReaderTokens(inline, self.tokens_file)
        except ConfigError as error:
            key = "tokens_file" if self.tokens_file else "tokens"
            detail = error.detail if error.path in ("tokens", "tokens_file") else str(error)
            raise ConfigError(f"offsets_api.{key}", detail) from None


DEFAULT_ADMIN_PORT = 9883
"""1883 (MQTT) + 8000: easy to remember, clear of MQTT's 1883/8883 and of the usual Prometheus exporters."""


@dataclass
class AdminHttpConfig:
    """Where the admin endpoint listens."""

    enabled: bool = True
    """Serve ``/metrics`` and ``/health``."""
    host: str = "127.0.0.1"
    """Address to bind; loopback by default because the endpoint has no authentication."""
    port: int = DEFAULT_ADMIN_PORT
    """TCP port; 0 picks a free one (tests)."""
    max_connections: int = 64
    """Open connections; more are answered 503 and closed."""
    request_timeout_s: float = 10.0
    """Seconds for a request's headers to arrive; a connection still sending them is closed."""
    min_read_bytes_per_s: int = 65_536
    """Slowest rate a client may take an answer at: an answer of N bytes not taken within
    ``request_timeout_s`` + N / this seconds is abandoned and its connection closed (one WARNING); 0 = no
    minimum."""

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65_535:
            raise ConfigError("port", f"must be between 0 and 65535, got {self.port!r}")
        if not self.host:
            raise ConfigError("host", "must not be empty")
        check_bind_host(self.host)
        check_http_limits(self.max_connections, self.request_timeout_s, self.min_read_bytes_per_s)


def _default_listeners() -> list[ListenerConfig]:
    return [ListenerConfig()]


@dataclass
class BrokerConfig:
    """Everything a broker reads at start; each section is documented in docs/configuration.md."""

    listeners: list[ListenerConfig] = field(default_factory=_default_listeners)
    """MQTT listeners (at least one)."""
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    acl: AclConfig = field(default_factory=AclConfig)
    storage: BrokerStorageConfig = field(default_factory=BrokerStorageConfig)
    offsets_api: OffsetsApiConfig = field(default_factory=OffsetsApiConfig)
    admin_http: AdminHttpConfig = field(default_factory=AdminHttpConfig)
    sys_topics: SysTopicsConfig = field(default_factory=SysTopicsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    retain: RetainConfig = field(default_factory=RetainConfig)
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    cluster: ClusterConfig | None = None
    """Join a cluster of brokers coordinated by etcd (docs/cluster.md); unset = run alone."""
    uplink: UplinkConfig | None = None
    """Send this broker's logs to a hub over a connection it opens (docs/uplink.md); unset = no uplink."""
    uplink_hub: UplinkHubConfig | None = None
    """Take sites' uplinks and hold their logs at their offsets (docs/uplink.md); unset = not a hub."""

    def __post_init__(self) -> None:
        if not self.listeners:
            raise ConfigError("listeners", "at least one listener is required")
        seen: set[str] = set()
        for index, listener in enumerate(self.listeners):
            if listener.name in seen:
                raise ConfigError(f"listeners[{index}].name", f"duplicate listener name {listener.name!r}")
            seen.add(listener.name)
            if not self.listener_allows_anonymous(listener) and not self.auth.password_file:
                client_certs = listener.tls is not None and listener.tls.require_client_cert
                if not client_certs:
                    raise ConfigError(
                        f"listeners[{index}]",
                        f"listener {listener.name!r} on {listener.host} would accept nobody: it requires "
                        "authentication (not loopback) but there is no auth.password_file and no client "
                        "certificates; set allow_anonymous: true to accept anonymous clients",
                    )
        self._check_record_floor()
        if self.cluster is not None:
            self._check_cluster(self.cluster)
        for name in ("uplink", "uplink_hub"):
            if getattr(self, name) is not None and not self.storage.enabled:
                raise ConfigError(name, "the uplink carries the commitlog: set storage.enabled: true")
        if self.offsets_api.enabled and not self.storage.enabled:
            self.offsets_api.enabled = False
        check_distinct_ports(self.bound_endpoints())

    def _check_record_floor(self) -> None:
        """``storage.max_record_bytes`` must hold a 1-byte payload from the longest client id accepted, at
        QoS 2 too (its record keeps the publisher's packet id)."""
        longest_id = self.limits.max_client_id_length
        floor = MIN_BODY_SIZE + U16.size + longest_id + 1
        if self.storage.max_record_bytes < floor:
            raise ConfigError(
                "storage.max_record_bytes",
                f"must be at least {floor}, the record of a 1-byte QoS 2 payload from a client id of "
                f"limits.max_client_id_length ({longest_id}) bytes: a {MIN_BODY_SIZE}-byte header, the "
                f"{U16.size}-byte packet id a QoS 2 record keeps, the client id and the payload; got "
                f"{self.storage.max_record_bytes}",
            )

    def _check_cluster(self, cluster: ClusterConfig) -> None:
        if not self.storage.enabled:
            raise ConfigError("cluster", "a cluster node needs its commitlog: set storage.enabled: true")
        if self.storage.partitions == 1:  # the default: store each cluster partition's topics apart
            self.storage.partitions = min(cluster.partitions, MAX_STORAGE_PARTITIONS)
        if not self.offsets_api.enabled:
            raise ConfigError(
                "cluster", "peers replicate through the offsets API: set offsets_api.enabled: true"
            )
        if cluster.advertise.mqtt is None and self.listeners[0].host in WILDCARD_HOSTS:
            raise ConfigError(
                "cluster.advertise.mqtt", "required when the first listener binds every interface"
            )
        if cluster.advertise.offsets_api is None and self.offsets_api.host in WILDCARD_HOSTS:
            raise ConfigError(
                "cluster.advertise.offsets_api", "required when the offsets API binds every interface"
            )
        members_host = self.members_host(cluster)
        if cluster.advertise.peer is None and members_host in WILDCARD_HOSTS:
            raise ConfigError(
                "cluster.advertise.peer", "required when the members' endpoint binds every interface"
            )
        try:
            cluster.check_members_endpoint(members_host)
        except ConfigError as error:
            raise ConfigError(f"cluster.{error.path}", error.detail) from None

    def members_host(self, cluster: ClusterConfig) -> str:
        """Where the members' endpoint binds: ``cluster.listen.host``, else the offsets API's host."""
        return cluster.listen.host if cluster.listen.host is not None else self.offsets_api.host

    def bound_endpoints(self) -> list[BoundEndpoint]:
        """Every socket this configuration binds, by the key of its port (each needs its own)."""
        endpoints = [
            BoundEndpoint(f"listeners[{index}].port", listener.host, listener.port)
            for index, listener in enumerate(self.listeners)
        ]
        if self.offsets_api.enabled:
            endpoints.append(BoundEndpoint("offsets_api.port", self.offsets_api.host, self.offsets_api.port))
        if self.admin_http.enabled:
            endpoints.append(BoundEndpoint("admin_http.port", self.admin_http.host, self.admin_http.port))
        if self.cluster is not None:
            host = self.members_host(self.cluster)
            endpoints.append(BoundEndpoint("cluster.listen.port", host, self.cluster.listen.port))
        if self.uplink_hub is not None:
            endpoints.append(BoundEndpoint("uplink_hub.port", self.uplink_hub.host, self.uplink_hub.port))
        return endpoints

    def listener_allows_anonymous(self, listener: ListenerConfig) -> bool:
        """The effective anonymous rule of a listener: its own setting, then ``auth``, then loopback-only."""
        setting = (
            listener.allow_anonymous if listener.allow_anonymous is not None else self.auth.allow_anonymous
        )
        return anonymous_allowed(setting, listener.host)

    def descriptor_needs(self) -> dict[str, int]:
        """File descriptors every part but client connections may hold, by the setting that sets them
        (``broker_edge.process.descriptors`` shares the process's limit with these first)."""
        needs = {"listeners": len(self.listeners)}
        if self.storage.enabled:
            needs["storage.max_open_files"] = self.storage.max_open_files + 2  # + the directory's syncs
        if self.admin_http.enabled:
            needs["admin_http.max_connections"] = self.admin_http.max_connections + 1
        if self.offsets_api.enabled:
            needs["offsets_api.max_connections"] = self.offsets_api.max_connections + 1
        if self.cluster is not None:  # members connect in, and this broker out to them
            needs["cluster.listen.max_connections"] = 2 * self.cluster.listen.max_connections + 1
        return needs

    def named_files(self, own_member: bool = True) -> list[tuple[str, str | None]]:
        """Every file a setting names, by dotted key (TLS servers' files apart: see ``server_tls``);
        ``own_member`` False: not ``cluster.tls``' certificate and key, which name the members' own files
        (``timestone broker --workers``)."""
        files: list[tuple[str, str | None]] = [
            ("auth.password_file", self.auth.password_file),
            ("acl.file", self.acl.file),
            ("offsets_api.tokens_file", self.offsets_api.tokens_file if self.offsets_api.enabled else None),
        ]
        cluster = self.cluster
        if cluster is not None:
            for section, tls_files in (("etcd_tls", cluster.etcd_tls), ("tls", cluster.tls)):
                for name in ("certfile", "keyfile", "cafile"):
                    if own_member or section != "tls" or name == "cafile":
                        files.append((f"cluster.{section}.{name}", getattr(tls_files, name, None)))
            auth = cluster.etcd_auth
            files.append(("cluster.etcd_auth.password_file", auth.password_file if auth else None))
        if self.uplink is not None:
            files += [
                (f"uplink.tls.{name}", getattr(self.uplink.tls, name))
                for name in ("certfile", "keyfile", "cafile")
            ]
        return files

    def server_tls(self) -> list[tuple[str, TlsConfig]]:
        """Every TLS server this configuration runs, by the dotted key of its ``tls`` section."""
        servers = [
            (f"listeners[{index}].tls", listener.tls)
            for index, listener in enumerate(self.listeners)
            if listener.tls is not None
        ]
        if self.offsets_api.enabled and self.offsets_api.tls is not None:
            servers.append(("offsets_api.tls", self.offsets_api.tls))
        if self.uplink_hub is not None:
            servers.append(("uplink_hub.tls", self.uplink_hub.tls))
        return servers


def check_files_of(config: BrokerConfig, own_member: bool = True) -> None:
    """Read every file ``config`` names, before anything is opened (``ConfigError`` naming the key);
    ``own_member``: as ``BrokerConfig.named_files``."""
    check_named_files(config.named_files(own_member))
    for key, tls in config.server_tls():
        check_server_tls(key, tls)
    if config.uplink is not None:  # a site's TLS client, loaded as each dial loads it
        site = config.uplink.tls
        client_ssl_context(site.certfile, site.keyfile, site.cafile, "uplink.tls")


def load_broker_config(path: str | Path | None = None) -> BrokerConfig:
    """The configuration in ``path`` (YAML), or the defaults when ``path`` is None; every file it names has
    been read once (``check_files_of``)."""
    return load_broker_document(path)[1]


def read_broker_settings(path: str | Path) -> BrokerConfig:
    """The configuration in ``path`` (YAML) without reading the files it names: for a tool that uses a few
    of a broker's settings on another machine (``cluster status``: the cluster's etcd), where the broker's
    password file, ACL and certificates are not."""
    return load_dataclass(BrokerConfig, load_yaml_file(path))


def load_broker_document(
    path: str | Path | None, own_member: bool = True
) -> tuple[dict[str, Any], BrokerConfig]:
    """The YAML document of ``path`` ({} when None) and the configuration it holds, as
    ``load_broker_config``: the file is read once (a pipe, ``-c <(envsubst < broker.yaml)``, reads empty a
    second time, and a named pipe opened again waits for a writer). ``own_member`` False: the file of
    ``--workers``, whose members read certificates of their own (``BrokerConfig.named_files``)."""
    document = load_yaml_file(path) if path is not None else {}
    config = load_dataclass(BrokerConfig, document)
    check_files_of(config, own_member)
    return document, config


WORKERS_DIRECTORY = "workers"
"""Under ``storage.directory``: the members of ``timestone broker --workers`` (``runtime.workers``), each
``w<n>`` with its data directory, its configuration ``w<n>.yaml`` and its ``w<n>.pid``, and their etcd."""


def workers_cluster(config: BrokerConfig) -> ClusterConfig | None:
    """The cluster the members of ``timestone broker --workers`` with ``config`` (no ``cluster:`` section)
    run, or last ran, in: the first member's configuration's, which names the command's own etcd (on a
    port free at its start); None when no command of ``config`` wrote one."""
    path = Path(config.storage.directory) / WORKERS_DIRECTORY / "w0.yaml"
    if not path.is_file():
        return None
    return load_broker_config(path).cluster
