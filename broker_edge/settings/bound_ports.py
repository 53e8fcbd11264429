"""Two endpoints of one broker configured on one address: refused at load, naming both keys.

A broker binds several sockets (its MQTT listeners, the offsets API, the admin endpoint, the members'
endpoint, a hub's uplink endpoint). Two of them on one port of overlapping addresses either fail at start
with an ``EADDRINUSE`` that names neither setting, or, where the kernel lets both bind (``SO_REUSEPORT``),
start with clients of one protocol landing on the server of another. Port 0 (a free one) never clashes.
A host that is neither an IP address nor a host name (``0.0.0.0:8883``) is refused at load too: the start
would fail on it with a resolver error that names no setting.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from broker_edge.config.loader import ConfigError
from broker_edge.process.sockets import hosts_overlap

__all__ = ["WILDCARD_HOSTS", "BoundEndpoint", "check_bind_host", "check_distinct_ports"]

WILDCARD_HOSTS = ("0.0.0.0", "::", "")
"""Hosts that bind every interface."""

_LABEL = r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}\.?\Z){_LABEL}(?:\.{_LABEL})*\.?")
"""A DNS host name: dot-separated labels of 1-63 letters, digits, ``-`` (not first nor last) or ``_``."""


def check_bind_host(host: str) -> None:
    """Raise ``ConfigError`` naming ``host`` unless it is an IP address (v4 or v6), a host name, or empty
    (whether empty is allowed is its section's own check)."""
    if not host or _HOST_NAME.fullmatch(host):
        return
    try:
        ipaddress.ip_address(host)
    except ValueError:
        name, colon, port = host.rpartition(":")
        hint = "; give the port in port" if colon and name and port.isdigit() else ""
        raise ConfigError("host", f"not an address or host name ({host!r}{hint})") from None


@dataclass(frozen=True)
class BoundEndpoint:
    """One socket a configuration binds, by the dotted key of its ``port`` setting."""

    key: str
    host: str
    port: int


def check_distinct_ports(endpoints: Iterable[BoundEndpoint]) -> None:
    """Raise ``ConfigError`` on the later of two endpoints bound to one port of overlapping hosts."""
    earlier: list[BoundEndpoint] = []
    for endpoint in endpoints:
        if endpoint.port == 0:
            continue
        for other in earlier:
            if other.port == endpoint.port and hosts_overlap(other.host, endpoint.host):
                raise ConfigError(
                    endpoint.key,
                    f"port {endpoint.port} on {endpoint.host or 'every interface'} is already "
                    f"{other.key} (on {other.host or 'every interface'}): each endpoint needs its own port",
                )
        earlier.append(endpoint)
