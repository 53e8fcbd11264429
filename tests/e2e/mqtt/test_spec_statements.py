"""Server rules of MQTT 3.1.1 and 5.0 checked one by one with a real broker and raw or paho clients: the
acknowledgements, subscription replacement, RETAIN and DUP on forwarding, packet identifiers reused after a
flow ends, flow control, shared subscriptions, refused connections and MQTT over WebSocket.

Each test names the normative statements it covers (``mqtt5`` / ``mqtt311`` markers, docs/conformance.md).
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from broker_edge.protocol import encode
from broker_edge.protocol.packets import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import TIMEOUT, PahoClient, RawClient, wait_for

PERSISTENT = Properties(session_expiry_interval=300)


def connected(broker, client_id: str, version: int = 5, **fields) -> RawClient:
    raw = RawClient(broker.port, version)
    ack = raw.connect(client_id, **fields)
    assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
    return raw


def reconnect_expecting_again(broker, client_id: str, started: Publish) -> RawClient:
    """Reconnect ``client_id``'s persistent session: the delivery ``started`` before comes again, with DUP."""
    back = connected(broker, client_id, clean_start=False, properties=PERSISTENT)
    resent = back.recv()
    assert (resent.payload, resent.dup, resent.packet_id) == (started.payload, True, started.packet_id)
    return back


@pytest.mark.mqtt5(
    "MQTT-2.2.1-6",
    "MQTT-3.8.4-1",
    "MQTT-3.8.4-2",
    "MQTT-3.8.4-5",
    "MQTT-3.8.4-6",
    "MQTT-3.8.4-7",
    "MQTT-3.9.3-1",
    "MQTT-3.9.3-2",
    "MQTT-3.10.4-4",
    "MQTT-3.10.4-5",
    "MQTT-3.10.4-6",
    "MQTT-3.11.3-1",
    "MQTT-3.11.3-2",
)
@pytest.mark.mqtt311(
    "MQTT-2.3.1-7",
    "MQTT-3.8.4-1",
    "MQTT-3.8.4-2",
    "MQTT-3.8.4-4",
    "MQTT-3.8.4-5",
    "MQTT-3.9.3-1",
    "MQTT-3.9.3-2",
    "MQTT-3.10.4-4",
    "MQTT-3.10.4-5",
    "MQTT-3.10.4-6",
)
@pytest.mark.parametrize(("version", "failure"), [(5, 0x8F), (4, 0x80)])
def test_suback_and_unsuback_answer_every_filter_in_order_with_the_packet_id(broker, version, failure):
    raw = connected(broker, "acks", version)
    filters = [Subscription("a/+", 1), Subscription("bad/#/x", 0), Subscription("b", 2)]
    raw.send_packet(Subscribe(0x1234, filters))
    suback = raw.recv()
    assert isinstance(suback, SubAck) and suback.packet_id == 0x1234
    assert suback.reason_codes == [1, failure, 2]

    raw.send_packet(Unsubscribe(0x4321, ["a/+", "never/subscribed"]))
    unsuback = raw.recv()
    assert isinstance(unsuback, UnsubAck) and unsuback.packet_id == 0x4321
    if version == 5:
        assert unsuback.reason_codes == [0x00, 0x11]
    PahoClient(broker.port, "p").publish("b", b"still subscribed", 1)
    assert raw.recv().payload == b"still subscribed"


@pytest.mark.mqtt5("MQTT-3.8.4-3")
@pytest.mark.mqtt311("MQTT-3.8.4-3")
@pytest.mark.parametrize("version", [5, 4])
def test_subscribing_to_the_same_filter_again_replaces_the_subscription(broker, version):
    sub = PahoClient(broker.port, "again", version=version)
    sub.subscribe("a", 0)
    sub.subscribe("a", 2)
    PahoClient(broker.port, "p").publish("a", b"once", 2)
    [message] = sub.expect(1)
    assert (message.payload, message.qos) == (b"once", 2)
    sub.expect_none()


