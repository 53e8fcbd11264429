"""Publish and subscribe with real clients: QoS both ways, wildcards, overlapping subscriptions, v5."""

from __future__ import annotations

from typing import Any

import pytest

from broker_edge.protocol.packets import (
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Subscription,
    Will,
)
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import PahoClient, RawClient, wait_for


@pytest.mark.mqtt311("MQTT-3.3.4-1", "MQTT-7.1.1-1")
@pytest.mark.mqtt5("MQTT-4.2.0-1")
@pytest.mark.parametrize("version", [4, 5, 3])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_round_trip_every_qos_and_version(broker, version, qos):
    sub = PahoClient(broker.port, "sub", version=version)
    assert sub.subscribe("sensors/+/temp", qos) == [qos]
    pub = PahoClient(broker.port, "pub", version=version)
    pub.publish("sensors/d1/temp", b"21.5", qos)
    [message] = sub.expect(1)
    assert (message.topic, message.payload, message.qos, message.retain) == (
        "sensors/d1/temp",
        b"21.5",
        qos,
        False,
    )


@pytest.mark.mqtt311("MQTT-3.8.4-6")
@pytest.mark.mqtt5("MQTT-3.8.4-8")
def test_granted_qos_caps_delivery_and_publish_qos_caps_it_too(broker):
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("a", 1)
    pub = PahoClient(broker.port, "pub")
    pub.publish("a", b"x", 2)
    pub.publish("a", b"y", 0)
    first, second = sub.expect(2)
    assert (first.payload, first.qos) == (b"x", 1)
    assert (second.payload, second.qos) == (b"y", 0)


@pytest.mark.mqtt311("MQTT-4.7.2-1")
@pytest.mark.mqtt5("MQTT-4.7.2-1")
def test_wildcards_and_dollar_topics(broker):
    root = PahoClient(broker.port, "root")
    root.subscribe("#", 0)
    root.subscribe("+/status", 0)
    dollar = PahoClient(broker.port, "dollar")
    dollar.subscribe("$internal/#", 0)
    dollar.subscribe("$internal/+", 0)
    broker.call(lambda: broker.broker.publish("$internal/status", b"broker topic"))
    assert [(m.topic, m.payload) for m in dollar.expect(1)] == [("$internal/status", b"broker topic")]
    pub = PahoClient(broker.port, "pub")
    pub.publish("room/status", b"visible")
    assert [m.payload for m in root.expect(1)] == [b"visible"]  # once, and the $ topic never came
    root.expect_none()
    dollar.expect_none()


def test_clients_cannot_publish_to_dollar_topics(broker):
    dollar = PahoClient(broker.port, "dollar")
    dollar.subscribe("$SYS/#", 0)
    raw = RawClient(broker.port, 5)
    raw.connect("forger")
    raw.send_packet(Publish("$SYS/broker/uptime", b"forged", 1, packet_id=1))
    assert raw.recv().reason_code == 0x87
    dollar.expect_none()


@pytest.mark.mqtt311("MQTT-3.3.2-3", "MQTT-4.7.1-3")
@pytest.mark.mqtt5("MQTT-3.3.2-3", "MQTT-4.7.1-2")
def test_plus_matches_one_whole_level(broker):
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("a/+/c", 0)
    sub.subscribe("+", 0)
    pub = PahoClient(broker.port, "pub")
    for topic in ("a/b/c", "a/b/x", "a/b/c/d", "a//c", "top", "a/b"):
        pub.publish(topic, topic)
    pub.publish("end", b"end", 1)
    assert [m.topic for m in sub.expect(4)] == ["a/b/c", "a//c", "top", "end"]


def test_hash_matches_parent_level(broker):
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("a/#", 0)
    pub = PahoClient(broker.port, "pub")
    pub.publish("a", b"parent")
    pub.publish("a/b/c", b"deep")
    assert [m.payload for m in sub.expect(2)] == [b"parent", b"deep"]


