"""A stopped server's port kept from everyone else until the server starts there again."""

from __future__ import annotations

import socket


class PortKeeper:
    """Binds ``host:port`` without listening while its server is away: dials there are refused as by a
    stopped server, yet no other test's listener or outgoing connection can take the port in the meantime
    (tests run in parallel, and the kernel hands out a freed port again). ``release()`` right before the
    server starts there again."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))

    def release(self) -> None:
        self._socket.close()