@pytest.mark.mqtt5("MQTT-3.3.1-8")
@pytest.mark.mqtt311("MQTT-3.3.1-12")
def test_a_publish_without_retain_leaves_the_retained_message_alone(broker):
    pub = PahoClient(broker.port, "p")
    pub.publish("lamp", b"on", 1, retain=True)
    pub.publish("lamp", b"off", 1, retain=False)
    late = PahoClient(broker.port, "late")
    late.subscribe("lamp", 1)
    [message] = late.expect(1)
    assert (message.payload, message.retain) == (b"on", True)


@pytest.mark.mqtt5("MQTT-3.3.1-3")
@pytest.mark.mqtt311("MQTT-3.3.1-3")
@pytest.mark.parametrize("version", [5, 4])
def test_the_dup_flag_of_a_forwarded_message_says_only_whether_it_is_a_retransmission(broker, version):
    sub = connected(broker, "sub", version)
    sub.subscribe("d", 1)
    pub = connected(broker, "pub", version)
    pub.send_packet(Publish("d", b"resent by its publisher", 1, dup=True, packet_id=3))
    assert isinstance(pub.recv(), PubAck)
    forwarded = sub.recv()
    assert (forwarded.payload, forwarded.dup) == (b"resent by its publisher", False)


@pytest.mark.mqtt5("MQTT-3.3.2-7", "MQTT-3.14.2-2")
def test_topic_alias_mappings_do_not_outlive_the_connection(broker):
    first = connected(broker, "aliaser")
    first.send_packet(Publish("t", b"x", 1, packet_id=1, properties=Properties(topic_alias=1)))
    assert isinstance(first.recv(), PubAck)
    first.send_packet(Disconnect())
    again = connected(broker, "aliaser")
    again.send_packet(Publish("", b"y", properties=Properties(topic_alias=1)))
    disconnect = again.expect_disconnect(0x82)
    assert disconnect.properties.session_expiry_interval is None


@pytest.mark.mqtt5("MQTT-3.3.4-10", "MQTT-4.9.0-3")
def test_other_packets_flow_while_the_send_quota_is_used_up(broker):
    raw = connected(broker, "one-at-a-time", properties=Properties(receive_maximum=1))
    raw.subscribe("w", 1)
    pub = PahoClient(broker.port, "p")
    pub.publish("w", b"first", 1)
    pub.publish("w", b"second", 1)
    first = raw.recv()
    assert first.payload == b"first"  # not acknowledged: the quota is 0 now
    raw.send_packet(PingReq())
    assert isinstance(raw.recv(), PingResp)
    raw.send_packet(Subscribe(2, [Subscription("other", 0)]))
    assert isinstance(raw.recv(), SubAck)
    raw.send_packet(PubAck(first.packet_id))
    assert raw.recv().payload == b"second"


@pytest.mark.mqtt5("MQTT-3.14.0-1")
def test_a_connection_that_never_sent_connect_is_closed_without_disconnect(broker):
    raw = RawClient(broker.port, 5)
    raw.send_packet(PingReq())
    assert raw.recv() is None


@pytest.mark.mqtt5("MQTT-3.14.2-3")
def test_a_disconnect_leaves_out_a_reason_string_the_client_could_not_take(broker):
    raw = connected(broker, "tiny", properties=Properties(maximum_packet_size=8))
    raw.send(b"\x30\x06\x00\x03a/#\x00")  # a wildcard in a topic name
    disconnect = raw.recv()
    assert isinstance(disconnect, Disconnect) and disconnect.reason_code == 0x90
    assert disconnect.properties is None or disconnect.properties.reason_string is None
    assert raw.closed()


