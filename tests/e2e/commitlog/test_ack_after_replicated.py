"""The replicated stage of the PUBLISH path: acknowledgements wait for it, in order, or report its failure.

A single broker passes straight through (``LocalOnly``). A cluster's leader will hold durable batches there
until followers have them; this test plays that part with a ``Replication`` that holds batches until told,
and checks what a real client receives over a real socket.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from broker_edge.engine.ports import AppendedRun, LocalOnly
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import PubAck, Publish
from tests.e2e.broker_clients import RawClient

TOPIC = "replicated/device-1"


class HeldReplication:
    """Holds every durable batch until ``release`` (or ``fail``) is called from the test thread."""

    def __init__(self) -> None:
        self.held: list[
            tuple[Sequence[AppendedRun], Callable[[], None], Callable[[BaseException], None]]
        ] = []
        self.arrived = threading.Event()

    def when_replicated(
        self, runs: Sequence[AppendedRun], done: Callable[[], None], failed: Callable[[BaseException], None]
    ) -> None:
        self.held.append((runs, done, failed))
        self.arrived.set()

    def release(self) -> None:
        held, self.held = self.held, []
        for _, done, _ in held:
            done()

    def fail(self) -> None:
        held, self.held = self.held, []
        for _, _, failed in held:
            failed(RuntimeError("followers lost"))


def _held_broker(brokers) -> tuple[Any, HeldReplication]:
    broker = brokers()
    replication = HeldReplication()
    broker.call(lambda: setattr(broker.broker.publish_path, "replication", replication))
    return broker, replication


def test_a_single_broker_replicates_as_it_stands(brokers):
    broker = brokers()
    assert isinstance(broker.call(lambda: broker.broker.publish_path.replication), LocalOnly)


def test_no_puback_before_the_batch_is_replicated_then_all_in_order(brokers):
    broker, replication = _held_broker(brokers)
    client = RawClient(broker.port, 5)
    client.connect("publisher")

    client.send(b"".join(encode(Publish(TOPIC, f"m{n}".encode(), 1, packet_id=n + 1), 5) for n in range(4)))

    assert replication.arrived.wait(10)
    client.recv_none(0.5)  # durable, not yet replicated: no acknowledgement
    runs = broker.call(
        lambda: [(run.topic, run.first_offset, len(run.messages)) for h in replication.held for run in h[0]]
    )
    assert runs == [(TOPIC, 0, 4)]
    broker.call(replication.release)
    acks = [client.recv() for _ in range(4)]
    assert [(type(ack), ack.packet_id, ack.reason_code) for ack in acks] == [
        (PubAck, n + 1, 0x10) for n in range(4)
    ]


def test_a_failed_replication_answers_v5_publishers_with_0x80(brokers):
    broker, replication = _held_broker(brokers)
    client = RawClient(broker.port, 5)
    client.connect("publisher")

    client.send_packet(Publish(TOPIC, b"lost with the leader", 1, packet_id=9))

    assert replication.arrived.wait(10)
    broker.call(replication.fail)
    ack = client.recv()
    assert (type(ack), ack.packet_id, ack.reason_code) == (PubAck, 9, 0x80)
    assert broker.call(lambda: broker.broker.counters.drops("replication_failed")) == 1
