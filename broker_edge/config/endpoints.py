"""How a reader of an edge broker reaches it: one ``BrokerEndpoint``, one way to write it as text.

The Spark source, the telemetry and OTA pipelines and their configs all name brokers the same way: a stable
name (the key of that broker in checkpointed offsets) and its offsets-API base URL, plus, for the jobs that
also publish, the MQTT address. In text (the source's ``brokers`` option, a YAML list) a broker is
``name=url``, or a bare ``url`` that is then also its name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from broker_edge.config.loader import ConfigError

__all__ = ["BrokerEndpoint", "format_endpoints", "is_base_url", "parse_endpoint", "parse_endpoints"]

_NAMED = re.compile(r"^([A-Za-z0-9_.\-]+)=(.+)$")


@dataclass(frozen=True)
class BrokerEndpoint:
    """One edge broker as a job reaches it: the offsets API to read logs, MQTT to publish."""

    name: str = "edge1"
    """Stable key of this broker (checkpointed offsets are per name)."""
    offsets_api: str = "http://127.0.0.1:9884"
    """Base URL of its offsets API (``http://`` or ``https://``)."""
    token: str | None = field(default=None, repr=False)
    """Bearer token of the offsets API, if it asks for one."""
    mqtt_host: str = "127.0.0.1"
    mqtt_port: int = 1883
    mqtt_tls: bool = False
    """MQTT over TLS (``mqtt_port`` a ``type: tls`` listener), the broker's certificate checked against the
    job's ``tls.cafile`` (or the system's CAs)."""
    username: str | None = None
    """MQTT user name of a job that publishes (OTA)."""
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("name", "must not be empty")
        if not is_base_url(self.offsets_api):
            raise ConfigError("offsets_api", f"must be an http(s) URL, got {self.offsets_api!r}")
        if self.offsets_api.endswith("/"):
            object.__setattr__(self, "offsets_api", self.offsets_api.rstrip("/"))
        if isinstance(self.mqtt_port, bool) or not 0 < self.mqtt_port < 65536:
            raise ConfigError("mqtt_port", f"must be a TCP port, got {self.mqtt_port}")


def is_base_url(url: str) -> bool:
    """Whether ``url`` is an http(s) URL with a host, and a port from 1 to 65535 if it names one."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    try:
        port = parts.port
    except ValueError:  # not a number, or past 65535
        return False
    return port is None or port > 0


def parse_endpoint(text: str) -> BrokerEndpoint:
    """``name=url`` or ``url`` (named after itself); ``ConfigError`` names what is wrong."""
    item = text.strip()
    named = _NAMED.match(item)
    if named and "://" in named.group(2) and "://" not in named.group(1):
        name, url = named.group(1), named.group(2).strip()
    else:
        name, url = "", item
    url = url.rstrip("/")
    try:
        return BrokerEndpoint(name or url, url)
    except ConfigError as exc:
        raise ConfigError(
            "", f"expected an http(s) base URL or name=url, got {text!r} (e.g. edge1=http://host:8081)"
        ) from exc


def parse_endpoints(text: str) -> tuple[BrokerEndpoint, ...]:
    """A comma-separated list of ``parse_endpoint`` entries, with unique names."""
    endpoints = []
    for item in text.split(","):
        if not item.strip():
            raise ConfigError("", f"empty entry in {text!r}")
        endpoints.append(parse_endpoint(item))
    names = [endpoint.name for endpoint in endpoints]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError("", f"broker names must be unique, repeated: {', '.join(repeated)}")
    return tuple(endpoints)


def format_endpoints(endpoints: Iterable[BrokerEndpoint]) -> str:
    """The text ``parse_endpoints`` reads back (the Spark source's ``brokers`` option)."""
    return ",".join(f"{endpoint.name}={endpoint.offsets_api}" for endpoint in endpoints)