@pytest.mark.mqtt5("MQTT-3.1.4-6", "MQTT-3.2.2-6", "MQTT-3.2.2-7", "MQTT-4.13.2-1")
@pytest.mark.mqtt311("MQTT-3.1.4-5", "MQTT-3.2.2-4", "MQTT-3.2.2-5")
@pytest.mark.parametrize(("version", "code"), [(5, 0x85), (4, 0x02)])
def test_after_a_refused_connect_nothing_the_client_sent_is_processed(start_broker, version, code):
    broker = start_broker(limits={"max_client_id_length": 23})
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("#", 0)
    raw = RawClient(broker.port, version)
    connect = encode(Connect(protocol_version=version, client_id="x" * 24, clean_start=False), version)
    raw.send(connect + encode(Publish("sneaked/in", b"x", 0), version))
    refusal = raw.recv()
    assert isinstance(refusal, ConnAck)
    assert (refusal.reason_code, refusal.session_present) == (code, False)
    assert raw.closed()
    PahoClient(broker.port, "p").publish("proof", b"traffic flows", 1)
    assert [m.topic for m in watcher.expect(1)] == ["proof"]
    watcher.expect_none()


@pytest.mark.mqtt5("MQTT-3.1.3-5")
@pytest.mark.mqtt311("MQTT-3.1.3-5")
@pytest.mark.parametrize("version", [5, 4])
def test_client_ids_of_up_to_23_letters_and_digits_are_accepted(broker, version):
    for client_id in ("0123456789abcdefghijKLM", "Z", "9"):
        connected(broker, client_id, version)


@pytest.mark.mqtt5("MQTT-3.1.2-28", "MQTT-4.12.0-6")
@pytest.mark.parametrize("requested", [0, 1])
def test_connack_carries_neither_response_information_nor_an_authentication_method(broker, requested):
    raw = RawClient(broker.port, 5)
    ack = raw.connect("plain", properties=Properties(request_response_information=requested))
    assert ack.reason_code == 0
    assert ack.properties.response_information is None
    assert ack.properties.authentication_method is None
    raw.send_packet(PingReq())
    assert isinstance(raw.recv(), PingResp)  # and no AUTH packet came first


@pytest.mark.mqtt5("MQTT-4.3.2-4", "MQTT-4.3.2-5", "MQTT-4.3.3-8", "MQTT-4.3.3-11", "MQTT-4.3.3-12")
@pytest.mark.mqtt311("MQTT-4.3.2-2", "MQTT-4.3.3-2")
@pytest.mark.parametrize("version", [5, 4])
def test_a_packet_id_reused_after_its_flow_ended_is_a_new_message(broker, version):
    sub = PahoClient(broker.port, "sub", version=version)
    sub.subscribe("ids", 2)
    pub = connected(broker, "pub", version)
    for payload in (b"q1 first", b"q1 second"):
        pub.send_packet(Publish("ids", payload, 1, packet_id=5))
        assert pub.recv() == PubAck(5)
    for payload in (b"q2 first", b"q2 second"):
        pub.send_packet(Publish("ids", payload, 2, packet_id=9))
        assert isinstance(pub.recv(), PubRec)
        pub.send_packet(PubRel(9))
        comp = pub.recv()
        assert isinstance(comp, PubComp) and comp.packet_id == 9
    assert [m.payload for m in sub.expect(4)] == [b"q1 first", b"q1 second", b"q2 first", b"q2 second"]


@pytest.mark.mqtt5("MQTT-4.3.3-9")
def test_a_packet_id_refused_with_an_error_pubrec_is_free_for_a_new_message(start_broker):
    broker = start_broker(acl={"rules": [{"permission": "allow", "action": "all", "topic": "open/#"}]})
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("open/#", 2)
    pub = connected(broker, "pub")
    pub.send_packet(Publish("closed/x", b"refused", 2, packet_id=7))
    refused = pub.recv()
    assert isinstance(refused, PubRec) and refused.reason_code == 0x87
    pub.send_packet(Publish("open/x", b"accepted", 2, packet_id=7))
    accepted = pub.recv()
    assert isinstance(accepted, PubRec) and accepted.reason_code == 0
    pub.send_packet(PubRel(7))
    assert isinstance(pub.recv(), PubComp)
    assert [m.payload for m in sub.expect(1)] == [b"accepted"]


@pytest.mark.mqtt5("MQTT-4.8.2-3")
def test_a_shared_subscription_gets_at_most_its_granted_qos(broker):
    member = PahoClient(broker.port, "member")
    member.subscribe("$share/g/jobs", 0)
    PahoClient(broker.port, "p").publish("jobs", b"j", 2)
    [message] = member.expect(1)
    assert (message.payload, message.qos) == (b"j", 0)


