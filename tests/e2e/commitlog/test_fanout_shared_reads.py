"""Fanout from the log: fifty devices replaying one range are served from the same reads, not fifty.

A spy counts the preads of segment files made by the broker (in this process) while fifty lean MQTT 5
clients replay the same thousand records from the start. The tail cache is made small so the replay
really goes to the files. Without sharing, each subscriber would read the range itself (about 16 reads
each with its in-flight window of 64: some 800 reads); with it, each block of 256 records is read once.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from broker_edge.storage.file_pool import FileHandlePool
from broker_edge.storage.read_cache import BLOCK_RECORDS
from pipelines.fleet.client import Message, MqttClient
from tests.e2e.broker_clients import wait_for
from tests.e2e.commitlog.e2e_helpers import LoopThread

TOPIC = "fanout/firmware-manifest"
RECORDS = 1000
SUBSCRIBERS = 50


class SegmentReads:
    """Counts preads of `.log` files (the real read still happens)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._lock = threading.Lock()
        real = FileHandlePool.pread

        def counting(pool: FileHandlePool, path: str, size: int, position: int) -> bytes:
            if path.endswith(".log"):
                with self._lock:
                    self.count += 1
            return real(pool, path, size, position)

        monkeypatch.setattr(FileHandlePool, "pread", counting)


def _fill(broker) -> None:
    def publish_all() -> None:
        for number in range(RECORDS):
            broker.broker.publish(TOPIC, f"manifest part {number}".encode(), qos=1)

    broker.call(publish_all)
    assert wait_for(lambda: broker.call(lambda: broker.broker.store.log_info(TOPIC).end_offset) == RECORDS)


async def _replay_all(port: int) -> list[list[int]]:
    offsets: list[list[int]] = [[] for _ in range(SUBSCRIBERS)]
    clients = []
    for number in range(SUBSCRIBERS):
        seen = offsets[number]

        def note(message: Message, seen: list[int] = seen) -> None:
            assert message.offset is not None  # a logged topic's deliveries carry their offset
            seen.append(message.offset)

        client = await MqttClient.connect("127.0.0.1", port, f"viewer-{number}", on_message=note)
        clients.append(client)
    await asyncio.gather(
        *(client.subscribe(TOPIC, 1, user_properties=[("offset", "earliest")]) for client in clients)
    )
    for _ in range(600):
        if all(len(seen) >= RECORDS for seen in offsets):
            break
        await asyncio.sleep(0.05)
    await asyncio.gather(*(client.disconnect() for client in clients))
    return offsets


def test_fifty_subscribers_replaying_one_range_share_the_reads(brokers, monkeypatch):
    broker = brokers(storage={"tail_cache_records": 16})
    _fill(broker)
    reads = SegmentReads(monkeypatch)
    loop = LoopThread()
    try:
        offsets = loop.run(_replay_all(broker.port), timeout_s=60)
    finally:
        loop.close()

    blocks = -(-RECORDS // BLOCK_RECORDS)
    assert all(seen == list(range(RECORDS)) for seen in offsets)
    assert reads.count <= 2 * blocks  # about one read per block for all fifty, not one per subscriber
    cache = broker.broker.store.read_cache
    assert cache.hits > SUBSCRIBERS * (RECORDS // BLOCK_RECORDS)
