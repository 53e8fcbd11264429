"""One client id, one session, cluster-wide: three broker processes and a real etcd, paho and raw clients.

A client that reconnects to another broker takes its session over from the broker that held it (which
disconnects the old connection: MQTT 5 DISCONNECT 0x8E, MQTT 3.1.1 a closed connection), and is redelivered
everything after its last acknowledged offset; a persistent session survives its broker's SIGKILL; a clean
start on another broker discards the session where it was; a client id whose session belongs to another
user is refused on any broker as the standalone broker refuses it.
"""

from __future__ import annotations

import pytest

from broker_edge.engine.message import OFFSETS_OPT_IN
from broker_edge.protocol.packets import (
    Connect,
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
from broker_edge.protocol.reason_codes import ReasonCode
from tests.e2e.broker_clients import PahoClient, RawClient
from tests.e2e.cluster.proof import session_record, wait_settled, wait_until
from tests.e2e.commitlog.e2e_helpers import offset_of

EXPIRY = 3600
VERSIONS = pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])
SHARED = pytest.mark.shares_cluster  # the module's one cluster: the test harms none of its brokers


def persistent_raw(port: int, client_id: str, version: int, will: Will | None = None) -> RawClient:
    """A raw client with a persistent session (it acknowledges only what the test tells it to); in MQTT 5
    it opts in to the ``offset`` property on deliveries."""
    raw = RawClient(port, version=version)
    properties = None
    if version == 5:
        properties = Properties(session_expiry_interval=EXPIRY, user_properties=[OFFSETS_OPT_IN])
    raw.send_packet(
        Connect(
            protocol_version=version, client_id=client_id, clean_start=False, will=will, properties=properties
        )
    )
    connack = raw.recv()
    assert connack is not None and getattr(connack, "reason_code", getattr(connack, "return_code", 1)) == 0
    return raw


def persistent_paho(port: int, client_id: str, version: int, clean: bool = False) -> PahoClient:
    return PahoClient(
        port, client_id, version=version, clean=clean, session_expiry=EXPIRY if version == 5 else None
    )


def session_present(client: PahoClient) -> bool:
    return bool(client.connack_result[0].session_present)


def payloads(client: PahoClient, count: int) -> list[bytes]:
    return [message.payload for message in client.expect(count, timeout=15)]


@SHARED
@VERSIONS
@pytest.mark.mqtt311("MQTT-3.1.4-2", "MQTT-3.1.2-4", "MQTT-3.1.2-8")
@pytest.mark.mqtt5("MQTT-3.1.4-3", "MQTT-3.1.2-5", "MQTT-3.1.2-8")
def test_a_client_moving_to_another_broker_takes_its_session_and_its_unacknowledged_messages(
    three_brokers, etcd, version
):
    a, b, c = three_brokers["a"], three_brokers["b"], three_brokers["c"]
    client_id = f"mover-{version}"
    topic = f"move/{version}/x"
    watcher = PahoClient(c.port, f"watch-{client_id}", version=version)
    watcher.subscribe(f"wills/{client_id}", 1)
    old = persistent_raw(a.port, client_id, version, Will(f"wills/{client_id}", b"old connection gone", 1))
    old.subscribe(f"move/{version}/#", 1)
    publisher = PahoClient(c.port, f"pub-{client_id}", version=version)
    for n in range(5):
        publisher.publish(topic, f"m{n}".encode(), 1)
    delivered = [old.recv(timeout=15) for _ in range(5)]
    assert [packet.payload for packet in delivered] == [f"m{n}".encode() for n in range(5)]
    for packet in delivered[:2]:  # m0 and m1 acknowledged; m2..m4 left in flight
        old.send_packet(PubAck(packet.packet_id))
    old.send_packet(PingReq())
    assert isinstance(old.recv(), PingResp)  # a has handled the acknowledgements

    moved = persistent_paho(b.port, client_id, version)

    assert session_present(moved)
    ended = old.recv(timeout=10)
    if version == 5:  # v5: told why; v3.1.1: the connection is closed [MQTT-3.1.4-2]
        assert isinstance(ended, Disconnect) and ended.reason_code == ReasonCode.SESSION_TAKEN_OVER
        assert old.recv(timeout=10) is None
    else:
        assert ended is None
    for n in range(5, 7):
        publisher.publish(topic, f"m{n}".encode(), 1)
    # everything after the last acknowledgement, from b's copy of the log, in order, once
    redelivered = moved.expect(5, timeout=15)
    assert [m.payload for m in redelivered] == [f"m{n}".encode() for n in range(2, 7)]
    if version == 5:  # the opt-in moved with the session, and the offsets are a's
        assert [offset_of(m) for m in redelivered] == list(range(2, 7))
    moved.expect_none(1.0)
    record = session_record(etcd, client_id)
    assert record is not None and record.node == "b"
    # a will without delay is published on a takeover, once, as by a broker alone (v5 section 3.1.4;
    # 3.1.1 deletes a will only on DISCONNECT)
    assert [m.payload for m in watcher.expect(1)] == [b"old connection gone"]
    watcher.expect_none(1.0)