@pytest.mark.mqtt311("MQTT-3.3.5-1")
@pytest.mark.mqtt5("MQTT-3.3.4-2", "MQTT-3.3.4-3", "MQTT-3.3.4-4")
@pytest.mark.parametrize("qos_of", [{"a/+": 1, "a/#": 0, "a/b": 2}, {"a/+": 2, "a/#": 1, "a/b": 0}])
def test_overlapping_subscriptions_deliver_one_copy_at_highest_qos_with_every_identifier(broker, qos_of):
    """The highest QoS wins whichever of the overlapping filters holds it."""
    raw = RawClient(broker.port, 5)
    raw.connect("overlap")
    ids = {"a/+": 7, "a/#": 9}
    for packet_id, topic_filter in enumerate(("a/+", "a/#", "a/b"), start=1):
        props = Properties(subscription_identifiers=[ids[topic_filter]]) if topic_filter in ids else None
        raw.send_packet(Subscribe(packet_id, [Subscription(topic_filter, qos_of[topic_filter])], props))
        assert raw.recv().reason_codes == [qos_of[topic_filter]]
    pub = PahoClient(broker.port, "pub")
    pub.publish("a/b", b"once", 2)
    delivered = raw.recv()
    assert isinstance(delivered, Publish)
    assert delivered.qos == 2
    assert sorted(delivered.properties.subscription_identifiers) == [7, 9]
    pub.publish("a/c", b"second", 0)
    nxt = raw.recv()
    assert nxt.payload == b"second"  # and not a second copy of "once"
    assert sorted(nxt.properties.subscription_identifiers) == [7, 9]


@pytest.mark.mqtt5("MQTT-3.8.3-3")
def test_no_local(broker):
    client = PahoClient(broker.port, "self")
    client.subscribe("chat", 1, noLocal=True)
    other = PahoClient(broker.port, "other")
    other.subscribe("chat", 1)
    client.publish("chat", b"mine", 1)
    other.publish("chat", b"theirs", 1)
    assert [m.payload for m in client.expect(1)] == [b"theirs"]
    assert sorted(m.payload for m in other.expect(2)) == [b"mine", b"theirs"]


@pytest.mark.mqtt5("MQTT-3.8.3-3", "MQTT-3.3.1-9")
def test_a_no_local_subscription_gets_the_clients_own_retained_message_on_subscribe_but_not_live(broker):
    """No Local [MQTT-3.8.3-3] keeps the client's own messages from being forwarded to it while the
    subscription exists; a retained message sent because a subscription is made [MQTT-3.3.1-9] is not such a
    forwarding and is sent whoever published it (as Mosquitto does; the statement leaves it open)."""
    client = PahoClient(broker.port, "self-retained")
    client.publish("state/self", b"before", 1, retain=True)
    client.subscribe("state/#", 1, noLocal=True)
    [stored] = client.expect(1)
    assert (stored.payload, stored.retain) == (b"before", True)
    client.publish("state/self", b"while subscribed", 1, retain=True)
    client.expect_none(0.3)
    late = PahoClient(broker.port, "late")
    late.subscribe("state/#", 1)
    assert [m.payload for m in late.expect(1)] == [b"while subscribed"]


