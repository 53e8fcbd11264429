"""Sessions: clean start, persistence and expiry, offline queues, takeover, redelivery, QoS 2 exactly once."""

from __future__ import annotations

import time

import pytest

from broker_edge.protocol.packets import (
    ConnAck,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Will,
)
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import PahoClient, RawClient, wait_for


@pytest.mark.mqtt5(
    "MQTT-3.1.2-5",
    "MQTT-3.1.2-6",
    "MQTT-3.1.2-23",
    "MQTT-3.1.3-2",
    "MQTT-3.2.2-3",
    "MQTT-4.1.0-1",
    "MQTT-4.5.0-1",
)
def test_persistent_session_keeps_subscriptions_and_queues_while_offline(broker):
    sub = PahoClient(broker.port, "device", clean=False, session_expiry=300)
    assert sub.connack_result[0].session_present is False
    sub.subscribe("cmd/#", 1)
    sub.disconnect()
    pub = PahoClient(broker.port, "backend")
    for i in range(3):
        pub.publish(f"cmd/{i}", str(i), 1)
    pub.publish("cmd/q0", b"qos0-not-queued", 0)
    pub.publish("elsewhere", b"after the QoS 0 one", 1)  # acknowledged: the QoS 0 PUBLISH was handled
    assert broker.call(lambda: broker.broker.router.sessions["device"].queue is not None)
    again = PahoClient(broker.port, "device", clean=False, session_expiry=300)
    assert again.connack_result[0].session_present is True
    assert [m.payload for m in again.expect(3)] == [b"0", b"1", b"2"]
    again.expect_none(0.2)
    PahoClient(broker.port, "backend2").publish("cmd/live", b"subscription kept", 1)
    assert again.expect(1)[0].payload == b"subscription kept"


@pytest.mark.mqtt311("MQTT-3.1.3-2", "MQTT-4.1.0-1", "MQTT-4.1.0-2", "MQTT-4.5.0-1")
def test_v3_persistent_session(broker):
    sub = PahoClient(broker.port, "v3dev", version=4, clean=False)
    sub.subscribe("x", 2)
    sub.disconnect()
    PahoClient(broker.port, "p", version=4).publish("x", b"queued", 2)
    again = PahoClient(broker.port, "v3dev", version=4, clean=False)
    assert again.connack_result[0].session_present is True
    assert again.expect(1)[0].payload == b"queued"


@pytest.mark.mqtt5("MQTT-3.1.2-4", "MQTT-3.1.4-4", "MQTT-3.2.2-2")
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
    assert wait_for(lambda: broker.call(lambda: "short" not in broker.broker.router.sessions))


@pytest.mark.mqtt5("MQTT-3.1.2-23", "MQTT-4.1.0-2")
@pytest.mark.parametrize(
    ("version", "session_expiry", "sections", "lifetime"),
    [
        (5, 100, {}, 100),  # v5: its Session Expiry Interval
        (4, None, {"sessions": {"max_session_expiry_s": 50}}, 50),  # v3 clean session 0: the maximum
    ],
)
def test_offline_session_lives_for_its_expiry(start_broker, version, session_expiry, sections, lifetime):
    broker = start_broker(**sections)
    sub = PahoClient(broker.port, "keep", version=version, clean=False, session_expiry=session_expiry)
    sub.subscribe("x", 1)
    sub.disconnect()
    assert wait_for(lambda: not broker.connected("keep"))
    broker.tick(lifetime - 10)
    assert broker.call(lambda: "keep" in broker.broker.router.sessions)
    broker.tick(lifetime + 1)
    assert broker.call(lambda: "keep" not in broker.broker.router.sessions)
    assert broker.call(lambda: broker.broker.router.trie.count) == 0
    again = PahoClient(broker.port, "keep", version=version, clean=False, session_expiry=session_expiry)
    assert again.connack_result[0].session_present is False


def test_session_expiry_capped_by_config(start_broker):
    broker = start_broker(sessions={"max_session_expiry_s": 60})
    raw = RawClient(broker.port, 5)
    ack = raw.connect("cap", clean_start=False, properties=Properties(session_expiry_interval=3600))
    assert ack.properties.session_expiry_interval == 60