@VERSIONS
def test_a_persistent_session_survives_its_broker_killed(three_brokers, etcd, version):
    """The session's state, saved to etcd while a held it, is restored by b after a's SIGKILL: what the
    client had acknowledged is not delivered again, what was published meanwhile is."""
    a, b, c = three_brokers["a"], three_brokers["b"], three_brokers["c"]
    client_id, topic = f"keeper-{version}", f"kept/{version}"
    keeper = persistent_paho(a.port, client_id, version)
    keeper.subscribe(f"{topic}/#", 1)
    publisher = PahoClient(c.port, f"pub-{client_id}", version=version)
    for n in range(3):
        publisher.publish(f"{topic}/x", f"k{n}".encode(), 1)
    assert payloads(keeper, 3) == [b"k0", b"k1", b"k2"]

    def saved_after_k2() -> bool:
        record = session_record(etcd, client_id)
        return record is not None and (record.state or {}).get("cursors", {}).get(f"{topic}/x") == 3

    wait_until(saved_after_k2, what="a saving the session's position (after k2) to etcd")
    a.kill()
    keeper.kill()
    wait_settled(etcd, {"b", "c"}, 2)
    for n in range(3, 6):
        publisher.publish(f"{topic}/x", f"k{n}".encode(), 1)

    back = persistent_paho(b.port, client_id, version)

    assert session_present(back)
    assert payloads(back, 3) == [b"k3", b"k4", b"k5"]
    back.expect_none(1.0)


@SHARED
@VERSIONS
@pytest.mark.mqtt311("MQTT-3.1.2-6", "MQTT-3.2.2-1")
@pytest.mark.mqtt5("MQTT-3.1.2-4", "MQTT-3.2.2-2")
def test_a_clean_start_on_another_broker_discards_the_session_where_it_was(three_brokers, etcd, version):
    a, b, c = three_brokers["a"], three_brokers["b"], three_brokers["c"]
    client_id = f"cleaner-{version}"
    first = persistent_paho(a.port, client_id, version)
    first.subscribe(f"clean/{version}/#", 1)
    first.disconnect()
    publisher = PahoClient(c.port, f"pub-{client_id}", version=version)
    publisher.publish(f"clean/{version}/x", b"while away", 1)

    fresh = PahoClient(b.port, client_id, version=version, clean=True)  # and no session after it

    assert not session_present(fresh)
    publisher.publish(f"clean/{version}/x", b"after the clean start", 1)
    fresh.expect_none(1.5)  # no subscription came with it, and nothing queued for the old one
    fresh.disconnect()
    wait_until(lambda: session_record(etcd, client_id) is None, what="the ended session's record removed")
    again = persistent_paho(a.port, client_id, version)
    assert not session_present(again)  # a kept nothing of it
    again.expect_none(1.0)