@pytest.mark.mqtt5("MQTT-3.8.3-3", "MQTT-3.3.4-2", "MQTT-3.3.4-3")
def test_a_no_local_subscription_gives_nothing_to_the_clients_own_message_through_an_overlapping_one(broker):
    """Of a session's overlapping subscriptions, a No Local one does not match the client's own messages: an
    own message that another of its subscriptions still delivers comes at that one's QoS and with its
    Subscription Identifier only [MQTT-3.8.3-3], [MQTT-3.3.4-2], [MQTT-3.3.4-3]. (It came at the No Local
    subscription's QoS 2, carrying its identifier too.) Someone else's message gets both, as before."""
    raw = RawClient(broker.port, 5)
    raw.connect("self")
    raw.send_packet(Subscribe(1, [Subscription("chat/#", 0)], Properties(subscription_identifiers=[3])))
    raw.send_packet(
        Subscribe(2, [Subscription("chat/+", 2, no_local=True)], Properties(subscription_identifiers=[4]))
    )
    assert [raw.recv().reason_codes, raw.recv().reason_codes] == [[0], [2]]
    raw.send_packet(Publish("chat/room", b"mine", 2, packet_id=1))
    own = next(p for p in (raw.recv(), raw.recv()) if isinstance(p, Publish))
    assert (own.payload, own.qos, own.properties.subscription_identifiers) == (b"mine", 0, [3])
    PahoClient(broker.port, "other").publish("chat/room", b"theirs", 2)
    theirs = raw.recv()
    assert (theirs.payload, theirs.qos, sorted(theirs.properties.subscription_identifiers)) == (
        b"theirs",
        2,
        [3, 4],
    )


@pytest.mark.mqtt5("MQTT-3.8.3-3", "MQTT-3.3.4-2", "MQTT-3.3.4-3")
def test_a_no_local_subscription_gives_nothing_to_the_clients_own_message_read_from_the_log(brokers):
    """The same rule for a message read back from the log (a subscription from an offset): the client's own
    message comes at the QoS and with the identifier of its subscription without No Local only."""
    broker = brokers()
    raw = RawClient(broker.port, 5)
    raw.connect("self")
    raw.send_packet(Publish("chat/room", b"mine", 1, packet_id=1))
    assert isinstance(raw.recv(), PubAck)
    raw.send_packet(
        Subscribe(1, [Subscription("chat/+", 1, no_local=True)], Properties(subscription_identifiers=[4]))
    )
    earliest = Properties(subscription_identifiers=[3], user_properties=[("offset", "earliest")])
    raw.send_packet(Subscribe(2, [Subscription("chat/#", 0)], earliest))
    packets = [raw.recv(), raw.recv(), raw.recv()]
    [own] = [p for p in packets if isinstance(p, Publish)]
    assert (own.payload, own.qos, own.properties.subscription_identifiers) == (b"mine", 0, [3])


APPLICATION_PROPERTIES: dict[str, Any] = {
    "response_topic": "resp/1",
    "correlation_data": b"\x01\x02",
    "content_type": "application/json",
    "payload_format_indicator": 1,
    "user_properties": [("k", "v"), ("k", "w")],
}


def assert_application_properties(message) -> None:
    got = message.properties
    assert got.ResponseTopic == "resp/1"
    assert got.CorrelationData == b"\x01\x02"
    assert got.ContentType == "application/json"
    assert got.PayloadFormatIndicator == 1
    assert got.UserProperty == [("k", "v"), ("k", "w")]


@pytest.mark.mqtt5(
    "MQTT-3.3.2-4",
    "MQTT-3.3.2-6",
    "MQTT-3.3.2-15",
    "MQTT-3.3.2-16",
    "MQTT-3.3.2-17",
    "MQTT-3.3.2-18",
    "MQTT-3.3.2-20",
)
def test_v5_properties_pass_through(broker):
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("req/#", 1)
    pub = RawClient(broker.port, 5)
    pub.connect("pub")
    pub.send_packet(Publish("req/a", b"{}", 1, packet_id=1, properties=Properties(**APPLICATION_PROPERTIES)))
    # the same with a topic alias and a message expiry, which the broker does not forward as they are
    per_hop = Properties(**APPLICATION_PROPERTIES, topic_alias=3, message_expiry_interval=100)
    pub.send_packet(Publish("req/b", b"{}", 1, packet_id=2, properties=per_hop))
    first, second = sub.expect(2)
    assert_application_properties(first)
    assert_application_properties(second)
    assert not hasattr(second.properties, "TopicAlias")
    assert 0 < second.properties.MessageExpiryInterval <= 100


