"""Fixtures of the timestone source tests: real edge brokers (a LogStore on disk served by the offsets API).

Each broker runs its store and server on an event loop in a background thread (the store belongs to its
loop); appends run on that loop and wait until durable, so the next listing sees them. A broker can stop
serving and serve again on the same port, the way a restarted broker looks to the source.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from broker_edge.offsets_api.server import serve
from broker_edge.runtime.launcher import free_port
from broker_edge.storage import AppendRecord, LogStore, StorageConfig
from sources.broker_stores import without_store
from sources.listed_filters import without_listed

BASE_TIME_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def telemetry(number: int, *, timestamp_ms: int | None = None) -> AppendRecord:
    """A small device record whose payload and properties identify it."""
    return AppendRecord(
        payload=f'{{"n":{number}}}'.encode(),
        qos=1,
        retain=number % 5 == 0,
        client_id=f"device-{number % 3}",
        user_properties=[("seq", str(number))],
        timestamp_ms=BASE_TIME_MS + number if timestamp_ms is None else timestamp_ms,
    )


class EdgeBroker:
    """A LogStore and its offsets API on 127.0.0.1, driven from a background event loop."""

    def __init__(
        self, directory: Path, config: StorageConfig | None = None, token: str | None = None
    ) -> None:
        self._token = token
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="edge-broker-test", daemon=True)
        self._thread.start()
        self.store: LogStore = self.run(self._open(directory, config or StorageConfig(group_commit_ms=1)))
        self.runner: web.AppRunner | None = None
        self.port = self._serve_on_a_free_port()

    @staticmethod
    async def _open(directory: Path, config: StorageConfig) -> LogStore:
        store = LogStore(directory, config)
        store.open()
        return store

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=60)

    def append(self, topic: str, records: list[AppendRecord]) -> list[int]:
        """Append on the broker's loop and return once the records are durable (served by the API)."""

        async def append_all() -> list[int]:
            offsets = [self.store.append(topic, record) for record in records]
            await self.store.wait_durable()
            return offsets

        return self.run(append_all())

    def fill(self, topic: str, count: int, first: int = 0) -> None:
        self.append(topic, [telemetry(number) for number in range(first, first + count)])

    def apply_retention(self, now_ms: int) -> int:
        """Apply retention as of ``now_ms``; returns the number of segments deleted."""

        async def retention() -> int:
            self.store.wait_sealed()  # retention looks at sealed segments (the sealer runs in a thread)
            return self.store.apply_retention(now_ms).segments_deleted

        return self.run(retention())

    def _serve_on_a_free_port(self) -> int:
        """Serve the store on a port below the kernel's ephemeral range (``free_port``), never one the kernel
        picks: once ``stop_server`` freed it, a server another test starts on port 0 could be given it and
        answer the source in this one's place (a 404 where the test expects a broker down)."""
        for _ in range(3):
            try:
                self.runner, bound = self.run(serve(self.store, "127.0.0.1", free_port(), self._token))
                return bound
            except OSError:  # taken since it was found free: choose again
                continue
        raise OSError("no free port below the ephemeral range for the test broker")

    def start_server(self, port: int) -> int:
        """Serve the store on ``port`` again, retrying while the port is still being released."""
        deadline = time.monotonic() + 10
        while True:
            try:
                self.runner, bound = self.run(serve(self.store, "127.0.0.1", port, self._token))
                return bound
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop_server(self) -> None:
        assert self.runner is not None
        self.run(self.runner.cleanup())
        self.runner = None
        assert not port_open(self.port)

    def close(self) -> None:
        if self.runner is not None:
            self.run(self.runner.cleanup())

        async def close_store() -> None:
            self.store.close()

        self.run(close_store())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[EdgeBroker]:
    broker = EdgeBroker(tmp_path / "edge")
    yield broker
    broker.close()


@pytest.fixture
def second_edge(tmp_path: Path) -> Iterator[EdgeBroker]:
    broker = EdgeBroker(tmp_path / "edge2")
    yield broker
    broker.close()


@pytest.fixture
def small_segments_edge(tmp_path: Path) -> Iterator[EdgeBroker]:
    """A broker whose logs roll every ~1 KiB, so retention can delete old records within a test."""
    broker = EdgeBroker(tmp_path / "edge-small", StorageConfig(group_commit_ms=1, segment_bytes=1024))
    yield broker
    broker.close()


@pytest.fixture(scope="session")
def timestone_spark(spark):
    """The shared SparkSession with the timestone source registered."""
    from sources import register_sources

    register_sources(spark)
    return spark


def plain(offsets: dict) -> dict:
    """``offsets`` without each broker's store key (``#s<id>``, ``sources.broker_stores``) and the filters it
    was listed with (``#f<filter>``, ``sources.listed_filters``), as the tests of the other rules compare them
    (test_store_replaced_spark.py, test_broker_stores.py and test_new_topic_loss*.py test the keys)."""
    return {broker: without_store(keys) for broker, keys in without_listed(offsets).items()}