@pytest.mark.mqtt5("MQTT-4.8.2-4")
def test_a_shared_qos2_delivery_is_completed_with_the_member_it_started_with(broker):
    member = connected(broker, "member", clean_start=False, properties=PERSISTENT)
    member.subscribe("$share/g/jobs", 2)
    PahoClient(broker.port, "p").publish("jobs", b"j", 2)
    started = member.recv()
    member.close()  # no PUBREC: the connection breaks mid-flow
    other = PahoClient(broker.port, "other")
    other.subscribe("$share/g/jobs", 2)
    reconnect_expecting_again(broker, "member", started)
    other.expect_none()


@pytest.mark.mqtt5("MQTT-4.8.2-5")
def test_a_shared_delivery_is_not_moved_to_another_member_when_its_session_ends(broker):
    """A QoS 2 delivery under way to a member whose session ends is sent to no other member [MQTT-4.8.2-5]
    (the member may have it already); a QoS 1 one is (tests/e2e/mqtt/test_pubsub.py)."""
    member = connected(broker, "member")  # Session Expiry 0: the session ends with the connection
    member.subscribe("$share/g/jobs", 2)
    PahoClient(broker.port, "p").publish("jobs", b"j", 2)
    assert member.recv().payload == b"j"
    other = PahoClient(broker.port, "other")
    other.subscribe("$share/g/jobs", 2)
    member.close()  # no PUBREC
    other.expect_none(0.5)


def _complete(client: RawClient, delivery: Publish) -> None:
    """Acknowledge ``delivery`` to the end of its flow (PUBACK; PUBREC, PUBREL, PUBCOMP)."""
    packet_id = delivery.packet_id
    assert packet_id is not None
    if delivery.qos == 1:
        client.send_packet(PubAck(packet_id))
        return
    client.send_packet(PubRec(packet_id))
    assert isinstance(client.recv(), PubRel)
    client.send_packet(PubComp(packet_id))


@pytest.mark.mqtt5("MQTT-4.8.2-4")
@pytest.mark.parametrize("qos", [1, 2])
def test_a_shared_member_back_with_its_session_gets_its_unfinished_deliveries_and_the_group_loses_none(
    broker, qos
):
    """A worker of a pool that drops off with deliveries unacknowledged and comes back with its session gets
    those again, with DUP and their packet ids, and completes them with the broker [MQTT-4.8.2-4]; what is
    published while it is away goes to the member that is connected. Every job reaches one member once."""
    away = connected(broker, "away", clean_start=False, properties=PERSISTENT)
    away.subscribe("$share/g/jobs", qos)
    here = PahoClient(broker.port, "here")
    here.subscribe("$share/g/jobs", qos)
    pub = PahoClient(broker.port, "p")
    for job in range(4):
        pub.publish("jobs", str(job), qos)
    started = [away.recv(), away.recv()]
    assert [m.payload for m in started] == [b"0", b"2"]  # round robin; not acknowledged
    assert [m.payload for m in here.expect(2)] == [b"1", b"3"]
    away.close()
    assert wait_for(lambda: broker.call(lambda: broker.broker.router.sessions["away"].connection is None))
    for job in range(4, 8):
        pub.publish("jobs", str(job), qos)
    assert [m.payload for m in here.expect(4)] == [b"4", b"5", b"6", b"7"]
    back = connected(broker, "away", clean_start=False, properties=PERSISTENT)
    again = [back.recv(), back.recv()]
    expected = [(m.payload, True, m.packet_id) for m in started]
    assert [(m.payload, m.dup, m.packet_id) for m in again] == expected
    for delivery in again:
        _complete(back, delivery)
    for job in (8, 9):
        pub.publish("jobs", str(job), qos)
    assert back.recv().payload == b"8"
    assert [m.payload for m in here.expect(1)] == [b"9"]
    back.recv_none()
    here.expect_none()


