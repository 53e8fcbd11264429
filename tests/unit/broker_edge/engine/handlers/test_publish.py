"""PUBLISH from a client: acknowledgement codes, QoS 2 de-duplication, aliases, ACL, limits (MQTT 3.3)."""

import logging

import pytest

from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import (
    MQTT_3_1_1,
    MQTT_5,
    Disconnect,
    PubAck,
    Publish,
    PubRec,
    Subscribe,
    Subscription,
)
from broker_edge.protocol.properties import Properties
from tests.unit.broker_edge.engine.handlers.wire import make_core
from tests.unit.broker_edge.engine.stand_ins import MemoryLog


def _subscribed(core, topic_filter="t/#", qos=1):
    subscriber = core.client()
    subscriber.connect("sub")
    subscriber.send(Subscribe(1, [Subscription(topic_filter, qos)]))
    return subscriber


def test_qos1_publish_is_delivered_and_acknowledged_with_puback_mqtt_4_3_2_2():
    """[MQTT-4.3.2-2] The receiver MUST respond with PUBACK containing the PUBLISH's packet identifier."""
    core = make_core()
    subscriber = _subscribed(core)
    publisher = core.client(MQTT_3_1_1)
    publisher.connect("pub")
    assert publisher.send_bytes(b"\x32\x09\x00\x03t/a\x00\x07hi") == [PubAck(7)]
    assert publisher.received == b"\x40\x02\x00\x07"
    delivered = subscriber.read()
    assert [(p.topic, p.payload, p.qos) for p in delivered] == [("t/a", b"hi", 1)]


def test_v5_puback_says_0x10_when_nobody_subscribed():
    core = make_core()
    publisher = core.client()
    publisher.connect("pub")
    assert publisher.send(Publish("nobody/here", b"x", 1, packet_id=3)) == [PubAck(3, 0x10)]
    assert core.counters.drops("no_subscribers") == 1


def test_a_qos2_resend_before_pubrel_is_acknowledged_again_and_never_routed_twice_mqtt_4_3_3_3():
    """[MQTT-4.3.3-3] Until PUBREL, a PUBLISH with the same packet id is not delivered again."""
    core = make_core()
    subscriber = _subscribed(core, qos=2)
    publisher = core.client()
    publisher.connect("pub")
    assert publisher.send(Publish("t/a", b"once", 2, packet_id=4)) == [PubRec(4)]
    assert publisher.send(Publish("t/a", b"once", 2, dup=True, packet_id=4)) == [PubRec(4)]
    assert [p.payload for p in subscriber.read()] == [b"once"]


def test_a_topic_alias_is_set_then_used_mqtt_3_3_2_12():
    """[MQTT-3.3.2-12] A PUBLISH with a Topic Alias and an empty topic uses the alias's topic."""
    core = make_core()
    subscriber = _subscribed(core, qos=0)
    publisher = core.client()
    publisher.connect("pub")
    publisher.send(Publish("t/long/name", b"1", properties=Properties(topic_alias=1)))
    publisher.send(Publish("", b"2", properties=Properties(topic_alias=1)))
    assert [(p.topic, p.payload) for p in subscriber.read()] == [("t/long/name", b"1"), ("t/long/name", b"2")]


def test_an_unknown_topic_alias_is_a_protocol_error_mqtt_3_3_4_7():
    core = make_core()
    publisher = core.client()
    publisher.connect("pub")
    answer = publisher.send(Publish("", b"x", properties=Properties(topic_alias=2)))
    assert [(type(p), p.reason_code) for p in answer] == [(Disconnect, 0x82)]
    assert publisher.closed


def test_acl_denied_publish_gets_0x87_in_v5_and_a_normal_ack_in_v3():
    core = make_core(
        acl={"rules": [{"permission": "allow", "action": "publish", "topic": "ok/#"}], "default": "deny"}
    )
    v5 = core.client()
    v5.connect("v5")
    assert v5.send(Publish("secret", b"x", 1, packet_id=1)) == [PubAck(1, 0x87)]
    v3 = core.client(MQTT_3_1_1)
    v3.connect("v3")
    assert v3.send(Publish("secret", b"x", 1, packet_id=1)) == [PubAck(1)]
    assert core.counters.drops("acl_denied") == 2


def test_clients_never_publish_to_dollar_topics_mqtt_4_7_2_1():
    """[MQTT-4.7.2-1] Topics starting with $ are the Server's: a client's PUBLISH there is refused."""
    core = make_core()
    publisher = core.client()
    publisher.connect("pub")
    assert publisher.send(Publish("$SYS/fake", b"x", 1, packet_id=1)) == [PubAck(1, 0x87)]


