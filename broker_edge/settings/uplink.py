"""The ``uplink:`` section (a site that dials out to a hub) and the ``uplink_hub:`` section (a hub that takes
sites' logs): dataclasses and checks only, so a broker without them loads nothing of ``broker_edge.uplink``.

A site is named by its id, which its certificate carries as the URI subject alternative name
``timestone://site/<site_id>``; the hub stores its logs as ``$site/<site_id>/<topic>`` (docs/uplink.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import SplitResult, urlsplit

from broker_edge.config.loader import ConfigError, expand_home
from broker_edge.protocol.errors import InvalidTopic
from broker_edge.protocol.topics import topic_matches, validate_topic_filter
from broker_edge.security.tls import TlsConfig
from broker_edge.settings.bound_ports import check_bind_host

__all__ = [
    "SITE_ID",
    "SITE_PREFIX",
    "Compression",
    "HubTlsConfig",
    "UplinkConfig",
    "UplinkHubConfig",
    "UplinkTlsConfig",
    "site_topic",
]

SITE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
"""A site id: a topic level and a path segment everywhere it appears (no ``/``, ``+``, ``#`` nor ``$``)."""
SITE_PREFIX = "$site/"
"""The hub's namespace of sites' logs: ``$site/<site_id>/<topic>`` (devices cannot publish under ``$``)."""

Compression = Literal["zstd", "zlib", "none"]
MIN_KEEPALIVE_S = 1.0
MAX_KEEPALIVE_S = 3600.0
MAX_WAIT_S = 3600.0
"""Most seconds of ``reconnect_min_s``, ``reconnect_max_s`` and ``heartbeat_s``: a site that waits longer
between dials, or between looks at its logs, is a slip of units, not a setting (1e300 never dialled again)."""


def site_topic(site_id: str, topic: str) -> str:
    """The hub's name of a site's topic."""
    return f"{SITE_PREFIX}{site_id}/{topic}"


@dataclass
class UplinkTlsConfig:
    """The site's side of the uplink's mutual TLS."""

    certfile: str
    """PEM certificate of this site, naming it as the URI subject alternative name
    ``timestone://site/<site_id>`` (the hub's only proof of who writes)."""
    keyfile: str
    """PEM private key of ``certfile`` (unencrypted; keep it at mode 0600)."""
    cafile: str
    """PEM CA certificates the hub's server certificate must chain to."""
    check_hostname: bool = True
    """Check that the hub's certificate names the host of the hub's address."""

    def __post_init__(self) -> None:
        expand_home(self, "certfile", "keyfile", "cafile")
        for name in ("certfile", "keyfile", "cafile"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(name, "must name a PEM file")


def _default_topics() -> list[str]:
    return ["#"]


def _default_downlink() -> list[str]:
    return ["actions/all", "actions/groups/#", "actions/buckets/#", "actions/devices/#"]


@dataclass
class UplinkConfig:
    """This broker is a site: it sends its logs to a hub over one connection it opens (docs/uplink.md)."""

    hubs: list[str]
    """The hub's uplink endpoints, ``wss://host:port/v1/uplink``; tried in turn when one cannot be reached."""
    site_id: str
    """This site's id; its certificate must name it (``timestone://site/<site_id>``)."""
    tls: UplinkTlsConfig
    """The site's certificate and key, and the CA of the hub's certificate."""
    topics: list[str] = field(default_factory=_default_topics)
    """Topic filters of the logs sent up (default ``#``: every log this broker persists)."""
    downlink: list[str] = field(default_factory=_default_downlink)
    """Topic filters of the hub's logs mirrored into this site's log at the hub's offsets (default: the
    actions job's action topics; devices' reports on ``actions/reports/...`` go up); written only by the hub
    here, never sent up; ``[]`` = none."""
    compression: Compression = "zstd"
    """How batches travel: ``zstd``, ``zlib`` or ``none``."""
    bandwidth_bytes_per_s: int | None = None
    """Upper bound of the bytes sent per second (after compression); null = no limit."""
    batch_bytes: int = 1_048_576
    """Stored bytes of records in one batch, at most (a record larger than it travels alone)."""
    max_batches_in_flight: int = 4
    """Batches sent and not yet acknowledged by the hub, at most."""
    reconnect_min_s: float = 0.5
    """First wait before dialling again after the connection failed (doubles up to ``reconnect_max_s``). At
    most 3600 (an hour)."""
    reconnect_max_s: float = 30.0
    """Longest wait between two attempts to reach the hub. At most 3600 (an hour)."""
    heartbeat_s: float = 5.0
    """Seconds between two reports of this site's log ends when nothing else is sent (the hub's lag). At most
    3600 (an hour)."""
    keepalive_s: float = 15.0
    """Seconds the link may stay silent before the site pings the hub; a hub that does not answer within
    half of that is taken for gone and the site dials again, so a silent cut is noticed within 1.5 x this."""
    proxy: str | None = None
    """An HTTP proxy the connection goes through (``http://proxy:3128``; another scheme, or none, is refused
    at start); null = direct."""
    retention_warning_ratio: float = 0.8
    """Warn (and count in ``uplink_unsent_at_risk_records``) before retention would delete unsent records:
    when a log's unsent records are older than this share of its ``retention_ms``, or lie in the oldest
    bytes it would lose once larger than this share of its ``retention_bytes`` (``storage`` or its
    ``persist`` rule's)."""

    def __post_init__(self) -> None:
        if not isinstance(self.hubs, list) or not self.hubs:
            raise ConfigError("hubs", "at least one hub address (wss://host:port/v1/uplink) is required")
        for index, hub in enumerate(self.hubs):
            parts = urlsplit(hub) if isinstance(hub, str) else None
            if parts is None or parts.scheme != "wss" or not parts.hostname:
                raise ConfigError(f"hubs[{index}]", f"expected wss://host:port/path, got {hub!r}")
            if parts.path in ("", "/"):  # the hub answers 404 there, at every dial
                raise ConfigError(
                    f"hubs[{index}]",
                    f"expected wss://host:port/path, the path the hub's uplink_hub.path names (/v1/uplink by "
                    f"default), got {hub!r}",
                )
            _check_port(parts, f"hubs[{index}]")
        if self.proxy is not None:
            parts = urlsplit(self.proxy) if isinstance(self.proxy, str) else None
            if parts is None or parts.scheme != "http" or not parts.hostname:
                raise ConfigError("proxy", f"expected http://host:port, got {self.proxy!r}")
            _check_port(parts, "proxy")
        if not isinstance(self.site_id, str) or not SITE_ID.match(self.site_id):
            raise ConfigError("site_id", f"letters, digits, '_', '.', '-' (at most 63), got {self.site_id!r}")
        if not self.topics:
            raise ConfigError("topics", "at least one topic filter")
        for index, topic_filter in enumerate(self.topics):
            try:
                validate_topic_filter(topic_filter)
            except InvalidTopic as error:
                raise ConfigError(f"topics[{index}]", str(error)) from None
        _check_downlink(self.downlink, "downlink")
        if self.compression not in ("zstd", "zlib", "none"):
            raise ConfigError("compression", f"expected zstd, zlib or none, got {self.compression!r}")
        if self.bandwidth_bytes_per_s is not None and not _positive_int(self.bandwidth_bytes_per_s):
            raise ConfigError(
                "bandwidth_bytes_per_s",
                f"must be an integer >= 1 or null, got {self.bandwidth_bytes_per_s!r}",
            )
        for name in ("batch_bytes", "max_batches_in_flight"):
            if not _positive_int(getattr(self, name)):
                raise ConfigError(name, f"must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("reconnect_min_s", "reconnect_max_s", "heartbeat_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_WAIT_S:
                raise ConfigError(
                    name, f"must be a number within (0, {MAX_WAIT_S:g}] s (an hour), got {value!r}"
                )
        if isinstance(self.keepalive_s, bool) or not isinstance(self.keepalive_s, (int, float)):
            raise ConfigError("keepalive_s", f"must be a number, got {self.keepalive_s!r}")
        if not MIN_KEEPALIVE_S <= self.keepalive_s <= MAX_KEEPALIVE_S:
            raise ConfigError(
                "keepalive_s",
                f"must be within [{MIN_KEEPALIVE_S:g}, {MAX_KEEPALIVE_S:g}] s, got {self.keepalive_s!r}",
            )
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ConfigError("reconnect_max_s", "must be >= reconnect_min_s")
        if not 0 < self.retention_warning_ratio <= 1:
            raise ConfigError(
                "retention_warning_ratio", f"must be in (0, 1], got {self.retention_warning_ratio!r}"
            )

    def downlinked(self, topic: str) -> bool:
        """Whether ``topic`` is one the hub writes here (devices may not publish to it)."""
        return any(topic_matches(topic_filter, topic) for topic_filter in self.downlink)


@dataclass
class HubTlsConfig(TlsConfig):
    """The hub endpoint's TLS: always mutual, as sites are known by their certificates."""

    require_client_cert: bool = True
    """Refuse sites without a certificate signed by ``cafile``; always true for a hub (``false`` is refused:
    sites are known by their certificates)."""

    def __post_init__(self) -> None:
        if self.require_client_cert is not True:  # written false: refused, never taken as true
            raise ConfigError(
                "require_client_cert", "must be true for a hub (sites are known by their certificates)"
            )
        if not self.cafile:
            raise ConfigError("cafile", "required: sites are known by their certificates")
        super().__post_init__()


@dataclass
class UplinkHubConfig:
    """This broker is a hub: sites dial in here and it holds each one's logs at the site's offsets."""

    tls: HubTlsConfig
    """The endpoint's certificate, and ``cafile``, the CA of the sites' certificates (always required)."""
    host: str = "127.0.0.1"
    """Address to bind."""
    port: int = 9886
    """TCP port; 0 picks a free one."""
    path: str = "/v1/uplink"
    """HTTP path of the WebSocket sites connect to."""
    sites: list[str] | None = None
    """Site ids admitted; null = any site whose certificate chains to ``tls.cafile``."""
    max_connections: int = 1024
    """Open connections (sites and strangers); more are refused."""
    request_timeout_s: float = 10.0
    """Seconds for a connection's request to arrive before it is closed."""
    max_message_bytes: int = 64 * 1024 * 1024
    """Largest batch a site may send (compressed, and once decompressed)."""
    downlink: list[str] = field(default_factory=_default_downlink)
    """Topic filters of this hub's logs sent down to every site (default: the actions job's action topics);
    a site's ``HELLO`` may ask for less, never more; ``[]`` = none."""
    site_downlink: dict[str, list[str]] = field(default_factory=dict)
    """Per site id, the topic filters sent down to that site instead of ``downlink`` (what is meant for
    it: ``{plant-1: [actions/all, actions/groups/line-1]}``). With ``sites`` set, each key must be one of
    them."""

    def downlink_of(self, site: str) -> list[str]:
        """The topic filters of this hub's logs that ``site`` is sent, whatever it asks for."""
        return self.site_downlink.get(site, self.downlink)

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65_535:
            raise ConfigError("port", f"must be between 0 and 65535, got {self.port!r}")
        check_bind_host(self.host)
        if not self.path.startswith("/"):
            raise ConfigError("path", f"must start with '/', got {self.path!r}")
        for index, site in enumerate(self.sites or []):
            if not isinstance(site, str) or not SITE_ID.match(site):
                raise ConfigError(f"sites[{index}]", f"not a site id: {site!r}")
        for name in ("max_connections", "max_message_bytes"):
            if not _positive_int(getattr(self, name)):
                raise ConfigError(name, f"must be an integer >= 1, got {getattr(self, name)!r}")
        if not self.request_timeout_s > 0:
            raise ConfigError("request_timeout_s", f"must be > 0, got {self.request_timeout_s!r}")
        _check_downlink(self.downlink, "downlink")
        if not isinstance(self.site_downlink, dict):
            raise ConfigError("site_downlink", "must map site ids to lists of topic filters")
        for site, filters in self.site_downlink.items():
            if not isinstance(site, str) or not SITE_ID.match(site):
                raise ConfigError(f"site_downlink.{site}", f"not a site id: {site!r}")
            if self.sites is not None and site not in self.sites:  # null: any site, so any id
                listed = ", ".join(self.sites) or "none"
                raise ConfigError(f"site_downlink.{site}", f"not a site of uplink_hub.sites ({listed})")
            _check_downlink(filters, f"site_downlink.{site}")


def _check_downlink(filters: object, name: str) -> None:
    """Topic filters of a hub's own logs (none of its ``$`` topics), or a ``ConfigError`` naming the one."""
    if not isinstance(filters, list):
        raise ConfigError(name, f"must be a list of topic filters, got {filters!r}")
    for index, topic_filter in enumerate(filters):
        try:
            if not isinstance(topic_filter, str):
                raise InvalidTopic(f"not a string: {topic_filter!r}")
            validate_topic_filter(topic_filter)
        except InvalidTopic as error:
            raise ConfigError(f"{name}[{index}]", str(error)) from None
        if topic_filter.startswith("$"):
            raise ConfigError(f"{name}[{index}]", f"the hub's '$' topics are its own: {topic_filter!r}")


def _check_port(parts: SplitResult, key: str) -> None:
    """``ConfigError`` naming ``key`` when the URL's port is no TCP port."""
    try:
        _ = parts.port  # urllib checks the port when asked for it
    except ValueError as error:
        raise ConfigError(key, f"{str(error).lower()}, got {parts.geturl()!r}") from None


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