@pytest.mark.mqtt5("MQTT-3.1.3-10")
def test_v5_will_properties_pass_through(broker):
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("wills/#", 1)
    raw = RawClient(broker.port, 5)
    will_props = Properties(**APPLICATION_PROPERTIES, will_delay_interval=0)
    raw.connect("dying", will=Will("wills/dying", b"gone", 1, properties=will_props))
    raw.close()
    [message] = watcher.expect(1)
    assert message.payload == b"gone"
    assert_application_properties(message)


@pytest.mark.mqtt5("MQTT-3.4.2-1")
def test_v5_no_matching_subscribers_reason_code(broker):
    raw = RawClient(broker.port, 5)
    raw.connect("pub")
    raw.send_packet(Publish("nobody/listens", b"x", 1, packet_id=5))
    ack = raw.recv()
    assert (ack.packet_id, ack.reason_code) == (5, 0x10)


@pytest.mark.mqtt311("MQTT-3.10.4-1", "MQTT-3.10.4-2")
@pytest.mark.mqtt5("MQTT-3.10.4-1", "MQTT-3.10.4-2")
def test_unsubscribe(broker):
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("a", 0)
    sub.subscribe("b", 0)
    assert sub.unsubscribe("a") == [0x00]
    pub = PahoClient(broker.port, "pub")
    pub.publish("a", b"gone")
    pub.publish("b", b"kept")
    assert [m.payload for m in sub.expect(1)] == [b"kept"]


@pytest.mark.mqtt5("MQTT-3.10.4-1", "MQTT-3.10.4-5", "MQTT-3.10.4-6", "MQTT-3.11.3-1", "MQTT-3.11.3-2")
def test_v5_unsuback_reason_codes(broker):
    raw = RawClient(broker.port, 5)
    raw.connect("u")
    raw.subscribe("x/y", 0)
    from broker_edge.protocol.packets import Unsubscribe

    raw.send_packet(Unsubscribe(2, ["x/y", "never"]))
    assert raw.recv().reason_codes == [0x00, 0x11]


@pytest.mark.mqtt5("MQTT-3.11.3-1", "MQTT-3.11.3-2")
def test_v5_unsuback_says_0x8f_for_a_filter_no_subscribe_could_have_made(broker):
    """[MQTT-3.11.3-1] [MQTT-3.11.3-2] A filter SUBSCRIBE refuses with 0x8F (a misplaced wildcard, an empty
    filter, a shared one without a group or filter) is refused with 0x8F in UNSUBACK too, one code per filter
    in order, rather than 0x11 "no subscription existed", which tells the client its filter was fine."""
    from broker_edge.protocol.packets import Unsubscribe

    raw = RawClient(broker.port, 5)
    raw.connect("u-invalid")
    raw.subscribe("x/y", 0)
    invalid = ["a/#/b", "a+/b", "", "$share/g", "$share//x"]
    raw.send_packet(Unsubscribe(3, ["x/y", *invalid, "never"]))
    unsuback = raw.recv()
    assert unsuback.packet_id == 3
    assert unsuback.reason_codes == [0x00, *[0x8F] * len(invalid), 0x11]


def test_shared_subscription_one_member_gets_each_message_round_robin(broker):
    members = [PahoClient(broker.port, f"m{i}") for i in range(3)]
    for member in members:
        member.subscribe("$share/workers/jobs/+", 1)
    plain = PahoClient(broker.port, "plain")
    plain.subscribe("jobs/+", 1)
    pub = PahoClient(broker.port, "pub")
    for i in range(9):
        pub.publish(f"jobs/{i}", str(i), 1)
    assert len(plain.expect(9)) == 9
    counts = [len(m.expect(3)) for m in members]
    assert counts == [3, 3, 3]
    for member in members:
        member.expect_none(0.1)


