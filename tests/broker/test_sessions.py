"""Sessions: clean start, persistence and expiry, offline queues, takeover, redelivery, QoS 2 exactly once."""

from __future__ import annotations

import time

from broker_edge.protocol.packets import (
    ConnAck,
    Connect,
    Disconnect,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
)
from broker_edge.protocol.properties import Properties
from tests.broker.broker_test_clients import PahoClient, RawClient


def test_persistent_session_keeps_subscriptions_and_queues_while_offline(broker):
    sub = PahoClient(broker.port, "device", clean=False, session_expiry=300)
    assert sub.connack_result[0].session_present is False
    sub.subscribe("cmd/#", 1)
    sub.disconnect()
    pub = PahoClient(broker.port, "backend")
    for i in range(3):
        pub.publish(f"cmd/{i}", str(i), 1)
    pub.publish("cmd/q0", b"qos0-not-queued", 0)
    again = PahoClient(broker.port, "device", clean=False, session_expiry=300)
    assert again.connack_result[0].session_present is True
    assert [m.payload for m in again.expect(3)] == [b"0", b"1", b"2"]
    again.expect_none(0.2)


def test_v3_persistent_session(broker):
    sub = PahoClient(broker.port, "v3dev", version=4, clean=False)
    sub.subscribe("x", 2)
    sub.disconnect()
    PahoClient(broker.port, "p", version=4).publish("x", b"queued", 2)
    again = PahoClient(broker.port, "v3dev", version=4, clean=False)
    assert again.connack_result[0].session_present is True
    assert again.expect(1)[0].payload == b"queued"


def test_clean_start_discards_the_old_session(broker):
    sub = PahoClient(broker.port, "d", clean=False, session_expiry=300)
    sub.subscribe("x", 1)
    sub.disconnect()
    fresh = PahoClient(broker.port, "d", clean=True)
    assert fresh.connack_result[0].session_present is False
    PahoClient(broker.port, "p").publish("x", b"nobody", 1)
    fresh.expect_none(0.2)
    assert broker.call(lambda: broker.broker.router.trie.count) == 0


def test_session_expiry_interval_zero_ends_session_at_disconnect(broker):
    sub = PahoClient(broker.port, "short", clean=False, session_expiry=0)
    sub.subscribe("x", 1)
    sub.disconnect()
    deadline = time.monotonic() + 5
    while broker.call(lambda: "short" in broker.broker.router.sessions) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert broker.call(lambda: "short" not in broker.broker.router.sessions)


def test_session_expires_after_its_interval(broker):
    sub = PahoClient(broker.port, "exp", clean=False, session_expiry=1)
    sub.subscribe("x", 1)
    sub.disconnect()
    deadline = time.monotonic() + 5
    while broker.call(lambda: "exp" in broker.broker.router.sessions) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert broker.call(lambda: "exp" not in broker.broker.router.sessions)
    again = PahoClient(broker.port, "exp", clean=False, session_expiry=1)
    assert again.connack_result[0].session_present is False


def test_session_expiry_capped_by_config(start_broker):
    broker = start_broker(sessions={"max_session_expiry_s": 60})
    raw = RawClient(broker.port, 5)
    ack = raw.connect("cap", clean_start=False, properties=Properties(session_expiry_interval=3600))
    assert ack.properties.session_expiry_interval == 60


def test_takeover_disconnects_old_connection_with_0x8e(broker):
    old = RawClient(broker.port, 5)
    old.connect("same-id")
    new = PahoClient(broker.port, "same-id")
    packet = old.recv()
    assert isinstance(packet, Disconnect) and packet.reason_code == 0x8E
    assert old.closed()
    new.subscribe("t", 0)
    PahoClient(broker.port, "p").publish("t", b"to-new")
    assert new.expect(1)[0].payload == b"to-new"


def test_unacknowledged_qos1_redelivered_with_dup_on_resume(broker):
    raw = RawClient(broker.port, 5)
    raw.connect("slow", clean_start=False, properties=Properties(session_expiry_interval=300))
    raw.subscribe("r", 1)
    PahoClient(broker.port, "p").publish("r", b"m1", 1)
    first = raw.recv()
    assert isinstance(first, Publish) and not first.dup
    raw.close()  # no PUBACK
    again = RawClient(broker.port, 5)
    ack = again.connect("slow", clean_start=False, properties=Properties(session_expiry_interval=300))
    assert ack.session_present
    resent = again.recv()
    assert (resent.payload, resent.dup, resent.packet_id) == (b"m1", True, first.packet_id)
    again.send_packet(PubAck(resent.packet_id))


def test_qos2_outgoing_resume_resends_pubrel_after_pubrec(broker):
    raw = RawClient(broker.port, 5)
    raw.connect("q2", clean_start=False, properties=Properties(session_expiry_interval=300))
    raw.subscribe("r", 2)
    PahoClient(broker.port, "p").publish("r", b"m", 2)
    message = raw.recv()
    raw.send_packet(PubRec(message.packet_id))
    assert isinstance(raw.recv(), PubRel)
    raw.close()  # no PUBCOMP
    again = RawClient(broker.port, 5)
    again.connect("q2", clean_start=False, properties=Properties(session_expiry_interval=300))
    rel = again.recv()
    assert isinstance(rel, PubRel) and rel.packet_id == message.packet_id
    again.send_packet(PubComp(rel.packet_id))


