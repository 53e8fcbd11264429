"""Message Expiry Interval on every path a held message takes: the offline queue of a persistent session, the
log (offline cursors, replays, after a restart) and the retained store.

A message whose interval passed before delivery started is not delivered [MQTT-3.3.2-5]; the others carry
what remains of their interval [MQTT-3.3.2-6]. Real brokers at their defaults (QoS 1/2 logged), real paho
MQTT 5 clients; a topic outside the persistence rules takes the in-memory queue instead of the log.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker_edge.protocol.packets import PubComp, Publish, PubRec, PubRel
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import PahoClient, RawClient
from tests.e2e.commitlog.e2e_helpers import replay_from

OFFLINE_S = 2.0
PERSISTENT: dict[str, Any] = {"clean": False, "session_expiry": 300}
QUEUED_ONLY = {"storage": {"persist": [{"pattern": "logged/#", "qos": [1, 2]}]}}
"""Persistence rules that leave ``queued/...`` topics out of the log: their offline copies wait in memory."""


def publish_expiring(
    broker, topic: str, payload: bytes, qos: int, expiry_s: int, retain: bool = False
) -> float:
    """Publish with a Message Expiry Interval; returns when the broker acknowledged it (the wait before a
    reconnect counts from there, so the interval left is at most the interval minus the wait)."""
    props = PahoProperties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = expiry_s
    publisher = PahoClient(broker.port, f"publisher-{payload.decode()}")
    publisher.publish(topic, payload, qos, retain, properties=props)
    acknowledged = time.monotonic()
    publisher.disconnect()
    return acknowledged


def wait_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def expiry_of(message) -> int | None:
    return getattr(message.properties, "MessageExpiryInterval", None)


def assert_only_the_long_lived_one(messages, subscriber) -> None:
    [message] = messages
    assert message.payload == b"long"
    expiry = expiry_of(message)
    assert expiry is not None and expiry <= 10 - OFFLINE_S
    subscriber.expect_none()


@pytest.mark.mqtt5("MQTT-3.3.2-5", "MQTT-3.3.2-6")
@pytest.mark.parametrize("qos", [1, 2])
@pytest.mark.parametrize("path", ["log", "queue"])
def test_offline_session_gets_only_what_has_not_expired_with_the_interval_left(brokers, qos, path):
    broker = brokers(**(QUEUED_ONLY if path == "queue" else {}))
    topic = "logged/1" if path == "log" else "queued/1"
    device = PahoClient(broker.port, f"device-{qos}", **PERSISTENT)
    device.subscribe(topic, qos)
    device.disconnect()

    publish_expiring(broker, topic, b"short", qos, 1)
    published = publish_expiring(broker, topic, b"long", qos, 10)
    in_log = broker.call(lambda: topic in broker.broker.store)
    assert in_log is (path == "log")
    wait_until(published + OFFLINE_S)

    back = PahoClient(broker.port, f"device-{qos}", **PERSISTENT)
    assert_only_the_long_lived_one(back.expect(1), back)
    assert broker.drops("expired") == 1


@pytest.mark.mqtt5("MQTT-3.3.2-5", "MQTT-3.3.2-6")
@pytest.mark.parametrize("qos", [1, 2])
def test_expiry_is_kept_in_the_log_across_a_restart(brokers, qos):
    broker = brokers()
    device = PahoClient(broker.port, "device", **PERSISTENT)
    device.subscribe("logged/2", qos)
    device.disconnect()
    publish_expiring(broker, "logged/2", b"short", qos, 1)
    published = publish_expiring(broker, "logged/2", b"long", qos, 10)
    broker.stop()
    broker = brokers()
    wait_until(published + OFFLINE_S)

    back = PahoClient(broker.port, "device", **PERSISTENT)
    assert_only_the_long_lived_one(back.expect(1), back)


@pytest.mark.mqtt5("MQTT-3.3.2-5", "MQTT-3.3.2-6")
def test_a_replay_from_an_offset_skips_expired_records(brokers):
    broker = brokers()
    publish_expiring(broker, "logged/3", b"short", 1, 1)
    published = publish_expiring(broker, "logged/3", b"long", 1, 10)
    wait_until(published + OFFLINE_S)

    reader = PahoClient(broker.port, "reader")
    assert reader.subscribe("logged/3", 1, properties=replay_from("earliest")) == [1]
    assert_only_the_long_lived_one(reader.expect(1), reader)


@pytest.mark.mqtt5("MQTT-3.3.2-5", "MQTT-3.3.2-6")
@pytest.mark.parametrize("qos", [1, 2])
def test_retained_messages_expire_and_carry_the_interval_left(brokers, qos):
    broker = brokers()
    publish_expiring(broker, "retained/short", b"short", qos, 1, retain=True)
    published = publish_expiring(broker, "retained/long", b"long", qos, 10, retain=True)
    wait_until(published + OFFLINE_S)

    newcomer = PahoClient(broker.port, "newcomer")
    newcomer.subscribe("retained/#", qos)
    [message] = newcomer.expect(1)
    assert message.retain
    assert_only_the_long_lived_one([message], newcomer)


@pytest.mark.mqtt5("MQTT-4.3.3-7")
@pytest.mark.parametrize("qos", [1, 2])
def test_a_message_already_sent_is_resent_after_its_expiry(brokers, qos):
    broker = brokers()
    device = RawClient(broker.port, 5)
    device.connect("device", clean_start=False, properties=Properties(session_expiry_interval=300))
    device.subscribe("logged/4", qos)
    published = publish_expiring(broker, "logged/4", b"in flight", qos, 1)
    first = device.recv()
    device.close()  # no acknowledgement: the delivery has started
    wait_until(published + 1.5)

    again = RawClient(broker.port, 5)
    again.connect("device", clean_start=False, properties=Properties(session_expiry_interval=300))
    resent = again.recv()
    assert (resent.payload, resent.dup, resent.packet_id) == (b"in flight", True, first.packet_id)


@pytest.mark.mqtt5("MQTT-4.3.3-13")
def test_the_qos2_handshake_of_an_expired_publish_completes(brokers):
    broker = brokers()
    publisher = RawClient(broker.port, 5)
    publisher.connect("publisher")
    expiring = Properties(message_expiry_interval=1)
    publisher.send_packet(Publish("logged/5", b"expires", 2, packet_id=4, properties=expiring))
    assert isinstance(publisher.recv(), PubRec)
    time.sleep(1.2)
    publisher.send_packet(PubRel(4))
    completed = publisher.recv()
    assert isinstance(completed, PubComp) and (completed.packet_id, completed.reason_code) == (4, 0)
