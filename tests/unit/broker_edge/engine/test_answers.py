"""Who a publish is answered to, and in which order: real client connections (their PUBACKs read as bytes)
and batches another broker forwarded, through ``AnswersInTurn``."""

from __future__ import annotations

from broker_edge.engine.answers import AnswersInTurn, ForwardedBatch, PendingPublish
from broker_edge.engine.message import Message
from broker_edge.engine.ports import ForwardAck
from broker_edge.protocol.packets import MQTT_3_1_1, MQTT_5, PubAck
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, WireClient, make_core


def connected(core: HandDrivenCore, client_id: str, version: int = MQTT_5) -> WireClient:
    client = core.client(version)
    client.connect(client_id)
    return client


def publishes(client: WireClient, count: int, first_id: int = 1) -> list[PendingPublish]:
    entries = [
        PendingPublish(client.conn, None, packet_id, 1) for packet_id in range(first_id, first_id + count)
    ]
    client.conn.incoming_pending += count
    return entries


def test_a_publishers_answers_known_out_of_order_go_in_the_order_of_its_publishes():
    core = make_core()
    client = connected(core, "device")
    answers = AnswersInTurn()
    first, second, third = publishes(client, 3)
    answers.expect([first, second, third])
    answers.ready(third)
    answers.ready(second)
    assert client.read() == [], "the first one's answer is not known yet"
    answers.ready(first)
    assert [ack.packet_id for ack in client.read()] == [1, 2, 3]
    assert client.conn.incoming_pending == 0 and answers.pending() == 0


def test_an_answer_waits_only_for_its_own_publishers_earlier_ones():
    core = make_core()
    slow, quick = connected(core, "slow"), connected(core, "quick")
    answers = AnswersInTurn()
    (waiting,), (answered,) = publishes(slow, 1), publishes(quick, 1)
    answers.expect([waiting, answered])
    answers.ready(answered)
    assert [ack.packet_id for ack in quick.read()] == [1]
    assert slow.read() == [] and answers.pending() == 1


def test_an_answer_nobody_waits_for_goes_at_once():
    """A broker alone's batches complete in the order they were appended: their answers are never queued."""
    core = make_core()
    client = connected(core, "alone")
    answers = AnswersInTurn()
    (entry,) = publishes(client, 1, first_id=7)
    entry.reason_code = 0x10
    answers.ready(entry)
    assert client.read() == [PubAck(7, 0x10)]


def test_a_refused_mqtt_3_client_is_closed_for_it_cannot_be_told():
    core = make_core()
    client = connected(core, "old", MQTT_3_1_1)
    answers = AnswersInTurn()
    (entry,) = publishes(client, 1)
    entry.reason_code = 0x80
    answers.ready(entry)
    assert client.closed and client.read() == []


def test_a_forwarded_batch_answers_its_broker_once_every_publish_has_its_answer():
    sent: list[list[ForwardAck]] = []
    messages = [Message("plant/a", f"m{n}".encode(), 1) for n in range(3)]
    batch = ForwardedBatch(messages, lambda acks: sent.append(list(acks)))
    answers = AnswersInTurn()
    entries = [PendingPublish(None, message, index, 1, batch=batch) for index, message in enumerate(messages)]
    answers.expect(entries)
    messages[0].offset, messages[2].offset = 40, 41
    entries[1].reason_code, entries[1].reason_string = 0x83, "refused here"
    answers.ready(entries[2])
    answers.ready(entries[0])
    assert sent == [], "the second one is not answered yet"
    answers.ready(entries[1])
    assert sent == [[ForwardAck(0, 40), ForwardAck(0x83, None, "refused here"), ForwardAck(0, 41)]]
    batch.answer(0, 0x80, None)  # a second answer for one publish changes nothing
    assert len(sent) == 1