def test_incoming_qos2_duplicate_is_delivered_once(broker):
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("once", 2)
    raw = RawClient(broker.port, 5)
    raw.connect("pub2", clean_start=False, properties=Properties(session_expiry_interval=300))
    raw.send_packet(Publish("once", b"exactly", 2, packet_id=11))
    assert isinstance(raw.recv(), PubRec)
    raw.send_packet(Publish("once", b"exactly", 2, dup=True, packet_id=11))
    rec = raw.recv()
    assert isinstance(rec, PubRec) and rec.packet_id == 11
    raw.close()
    # resume: the id is still held until PUBREL
    again = RawClient(broker.port, 5)
    again.connect("pub2", clean_start=False, properties=Properties(session_expiry_interval=300))
    again.send_packet(Publish("once", b"exactly", 2, dup=True, packet_id=11))
    assert isinstance(again.recv(), PubRec)
    again.send_packet(PubRel(11))
    comp = again.recv()
    assert isinstance(comp, PubComp) and comp.reason_code == 0
    assert sub.expect(1)[0].payload == b"exactly"
    sub.expect_none(0.3)


def test_pubrel_for_unknown_id_gets_0x92(broker):
    raw = RawClient(broker.port, 5)
    raw.connect("x")
    raw.send_packet(PubRel(99))
    comp = raw.recv()
    assert isinstance(comp, PubComp) and comp.reason_code == 0x92


def test_empty_client_id_is_assigned_in_v5(broker):
    raw = RawClient(broker.port, 5)
    ack = raw.connect("")
    assert ack.reason_code == 0
    assert ack.properties.assigned_client_identifier


def test_empty_client_id_with_clean_session_0_rejected_in_v3(broker):
    raw = RawClient(broker.port, 4)
    ack = raw.connect("", clean_start=False)
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x02
    assert raw.closed()
    ok = RawClient(broker.port, 4)
    assert ok.connect("", clean_start=True).reason_code == 0


def test_client_receive_maximum_limits_inflight_rest_waits(broker):
    raw = RawClient(broker.port, 5)
    raw.connect("rm", properties=Properties(receive_maximum=2))
    raw.subscribe("f", 1)
    pub = PahoClient(broker.port, "p")
    for i in range(5):
        pub.publish("f", str(i), 1)
    first = [raw.recv(), raw.recv()]
    assert [p.payload for p in first] == [b"0", b"1"]
    try:
        extra = raw.recv(timeout=0.3)
    except TimeoutError:
        extra = None
    assert extra is None  # the third waits for a free slot
    raw.send_packet(PubAck(first[0].packet_id))
    assert raw.recv().payload == b"2"


def test_exceeding_broker_receive_maximum_is_0x93(start_broker):
    broker = start_broker(limits={"receive_maximum": 2})
    raw = RawClient(broker.port, 5)
    assert raw.connect("flood").properties.receive_maximum == 2
    for pid in (1, 2, 3):  # QoS 2 without PUBREL keeps each id unacknowledged
        raw.send_packet(Publish("t", b"x", 2, packet_id=pid))
    codes = []
    while True:
        packet = raw.recv()
        if packet is None:
            break
        codes.append(type(packet).__name__ + f":{packet.reason_code}")
        if isinstance(packet, Disconnect):
            break
    assert codes[-1] == "Disconnect:147"


def test_message_expiry_drops_expired_queued_messages(broker):
    sub = PahoClient(broker.port, "ex", clean=False, session_expiry=300)
    sub.subscribe("e/#", 1)
    sub.disconnect()
    pub = RawClient(broker.port, 5)
    pub.connect("pub")
    pub.send_packet(
        Publish("e/short", b"gone", 1, packet_id=1, properties=Properties(message_expiry_interval=1))
    )
    pub.recv()
    pub.send_packet(
        Publish("e/long", b"kept", 1, packet_id=2, properties=Properties(message_expiry_interval=100))
    )
    pub.recv()
    time.sleep(1.1)
    again = RawClient(broker.port, 5)
    again.connect("ex", clean_start=False, properties=Properties(session_expiry_interval=300))
    message = again.recv()
    assert message.payload == b"kept"
    assert 0 < message.properties.message_expiry_interval <= 99
    assert broker.drops("expired") == 1


def test_keepalive_timeout_closes_connection(broker):
    raw = RawClient(broker.port, 5)
    ack = raw.connect("idle", keep_alive=1)
    assert ack.reason_code == 0
    packet = raw.recv(timeout=5)
    assert isinstance(packet, Disconnect) and packet.reason_code == 0x8D


def test_server_keep_alive_when_client_asks_more_than_maximum(start_broker):
    broker = start_broker(limits={"max_keepalive_s": 30})
    raw = RawClient(broker.port, 5)
    assert raw.connect("ka", keep_alive=600).properties.server_keep_alive == 30
    zero = RawClient(broker.port, 5)
    assert zero.connect("ka0", keep_alive=0).properties.server_keep_alive == 30


def test_keepalive_zero_in_v3_means_none(broker):
    raw = RawClient(broker.port, 4)
    raw.connect("forever", keep_alive=0)
    assert (
        broker.call(lambda: next(c.keepalive for c in broker.broker.connections if c.client_id == "forever"))
        == 0
    )


def test_connect_twice_with_connect_packet_in_fields(broker):
    raw = RawClient(broker.port, 4)
    raw.send_packet(Connect(protocol_version=4, client_id="a"))
    raw.send_packet(Connect(protocol_version=4, client_id="a"))
    assert isinstance(raw.recv(), ConnAck)
    assert raw.closed()
