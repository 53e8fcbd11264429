"""Requests to etcd's JSON gateway over a kept-alive connection: the tests' own reads and writes of etcd.

A test polls etcd's records many times a second while it waits for a cluster to settle or a partition to
move. Opened per request (``urllib``), each poll paid a TLS handshake with a client certificate on both
sides and a new SSL context in the test's process, about 15 ms of CPU between the test and etcd, where the
request itself costs well under one. ``GatewayConnections`` keeps one connection per thread (a test's
threads poll too) and one SSL context per server, and says what fails as ``urllib`` did: an ``OSError``
when etcd cannot be reached or answers nothing in time (paused, stopped), ``urllib.error.HTTPError`` for an
answer that is not 200.

A kept connection that etcd closed (a restart) is closed here too and the request sent once more on a new
one; one that timed out (etcd paused) is closed and the timeout raised, as a new connection's would be. The
gateway's range and put are idempotent, so sending one again changes nothing.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.error
from collections.abc import Callable
from email.message import Message
from typing import Any
from urllib.parse import urlsplit

__all__ = ["GatewayConnections"]


class GatewayConnections:
    """POSTs of JSON to the etcd at ``url`` (``http://`` or ``https://`` with ``context()``'s SSL context,
    made once, on first use), each thread on a connection of its own, kept between requests."""

    def __init__(
        self, url: str, context: Callable[[], ssl.SSLContext | None], timeout_s: float = 5.0
    ) -> None:
        parts = urlsplit(url)
        self.url = url
        self._secure = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port
        self._make_context = context
        self._context: ssl.SSLContext | None = None
        self._timeout_s = timeout_s
        self._local = threading.local()

    def post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """The JSON answer of ``path`` to ``body``; ``HTTPError`` when the status is not 200."""
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **headers}
        kept = getattr(self._local, "connection", None)
        while True:
            connection = kept or self._connect()
            try:
                connection.request("POST", path, data, headers)
                answer = connection.getresponse()
                payload = answer.read()
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                self._local.connection = None
                if connection is kept and not isinstance(exc, TimeoutError):  # closed meanwhile: a new one
                    kept = None
                    continue
                raise OSError(f"etcd at {self.url}{path}: {exc!r}") from exc
            self._local.connection = connection
            if answer.status != 200:
                fields = Message()
                for name, value in answer.getheaders():
                    fields[name] = value
                raise urllib.error.HTTPError(f"{self.url}{path}", answer.status, answer.reason, fields, None)
            document: dict[str, Any] = json.loads(payload)
            return document

    def close(self) -> None:
        """Close this thread's connection (the others' close with their threads or the process)."""
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def _connect(self) -> http.client.HTTPConnection:
        if not self._secure:
            return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)
        if self._context is None:
            self._context = self._make_context()
        return http.client.HTTPSConnection(
            self._host, self._port, timeout=self._timeout_s, context=self._context
        )