@pytest.mark.mqtt5("MQTT-3.1.4-3", "MQTT-3.14.2-1")
def test_takeover_disconnects_old_connection_with_0x8e(broker):
    old = RawClient(broker.port, 5)
    old.connect("same-id")
    new = PahoClient(broker.port, "same-id")
    packet = old.expect_disconnect(0x8E)
    assert packet.properties.reason_string == "another connection took over this client id"
    assert broker.disconnects("session_taken_over") == 1
    new.subscribe("t", 0)
    PahoClient(broker.port, "p").publish("t", b"to-new")
    assert new.expect(1)[0].payload == b"to-new"


@pytest.mark.mqtt311("MQTT-2.3.1-4", "MQTT-3.3.1-1", "MQTT-4.3.2-1", "MQTT-4.4.0-1")
@pytest.mark.mqtt5("MQTT-3.2.0-1", "MQTT-3.3.1-1", "MQTT-4.3.2-2", "MQTT-4.4.0-1")
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


@pytest.mark.mqtt311("MQTT-2.3.1-6", "MQTT-4.3.3-1", "MQTT-4.4.0-1")
@pytest.mark.mqtt5(
    "MQTT-2.2.1-5",
    "MQTT-3.6.2-1",
    "MQTT-4.3.3-2",
    "MQTT-4.3.3-4",
    "MQTT-4.3.3-5",
    "MQTT-4.3.3-6",
    "MQTT-4.4.0-1",
)
def test_qos2_outgoing_resume_resends_pubrel_after_pubrec(broker):
    raw = RawClient(broker.port, 5)
    raw.connect("q2", clean_start=False, properties=Properties(session_expiry_interval=300))
    raw.subscribe("r", 2)
    PahoClient(broker.port, "p").publish("r", b"m", 2)
    message = raw.recv()
    assert (message.qos, message.dup) == (2, False)
    raw.send_packet(PubRec(message.packet_id))
    assert isinstance(raw.recv(), PubRel)
    raw.close()  # no PUBCOMP
    again = RawClient(broker.port, 5)
    again.connect("q2", clean_start=False, properties=Properties(session_expiry_interval=300))
    rel = again.recv()
    assert isinstance(rel, PubRel) and rel.packet_id == message.packet_id
    again.send_packet(PubComp(rel.packet_id))


@pytest.mark.mqtt311("MQTT-2.3.1-6")
@pytest.mark.mqtt5(
    "MQTT-2.2.1-5",
    "MQTT-3.3.4-1",
    "MQTT-3.5.2-1",
    "MQTT-3.7.2-1",
    "MQTT-4.3.3-8",
    "MQTT-4.3.3-10",
    "MQTT-4.3.3-11",
)
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


@pytest.mark.mqtt5("MQTT-3.7.2-1")
def test_pubrel_for_unknown_id_gets_0x92(broker):
    raw = RawClient(broker.port, 5)
    raw.connect("x")
    raw.send_packet(PubRel(99))
    comp = raw.recv()
    assert isinstance(comp, PubComp) and comp.reason_code == 0x92


@pytest.mark.mqtt5("MQTT-3.1.3-6", "MQTT-3.1.3-7", "MQTT-3.1.4-5", "MQTT-3.2.2-16")
def test_empty_client_id_is_assigned_in_v5(broker):
    raw = RawClient(broker.port, 5)
    ack = raw.connect("")
    assert ack.reason_code == 0
    assigned = ack.properties.assigned_client_identifier
    assert assigned and broker.connected(assigned)
    other = RawClient(broker.port, 5)
    assert other.connect("").properties.assigned_client_identifier not in (None, assigned)
    named = RawClient(broker.port, 5)
    assert named.connect("named").properties.assigned_client_identifier is None


@pytest.mark.mqtt311("MQTT-3.1.3-8", "MQTT-3.2.2-5")
def test_empty_client_id_with_clean_session_0_rejected_in_v3(broker):
    raw = RawClient(broker.port, 4)
    ack = raw.connect("", clean_start=False)
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x02
    assert raw.closed()


