"""Requests pipelined flat out at the broker's HTTP endpoints (the admin endpoint's ``/health``, the offsets
API's reads and listings, a stranger's requests refused with 401) take the loop's turns one piece of work
at a time (``ReadTurns.work_turn``): counted on the broker's own loop, a turn begins at most one request or
lists one chunk, however many connections ask, and the devices' packets are read between two. Handled as
they came, each turn began a request of every connection, or a chunk of every listing."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker_edge.storage import AppendRecord
from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.http_pipeliners import HttpPipeliners, http_request

NO_RATE_LIMITS = {"messages_per_second_per_client": 0, "new_connections_per_second": 0}
TOKEN = "reader-secret"
OFFSETS_API = {"host": "127.0.0.1", "port": 0, "tokens": [{"name": "reader", "token": TOKEN}]}
MOST_PER_TURN = 2
"""One piece a turn; counted between two runs of a callback of the loop, two may fall in one count."""


class LoopTurns:
    """The turns of a broker's loop (a callback that schedules itself again each turn) and the pieces of
    work counted in each (``counted``)."""

    def __init__(self, broker: RunningBroker) -> None:
        self.loop = broker.loop
        self.turn = 0
        self.pieces: Counter[int] = Counter()
        self.running = True
        self.loop.call_soon_threadsafe(self._next)

    def _next(self) -> None:
        self.turn += 1
        if self.running:
            self.loop.call_soon(self._next)

    def counted(self, work: Callable[..., Any]) -> Callable[..., Any]:
        """``work``, each call counted in the turn it runs in."""

        def count(*args: Any, **kwargs: Any) -> Any:
            self.pieces[self.turn] += 1
            return work(*args, **kwargs)

        return count

    def counted_chunks(self, chunks: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        """``chunks`` (a generator function), each chunk it yields counted in the turn it is made in."""

        def count(*args: Any, **kwargs: Any) -> Iterator[Any]:
            for chunk in chunks(*args, **kwargs):
                self.pieces[self.turn] += 1
                yield chunk

        return count

    def most(self) -> int:
        """The most pieces of work counted in one turn (the loop's turns then stop being counted)."""
        self.running = False
        return max(self.pieces.values(), default=0)


def ask_flat_out(
    broker: RunningBroker, port: int | None, request: bytes, answers: int, connections: int = 60
) -> Counter[int]:
    """``connections`` connections pipelining ``request`` until ``answers`` are read, while a device's QoS 1
    publishes are acknowledged; the answers' statuses."""
    assert port is not None
    pipeliners = HttpPipeliners(port, connections=connections, request=request).start()
    try:
        publisher = PahoClient(broker.port, "device")
        for _ in range(10):
            publisher.publish("devices/1/telemetry", b"21.5", qos=1)  # waits for its PUBACK, asserts it
        assert wait_for(lambda: pipeliners.answers >= answers, timeout=60)
    finally:
        pipeliners.stop()
    assert pipeliners.failures == []
    return pipeliners.statuses


def test_pipelined_health_requests_begin_one_a_turn(start_broker, monkeypatch):
    broker = start_broker(limits=NO_RATE_LIMITS)
    turns = LoopTurns(broker)
    monkeypatch.setattr(broker.broker, "health", turns.counted(broker.broker.health))  # (taken at its start)

    statuses = ask_flat_out(broker, broker.broker.admin_port, http_request("/health"), 3000)

    assert set(statuses) == {200}
    assert turns.most() <= MOST_PER_TURN
    assert sum(turns.pieces.values()) >= 3000


@pytest.fixture
def offsets_broker(start_broker) -> RunningBroker:
    """A broker with a commitlog of 3,000 topics, its offsets API asking a reader token."""
    broker = start_broker(limits=NO_RATE_LIMITS, storage={}, offsets_api=OFFSETS_API)
    store = broker.broker.store

    def fill() -> None:
        for number in range(3000):
            store.append(f"plant/{number}/temp", AppendRecord(payload=b"21.5", qos=1, client_id="dev"))

    broker.call(fill, timeout=60)
    return broker


@pytest.mark.parametrize(("token", "status"), [(TOKEN, 200), ("not-" + TOKEN, 401), (None, 401)])
def test_pipelined_reads_and_refusals_begin_one_a_turn(
    offsets_broker: RunningBroker, token, status, monkeypatch
):
    broker = offsets_broker
    turns = LoopTurns(broker)
    tokens = broker.broker.reader_tokens
    monkeypatch.setattr(tokens, "access", turns.counted(tokens.access))  # each request's token, checked first
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = http_request("/v1/logs/plant%2F1%2Ftemp/offset?timestamp_ms=0", headers=headers)

    statuses = ask_flat_out(broker, broker.broker.offsets_port, request, 2000)

    assert set(statuses) == {status}  # a stranger's connection is closed at its 401, and opened again
    assert turns.most() <= MOST_PER_TURN
    assert sum(turns.pieces.values()) >= 2000


def test_listings_asked_at_once_list_a_chunk_a_turn(offsets_broker: RunningBroker, monkeypatch):
    broker = offsets_broker
    turns = LoopTurns(broker)
    store = broker.broker.store
    monkeypatch.setattr(store, "iter_logs", turns.counted_chunks(store.iter_logs))
    request = http_request("/v1/logs", headers={"Authorization": f"Bearer {TOKEN}"})

    statuses = ask_flat_out(broker, broker.broker.offsets_port, request, 100, connections=20)

    assert set(statuses) == {200}
    assert turns.most() <= MOST_PER_TURN
    assert sum(turns.pieces.values()) >= 100 * 3000 // 1024


FETCHES = [{"topic": f"plant/{number}/temp", "offset": 0} for number in range(20)]
ARROW_READS = {
    "fetch": ("server", "POST", "/v1/fetch", json.dumps({"fetches": FETCHES}).encode()),
    "partition": (
        "partitions",
        "GET",
        "/v1/partitions/0/records?position=0&max_entries=200&max_bytes=65536",
        b"",
    ),
}
"""A batch fetch and a partition's read: the module building their Arrow answer (in a thread), method, path,
body."""


@pytest.mark.parametrize("read", sorted(ARROW_READS))
def test_reads_asked_at_once_build_their_arrow_answers_one_at_a_time(offsets_broker, monkeypatch, read):
    from broker_edge.offsets_api import partitions, server

    module = {"server": server, "partitions": partitions}[ARROW_READS[read][0]]  # (loaded by the broker)
    building = Counter[str]()
    lock = threading.Lock()

    def counted_build(*args: Any) -> Any:
        with lock:
            building["now"] += 1
            building["most"] = max(building["most"], building["now"])
        try:
            return build(*args)
        finally:
            with lock:
                building["now"] -= 1

    build = module._arrow_body
    monkeypatch.setattr(module, "_arrow_body", counted_build)
    _, method, path, body = ARROW_READS[read]
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    request = http_request(path, method, headers, body)

    statuses = ask_flat_out(offsets_broker, offsets_broker.broker.offsets_port, request, 300, connections=30)

    assert set(statuses) == {200}
    assert building["most"] == 1  # each in a thread, but one at a time