@SHARED
@VERSIONS
def test_a_session_of_another_user_is_refused_on_any_broker_and_left_alone(three_brokers, version):
    """Timestone's session-owner rule (docs/security.md), cluster-wide: the registry names the owner."""
    a, b, c = three_brokers["a"], three_brokers["b"], three_brokers["c"]
    client_id = f"owned-{version}"
    alice = PahoClient(a.port, client_id, version=version, username="alice")
    alice.subscribe(f"owned/{version}", 1)

    intruder = PahoClient(b.port, client_id, version=version, username="mallory", connect=False)
    _, code, _ = intruder.connect()

    assert code == ReasonCode.NOT_AUTHORIZED  # paho shows 3.1.1's return code 5 as this reason code too
    PahoClient(c.port, f"pub-{client_id}", version=version).publish(f"owned/{version}", b"still here", 1)
    assert payloads(alice, 1) == [b"still here"]  # neither taken over nor discarded


def test_a_broker_stopped_cleanly_leaves_exact_positions_and_its_clients_wills(three_brokers, etcd):
    """SIGTERM: a saves its sessions' positions before it disconnects its clients (MQTT 5: 0x8B) and leaves;
    a survivor publishes the will once; the client resumes on b with nothing repeated and nothing lost."""
    a, b, c = three_brokers["a"], three_brokers["b"], three_brokers["c"]
    watcher = PahoClient(b.port, "watch-drained")
    watcher.subscribe("wills/drained", 1)
    client = PahoClient(
        a.port, "drained", clean=False, session_expiry=EXPIRY, will=("wills/drained", b"gone", 1, False)
    )
    client.subscribe("drain/#", 1)
    publisher = PahoClient(c.port, "pub-drained")
    for n in range(3):
        publisher.publish("drain/x", f"d{n}".encode(), 1)
    assert payloads(client, 3) == [b"d0", b"d1", b"d2"]
    client.publish("sync/drained", b"", 1)  # acknowledged after a has read the client's PUBACKs before it

    a.stop()

    assert client.disconnects.get(timeout=15) == ReasonCode.SERVER_SHUTTING_DOWN
    [will] = watcher.expect(1, timeout=15)
    assert will.payload == b"gone"
    publisher.publish("drain/x", b"d3", 1)
    back = persistent_paho(b.port, "drained", 5)
    assert session_present(back)
    assert payloads(back, 1) == [b"d3"]
    back.expect_none(1.0)
    watcher.expect_none(1.0)


@SHARED
@pytest.mark.mqtt5("MQTT-3.1.4-3", "MQTT-3.1.2-5")
def test_a_session_without_expiry_is_resumed_by_a_takeover_while_its_connection_is_open(three_brokers):
    """As on one broker: the session of an open connection exists, whatever its expiry, so a takeover with
    Clean Start 0 resumes it (its subscription with it) before the old connection's end could end it."""
    a, b, c = three_brokers["a"], three_brokers["b"], three_brokers["c"]
    old = PahoClient(a.port, "brief", session_expiry=0)
    old.subscribe("brief/#", 1, noLocal=True)

    moved = PahoClient(b.port, "brief", clean=False, session_expiry=0)

    assert session_present(moved)
    assert old.disconnects.get(timeout=10) == ReasonCode.SESSION_TAKEN_OVER
    PahoClient(c.port, "pub-brief").publish("brief/x", b"to the moved session", 1)
    assert payloads(moved, 1) == [b"to the moved session"]
    moved.publish("brief/x", b"its own", 1)
    moved.expect_none(1.0)  # No Local came with the subscription


