"""PUBACK, PUBREC, PUBREL, PUBCOMP: the QoS 1 and QoS 2 flows in both directions (MQTT 4.3)."""

import pytest

from broker_edge.engine import message as message_module
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import (
    MQTT_3_1_1,
    MQTT_5,
    Connect,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Subscription,
)
from tests.unit.broker_edge.engine.handlers.wire import make_core
from tests.unit.broker_edge.engine.stand_ins import MemoryLog


def _pair(sub_qos, *, receive_maximum=None):
    core = make_core()
    subscriber = core.client()
    fields = {}
    if receive_maximum is not None:
        from broker_edge.protocol.properties import Properties

        fields["properties"] = Properties(receive_maximum=receive_maximum)
    subscriber.connect("sub", **fields)
    subscriber.send(Subscribe(1, [Subscription("t", sub_qos)]))
    publisher = core.client()
    publisher.connect("pub")
    return core, subscriber, publisher


def test_puback_frees_the_in_flight_slot_for_the_next_queued_message_mqtt_4_3_2():
    core, subscriber, publisher = _pair(1, receive_maximum=1)
    publisher.send(Publish("t", b"1", 1, packet_id=1), Publish("t", b"2", 1, packet_id=2))
    first = subscriber.read()
    assert [p.payload for p in first] == [b"1"]
    assert core.router.sessions["sub"].inflight_count() == 1
    assert [p.payload for p in subscriber.send(PubAck(first[0].packet_id))] == [b"2"]


def test_pubrec_is_answered_with_pubrel_and_pubcomp_ends_the_flow_mqtt_4_3_3_5():
    """[MQTT-4.3.3-5] The sender MUST send PUBREL after PUBREC, with the same packet identifier."""
    core, subscriber, publisher = _pair(2)
    publisher.send(Publish("t", b"x", 2, packet_id=9))
    delivered = subscriber.read()
    packet_id = delivered[0].packet_id
    assert subscriber.send(PubRec(packet_id)) == [PubRel(packet_id)]
    assert subscriber.send(PubComp(packet_id)) == []
    assert core.router.sessions["sub"].inflight_count() == 0


def test_a_repeated_pubrec_gets_pubrel_again_and_an_unknown_one_0x92():
    _, subscriber, publisher = _pair(2)
    publisher.send(Publish("t", b"x", 2, packet_id=9))
    packet_id = subscriber.read()[0].packet_id
    subscriber.send(PubRec(packet_id))
    assert subscriber.send(PubRec(packet_id)) == [PubRel(packet_id)]
    assert subscriber.send(PubRec(999)) == [PubRel(999, 0x92)]


def test_pubrel_releases_a_held_qos2_id_with_pubcomp_mqtt_4_3_3_9():
    """[MQTT-4.3.3-9] The receiver MUST respond to PUBREL with PUBCOMP with the same packet identifier."""
    core = make_core()
    publisher = core.client(MQTT_3_1_1)
    publisher.connect("pub")
    assert publisher.send(Publish("t", b"x", 2, packet_id=5)) == [PubRec(5)]
    assert core.router.sessions["pub"].incoming_qos2 == {5}
    assert publisher.send(PubRel(5)) == [PubComp(5)]
    assert core.router.sessions["pub"].incoming_qos2 is None
    assert publisher.conn.incoming_pending == 0


def test_pubrel_for_an_unknown_id_gets_pubcomp_0x92_from_a_v5_broker():
    publisher = make_core().client()
    publisher.connect("pub")
    assert publisher.send(PubRel(77)) == [PubComp(77, 0x92)]


def _window_of(size, version=MQTT_3_1_1, sub_qos=1):
    """A subscriber whose in-flight window holds ``size`` and a publisher, both of ``version``."""
    core = make_core(limits={"max_inflight_out": size})
    subscriber = core.client(version)
    subscriber.connect("sub")
    subscriber.send(Subscribe(1, [Subscription("t/#", sub_qos)]))
    publisher = core.client(version)
    publisher.connect("pub")
    return core, subscriber, publisher


