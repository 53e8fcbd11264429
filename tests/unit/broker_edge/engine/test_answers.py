"""Who a publish is answered to, and in which order: real client connections (their PUBACKs read as bytes)
and batches another broker forwarded, through ``AnswersInTurn``."""

from __future__ import annotations

from broker_edge.engine.answers import AnswersInTurn, ForwardedBatch, PendingPublish, answer_all
from broker_edge.engine.message import Message
from broker_edge.engine.ports import ForwardAck
from broker_edge.protocol.codec import PacketDecoder
from broker_edge.protocol.packets import MQTT_3_1_1, MQTT_5, PubAck, PubRec
from broker_edge.protocol.properties import Properties
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, WireClient, make_core


def connected(core: HandDrivenCore, client_id: str, version: int = MQTT_5) -> WireClient:
    client = core.client(version)
    client.connect(client_id)
    return client


def publishes(client: WireClient, count: int, first_id: int = 1) -> list[PendingPublish]:
    entries = [
        PendingPublish(client.conn, None, packet_id, 1) for packet_id in range(first_id, first_id + count)
    ]
    client.conn.started_inbound.pending += count
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


def test_a_publish_no_subscriber_matched_is_acknowledged_to_each_version_as_it_can_be_told():
    """A device with one publish in flight and no subscriber for it (telemetry read by offset): MQTT 5 is
    told 0x10 No matching subscribers, MQTT 3.1.1 gets the plain four-byte PUBACK."""
    core = make_core()
    new, old = connected(core, "new"), connected(core, "old", MQTT_3_1_1)
    (told,), (plain,) = publishes(new, 1, first_id=9), publishes(old, 1, first_id=9)
    told.reason_code = plain.reason_code = 0x10
    answer_all([told])
    answer_all([plain])
    assert new.read() == [PubAck(9, 0x10)] and new.received == b"\x40\x03\x00\x09\x10"
    assert old.read() == [PubAck(9)] and old.received == b"\x40\x02\x00\x09"


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


def test_a_batch_answered_at_once_acknowledges_each_publisher_in_the_order_of_its_publishes():
    """A broker alone answers a durable batch in one pass: the accepted QoS 1 publishes of one client that
    follow each other go out as one write, and every client still reads its answers in its order."""
    core = make_core()
    new, old = connected(core, "new"), connected(core, "old", MQTT_3_1_1)
    a1, a2 = publishes(new, 2)
    (b1,) = publishes(old, 1)
    a3, a4 = publishes(new, 2, first_id=3)
    (b2,) = publishes(old, 1, first_id=2)
    a3.reason_code = b2.reason_code = 0x10  # no subscriber matched: MQTT 5 is told, MQTT 3.1.1 cannot be
    a4.reason_string = "retained message not kept"
    answer_all([a1, a2, b1, a3, a4, b2])
    assert new.read() == [
        PubAck(1),
        PubAck(2),
        PubAck(3, 0x10),
        PubAck(4, 0, properties=Properties(reason_string="retained message not kept")),
    ]
    assert old.read() == [PubAck(1), PubAck(2)]
    assert new.conn.incoming_pending == 0 and old.conn.incoming_pending == 0


def test_a_batch_answered_at_once_keeps_other_answers_in_their_place():
    """A QoS 2 publish (PUBREC) and a refusal between accepted QoS 1 publishes of the same client are
    answered in their turn; a refused MQTT 3.1.1 client is closed after the answers before its refusal, and
    a client gone before its batch was durable gets nothing."""
    core = make_core()
    client, old, gone = connected(core, "client"), connected(core, "old", MQTT_3_1_1), connected(core, "gone")
    first, second, fourth = publishes(client, 3)
    third = PendingPublish(client.conn, None, 9, 2)
    fourth.reason_code = 0x97
    (accepted, refused) = publishes(old, 2)
    refused.reason_code = 0x80
    late = publishes(gone, 2)
    gone.conn.close()
    answer_all([first, second, third, accepted, fourth, *late, refused])
    assert client.read() == [PubAck(1), PubAck(2), PubRec(9), PubAck(3, 0x97)]
    assert old.closed and old.read() == [PubAck(1)]
    assert gone.read() == []


def test_a_members_batch_answers_what_came_due_in_turn_and_a_publishers_run_in_one_write():
    """A cluster member's batches complete in any order: ``ready_all`` of a batch answers what it makes due,
    each publisher's answers in the order of its publishes, and a publisher's PUBACKs due together as one
    write, as a broker alone's."""
    core = make_core()
    device, other = connected(core, "device"), connected(core, "other")
    answers = AnswersInTurn()
    first, second, third, fourth = publishes(device, 4)
    (alone,) = publishes(other, 1)
    answers.expect([first, second, third, fourth, alone])
    answers.ready_all([third, fourth, alone])
    assert device.read() == [] and other.read() == [PubAck(1)]
    answers.ready_all([first, second])
    core.run_soon()
    written = device.conn.take_output()
    assert written is not None and len(written) == 1, "the four PUBACKs are one write"
    decoder = PacketDecoder(role="client", protocol_version=MQTT_5)
    assert decoder.feed(written[0]) == [PubAck(1), PubAck(2), PubAck(3), PubAck(4)]
    assert device.conn.incoming_pending == 0 and answers.pending() == 0