@SHARED
@pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])
@pytest.mark.mqtt311("MQTT-3.1.4-2", "MQTT-3.1.2-8")
@pytest.mark.mqtt5("MQTT-3.1.4-3", "MQTT-3.1.2-8")
def test_a_takeover_on_the_same_broker_of_a_cluster_follows_the_same_rules(three_brokers, version):
    b, c = three_brokers["b"], three_brokers["c"]
    client_id = f"twice-{version}"
    watcher = PahoClient(c.port, f"watch-{client_id}", version=version)
    watcher.subscribe(f"wills/{client_id}", 1)
    old = PahoClient(
        b.port,
        client_id,
        version=version,
        clean=False,
        session_expiry=EXPIRY if version == 5 else None,
        will=(f"wills/{client_id}", b"gone", 1, False),
    )
    old.subscribe(f"twice/{version}", 1)

    again = persistent_paho(b.port, client_id, version)

    assert session_present(again)
    if version == 5:
        assert old.disconnects.get(timeout=10) == ReasonCode.SESSION_TAKEN_OVER
    assert [m.payload for m in watcher.expect(1)] == [b"gone"]  # no delay: published, as by a broker alone
    PahoClient(c.port, f"pub-{client_id}", version=version).publish(f"twice/{version}", b"kept", 1)
    assert payloads(again, 1) == [b"kept"]
    watcher.expect_none(1.0)  # once


def test_a_connect_waiting_on_a_member_that_lost_its_lease_is_sent_to_a_live_member_with_connack_0x9c(
    three_brokers,
):
    """A member hung past its lease's TTL (SIGSTOP) fences itself when it runs again. A v5 CONNECT that
    reached it meanwhile is answered at once with CONNACK 0x9C "use another server" naming a live member
    (MQTT 5 4.11), not held until the member has registered again; the client connects there."""
    import os
    import signal
    import time

    paused = three_brokers["a"]
    assert paused.process is not None
    others = {f"127.0.0.1:{three_brokers[node].port}": three_brokers[node] for node in ("b", "c")}
    os.kill(paused.process.pid, signal.SIGSTOP)
    try:
        waiting = RawClient(paused.port, version=5)  # the kernel takes the connection in meanwhile
        waiting.send_packet(Connect(protocol_version=5, client_id="waiting", clean_start=True))
        time.sleep(4.0)  # the lease's TTL is 3 s
    finally:
        os.kill(paused.process.pid, signal.SIGCONT)

    connack = waiting.recv(timeout=10)
    assert connack.reason_code == ReasonCode.USE_ANOTHER_SERVER
    assert connack.properties is not None and connack.properties.server_reference in others
    assert waiting.closed()
    elsewhere = RawClient(others[connack.properties.server_reference].port, version=5)
    assert elsewhere.connect("waiting").reason_code == 0


@pytest.mark.parametrize(
    "ending",
    [
        pytest.param("takeover", marks=SHARED),
        pytest.param("takeover on the same member", marks=SHARED),
        "SIGKILL",
    ],
)
@pytest.mark.mqtt5("MQTT-4.3.3-10", "MQTT-4.3.3-11", "MQTT-4.4.0-1")
def test_an_incoming_qos2_id_moves_with_the_session_to_another_member(three_brokers, etcd, ending):
    """[MQTT-4.3.3-10] [MQTT-4.3.3-11] A publisher past PUBREC of a QoS 2 PUBLISH that resumes its session
    on another member (its connection to the first still open, or the first killed after saving the
    session) or on the same one while its connection there is open, and resends the PUBLISH with DUP
    [MQTT-4.4.0-1], gets PUBREC and PUBCOMP 0: the id came with the session, and the message reaches its
    subscriber once."""
    a, b, c = three_brokers["a"], three_brokers["b"], three_brokers["c"]
    name = ending.replace(" ", "-")
    client_id, topic = f"q2-mover-{name}", f"q2move/{name}"
    reader = PahoClient(c.port, f"read-{client_id}")
    reader.subscribe(topic, 2)
    old = persistent_raw(a.port, client_id, 5)
    old.send_packet(Publish(topic, b"exactly once", 2, packet_id=9))
    rec = old.recv(timeout=15)
    assert isinstance(rec, PubRec) and rec.packet_id == 9
    assert payloads(reader, 1) == [b"exactly once"]
    if ending == "SIGKILL":

        def saved_with_the_id() -> bool:
            record = session_record(etcd, client_id)
            return record is not None and (record.state or {}).get("received") == [9]

        wait_until(saved_with_the_id, what="a saving the session's held QoS 2 id to etcd")
        a.kill()
        old.close()
        wait_settled(etcd, {"b", "c"}, 2)

    moved = persistent_raw((a if ending.endswith("member") else b).port, client_id, 5)
    moved.send_packet(Publish(topic, b"exactly once", 2, dup=True, packet_id=9))
    again = moved.recv(timeout=15)
    assert isinstance(again, PubRec) and again.packet_id == 9
    moved.send_packet(PubRel(9))
    comp = moved.recv(timeout=15)
    assert isinstance(comp, PubComp) and (comp.packet_id, comp.reason_code) == (9, 0)
    reader.expect_none(1.0)