def _publish_eight(publisher):
    publisher.send(*(Publish("t/a", b"%d" % n, 1, packet_id=n + 1) for n in range(8)))


def test_pubacks_read_together_free_their_slots_and_the_queue_follows_in_order_mqtt_4_3_2():
    """A read holding several PUBACKs frees each of their slots, and the queued messages that refill the
    window are the ones, in the order and with the bytes, that acknowledging one PUBACK a read would send."""
    core, subscriber, publisher = _window_of(3)
    _publish_eight(publisher)
    first = subscriber.read()
    assert [p.payload for p in first] == [b"0", b"1", b"2"]
    refilled = subscriber.send(*(PubAck(p.packet_id) for p in first), PubAck(999))  # 999: never sent
    assert [p.payload for p in refilled] == [b"3", b"4", b"5"]
    together = subscriber.received
    assert together == b"".join(encode(p, MQTT_3_1_1) for p in refilled)
    assert core.router.sessions["sub"].inflight_count() == 3

    _, alone, publisher = _window_of(3)
    _publish_eight(publisher)
    one_by_one = b""
    for delivered in alone.read():
        alone.send(PubAck(delivered.packet_id))
        one_by_one += alone.received
    assert one_by_one == together


def test_pubacks_read_together_leave_a_qos2_delivery_in_flight_mqtt_4_3_3():
    """A PUBACK names a QoS 1 delivery: one for the id of a QoS 2 delivery frees nothing, read alone or
    with others, and sends nothing in its place."""
    core, subscriber, publisher = _window_of(1, sub_qos=2)
    publisher.send(Publish("t/a", b"two", 2, packet_id=1), Publish("t/a", b"next", 2, packet_id=2))
    (delivered,) = subscriber.read()
    assert subscriber.send(PubAck(delivered.packet_id), PubAck(delivered.packet_id)) == []
    assert core.router.sessions["sub"].inflight_count() == 1


@pytest.mark.parametrize("logged", [False, True])
def test_a_message_queued_behind_a_full_window_is_sent_as_the_frame_received(logged, monkeypatch):
    """An MQTT 3.1.1 delivery waiting for room in the window is cut out of the frame it came in while the
    message still holds it, not encoded again when the window opens: the same bytes, no encoder run."""
    core, subscriber, publisher = _window_of(1)
    if logged:
        store = MemoryLog()
        core.publish_path.attach_store(store, None)
    monkeypatch.setattr(message_module, "encode_publish_template", _not_called)
    publisher.send(*(Publish("t/a", b"%d" % n, 1, packet_id=n + 1) for n in range(3)))
    if logged:
        store.make_durable()
    waiting = core.router.sessions["sub"].queue
    assert [m.frame for m, *_ in waiting] == [None, None]  # routed: the frames are let go of
    sent = []
    delivered = subscriber.read()
    while delivered:
        sent += delivered
        assert subscriber.received == encode(delivered[0], MQTT_3_1_1)
        delivered = subscriber.send(PubAck(delivered[0].packet_id))
    assert [(p.payload, p.qos) for p in sent] == [(b"0", 1), (b"1", 1), (b"2", 1)]


def _not_called(*args, **kwargs):
    raise AssertionError("encoded again")


