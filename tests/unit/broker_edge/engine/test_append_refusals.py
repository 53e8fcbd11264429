"""Publishes the log refuses as they are appended (a full disk, the broker's topic limit): what their
publishers are told, and which of them are closed.

Fed through real ``Connection``s of a hand-driven core (``handlers/wire.py``); the log is a ``MemoryLog``
that logs QoS 0 as well (a persistence rule can) and refuses the appends of the topics a test names.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from broker_edge.protocol.packets import MQTT_3_1_1, MQTT_5, PubAck, Publish
from broker_edge.storage.errors import DISK_FULL, StorageError, StorageShortage, TooManyTopics
from broker_edge.storage.record import RecordFields
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, WireClient, make_core
from tests.unit.broker_edge.engine.stand_ins import MemoryLog


class RefusingLog(MemoryLog):
    """Logs every QoS, and refuses each append to a topic of ``refusals`` with its error."""

    def __init__(self, refusals: dict[str, StorageError]) -> None:
        super().__init__()
        self.refusals = refusals

    def should_persist(self, topic: str, qos: int) -> bool:
        return True

    def append_batch(self, topic: str, records: Sequence[RecordFields]) -> int:
        refusal = self.refusals.get(topic)
        if refusal is not None:
            raise refusal
        return super().append_batch(topic, records)


def _publisher(
    refusals: dict[str, StorageError], version: int
) -> tuple[HandDrivenCore, RefusingLog, WireClient]:
    core = make_core()
    store = RefusingLog(refusals)
    store.logs["ok"] = []
    core.publish_path.attach_store(store, None)
    client = core.client(version)
    client.connect("device")
    return core, store, client


FULL = StorageShortage(DISK_FULL, "No space left on device")


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_a_qos0_publish_the_log_refuses_is_dropped_and_counted_and_its_publisher_stays(version):
    """Nothing is promised for a QoS 0 message: one the log refuses (disk full) is counted as ``disk_full``
    and its publisher, of either version, keeps its connection and its later publishes."""
    core, store, client = _publisher({"full": FULL}, version)
    client.send(Publish("full", b"lost", 0))
    store.make_durable()
    assert not client.closed
    assert core.counters.drops("disk_full") == 1
    client.send(Publish("ok", b"kept", 1, packet_id=1))
    store.make_durable()
    assert [(type(ack), ack.packet_id, ack.reason_code < 0x80) for ack in client.read()] == [
        (PubAck, 1, True)
    ]
    assert [fields[0] for fields in store.logs["ok"]] == [b"kept"]


def test_a_v3_qos1_publish_the_log_refuses_closes_its_publisher():
    """An MQTT 3.1.1 client cannot be told that its QoS 1 publish was refused: it is closed, and sends the
    publish again once reconnected (nothing acknowledged is lost)."""
    core, store, client = _publisher({"full": FULL}, MQTT_3_1_1)
    client.send(Publish("full", b"refused", 1, packet_id=1))
    store.make_durable()
    assert client.closed
    assert core.counters.drops("disk_full") == 1


def test_a_qos0_publish_past_the_topic_limit_frees_no_slot_of_the_clients_unanswered_publishes():
    """An MQTT 3.1.1 client's QoS 1 publishes waiting for the log count towards ``limits.receive_maximum``;
    a QoS 0 publish refused at the broker's topic limit never counted, so it takes none away."""
    core, store, client = _publisher({"new": TooManyTopics("new", 1)}, MQTT_3_1_1)
    client.send(Publish("ok", b"waiting", 1, packet_id=1))
    assert client.conn.incoming_pending == 1
    client.send(Publish("new", b"refused", 0))
    assert client.conn.incoming_pending == 1
    assert core.counters.drops("topic_limit") == 1
    store.make_durable()
    assert client.read() == [PubAck(1)]
    assert client.conn.incoming_pending == 0