def test_shared_subscription_prefers_connected_members(broker):
    away = PahoClient(broker.port, "away", clean=False, session_expiry=300)
    away.subscribe("$share/g/t", 1)
    here = PahoClient(broker.port, "here")
    here.subscribe("$share/g/t", 1)
    away.disconnect()
    pub = PahoClient(broker.port, "pub")
    for i in range(4):
        pub.publish("t", str(i), 1)
    assert len(here.expect(4)) == 4


@pytest.mark.mqtt5("MQTT-4.9.0-2")
@pytest.mark.parametrize("qos", [1, 2])
def test_a_shared_member_whose_receive_maximum_is_used_up_is_passed_over(broker, qos):
    """A member of a group that has all the unacknowledged messages its Receive Maximum allows (a slow or
    stuck consumer, still connected) gets nothing more while it does [MQTT-4.9.0-2]; the group's messages
    go to the members that can take them now, instead of waiting in its queue behind it. Once it
    acknowledges, it is in the round again."""
    slow = RawClient(broker.port, 5)
    slow.connect("slow", properties=Properties(receive_maximum=1))
    slow.subscribe("$share/workers/jobs", qos)
    fast = PahoClient(broker.port, "fast")
    fast.subscribe("$share/workers/jobs", qos)
    pub = PahoClient(broker.port, "pub")
    for job in range(6):
        pub.publish("jobs", str(job), qos)
    held = slow.recv()
    assert held.payload == b"0"  # and not acknowledged: its window is full
    assert [m.payload for m in fast.expect(5)] == [b"1", b"2", b"3", b"4", b"5"]
    slow.recv_none()
    slow.send_packet(PubAck(held.packet_id) if qos == 1 else PubRec(held.packet_id))
    if qos == 2:
        assert isinstance(slow.recv(), PubRel)
        slow.send_packet(PubComp(held.packet_id))
    for job in (6, 7):
        pub.publish("jobs", str(job), qos)
    assert slow.recv().payload == b"6"
    assert fast.expect(1)[0].payload == b"7"


@pytest.mark.mqtt5("MQTT-3.1.2-24", "MQTT-3.1.2-25")
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_a_shared_message_too_large_for_one_member_goes_to_another(broker, qos):
    """A message larger than a member's Maximum Packet Size is never sent to it [MQTT-3.1.2-24]; in a
    shared group it goes to a member that can take it (MQTT 5.0 4.8.2 lets the Server choose so) instead of
    being dropped for the one whose turn it was. Only when no member can take it is it dropped, counted
    ``too_large`` [MQTT-3.1.2-25]."""
    small = RawClient(broker.port, 5)
    small.connect("small", properties=Properties(maximum_packet_size=64))
    small.subscribe("$share/workers/jobs", qos)
    large = PahoClient(broker.port, "large")
    large.subscribe("$share/workers/jobs", qos)
    pub = PahoClient(broker.port, "pub")
    for job in range(4):
        pub.publish("jobs", str(job).encode() * 200, qos)
    assert [m.payload[:1] for m in large.expect(4)] == [b"0", b"1", b"2", b"3"]
    small.recv_none()
    assert broker.drops("too_large") == 0
    large.unsubscribe("$share/workers/jobs")
    pub.publish("jobs", b"x" * 200, qos)
    pub.publish("jobs", b"ok", qos)
    assert small.recv().payload == b"ok"
    assert wait_for(lambda: broker.drops("too_large") == 1)