@pytest.mark.mqtt311("MQTT-3.3.1-1", "MQTT-4.4.0-1")
def test_a_3_1_1_frame_is_each_same_family_delivery_around_its_packet_id_and_its_resend_with_dup(monkeypatch):
    """A QoS 1 PUBLISH from an MQTT 3.1.1 client reaches each QoS 1 subscriber of that family as the bytes
    received around that subscriber's own packet id, with no encoder run for any of them (the first cut is
    kept for the others), and an MQTT 5 subscriber as an encoding of its own. Sent again to a subscriber
    back in its session, the same bytes carry DUP [MQTT-3.3.1-1]."""
    core = make_core()
    versions: list[int] = []
    encode_template = message_module.encode_publish_template

    def counted(topic, payload, version, **fields):
        versions.append(version)
        return encode_template(topic, payload, version, **fields)

    monkeypatch.setattr(message_module, "encode_publish_template", counted)
    subscribers = []
    for n, version in enumerate((MQTT_3_1_1, MQTT_3_1_1, MQTT_5)):
        subscriber = core.client(version)
        subscriber.connect(f"sub-{n}", clean_start=version == MQTT_5)
        subscriber.send(Subscribe(1, [Subscription("t/#", 1), Subscription(f"only/{n}", 1)]))
        subscribers.append(subscriber)
    publisher = core.client(MQTT_3_1_1)
    publisher.connect("pub")
    publisher.send(Publish("only/1", b"first", 1, packet_id=1))  # sub-1's ids now run one ahead
    subscribers[1].read()
    publisher.send(Publish("t/a", b"payload", 1, packet_id=7))
    ids = []
    for subscriber in subscribers:
        (delivered,) = subscriber.read()
        ids.append(delivered.packet_id)
        expected = Publish("t/a", b"payload", 1, packet_id=delivered.packet_id)
        assert subscriber.received == encode(expected, subscriber.version)
    assert ids == [1, 2, 1]
    assert MQTT_3_1_1 not in versions
    inflight = core.router.sessions["sub-0"].inflight
    assert inflight is not None
    delivery = inflight[1]
    assert isinstance(delivery, tuple)
    message = delivery[0]
    frame = encode(Publish("t/a", b"payload", 1, packet_id=1), MQTT_3_1_1)
    assert (message.frame, message.frame_head) == (None, frame[: -len(b"payload") - 2])
    assert [key for key in message.templates or () if key in (2, 3)] == []  # no 3.1.1 QoS 1 template
    back = core.client(MQTT_3_1_1)  # sub-0 again, on a new connection, before acknowledging
    back.send(Connect(client_id="sub-0", protocol_version=MQTT_3_1_1, clean_start=False))
    assert back.received.endswith(encode(Publish("t/a", b"payload", 1, dup=True, packet_id=1), MQTT_3_1_1))
    assert MQTT_3_1_1 not in versions


def test_a_persistent_sessions_qos2_id_is_journaled_with_its_pubrec_and_its_release_with_its_pubcomp():
    """The journal of held ids (``runtime.qos2_journal``) and the session's saved state (``received``) learn
    of an id when its PUBREC leaves, after the message is durable, not at the PUBLISH: a broker killed before
    then has not logged the message, and the client's resend must then be taken as new, not answered as a
    duplicate and dropped."""
    from broker_edge.engine.sessions.snapshot import session_document
    from broker_edge.protocol.properties import Properties

    core = make_core()
    store = MemoryLog()  # durable only when told
    core.publish_path.attach_store(store, None)
    lines: list[tuple[str, int, bool]] = []
    core.router.qos2_journal = lambda client_id, packet_id, held: lines.append((client_id, packet_id, held))
    publisher = core.client()
    publisher.connect("pub", clean_start=False, properties=Properties(session_expiry_interval=60))
    assert publisher.send(Publish("t", b"m", 2, packet_id=5)) == []
    session = core.router.sessions["pub"]
    assert lines == []  # not durable yet: nothing answered, nothing journaled
    assert "received" not in session_document(session, 0.0)
    store.make_durable()
    assert [type(p) for p in publisher.read()] == [PubRec]
    assert lines == [("pub", 5, True)]
    assert session_document(session, 0.0)["received"] == [5]
    assert [type(p) for p in publisher.send(PubRel(5))] == [PubComp]
    assert lines == [("pub", 5, True), ("pub", 5, False)]
