"""Two endpoints of one broker configured on one address: refused at load, naming both keys.

A broker binds several sockets (its MQTT listeners, the offsets API, the admin endpoint, the members'
endpoint, a hub's uplink endpoint). Two of them on one port of overlapping addresses either fail at start
with an ``EADDRINUSE`` that names neither setting, or, where the kernel lets both bind (``SO_REUSEPORT``),
start with clients of one protocol landing on the server of another. Port 0 (a free one) never clashes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from broker_edge.config.loader import ConfigError

__all__ = ["BoundEndpoint", "check_distinct_ports", "hosts_overlap"]

_ANY = ""
_ANY_IPV4 = "0.0.0.0"
_ANY_IPV6 = "::"
_LOCALHOST = ("127.0.0.1", "::1")
"""The addresses ``localhost`` binds (the one name known without asking a resolver)."""


@dataclass(frozen=True)
class BoundEndpoint:
    """One socket a configuration binds, by the dotted key of its ``port`` setting."""

    key: str
    host: str
    port: int


def _version(host: str) -> int | None:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None  # a host name: it may resolve to either family


def hosts_overlap(first: str, second: str) -> bool:
    """Whether binding one port on both hosts can clash: the same host, or a wildcard covering the other
    (``0.0.0.0`` covers IPv4 addresses and names, ``::`` IPv6 ones and names: its sockets are IPv6 only);
    ``localhost`` is its loopback addresses, other names are not resolved (equal names overlap)."""
    if first == second or _ANY in (first, second):
        return True
    if "localhost" in (first, second):
        firsts = _LOCALHOST if first == "localhost" else (first,)
        seconds = _LOCALHOST if second == "localhost" else (second,)
        return any(hosts_overlap(one, other) for one in firsts for other in seconds)
    for wildcard, family in ((_ANY_IPV4, 4), (_ANY_IPV6, 6)):
        for one, other in ((first, second), (second, first)):
            if one == wildcard and _version(other) in (family, None):
                return True
    return False


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
