"""Retained messages (v5 retain handling, retain as published) and wills (delay, DISCONNECT 0x04)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from broker_edge.protocol.packets import Disconnect, PubAck, Publish, Subscribe, Subscription, Will
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import PahoClient, RawClient, wait_for


@pytest.mark.mqtt311("MQTT-3.3.1-5", "MQTT-3.3.1-6", "MQTT-3.3.1-8", "MQTT-3.3.1-10", "MQTT-3.3.1-11")
@pytest.mark.mqtt5("MQTT-3.3.1-6", "MQTT-3.3.1-7")
def test_retained_message_sent_on_subscribe_and_cleared_by_empty_payload(broker):
    pub = PahoClient(broker.port, "pub")
    pub.publish("state/lamp", b"on", 1, retain=True)
    first = PahoClient(broker.port, "s1")
    first.subscribe("state/#", 1)
    [message] = first.expect(1)
    assert (message.payload, message.retain) == (b"on", True)
    pub.publish("state/lamp", b"", 1, retain=True)
    later = PahoClient(broker.port, "s2")
    later.subscribe("state/#", 1)
    pub.publish("state/other", b"live", 1)
    assert [m.payload for m in later.expect(1)] == [b"live"]


@pytest.mark.mqtt311("MQTT-3.3.1-9")
@pytest.mark.mqtt5("MQTT-3.3.1-12", "MQTT-3.3.1-13")
def test_live_delivery_clears_retain_flag_unless_retain_as_published(broker):
    plain = PahoClient(broker.port, "plain")
    plain.subscribe("r", 0)
    rap = PahoClient(broker.port, "rap")
    rap.subscribe("r", 0, retainAsPublished=True)
    v3 = PahoClient(broker.port, "v3", version=4)
    v3.subscribe("r", 0)
    PahoClient(broker.port, "pub").publish("r", b"x", 0, retain=True)
    assert plain.expect(1)[0].retain is False
    assert rap.expect(1)[0].retain is True
    assert v3.expect(1)[0].retain is False


@pytest.mark.mqtt5("MQTT-3.3.1-9", "MQTT-3.3.1-10", "MQTT-3.3.1-11", "MQTT-3.8.4-4")
def test_retain_handling_1_and_2(broker):
    PahoClient(broker.port, "pub").publish("rh", b"kept", 1, retain=True)
    never = PahoClient(broker.port, "never")
    never.subscribe("rh", 0, retainHandling=2)
    if_new = PahoClient(broker.port, "ifnew")
    if_new.subscribe("rh", 0, retainHandling=1)
    assert if_new.expect(1)[0].payload == b"kept"
    if_new.subscribe("rh", 0, retainHandling=1)  # not new: nothing
    always = PahoClient(broker.port, "always")
    always.subscribe("rh", 0, retainHandling=0)
    always.subscribe("rh", 0, retainHandling=0)
    assert len(always.expect(2)) == 2
    never.expect_none(0.1)
    if_new.expect_none(0.1)


def test_retained_limit(start_broker):
    broker = start_broker(retain={"max_retained": 2})
    pub = PahoClient(broker.port, "pub")
    for i in range(3):
        pub.publish(f"r/{i}", b"v", 1, retain=True)
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("r/#", 0)
    assert sorted(m.topic for m in sub.expect(2)) == ["r/0", "r/1"]
    sub.expect_none(0.2)
    assert broker.drops("retained_full") == 1


@pytest.mark.mqtt311("MQTT-3.1.2-8")
@pytest.mark.mqtt5("MQTT-3.1.2-7", "MQTT-3.1.2-8", "MQTT-3.1.2-14")
def test_will_published_when_connection_drops(broker):
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("wills/#", 1)
    device = PahoClient(broker.port, "dev", will=("wills/dev", b"offline", 1, False))
    device.kill()
    [message] = watcher.expect(1)
    assert (message.topic, message.payload, message.retain) == ("wills/dev", b"offline", False)
    assert broker.call(lambda: broker.broker.router.retained.count) == 0  # published, not retained


@pytest.mark.mqtt311("MQTT-3.1.2-8", "MQTT-3.1.2-10", "MQTT-3.14.4-3")
@pytest.mark.mqtt5("MQTT-3.1.2-8", "MQTT-3.1.2-10", "MQTT-3.14.4-3")
def test_no_will_after_normal_disconnect_but_0x04_sends_it(broker):
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("wills/#", 1)
    for version in (4, 5):
        polite = RawClient(broker.port, version)
        polite.connect(f"polite{version}", will=Will(f"wills/polite{version}", b"x", 1))
        polite.send_packet(Disconnect())
        assert polite.closed()
    explicit = RawClient(broker.port, 5)
    explicit.connect("explicit", will=Will("wills/explicit", b"bye", 1))
    explicit.send_packet(Disconnect(0x04))
    [message] = watcher.expect(1)  # the polite clients left before: a will of theirs would come first
    assert (message.topic, message.payload) == ("wills/explicit", b"bye")
    watcher.expect_none(0.2)


@pytest.mark.mqtt5("MQTT-3.1.2-8", "MQTT-3.1.2-10", "MQTT-3.1.3-9")
def test_will_delay_cancelled_by_reconnect_and_sent_after_delay(broker):
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("wills/#", 1)
    will: dict[str, Any] = {"clean": False, "session_expiry": 300, "will_delay": 100}
    flaky = PahoClient(broker.port, "flaky", will=("wills/flaky", b"gone", 1, False), **will)
    flaky.kill()
    assert wait_for(lambda: not broker.connected("flaky"))
    broker.tick(50)
    PahoClient(broker.port, "flaky", clean=False, session_expiry=300)  # back before the delay: no will
    delayed = PahoClient(broker.port, "slowwill", will=("wills/slow", b"late", 1, False), **will)
    delayed.kill()
    assert wait_for(lambda: not broker.connected("slowwill"))
    broker.tick(90)
    watcher.expect_none(0.2)  # not yet: neither will was sent at once
    broker.tick(101)
    [message] = watcher.expect(1)
    assert (message.topic, message.payload) == ("wills/slow", b"late")
    broker.tick(1000)
    watcher.expect_none(0.2)


@pytest.mark.mqtt5("MQTT-3.1.2-8")
def test_delayed_will_is_sent_when_the_session_ends_first(broker):
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("wills/#", 1)
    device = PahoClient(
        broker.port,
        "short-session",
        clean=False,
        session_expiry=10,
        will=("wills/short", b"session over", 1, False),
        will_delay=600,
    )
    device.kill()
    assert wait_for(lambda: not broker.connected("short-session"))
    watcher.expect_none(0.2)
    broker.tick(11)  # the session expires long before the will delay
    assert watcher.expect(1)[0].payload == b"session over"


def test_will_is_sent_at_once_without_delay_on_takeover(broker):
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("wills/#", 1)
    RawClient(broker.port, 5).connect("twin", will=Will("wills/twin", b"taken over", 0))
    RawClient(broker.port, 5).connect("twin")
    assert watcher.expect(1)[0].payload == b"taken over"


@pytest.mark.mqtt311("MQTT-3.1.2-7", "MQTT-3.1.2-17")
@pytest.mark.mqtt5("MQTT-3.1.2-15")
def test_retained_will(broker):
    device = PahoClient(broker.port, "dev", version=4, will=("status/dev", b"dead", 1, True))
    device.kill()
    assert wait_for(lambda: broker.call(lambda: broker.broker.router.retained.count) == 1)
    watcher = PahoClient(broker.port, "late")
    watcher.subscribe("status/dev", 1)
    [message] = watcher.expect(1)
    assert (message.payload, message.retain) == (b"dead", True)


@pytest.mark.mqtt5("MQTT-3.2.2-8")
def test_will_topic_the_acl_denies_or_a_dollar_topic_is_refused_at_connect(start_broker):
    broker = start_broker(acl={"rules": [{"permission": "allow", "action": "all", "topic": "ok/#"}]})
    assert RawClient(broker.port, 5).connect("a", will=Will("forbidden/x", b"w")).reason_code == 0x87
    assert RawClient(broker.port, 4).connect("b", will=Will("forbidden/x", b"w")).reason_code == 0x05
    assert RawClient(broker.port, 5).connect("c", will=Will("ok/x", b"w")).reason_code == 0
    open_broker = start_broker()
    assert RawClient(open_broker.port, 5).connect("d", will=Will("$SYS/fake", b"w")).reason_code == 0x87


@pytest.mark.mqtt5("MQTT-3.1.2-8", "MQTT-3.1.2-10")
def test_a_disconnect_with_an_error_code_publishes_the_will(broker):
    """Only a DISCONNECT with 0x00 (Normal disconnection) deletes the will [MQTT-3.1.2-10]; a client that
    ends its connection with an error code (0x80 Unspecified error, 0x83 Implementation specific error)
    did not leave normally, and its will is published as on any other abnormal end [MQTT-3.1.2-8]."""
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("wills/#", 1)
    for code in (0x80, 0x83):
        failing = RawClient(broker.port, 5)
        failing.connect(f"failing{code:x}", will=Will(f"wills/{code:x}", b"failed", 1))
        failing.send_packet(Disconnect(code))
        assert failing.closed()
        [message] = watcher.expect(1)
        assert (message.topic, message.payload) == (f"wills/{code:x}", b"failed")
    watcher.expect_none(0.2)


@pytest.mark.mqtt5("MQTT-3.3.1-9")
def test_a_wildcard_subscription_gets_every_retained_message_however_many(start_broker):
    """A QoS 1 subscription to ``#`` on a broker holding more retained messages than a session's window and
    queue (``limits.max_offline_messages``) hold gets every one of them, as fast as it acknowledges
    [MQTT-3.3.1-9]: none is dropped for want of room, and a live message published meanwhile comes after."""
    broker = start_broker(limits={"messages_per_second_per_client": 0, "max_offline_messages": 50})
    publisher = RawClient(broker.port, 5)
    publisher.connect("states")
    count = 300
    for i in range(count):
        publisher.send_packet(Publish(f"state/{i}", b"s", 1, retain=True, packet_id=i + 1))
    assert all(isinstance(publisher.recv(), PubAck) for _ in range(count))
    dashboard = RawClient(broker.port, 5)
    dashboard.connect("dashboard", properties=Properties(receive_maximum=10))
    dashboard.send_packet(Subscribe(1, [Subscription("state/#", 1)]))
    assert dashboard.recv().reason_codes == [1]
    publisher.send_packet(Publish("state/0", b"new", 1, packet_id=1))
    topics: list[str] = []
    while len(topics) < count + 1:
        message = dashboard.recv()
        assert message.retain == (len(topics) < count), message
        topics.append(message.topic)
        dashboard.send_packet(PubAck(message.packet_id))
    assert sorted(topics[:count]) == sorted(f"state/{i}" for i in range(count))
    assert topics[count] == "state/0"  # the live message, after the retained ones
    assert broker.drops("queue_full") == 0


@pytest.mark.mqtt5("MQTT-3.3.2-6")
def test_a_retained_message_with_an_expiry_keeps_one_encoding_of_its_interval_left(broker):
    """Each delivery of a retained message carries what is left of its Message Expiry Interval
    [MQTT-3.3.2-6], so a subscriber a second later gets another encoding. The one of an earlier second is
    never sent again: it is not kept, or a retained message with a day's expiry would keep up to 86,400
    copies of its payload as devices subscribe through the day."""
    pub = RawClient(broker.port, 5)
    pub.connect("pub")
    expiring = Properties(message_expiry_interval=600)
    pub.send_packet(Publish("status/door", b"open", 1, retain=True, packet_id=1, properties=expiring))
    assert isinstance(pub.recv(), PubAck)
    intervals = []
    for second in range(3):
        subscriber = RawClient(broker.port, 5)
        subscriber.connect(f"reader-{second}")
        subscriber.subscribe("status/door", 0)
        delivered = subscriber.recv()
        assert (delivered.payload, delivered.retain) == (b"open", True)
        intervals.append(delivered.properties.message_expiry_interval)
        time.sleep(1.05)  # the next subscriber comes a second later: less of the interval is left
    assert intervals[0] > intervals[1] > intervals[2]
    retained = broker.call(lambda: broker.broker.router.retained.get("status/door"))
    assert len(broker.call(lambda: dict(retained.templates))) == 1
