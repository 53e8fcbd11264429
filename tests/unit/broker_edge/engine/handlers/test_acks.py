"""PUBACK, PUBREC, PUBREL, PUBCOMP: the QoS 1 and QoS 2 flows in both directions (MQTT 4.3)."""

from broker_edge.protocol.packets import (
    MQTT_3_1_1,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Subscription,
)
from tests.unit.broker_edge.engine.handlers.wire import make_core


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