def test_exceeding_broker_receive_maximum_is_0x93(start_broker):
    broker = start_broker(limits={"receive_maximum": 2})
    raw = RawClient(broker.port, 5)
    assert raw.connect("flood").properties.receive_maximum == 2
    for pid in (1, 2, 3):  # QoS 2 without PUBREL keeps each id unacknowledged
        raw.send_packet(Publish("t", b"x", 2, packet_id=pid))
    replies = [raw.recv(), raw.recv()]
    assert [(type(p), p.packet_id) for p in replies] == [(PubRec, 1), (PubRec, 2)]
    raw.expect_disconnect(0x93)
    assert broker.disconnects("receive_maximum_exceeded") == 1


@pytest.mark.mqtt311("MQTT-2.3.1-6")
@pytest.mark.mqtt5("MQTT-2.2.1-5", "MQTT-3.3.4-1", "MQTT-4.3.2-4")
def test_receive_maximum_counts_only_unacknowledged_publishes(start_broker):
    broker = start_broker(limits={"receive_maximum": 2})
    raw = RawClient(broker.port, 5)
    raw.connect("steady")
    for pid in range(1, 7):  # six QoS 2 flows, completed one by one: never more than one open
        raw.send_packet(Publish("t", b"x", 2, packet_id=pid))
        assert isinstance(raw.recv(), PubRec)
        raw.send_packet(PubRel(pid))
        assert isinstance(raw.recv(), PubComp)
    for pid in range(1, 9):  # QoS 1 is acknowledged at once
        raw.send_packet(Publish("t", b"y", 1, packet_id=pid))
    assert [raw.recv().packet_id for _ in range(8)] == list(range(1, 9))


def _held_qos2_publish(port: int, client_id: str, packet_id: int) -> None:
    """A QoS 2 PUBLISH of a persistent session answered with PUBREC, then the connection lost before
    PUBREL: the session holds ``packet_id`` for the next connection."""
    raw = RawClient(port, 5)
    raw.connect(client_id, clean_start=False, properties=Properties(session_expiry_interval=300))
    raw.send_packet(Publish("t", b"held", 2, packet_id=packet_id))
    assert isinstance(raw.recv(), PubRec)
    raw.close()


@pytest.mark.mqtt5("MQTT-4.3.3-10", "MQTT-4.4.0-1")
@pytest.mark.parametrize("finish_old", ["pubrel", "publish_again"])
def test_receive_maximum_of_a_resumed_session_counts_this_connections_qos2_publishes(
    start_broker, finish_old
):
    """A client back on its session finishes the QoS 2 flow its last connection left open [MQTT-4.4.0-1]:
    its PUBREL is answered with PUBCOMP [MQTT-4.3.3-10] and frees nothing of this connection's Receive
    Maximum, which that PUBLISH never took; a PUBLISH sent again takes a place as any other. Either way a
    client with two QoS 2 publishes of this connection open that sends a third is over the broker's Receive
    Maximum of 2: DISCONNECT 0x93."""
    broker = start_broker(limits={"receive_maximum": 2})
    _held_qos2_publish(broker.port, "device", 1)
    back = RawClient(broker.port, 5)
    assert back.connect("device", clean_start=False, properties=Properties(session_expiry_interval=300))
    if finish_old == "publish_again":  # its PUBREC was lost: the PUBLISH again, a place taken until PUBCOMP
        back.send_packet(Publish("t", b"held", 2, dup=True, packet_id=1))
        assert isinstance(back.recv(), PubRec)
    back.send_packet(Publish("t", b"new", 2, packet_id=2))
    assert isinstance(back.recv(), PubRec)
    if finish_old == "pubrel":
        back.send_packet(Publish("t", b"new", 2, packet_id=3))
        assert isinstance(back.recv(), PubRec)
    back.send_packet(PubRel(1))
    comp = back.recv()
    assert isinstance(comp, PubComp) and (comp.packet_id, comp.reason_code) == (1, 0)
    if finish_old == "publish_again":
        back.send_packet(Publish("t", b"new", 2, packet_id=3))
        assert isinstance(back.recv(), PubRec)
    back.send_packet(Publish("t", b"one too many", 2, packet_id=4))  # 2 and 3 wait for PUBREL
    back.expect_disconnect(0x93)


@pytest.mark.mqtt5("MQTT-3.3.2-5", "MQTT-3.3.2-6")
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


