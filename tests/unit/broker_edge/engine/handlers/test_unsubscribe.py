"""UNSUBSCRIBE: one reason code per filter, the subscription gone from the trie (MQTT 3.10)."""

from broker_edge.protocol.packets import (
    MQTT_3_1_1,
    Publish,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
)
from tests.unit.broker_edge.engine.handlers.wire import make_core


def test_unsuback_has_a_code_per_filter_and_0x11_for_one_not_subscribed_mqtt_3_11_3_1():
    """[MQTT-3.11.3-1] The UNSUBACK has a Reason Code for each Topic Filter, in order."""
    core = make_core()
    client = core.client()
    client.connect()
    client.send(Subscribe(1, [Subscription("a/+", 1)]))
    assert client.send(Unsubscribe(2, ["a/+", "never/subscribed"])) == [UnsubAck(2, [0x00, 0x11])]
    assert core.router.trie.count == 0


def test_no_message_is_delivered_after_unsubscribe_mqtt_3_10_4_1():
    """[MQTT-3.10.4-1] The filters in UNSUBSCRIBE are compared character by character and removed."""
    core = make_core()
    subscriber = core.client(MQTT_3_1_1)
    subscriber.connect("sub")
    subscriber.send(Subscribe(1, [Subscription("a/b", 0)]))
    assert subscriber.send(Unsubscribe(2, ["a/b"])) == [UnsubAck(2, [])]
    publisher = core.client()
    publisher.connect("pub")
    publisher.send(Publish("a/b", b"x"))
    assert subscriber.read() == []


def test_the_v3_replay_form_unsubscribes_the_plain_filter():
    core = make_core()
    client = core.client()
    client.connect()
    client.send(Subscribe(1, [Subscription("a/b", 0)]))
    assert client.send(Unsubscribe(2, ["$offset/earliest/a/b"])) == [UnsubAck(2, [0x00])]
