"""Listening sockets as asyncio's servers bind them, for the servers the broker runs itself (its native TCP
transport, its TLS listeners)."""

from __future__ import annotations

import socket

__all__ = ["listening_sockets"]


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