@pytest.mark.mqtt5("MQTT-3.8.3-4")
def test_no_local_on_a_shared_subscription_is_a_protocol_error(broker):
    """No Local set on a Shared Subscription is a Protocol Error [MQTT-3.8.3-4]: DISCONNECT 0x82 and the
    connection closed, the subscription not made."""
    member = connected(broker, "member")
    member.send_packet(Subscribe(1, [Subscription("$share/g/jobs", 1, no_local=True)]))
    member.expect_disconnect(0x82)
    other = PahoClient(broker.port, "other")
    other.subscribe("$share/g/jobs", 1)
    other.publish("jobs", b"j", 1)
    assert [m.payload for m in other.expect(1)] == [b"j"]  # the group's only member: the refused one is none


@pytest.mark.mqtt5("MQTT-3.3.1-13")
def test_a_shared_subscription_gets_no_retained_message_and_retain_as_published_holds_live(broker):
    """Retained messages are not sent to a new shared subscription, whatever its Retain Handling (one member
    would get what is the group's); a live message published with RETAIN reaches a member that asked for
    Retain As Published with RETAIN set [MQTT-3.3.1-13], and one that did not with it clear."""
    pub = PahoClient(broker.port, "p")
    pub.publish("jobs", b"kept", 1, retain=True)
    keeps = connected(broker, "keeps")
    assert keeps.subscribe("$share/g/jobs", 1, retain_as_published=True).reason_codes == [1]
    plain = connected(broker, "plain")
    assert plain.subscribe("$share/h/jobs", 1, retain_handling=0).reason_codes == [1]
    pub.publish("jobs", b"live", 1, retain=True)
    first, second = keeps.recv(), plain.recv()  # the first packet of each is the live message
    assert (first.payload, first.retain) == (b"live", True)
    assert (second.payload, second.retain) == (b"live", False)


@pytest.mark.mqtt5("MQTT-3.10.4-3")
@pytest.mark.mqtt311("MQTT-3.10.4-3")
def test_unsubscribing_completes_the_deliveries_already_started(broker):
    raw = connected(broker, "leaver", clean_start=False, properties=PERSISTENT)
    raw.subscribe("u", 1)
    PahoClient(broker.port, "p").publish("u", b"started", 1)
    started = raw.recv()
    raw.send_packet(Unsubscribe(2, ["u"]))
    assert isinstance(raw.recv(), UnsubAck)
    raw.close()
    back = reconnect_expecting_again(broker, "leaver", started)
    back.send_packet(PubAck(started.packet_id))
    PahoClient(broker.port, "p2").publish("u", b"after unsubscribe", 1)
    back.recv_none()


# -- MQTT over WebSocket ------------------------------------------------------------------------------------


def websocket_broker(start_broker):
    return start_broker(
        listeners=[{"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0, "path": "/mqtt"}]
    )


async def _websocket_session(port: int, frames: list[bytes], until: bytes) -> tuple[str | None, bytes]:
    """Open a WebSocket offering "mqtt", send ``frames`` as binary messages and read until what came ends
    with ``until``; returns the chosen subprotocol and the bytes."""
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"http://127.0.0.1:{port}/mqtt", protocols=("mqtt",)) as ws,
    ):
        for data in frames:
            await ws.send_bytes(data)
        received = b""
        while not received.endswith(until):
            message = await ws.receive(timeout=TIMEOUT)
            assert message.type == aiohttp.WSMsgType.BINARY, message
            received += message.data
        return ws.protocol, received


@pytest.mark.mqtt5("MQTT-6.0.0-2", "MQTT-6.0.0-4")
@pytest.mark.mqtt311("MQTT-6.0.0-2", "MQTT-6.0.0-4")
def test_websocket_packets_may_span_and_share_frames_and_the_subprotocol_is_mqtt(start_broker):
    broker = websocket_broker(start_broker)
    connect = encode(Connect(protocol_version=5, client_id="ws"), 5)
    two_pings = encode(PingReq(), 5) * 2
    two_pings_answered = encode(PingResp(), 5) * 2
    frames = [connect[:5], connect[5:], two_pings]
    protocol, received = asyncio.run(_websocket_session(broker.port_of("ws"), frames, two_pings_answered))
    assert protocol == "mqtt"
    assert received[0] == 0x20 and received.endswith(two_pings_answered)