@pytest.mark.mqtt311("MQTT-3.1.4-2")
def test_takeover_of_a_v3_client_closes_it_and_sends_its_will(broker):
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("wills/#", 1)
    old = PahoClient(broker.port, "dup", version=4, clean=False, will=("wills/dup", b"replaced", 1, False))
    old.subscribe("kept", 1)
    new = PahoClient(broker.port, "dup", version=4, clean=False)
    assert new.connack_result[0].session_present is True  # the session moves to the new connection
    assert old.disconnects.get(timeout=5) is not None
    assert watcher.expect(1)[0].payload == b"replaced"
    PahoClient(broker.port, "p").publish("kept", b"to the new one", 1)
    assert new.expect(1)[0].payload == b"to the new one"
    old.expect_none(0.1)


@pytest.mark.mqtt311("MQTT-3.1.2-24")
@pytest.mark.mqtt5("MQTT-3.1.2-22", "MQTT-3.2.2-22")
def test_keepalive_timeout_is_one_and_a_half_times_the_keepalive(broker):
    raw = RawClient(broker.port, 5)
    assert raw.connect("idle", keep_alive=100).reason_code == 0
    after = broker.call(broker.broker.loop.time)
    connection = broker.connection("idle")
    broker.call(lambda: connection.check_timers(after + 149))  # the sweep, 149 s later, no packet since
    raw.recv_none(0.1)
    assert broker.connected("idle")
    broker.call(lambda: connection.check_timers(after + 151))
    raw.expect_disconnect(0x8D)
    assert broker.disconnects("keep_alive_timeout") == 1


@pytest.mark.mqtt5("MQTT-3.1.2-22", "MQTT-3.12.4-1")
def test_any_packet_restarts_the_keepalive_period(broker):
    raw = RawClient(broker.port, 5)
    assert raw.connect("active", keep_alive=100).reason_code == 0
    broker.call(lambda: broker.broker._sweep_handle.cancel())  # only the times given below
    connection = broker.connection("active")
    start = broker.call(broker.broker.loop.time)
    raw.send_packet(PingReq())
    assert isinstance(raw.recv(), PingResp)
    broker.call(lambda: connection.check_timers(start + 100))  # the sweep that sees the PINGREQ
    broker.call(lambda: connection.check_timers(start + 249))  # 149 s after it: still open
    raw.recv_none(0.1)
    broker.call(lambda: connection.check_timers(start + 251))
    raw.expect_disconnect(0x8D)


@pytest.mark.mqtt311("MQTT-3.1.2-8", "MQTT-3.1.2-16", "MQTT-3.1.2-24")
def test_keepalive_timeout_closes_v3_connection_and_sends_the_will(broker):
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("wills/#", 1)
    raw = RawClient(broker.port, 4)
    raw.connect("silent", keep_alive=10, will=Will("wills/silent", b"timed out", 1))
    after = broker.call(broker.broker.loop.time)
    connection = broker.connection("silent")
    broker.call(lambda: connection.check_timers(after + 16))
    assert raw.closed()
    [will] = watcher.expect(1)
    assert (will.payload, will.retain) == (b"timed out", False)


@pytest.mark.mqtt5("MQTT-3.2.2-22")
def test_server_keep_alive_when_client_asks_more_than_maximum(start_broker):
    broker = start_broker(limits={"max_keepalive_s": 30})
    raw = RawClient(broker.port, 5)
    assert raw.connect("ka", keep_alive=600).properties.server_keep_alive == 30
    zero = RawClient(broker.port, 5)
    assert zero.connect("ka0", keep_alive=0).properties.server_keep_alive == 30
    within = RawClient(broker.port, 5)
    assert within.connect("ka20", keep_alive=20).properties.server_keep_alive is None
    connection = broker.connection("ka")
    now = broker.call(broker.broker.loop.time)
    broker.call(lambda: connection.check_timers(now + 46))  # enforced: 1.5 x 30, not 1.5 x 600
    assert raw.recv().reason_code == 0x8D


@pytest.mark.mqtt311("MQTT-3.12.4-1")
def test_keepalive_zero_in_v3_means_none(broker):
    raw = RawClient(broker.port, 4)
    raw.connect("forever", keep_alive=0)
    now = broker.call(broker.broker.loop.time)
    connection = broker.connection("forever")
    broker.call(lambda: connection.check_timers(now + 10**7))  # four months without a packet
    assert broker.connected("forever")
    raw.send_packet(PingReq())
    assert isinstance(raw.recv(), PingResp)