def test_qos1_jobs_of_a_shared_member_whose_session_ends_go_to_another_member(broker):
    """MQTT 5.0 section 4.8.2: a QoS 1 message the Server was sending to a member whose Session terminates
    before it acknowledged it SHOULD be sent to another member of the Shared Subscription. The message in
    flight to the member and the one waiting behind it (Receive Maximum 1) go to the other member, in order;
    a job its session had acknowledged does not come again."""
    leaving = RawClient(broker.port)
    ack = leaving.connect("leaving", properties=Properties(receive_maximum=1))
    assert ack.reason_code == 0  # Session Expiry 0: the session ends with the connection
    leaving.subscribe("$share/workers/jobs", 1)
    pub = PahoClient(broker.port, "pub")
    pub.publish("jobs", b"done", 1)
    done = leaving.recv()
    leaving.send_packet(PubAck(done.packet_id))
    for job in (b"started", b"waiting"):
        pub.publish("jobs", job, 1)
    assert leaving.recv().payload == b"started"  # not acknowledged; "waiting" waits behind it
    staying = PahoClient(broker.port, "staying")
    staying.subscribe("$share/workers/jobs", 1)
    leaving.close()
    assert [m.payload for m in staying.expect(2)] == [b"started", b"waiting"]
    staying.expect_none(0.3)


@pytest.mark.mqtt5("MQTT-3.3.2-6")
def test_a_message_expiry_interval_of_0_is_forwarded_as_0(broker):
    """The Message Expiry Interval a subscriber gets is the one received less the time the message waited
    [MQTT-3.3.2-6]: a publish with 0, delivered at once, goes on with 0 (not with a second more)."""
    sub = RawClient(broker.port, 5)
    sub.connect("sub")
    sub.subscribe("now/#", 1)
    pub = RawClient(broker.port, 5)
    pub.connect("pub")
    pub.send_packet(Publish("now/a", b"x", 1, packet_id=1, properties=Properties(message_expiry_interval=0)))
    message = sub.recv()
    assert (message.payload, message.properties.message_expiry_interval) == (b"x", 0)


def test_a_payload_said_to_be_utf8_that_is_not_is_refused_with_0x99_and_counted(broker):
    """Payload Format Indicator 1 says the payload is UTF-8 (MQTT 3.3.2.3.2): the receiver may check it and
    answer 0x99 (Payload format invalid). A payload that is not is neither routed nor logged, where
    subscribers and the commitlog's readers (the telemetry pipeline) were handed it as text; the client's
    connection and its next messages go on. QoS 0: dropped, counted and logged as the refusals are."""
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("text/#", 1)
    pub = RawClient(broker.port, 5)
    pub.connect("pub")
    said_utf8 = Properties(payload_format_indicator=1)
    for packet_id, payload in [(1, b"\xff\xfe"), (2, b"caf\xc3"), (3, "café ✓".encode())]:
        pub.send_packet(Publish("text/a", payload, 1, packet_id=packet_id, properties=said_utf8))
        ack = pub.recv()
        assert (ack.packet_id, ack.reason_code) == (packet_id, 0x99 if packet_id < 3 else 0)
    pub.send_packet(Publish("text/a", b"\xed\xa0\x80", 0, properties=said_utf8))  # a surrogate: not UTF-8
    pub.send_packet(Publish("text/b", b"\xff", 1, packet_id=4))  # not said to be UTF-8: bytes, passed on
    assert pub.recv().reason_code == 0
    delivered = [(m.topic, m.payload) for m in sub.expect(2)]
    assert delivered == [("text/a", "café ✓".encode()), ("text/b", b"\xff")]
    sub.expect_none(0.3)
    assert broker.call(lambda: broker.broker.counters.drops("payload_format_invalid")) == 3


def test_a_will_said_to_be_utf8_that_is_not_is_refused_with_connack_0x99(broker):
    """The same check of a will's payload (MQTT 3.1.3.2.3): CONNACK 0x99 and the reason, where the will was
    taken and published as text when the client went."""
    raw = RawClient(broker.port, 5)
    will = Will("wills/a", b"\xc0\xaf", 1, properties=Properties(payload_format_indicator=1))
    connack = raw.connect("dying", will=will)
    assert connack.reason_code == 0x99 and "Payload Format Indicator" in connack.properties.reason_string
    assert raw.recv() is None
    fine = RawClient(broker.port, 5)
    good = Will("wills/a", "bye ✓".encode(), 1, properties=Properties(payload_format_indicator=1))
    assert fine.connect("dying", will=good).reason_code == 0