@pytest.mark.mqtt5("MQTT-6.0.0-1")
@pytest.mark.mqtt311("MQTT-6.0.0-1")
def test_a_websocket_text_frame_closes_the_connection(start_broker):
    broker = websocket_broker(start_broker)

    async def scenario() -> tuple[bytes, aiohttp.WSMsgType]:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(f"http://127.0.0.1:{broker.port_of('ws')}/mqtt", protocols=("mqtt",)) as ws,
        ):
            await ws.send_bytes(encode(Connect(protocol_version=4, client_id="ws-text"), 4))
            connack = await ws.receive(timeout=TIMEOUT)
            await ws.send_str("hello")
            after = await ws.receive(timeout=TIMEOUT)
            return connack.data, after.type

    connack, after = asyncio.run(scenario())
    assert connack == b"\x20\x02\x00\x00"
    assert after in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)


# -- MQTT 3.1.1 sessions, wills and refusals ---------------------------------------------------------------


@pytest.mark.mqtt311(
    "MQTT-3.1.2-4",
    "MQTT-3.1.2-5",
    "MQTT-3.1.2-6",
    "MQTT-3.1.4-3",
    "MQTT-3.2.0-1",
    "MQTT-3.2.2-1",
    "MQTT-3.2.2-2",
    "MQTT-3.2.2-3",
)
def test_v311_clean_session_decides_whether_the_session_outlives_the_connection(broker):
    first = RawClient(broker.port, 4)
    assert first.connect("v3", clean_start=False).session_present is False  # none yet: a new one
    first.subscribe("cmd", 1)
    first.close()
    PahoClient(broker.port, "p", version=4).publish("cmd", b"held", 1)

    resumed = RawClient(broker.port, 4)
    ack = resumed.connect("v3", clean_start=False)
    assert isinstance(ack, ConnAck) and ack.session_present is True  # CONNACK before the held message
    held = resumed.recv()
    assert held.payload == b"held"
    resumed.send_packet(PubAck(held.packet_id))
    resumed.send_packet(Disconnect())

    clean = RawClient(broker.port, 4)
    assert clean.connect("v3", clean_start=True).session_present is False
    PahoClient(broker.port, "p2", version=4).publish("cmd", b"nobody subscribed", 1)
    clean.recv_none()
    clean.send_packet(Disconnect())
    assert RawClient(broker.port, 4).connect("v3", clean_start=False).session_present is False


@pytest.mark.mqtt311("MQTT-3.1.2-12")
def test_v311_connection_without_will_publishes_nothing_when_it_drops(broker):
    watcher = PahoClient(broker.port, "watcher", version=4)
    watcher.subscribe("#", 1)
    PahoClient(broker.port, "no-will", version=4).kill()
    assert wait_for(lambda: not broker.connected("no-will"))
    watcher.expect_none()


@pytest.mark.mqtt311("MQTT-3.1.4-1", "MQTT-3.2.2-6")
def test_a_malformed_connect_is_closed_without_connack(broker):
    """An MQTT 3.1.1 client: no return code says malformed, so the connection is closed."""
    raw = RawClient(broker.port, 4)
    frame = bytearray(encode(Connect(protocol_version=4, client_id="abc"), 4))
    frame[frame.index(b"abc") : frame.index(b"abc") + 3] = b"a\xffc"  # not UTF-8
    raw.send(bytes(frame))
    assert raw.recv() is None


_V5_CONNECT = encode(Connect(protocol_version=5, client_id="abc"), 5)
"""10 10 | 00 04 MQTT 05 | flags 02 | keep alive 003c | properties 00 | client id 0003 abc."""