def test_more_unacknowledged_qos1_than_receive_maximum_closes_with_0x93_mqtt_3_3_4_9():
    """[MQTT-3.3.4-9] The Server MUST NOT have more QoS 1/2 PUBLISHes unacknowledged than Receive Maximum."""
    core = make_core(limits={"receive_maximum": 1})
    publisher = core.client()
    publisher.connect("pub")
    answer = publisher.send(Publish("t", b"1", 2, packet_id=1), Publish("t", b"2", 2, packet_id=2))
    assert [(type(p), p.reason_code) for p in answer] == [(PubRec, 0x10), (Disconnect, 0x93)]


def test_a_client_disconnected_for_a_publish_no_broker_may_take_is_said_in_the_rate_limited_lines(caplog):
    """A client past Receive Maximum at every connection was disconnected over and over with nothing in the
    log but a counter: each such disconnect is a refusal line naming the client and why, rate-limited."""
    core = make_core(limits={"receive_maximum": 1})
    with caplog.at_level(logging.INFO):
        for attempt in range(30):
            publisher = core.client()
            publisher.connect(f"pub-{attempt}")
            publisher.send(Publish("t", b"1", 2, packet_id=1), Publish("t", b"2", 2, packet_id=2))
    said = [r for r in caplog.records if "disconnected: receive_maximum_exceeded" in r.getMessage()]
    assert said and "more unacknowledged QoS 1/2 PUBLISHes than Receive Maximum" in said[0].getMessage()
    assert getattr(said[0], "client_id", None) == "pub-0"
    assert len(said) < 30  # rate-limited


def test_a_topic_longer_than_the_limit_closes_the_connection_0x90():
    core = make_core(limits={"max_topic_length": 8})
    publisher = core.client()
    publisher.connect("pub")
    answer = publisher.send(Publish("a/b/c/d/e/f", b"x"))
    assert [(type(p), p.reason_code) for p in answer] == [(Disconnect, 0x90)]


def test_over_its_message_rate_a_client_stops_being_read_until_a_token_is_back():
    core = make_core(limits={"messages_per_second_per_client": 1, "messages_burst_per_client": 1})
    publisher = core.client()
    publisher.connect("pub")
    publisher.send(Publish("t", b"1"), Publish("t", b"2"))
    assert publisher.reading_paused
    assert core.counters.throttled == 1
    core.advance(2)
    assert not publisher.reading_paused


def test_retain_when_retain_is_disabled_closes_a_v5_client_with_0x9a():
    core = make_core(retain={"enabled": False})
    publisher = core.client()
    publisher.connect("pub")
    answer = publisher.send(Publish("t", b"x", retain=True))
    assert [(type(p), p.reason_code) for p in answer] == [(Disconnect, 0x9A)]


def test_subscribers_of_one_message_each_get_their_own_variant_of_its_publish_mqtt_3_8_4_6_and_3_3_1_9():
    """[MQTT-3.8.4-6] A delivery's QoS is the minimum of the publish's and the subscription's; [MQTT-3.3.1-9]
    RETAIN is 0 on a delivery to an established subscription. Every subscriber of one message gets the
    encoding of its own variant (protocol version, QoS, subscription identifier), the second subscriber of a
    variant the same bytes as the first."""
    core = make_core()
    subscribers = []
    for index, (version, qos, props) in enumerate(
        [
            (MQTT_3_1_1, 0, None),
            (MQTT_3_1_1, 0, None),
            (5, 0, None),
            (5, 1, None),
            (5, 1, None),
            (5, 1, Properties(subscription_identifiers=[7])),
            (MQTT_3_1_1, 1, None),
        ]
    ):
        subscriber = core.client(version)
        subscriber.connect(f"sub-{index}")
        subscriber.send(Subscribe(1, [Subscription("t/#", qos)], properties=props))
        subscribers.append(subscriber)
    publisher = core.client()
    publisher.connect("pub")
    for round_ in range(2):
        publisher.send(Publish("t/a", b"payload", 1, packet_id=round_ + 1))
        delivered = [subscriber.read() for subscriber in subscribers]
        assert [[(p.topic, p.payload, p.qos, p.retain) for p in packets] for packets in delivered] == [
            [("t/a", b"payload", qos, False)] for qos in (0, 0, 0, 1, 1, 1, 1)
        ]
        ids = [
            packets[0].properties.subscription_identifiers if packets[0].properties else []
            for packets in delivered
        ]
        assert ids == [[], [], [], [], [], [7], []]
        assert subscribers[0].received == subscribers[1].received
        assert subscribers[3].received == subscribers[4].received


