"""Two endpoints of one broker configured on one address: refused at load, naming both keys.

A broker binds several sockets (its MQTT listeners, the offsets API, the admin endpoint, the members'
endpoint, a hub's uplink endpoint). Two of them on one port of overlapping addresses either fail at start
with an ``EADDRINUSE`` that names neither setting, or, where the kernel lets both bind (``SO_REUSEPORT``),
start with clients of one protocol landing on the server of another. Port 0 (a free one) never clashes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from broker_edge.config.loader import ConfigError
from broker_edge.process.sockets import hosts_overlap

__all__ = ["BoundEndpoint", "check_distinct_ports"]


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
