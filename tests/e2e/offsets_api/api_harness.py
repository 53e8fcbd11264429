"""A real LogStore and offsets API server on 127.0.0.1:0, run on an event loop in a background thread.

Tests talk to it with real HTTP (the blocking client or raw `http.client`); appends are run on the loop
thread (the store belongs to its loop) and wait until durable, so they are visible to the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import logging
import os
import socket
import ssl
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from broker_edge.http.guard import GuardedRunner
from broker_edge.offsets_api.requests import ApiLimits
from broker_edge.offsets_api.server import create_app, serve, serve_app
from broker_edge.security.http_budget import MemoryBudget
from broker_edge.storage import AppendRecord, LogStore, StorageConfig

TOKEN = "s3cret-token"
BASE_TIME_MS = 1_700_000_000_000


def sample_record(number: int) -> AppendRecord:
    """Records with user properties, a content type on even numbers and a binary payload on every third."""
    payload = bytes([0xFF, 0xFE, number % 256]) if number % 3 == 2 else f'{{"n": {number}}}'.encode()
    return AppendRecord(
        payload=payload,
        qos=1,
        retain=number == 0,
        client_id=f"device-{number % 4}",
        user_properties=[("seq", str(number))],
        content_type="application/json" if number % 2 == 0 else None,
        timestamp_ms=BASE_TIME_MS + 1000 * number,
    )


def write_damaged_log(directory: Path, topic: str = "t") -> StorageConfig:
    """A store whose `topic` holds records 0, 1, 2 (one per segment), record 1 with a flipped payload byte.

    Returns the config to reopen it with (sealed segments keep their clean index, so the damage is
    found by the checksum at read time).
    """
    config = StorageConfig(group_commit_ms=1, segment_bytes=100)
    store = LogStore(directory, config)
    store.open()
    for number in range(3):
        store.append(topic, sample_record(number))
    store.close()
    sealed = directory / "log" / "00" / f"{1:020d}.log"  # the second segment: record 1 alone
    data = bytearray(sealed.read_bytes())
    data[-3] ^= 0xFF
    sealed.write_bytes(bytes(data))
    return config


class ApiHarness:
    """One store + server (with `limits`, within `budget` when given); `append` and `run` execute on the
    server's loop."""

    def __init__(
        self,
        directory: Path,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        config: StorageConfig | None = None,
        limits: ApiLimits | None = None,
        budget: MemoryBudget | None = None,
    ) -> None:
        self.directory = directory
        self._limits = limits
        self._budget = budget
        self._token = token
        self._ssl_context = ssl_context
        self._config = config or StorageConfig(group_commit_ms=1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="offsets-api-test", daemon=True)
        self._thread.start()
        self.store: LogStore = self.run(self._open_store())
        self.runner: GuardedRunner
        self.port: int
        self.runner, self.port = self.run(self._serve())

    @property
    def base_url(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://127.0.0.1:{self.port}"

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run `coroutine` on the server loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)

    def append(self, topic: str, *records: AppendRecord) -> list[int]:
        """Append on the loop and wait until durable (readable through the API)."""

        async def append_all() -> list[int]:
            offsets = [self.store.append(topic, record) for record in records]
            await self.store.wait_durable()
            return offsets

        return self.run(append_all())

    def append_later(self, topic: str, record: AppendRecord, delay_s: float) -> None:
        """Schedule an append `delay_s` from now (to wake a long-poll that is already waiting)."""
        self._loop.call_soon_threadsafe(self._loop.call_later, delay_s, self.store.append, topic, record)

    def stop_server(self) -> None:
        self.run(self.runner.cleanup())

    def restart_server(self) -> None:
        """Serve again on the same port (a broker restart as a client sees it)."""
        self.stop_server()
        self.runner, self.port = self.run(self._serve(self.port))

    def close(self) -> None:
        self.run(self.runner.cleanup())
        self.run(self._close_store())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _open_store(self) -> LogStore:
        store = LogStore(self.directory, self._config)
        store.open()
        return store

    async def _close_store(self) -> None:
        self.store.close()

    async def _serve(self, port: int = 0) -> tuple[GuardedRunner, int]:
        if self._budget is None:
            return await serve(self.store, "127.0.0.1", port, self._token, self._ssl_context, self._limits)
        app = create_app(self.store, self._token, self._limits)
        return await serve_app(app, "127.0.0.1", port, self._ssl_context, self._limits, self._budget)


def status_of(port: int, target: str, token: str = "spark-secret", timeout_s: float = 5.0) -> int:
    """The status of ``GET target`` with ``token``, on a connection of its own (``timeout_s`` per socket
    operation)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        connection.request("GET", target, headers={"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def read_until_closed(sock: socket.socket) -> bytes:
    """What ``sock`` receives until the server closes it (or resets it, or its timeout passes)."""
    data = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def logged_errors(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    """The records among ``records`` at ERROR or with a traceback, but py4j's (some on the root logger): a
    Spark session of an earlier test on the same worker may log its gateway's closed connection while this
    one runs."""
    return [
        r
        for r in records
        if f"{os.sep}py4j{os.sep}" not in r.pathname and (r.levelno >= logging.ERROR or r.exc_info)
    ]
