"""A QoS 1 PUBACK (QoS 2 PUBREC) leaves the broker only once the record is durable under the policy.

The proof holds the broker's fdatasyncs at a gate: while the gate is closed no acknowledgement may arrive
(with `fsync` and `group`), and once it opens the acknowledgement comes with the record's bytes synced.
With `none` the gate stays closed and the acknowledgement still comes: the record was written to the OS,
never synced. Every check is on what a real client receives over a real socket.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import PubAck, Publish, PubRec
from broker_edge.settings.broker import BrokerConfig
from tests.e2e.broker_clients import RawClient
from tests.e2e.commitlog.e2e_helpers import offsets_client

TOPIC = "acks/device-1"


class SyncGate:
    """Holds every fdatasync of files under `directory` until `release()`; records (path, size) synced."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
        self._released = threading.Event()
        self._lock = threading.Lock()
        self.synced: list[tuple[str, int]] = []
        real = os.fdatasync
        prefix = str(directory)

        def gated(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            if not path.startswith(prefix):
                real(fd)
                return
            self._released.wait(timeout=30)
            real(fd)
            with self._lock:
                self.synced.append((path, os.fstat(fd).st_size))

        monkeypatch.setattr(os, "fdatasync", gated)

    def release(self) -> None:
        self._released.set()

    def syncs_of(self, suffix: str) -> list[int]:
        with self._lock:
            return [size for path, size in self.synced if path.endswith(suffix)]


def _publisher(broker) -> RawClient:
    client = RawClient(broker.port, 5)
    client.connect("publisher")
    return client


def _segment(directory: Path) -> Path:
    return directory / "log" / "00" / f"{0:020d}.log"


def test_the_default_policy_is_group_commit_without_a_timer():
    storage = BrokerConfig().storage

    assert (storage.durability, storage.group_commit_ms) == ("group", 0.0)


@pytest.mark.parametrize("qos", [1, 2])
@pytest.mark.parametrize("durability", ["group", "fsync"])
def test_no_acknowledgement_before_the_record_is_synced(brokers, tmp_path, monkeypatch, durability, qos):
    gate = SyncGate(monkeypatch, tmp_path)
    broker = brokers(storage={"durability": durability, "syncfs_min_segments": 0})
    client = _publisher(broker)

    client.send(b"".join(encode(Publish(TOPIC, f"m{n}".encode(), qos, packet_id=n + 1), 5) for n in range(5)))

    client.recv_none(0.5)  # held: the log's fdatasync has not returned
    with offsets_client(broker) as api:
        assert api.log_info(TOPIC).end_offset == 0  # and no reader sees the records yet
        gate.release()
        acks = [client.recv() for _ in range(5)]
        records = api.fetch(TOPIC, 0).data.column("payload").to_pylist()
    expected_type = PubAck if qos == 1 else PubRec
    assert [type(ack) for ack in acks] == [expected_type] * 5
    assert [ack.packet_id for ack in acks] == [1, 2, 3, 4, 5]
    assert records == [f"m{n}".encode() for n in range(5)]
    synced = gate.syncs_of(".log")
    assert max(synced) == _segment(tmp_path / "a").stat().st_size  # every acked byte was synced
    if durability == "group":
        assert len(synced) == 1  # one sync for the whole window


def test_with_durability_none_the_ack_follows_the_write_without_a_sync(brokers, tmp_path, monkeypatch):
    """Only a new topic's catalog entry is synced under `none` (the topic exists after a power cut): the
    topic is created first, then no record is ever synced."""
    broker = brokers(storage={"durability": "none"})
    client = _publisher(broker)
    client.send_packet(Publish(TOPIC, b"creates the topic", 1, packet_id=6))
    assert client.recv().packet_id == 6
    gate = SyncGate(monkeypatch, tmp_path)  # never released: a sync would hold the ack forever

    client.send_packet(Publish(TOPIC, b"written, not synced", 1, packet_id=7))
    ack = client.recv()

    assert isinstance(ack, PubAck) and ack.packet_id == 7
    assert b"written, not synced" in _segment(tmp_path / "a").read_bytes()  # in the file (page cache)
    assert gate.syncs_of(".log") == []
    gate.release()
