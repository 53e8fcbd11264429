"""When a connection reads: the reasons that hold it (``Connection.hold`` / ``release``) and the bound on the
QoS 1/2 publishes it has read and the broker has not answered yet (``limits.receive_maximum``).

Real ``Connection``s of a hand-driven core (``handlers/wire.py``) over a log kept in memory that makes
batches durable when the test says so: a store that has fallen behind, as long as the test wants.
"""

from __future__ import annotations

import logging

import pytest

from broker_edge.engine.connection.states import HELD_FOR_ACKS, HELD_FOR_RATE, HELD_FOR_SUBACK
from broker_edge.engine.ports import ClusterPorts
from broker_edge.protocol.packets import (
    MQTT_5,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
)
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, WireClient, make_core
from tests.unit.broker_edge.engine.stand_ins import MemoryLog
from tests.unit.broker_edge.engine.test_publish import HeldForwarding

MQTT_3_1_1 = 4


def _core_with_log(**limits: object) -> tuple[HandDrivenCore, MemoryLog]:
    core = make_core(limits=limits)
    store = MemoryLog()
    core.publish_path.attach_store(store, None)
    return core, store


def _publisher(core: HandDrivenCore, version: int) -> WireClient:
    client = core.client(version)
    client.connect("publisher")
    return client


def _qos1(first: int, count: int) -> list[Publish]:
    return [Publish("meter", str(n).encode(), 1, packet_id=n) for n in range(first, first + count)]


def test_reading_resumes_only_once_no_reason_holds_it():
    core = make_core()
    client = _publisher(core, MQTT_5)
    conn = client.conn

    conn.hold(HELD_FOR_RATE)
    conn.hold(HELD_FOR_SUBACK)
    assert client.reading_paused
    conn.release(HELD_FOR_SUBACK)
    assert client.reading_paused  # the rate still holds it
    conn.release(HELD_FOR_RATE)
    assert not client.reading_paused
    assert conn.held == 0


def test_packets_read_while_held_are_handled_in_order_before_reading_resumes():
    core = make_core()
    client = _publisher(core, MQTT_5)
    conn = client.conn
    conn.hold(HELD_FOR_SUBACK)
    conn.backlog = []
    assert client.send(PingReq(), Publish("t", b"x", 1, packet_id=7)) == []  # read, not handled

    conn.release(HELD_FOR_SUBACK)
    assert client.read() == [PingResp(), PubAck(7, 0x10)]
    assert not client.reading_paused


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5], ids=["3.1.1", "5"])
def test_a_client_is_not_read_past_receive_maximum_unanswered_publishes(version):
    """Ten QoS 1 publishes in one read with a bound of four and a log that is not durable: the broker takes
    four, keeps the rest of the read unhandled and stops reading; each durable batch answers four, and
    reading resumes. Every publish is logged once and acknowledged in order. An MQTT 5 client, which was
    told the bound, is held the same way (``limits.receive_maximum_exceeded: hold``)."""
    core, store = _core_with_log(receive_maximum=4)
    client = _publisher(core, version)
    conn = client.conn

    assert client.send(*_qos1(1, 10)) == []
    assert conn.incoming_pending == 4
    assert client.reading_paused and conn.held == HELD_FOR_ACKS
    assert core.counters.held_for_acks == 1
    acks: list[int] = []
    while len(acks) < 10:
        store.make_durable()
        answered = client.read()
        assert answered, "a durable batch is answered"
        acks += [packet.packet_id for packet in answered if isinstance(packet, PubAck)]
        assert conn.incoming_pending <= 4

    assert acks == list(range(1, 11))
    assert [fields[0] for fields in store.logs["meter"]] == [str(n).encode() for n in range(1, 11)]
    assert conn.incoming_pending == 0
    assert not client.reading_paused
    assert core.counters.held_for_acks == 2  # after 4 and after 8 publishes read


def test_reading_resumes_once_at_most_half_of_the_bound_is_left_unanswered():
    core, store = _core_with_log(receive_maximum=6)
    client = _publisher(core, MQTT_3_1_1)
    client.send(*_qos1(1, 2))  # one batch
    client.send(*_qos1(3, 4))  # another: six unanswered, held
    assert client.reading_paused
    first, second = store.waiting

    first()  # two answered, four left: more than half of six
    assert [packet.packet_id for packet in client.read()] == [1, 2]
    assert client.reading_paused
    second()
    assert [packet.packet_id for packet in client.read()] == [3, 4, 5, 6]
    assert not client.reading_paused


