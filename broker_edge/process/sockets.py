"""Listening sockets as asyncio's servers bind them, for the servers the broker runs itself (its native TCP
transport, its TLS listeners)."""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["hosts_overlap", "listening_sockets"]

_ANY = ""
_ANY_IPV4 = "0.0.0.0"
_ANY_IPV6 = "::"
_LOCALHOST = ("127.0.0.1", "::1")
"""The addresses ``localhost`` binds (the one name known without asking a resolver)."""


def listening_sockets(
    host: str | None, port: int, backlog: int, reuse_port: bool = False
) -> list[socket.socket]:
    """Non-blocking sockets bound to every address of ``host`` (None or "": all interfaces) at ``port``,
    as asyncio's ``create_server`` binds them (``SO_REUSEADDR``, IPv6 sockets IPv6 only); ``reuse_port``:
    with ``SO_REUSEPORT``, so that several processes listen on the same address."""
    infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


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


def _version(host: str) -> int | None:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None  # a host name: it may resolve to either family