@pytest.mark.mqtt311("MQTT-3.1.3-6", "MQTT-3.1.4-4")
def test_empty_client_id_is_assigned_in_v3_with_clean_session(broker):
    raw = RawClient(broker.port, 4)
    assert raw.connect("", clean_start=True).reason_code == 0
    assert broker.call(lambda: [s for s in broker.broker.router.sessions if s.startswith("auto-")])
    raw.subscribe("anon/t", 1)
    PahoClient(broker.port, "p").publish("anon/t", b"to an assigned id", 1)
    assert raw.recv().payload == b"to an assigned id"


@pytest.mark.mqtt5("MQTT-3.3.4-9", "MQTT-4.4.0-1")
def test_a_resumed_session_resends_no_more_than_the_new_receive_maximum(broker):
    """A client that comes back with a smaller Receive Maximum than its session had in flight gets the
    unacknowledged messages again with their own packet ids and DUP [MQTT-4.4.0-1], but never more of them
    unacknowledged at once than it now allows [MQTT-3.3.4-9]: the rest follow as it acknowledges, then
    what waited in the queue."""
    persistent = Properties(session_expiry_interval=300, receive_maximum=5)
    device = RawClient(broker.port, 5)
    device.connect("device", clean_start=False, properties=persistent)
    device.subscribe("cmd", 2)
    pub = PahoClient(broker.port, "backend")
    for i in range(6):
        pub.publish("cmd", f"{i}".encode(), 1 if i % 2 else 2)
    first = [device.recv() for _ in range(5)]  # the sixth waits: the window is full
    device.send_packet(PubRec(first[0].packet_id))  # a QoS 2 delivery past PUBREC: its PUBREL comes again
    assert isinstance(device.recv(), PubRel)
    device.close()

    back = RawClient(broker.port, 5)
    small = Properties(session_expiry_interval=300, receive_maximum=2)
    assert back.connect("device", clean_start=False, properties=small).session_present
    released = back.recv()
    assert isinstance(released, PubRel) and released.packet_id == first[0].packet_id
    again = back.recv()
    assert (again.packet_id, again.dup, again.payload) == (first[1].packet_id, True, b"1")
    back.recv_none()  # two unacknowledged: the PUBREL's flow and the QoS 1 PUBLISH
    back.send_packet(PubComp(released.packet_id))
    resent = back.recv()
    assert (resent.packet_id, resent.dup, resent.payload) == (first[2].packet_id, True, b"2")
    back.recv_none()
    payloads = []
    for packet in (again, resent):
        back.send_packet(PubAck(packet.packet_id) if packet.qos == 1 else PubRec(packet.packet_id))
    for _ in range(6):  # the PUBREL of "2", then "3" and "4" again, then "5" from the queue, one by one
        packet = back.recv()
        if isinstance(packet, PubRel):
            back.send_packet(PubComp(packet.packet_id))
            continue
        payloads.append((packet.payload, packet.dup))
        back.send_packet(PubAck(packet.packet_id) if packet.qos == 1 else PubRec(packet.packet_id))
        if len(payloads) == 3:
            break
    assert payloads == [(b"3", True), (b"4", True), (b"5", False)]


def test_a_disconnect_may_repeat_a_session_expiry_the_broker_lowered_to_0(start_broker):
    """Setting a Session Expiry Interval on DISCONNECT is a protocol error only when the CONNECT's was 0
    (MQTT 5.0 3.14.2.2.2). A client that asked for one and was told 0 in CONNACK (a broker that keeps no
    sessions: ``sessions.max_session_expiry_s: 0``) and says it again when it leaves has made no error: it
    is closed without a DISCONNECT 0x82, and its session ends all the same."""
    broker = start_broker(sessions={"max_session_expiry_s": 0})
    device = RawClient(broker.port, 5)
    ack = device.connect("device", clean_start=False, properties=Properties(session_expiry_interval=600))
    assert ack.properties.session_expiry_interval == 0
    device.send_packet(Disconnect(0, Properties(session_expiry_interval=600)))
    assert device.recv() is None  # closed, no DISCONNECT from the broker
    again = RawClient(broker.port, 5)
    assert not again.connect("device", clean_start=False).session_present