def test_a_held_3_1_1_client_is_not_taken_for_idle():
    core, _ = _core_with_log(receive_maximum=2)
    client = core.client(MQTT_3_1_1)
    client.connect("publisher", keep_alive=2)
    client.send(*_qos1(1, 2))
    assert client.reading_paused
    core.advance(10)  # silent, but the broker is the one not reading
    assert not client.closed


def test_a_3_1_1_qos2_publish_counts_until_its_pubrec_so_its_pubrel_is_read():
    """A held client's PUBRELs must stay readable: its QoS 2 publishes stop counting with the PUBREC."""
    core, store = _core_with_log(receive_maximum=2)
    client = _publisher(core, MQTT_3_1_1)
    sent = [Publish("meter", b"a", 2, packet_id=1), Publish("meter", b"b", 2, packet_id=2)]
    assert client.send(*sent) == []
    assert client.reading_paused

    store.make_durable()
    assert client.read() == [PubRec(1), PubRec(2)]
    assert not client.reading_paused
    assert client.send(PubRel(1), PubRel(2)) == [PubComp(1), PubComp(2)]
    assert client.conn.incoming_pending == 0


def test_a_3_1_1_duplicate_qos2_publish_waits_for_its_answer_like_a_publish():
    core, store = _core_with_log(receive_maximum=2)
    client = _publisher(core, MQTT_3_1_1)
    client.send(Publish("meter", b"a", 2, packet_id=1))
    store.make_durable()
    assert client.read() == [PubRec(1)]
    assert client.send(Publish("meter", b"a", 2, packet_id=1, dup=True)) == []  # its PUBREC keeps its turn
    assert client.conn.incoming_pending == 1
    store.make_durable()
    assert client.read() == [PubRec(1)]
    assert client.conn.incoming_pending == 0


def test_an_mqtt_5_client_over_receive_maximum_is_disconnected_0x93_when_so_configured():
    """A v5 client is told Receive Maximum in CONNACK and must not have more QoS 1/2 publishes unanswered
    ([MQTT-3.3.4-7], the Client's rule); with ``receive_maximum_exceeded: disconnect`` the Server's answer
    to one that does, while its log is behind, is DISCONNECT 0x93 (3.3.4), not a pause."""
    core, _ = _core_with_log(receive_maximum=4, receive_maximum_exceeded="disconnect")
    client = _publisher(core, MQTT_5)
    answer = client.send(*_qos1(1, 5))
    assert [(type(packet), packet.reason_code) for packet in answer] == [(Disconnect, 0x93)]
    assert not client.reading_paused


def test_an_mqtt_5_client_held_past_receive_maximum_is_said_once_in_a_refusal_line(caplog):
    """A v5 client resending at once all it queued while disconnected (paho-mqtt's resend ignores Receive
    Maximum): disconnected at the first one too many, it sent them all again at every connection, for ever,
    each time appending those before it again. It is held as a 3.1.1 client is (above), and since it broke
    the rule it was told, said in a refusal line naming it; a 3.1.1 client held is not."""
    for version in (MQTT_3_1_1, MQTT_5):
        core, _ = _core_with_log(receive_maximum=4)
        client = _publisher(core, version)
        with caplog.at_level(logging.WARNING):
            assert client.send(*_qos1(1, 10)) == []
        assert client.reading_paused and client.conn.held == HELD_FOR_ACKS
    said = [r for r in caplog.records if getattr(r, "reason", None) == "receive_maximum_exceeded"]
    assert len(said) == 1 and getattr(said[0], "client_id", None) == "publisher"
    assert said[0].getMessage() == (
        "receive maximum exceeded: more unacknowledged QoS 1/2 PUBLISHes, read once half are answered"
    )


def test_an_mqtt_5_qos2_publish_refused_gives_its_receive_maximum_slot_back():
    """A refused QoS 2 publish (PUBREC 0x83) ends its flow: no PUBREL follows, so it stops counting."""
    core, store = _core_with_log(receive_maximum=1)
    forwarding = HeldForwarding()
    forwarding.refused.add("meter")
    core.join_cluster(ClusterPorts(forwarding=forwarding))
    client = _publisher(core, MQTT_5)
    for packet_id in (1, 2, 3):
        answer = client.send(Publish("meter", b"x", 2, packet_id=packet_id))  # refused at once
        store.make_durable()
        answer += client.read()
        assert [(type(packet), packet.reason_code) for packet in answer] == [(PubRec, 0x83)]
    assert client.conn.incoming_pending == 0
    assert not client.closed
