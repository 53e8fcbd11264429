"""SUBSCRIBE: a code per filter, SUBACK before retained messages, ACL and quota refusals (MQTT 3.8, 3.9)."""

from broker_edge.protocol.packets import (
    MQTT_3_1_1,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from broker_edge.protocol.properties import Properties
from tests.unit.broker_edge.engine.handlers.wire import make_core


def test_suback_grants_the_requested_qos_per_filter_in_order_mqtt_3_8_4_6():
    """[MQTT-3.8.4-6] The SUBACK MUST contain a return code for each Topic Filter, in the same order."""
    core = make_core()
    client = core.client(MQTT_3_1_1)
    client.connect()
    answer = client.send(Subscribe(5, [Subscription("a/#", 0), Subscription("b/+", 2)]))
    assert answer == [SubAck(5, [0, 2])]
    assert client.received == b"\x90\x04\x00\x05\x00\x02"
    assert core.router.trie.count == 2


def test_an_invalid_filter_fails_alone_0x8f_in_v5_0x80_in_v3():
    """The v5 SUBACK says why in its reason string; MQTT 3.1.1 has no way to."""
    why = Properties(reason_string="misplaced wildcard in topic filter 'a/#/b'")
    for version, failure, properties in ((5, 0x8F, why), (MQTT_3_1_1, 0x80, None)):
        client = make_core().client(version)
        client.connect()
        assert client.send(Subscribe(1, [Subscription("a/#/b", 1), Subscription("ok", 1)])) == [
            SubAck(1, [failure, 1], properties)
        ]


def test_retained_messages_follow_the_suback_with_retain_set_mqtt_3_3_1_9():
    """[MQTT-3.3.1-9] A retained message sent because of a new subscription has RETAIN set."""
    core = make_core()
    publisher = core.client()
    publisher.connect("pub")
    publisher.send(Publish("r/1", b"kept", 1, retain=True, packet_id=1))
    subscriber = core.client()
    subscriber.connect("sub")
    answer = subscriber.send(Subscribe(2, [Subscription("r/#", 1)]))
    assert isinstance(answer[0], SubAck)
    assert [(p.topic, p.payload, p.retain) for p in answer[1:]] == [("r/1", b"kept", True)]


def test_retain_handling_2_sends_no_retained_messages_mqtt_3_3_1_10():
    """[MQTT-3.3.1-10] Retain Handling 2: retained messages are not sent at subscribe time."""
    core = make_core()
    publisher = core.client()
    publisher.connect("pub")
    publisher.send(Publish("r/1", b"kept", 0, retain=True))
    subscriber = core.client()
    subscriber.connect("sub")
    assert subscriber.send(Subscribe(2, [Subscription("r/#", 1, retain_handling=2)])) == [SubAck(2, [1])]


def test_acl_denied_filter_gets_0x87_and_is_counted():
    core = make_core(acl={"rules": [{"permission": "allow", "action": "subscribe", "topic": "ok/#"}]})
    client = core.client()
    client.connect()
    assert client.send(Subscribe(1, [Subscription("secret/#", 0), Subscription("ok/1", 0)])) == [
        SubAck(1, [0x87, 0])
    ]
    assert core.counters.drops("subscribe_denied") == 1


def test_more_subscriptions_than_the_client_quota_get_0x97():
    core = make_core(limits={"max_subscriptions_per_client": 1})
    client = core.client()
    client.connect()
    assert client.send(Subscribe(1, [Subscription("a", 0), Subscription("b", 0)])) == [SubAck(1, [0, 0x97])]


def test_a_replay_without_a_commitlog_is_refused_0x83():
    client = make_core().client()
    client.connect()
    subscribe = Subscribe(1, [Subscription("a", 1)], Properties(user_properties=[("offset", "earliest")]))
    why = "replay refused: this broker keeps no commitlog (storage.enabled is false)"
    assert client.send(subscribe) == [SubAck(1, [0x83], Properties(reason_string=why))]


def test_subscription_identifier_is_carried_on_each_delivery_mqtt_3_8_4_17():
    """[MQTT-3.8.4-17] Deliveries for a subscription carry its Subscription Identifier."""
    core = make_core()
    subscriber = core.client()
    subscriber.connect("sub")
    subscriber.send(Subscribe(1, [Subscription("t", 0)], Properties(subscription_identifiers=[42])))
    publisher = core.client()
    publisher.connect("pub")
    publisher.send(Publish("t", b"x"))
    assert [p.properties.subscription_identifiers for p in subscriber.read()] == [[42]]