def test_a_subscriber_of_the_publishers_version_and_qos_gets_the_frame_as_it_was_sent():
    """The frame a subscriber of the publisher's protocol version and QoS is sent is the one received (with
    its own packet id), made from those bytes rather than encoded again; any other variant is encoded."""
    core = make_core()
    v3_qos0 = core.client(MQTT_3_1_1)
    v3_qos0.connect("v3-qos0")
    v3_qos0.send(Subscribe(1, [Subscription("t/0", 0)]))
    v3_qos1 = core.client(MQTT_3_1_1)
    v3_qos1.connect("v3-qos1")
    v3_qos1.send(Subscribe(1, [Subscription("t/#", 1)]))
    v5 = _subscribed(core)
    publisher = core.client(MQTT_3_1_1)
    publisher.connect("pub")
    qos0 = b"\x30\x0a\x00\x03t/0hello"
    publisher.send_bytes(qos0)
    assert v3_qos0.read() == [Publish("t/0", b"hello")]
    assert v3_qos0.received == qos0
    publisher.send_bytes(b"\x32\x0c\x00\x03t/1\x00\x09hello")
    delivered = v3_qos1.read()
    assert [(p.topic, p.payload, p.qos) for p in delivered] == [("t/0", b"hello", 0), ("t/1", b"hello", 1)]
    packet_id = delivered[1].packet_id
    assert packet_id is not None
    assert v3_qos1.received.endswith(b"\x32\x0c\x00\x03t/1" + packet_id.to_bytes(2, "big") + b"hello")
    assert [(p.topic, p.qos) for p in v5.read()] == [("t/0", 0), ("t/1", 1)]  # v5 frames: encoded for it


def test_a_retained_or_v5_publish_with_properties_is_encoded_for_its_subscribers():
    core = make_core()
    subscriber = core.client(MQTT_3_1_1)
    subscriber.connect("v3")
    subscriber.send(Subscribe(1, [Subscription("t/#", 0)]))
    publisher = core.client()
    publisher.connect("pub")
    publisher.send(Publish("t/r", b"kept", 0, retain=True))
    publisher.send(Publish("t/p", b"typed", 0, properties=Properties(content_type="text/plain")))
    assert [(p.topic, p.payload, p.retain) for p in subscriber.read()] == [
        ("t/r", b"kept", False),  # a live delivery without RETAIN (MQTT 3.3.1.3)
        ("t/p", b"typed", False),
    ]


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
@pytest.mark.parametrize("size", [0, 5, 121, 200, 16_400])
def test_a_delivery_made_of_the_frame_as_received_is_byte_identical_to_an_encoded_one(version, size):
    """Subscribers of the publisher's protocol version at its QoS (0, 1, 2) get what the encoder would make
    of the message with their own packet id; the other version's subscribers get it encoded for them."""
    core = make_core()
    same, other = core.client(version), core.client(MQTT_5 if version == MQTT_3_1_1 else MQTT_3_1_1)
    for name, subscriber in (("same", same), ("other", other)):
        subscriber.connect(name)
        subscriber.send(Subscribe(1, [Subscription("t/#", 2)]))
    publisher = core.client(version)
    publisher.connect("pub")
    payload = bytes(range(256)) * (size // 256) + b"p" * (size % 256)
    for qos in (0, 1, 2):
        publisher.send_bytes(encode(Publish(f"t/{qos}", payload, qos, packet_id=qos or None), version))
        for subscriber in (same, other):
            (delivered,) = subscriber.read()
            expected = Publish(f"t/{qos}", payload, qos, packet_id=delivered.packet_id)
            assert subscriber.received == encode(expected, subscriber.conn.version)


@pytest.mark.parametrize("logged", [False, True])
def test_a_message_kept_after_routing_lets_go_of_the_frame_it_came_in(logged):
    """A delivery waiting for its PUBACK keeps its message, counted by its payload towards the limits: the
    frame it came in (a second copy of the payload) is let go once the message is routed, logged or not."""
    core = make_core()
    if logged:
        store = MemoryLog()
        core.publish_path.attach_store(store, None)
    subscriber = _subscribed(core)
    publisher = core.client()
    publisher.connect("pub")
    frame = encode(Publish("t/kept", b"payload", 1, packet_id=5), MQTT_5)
    answers = publisher.send_bytes(frame)
    if logged:
        assert answers == []  # acknowledged once durable
        store.make_durable()
        answers = publisher.read()
    assert answers == [PubAck(5)]
    (delivered,) = subscriber.read()
    assert subscriber.received == encode(
        Publish("t/kept", b"payload", 1, packet_id=delivered.packet_id), MQTT_5
    )
    (waiting,) = core.router.sessions["sub"].inflight.values()
    assert isinstance(waiting, tuple)  # a delivery, not a QoS 2 release
    assert (waiting[0].payload, waiting[0].frame) == (b"payload", None)