def _v5_connect(
    flags: int = 0x02, properties: bytes = b"\x00", client_id: bytes = b"abc", tail: bytes = b""
) -> bytes:
    """A v5 CONNECT made by hand: ``flags``, ``properties`` (with their length) and the client id's bytes."""
    body = b"\x00\x04MQTT\x05" + bytes([flags]) + b"\x00\x3c" + properties
    body += len(client_id).to_bytes(2, "big") + client_id + tail
    return bytes([0x10, len(body)]) + body


@pytest.mark.mqtt5("MQTT-3.1.4-1", "MQTT-4.13.1-1")
@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (_v5_connect(flags=0x03), 0x81),  # the reserved flag [MQTT-3.1.2-3]
        (_v5_connect(flags=0x0A), 0x81),  # will QoS 1 without a will [MQTT-3.1.2-11]
        (_v5_connect(properties=b"\x0a\x11\x00\x00\x00\x01\x11\x00\x00\x00\x01"), 0x82),  # twice
        (_v5_connect(properties=b"\x03\x21\x00\x00"), 0x82),  # Receive Maximum 0
        (_v5_connect(properties=b"\x03\x23\x00\x01"), 0x81),  # a Topic Alias: not a CONNECT property
        (_v5_connect(client_id=b"a\xffc"), 0x81),  # a client id that is not UTF-8 [MQTT-1.5.4-1]
        (_v5_connect(tail=b"\x00"), 0x81),  # a byte past the CONNECT's last field
    ],
    ids=[
        "reserved flag",
        "will QoS without will",
        "property twice",
        "receive maximum 0",
        "topic alias",
        "client id not UTF-8",
        "trailing byte",
    ],
)
def test_a_malformed_v5_connect_is_told_why_in_a_connack_and_closed(broker, frame, code):
    """MQTT 5 4.13.1: before CONNACK, a malformed packet or protocol error may be answered with a CONNACK
    of 0x80 or above: once the CONNECT's protocol level is read, the broker knows the client speaks MQTT 5
    and tells it which (no reason string: the client's Maximum Packet Size was never read)."""
    assert _v5_connect() == _V5_CONNECT  # the hand-made frame is the codec's
    raw = RawClient(broker.port, 5)
    raw.send(frame)
    ack = raw.recv()
    assert isinstance(ack, ConnAck), ack
    assert (ack.reason_code, ack.session_present, ack.properties) == (code, False, None)
    assert raw.recv() is None


@pytest.mark.mqtt5("MQTT-3.3.1-5")
@pytest.mark.mqtt311("MQTT-3.3.1-5", "MQTT-3.3.1-7")
@pytest.mark.parametrize("version", [5, 4])
def test_a_retained_publish_of_any_qos_replaces_the_retained_message(broker, version):
    pub = PahoClient(broker.port, "p", version=version)
    pub.publish("lamp", b"on", 1, retain=True)
    pub.publish("lamp", b"dimmed", 0, retain=True)
    pub.publish("lamp-sync", b"", 1)  # acknowledged after the broker read the QoS 0 publish before it
    late = PahoClient(broker.port, "late", version=version)
    late.subscribe("lamp", 1)
    [message] = late.expect(1)
    assert (message.payload, message.qos, message.retain) == (b"dimmed", 0, True)


@pytest.mark.mqtt5("MQTT-3.2.2-13")
def test_a_retained_will_is_refused_when_retained_messages_are_disabled(start_broker):
    broker = start_broker(retain={"enabled": False})
    raw = RawClient(broker.port, 5)
    ack = raw.connect("w", will=Will("status/w", b"gone", 1, retain=True))
    assert (ack.reason_code, ack.session_present) == (0x9A, False)
    assert raw.closed()


@pytest.mark.mqtt5("MQTT-3.2.2-19")
def test_a_refusal_leaves_out_a_reason_string_the_client_could_not_take(start_broker):
    broker = start_broker(limits={"max_client_id_length": 23})
    told = RawClient(broker.port, 5).connect("x" * 24)
    small = RawClient(broker.port, 5)
    refused = small.connect("y" * 24, properties=Properties(maximum_packet_size=8))
    assert told.reason_code == refused.reason_code == 0x85
    assert told.properties.reason_string
    assert refused.properties is None or refused.properties.reason_string is None
    assert small.closed()