@SHARED
@pytest.mark.mqtt5("MQTT-4.4.0-1")
def test_a_qos2_delivery_past_pubrec_gets_its_pubrel_again_on_another_member(three_brokers):
    """[MQTT-4.4.0-1] A subscriber that answered a QoS 2 delivery with PUBREC and moved to another member
    before its PUBCOMP gets the PUBREL again there with the same packet id, and the message is not sent
    again: the released id moves with the session. New deliveries follow (the window restored with the
    released id once lacked the id to try next: the first raised AttributeError)."""
    a, b, c = three_brokers["a"], three_brokers["b"], three_brokers["c"]
    device = persistent_raw(a.port, "q2-released", 5)
    device.subscribe("released/x", 2)
    PahoClient(c.port, "pub-q2-released").publish("released/x", b"once", 2)
    delivery = device.recv(timeout=15)
    assert isinstance(delivery, Publish) and delivery.packet_id is not None
    device.send_packet(PubRec(delivery.packet_id))
    assert isinstance(device.recv(timeout=15), PubRel)

    moved = persistent_raw(b.port, "q2-released", 5)

    resent = moved.recv(timeout=15)
    assert isinstance(resent, PubRel) and resent.packet_id == delivery.packet_id
    PahoClient(c.port, "pub-q2-released-2").publish("released/x", b"next", 1)  # the window takes new ones
    fresh = moved.recv(timeout=15)
    assert isinstance(fresh, Publish) and fresh.payload == b"next"
    moved.send_packet(PubComp(resent.packet_id))
    moved.recv_none(1.0)


@SHARED
@pytest.mark.mqtt5("MQTT-4.4.0-1", "MQTT-3.3.1-1")
def test_a_qos2_delivery_not_yet_pubreced_is_resent_with_its_packet_id_on_another_member(three_brokers):
    """[MQTT-4.4.0-1] [MQTT-3.3.1-1] A QoS 2 delivery the client had not answered with PUBREC when it moved
    to another member comes again there with its packet id and DUP 1 (read from that member's copy of the
    log), so a client that had it takes it as a duplicate rather than a second message."""
    a, b, c = three_brokers["a"], three_brokers["b"], three_brokers["c"]
    device = persistent_raw(a.port, "q2-unanswered", 5)
    device.subscribe("unanswered/x", 2)
    publisher = PahoClient(c.port, "pub-q2-unanswered")
    publisher.publish("unanswered/x", b"first", 2)
    first = device.recv(timeout=15)
    assert isinstance(first, Publish) and first.packet_id is not None
    device.send_packet(PubRec(first.packet_id))
    assert isinstance(device.recv(timeout=15), PubRel)
    device.send_packet(PubComp(first.packet_id))
    publisher.publish("unanswered/x", b"second", 2)
    second = device.recv(timeout=15)
    assert isinstance(second, Publish) and second.payload == b"second" and second.packet_id != 1

    moved = persistent_raw(b.port, "q2-unanswered", 5)

    resent = moved.recv(timeout=15)
    assert isinstance(resent, Publish)
    assert (resent.payload, resent.packet_id, resent.dup) == (b"second", second.packet_id, True)
