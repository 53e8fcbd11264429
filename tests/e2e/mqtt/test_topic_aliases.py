"""MQTT 5 topic aliases in both directions: clients to the broker, and the broker to clients (LRU)."""

from __future__ import annotations

import asyncio

import pytest
from gmqtt import Client as GmqttClient

from broker_edge.engine.message import Message
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import MQTT_5, PubAck, Publish
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import TIMEOUT, PahoClient, RawClient


def aliased(publish: Publish) -> tuple[str, int | None, bytes]:
    """(topic name as sent, Topic Alias property, payload) of a PUBLISH from the broker."""
    alias = publish.properties.topic_alias if publish.properties is not None else None
    return publish.topic, alias, publish.payload


def alias_subscriber(broker, client_id: str, maximum: int, qos: int = 0) -> RawClient:
    raw = RawClient(broker.port, 5)
    assert raw.connect(client_id, properties=Properties(topic_alias_maximum=maximum)).reason_code == 0
    assert raw.subscribe("al/#", qos).reason_codes == [qos]
    return raw


@pytest.mark.mqtt5("MQTT-3.3.2-12")
def test_topic_alias_from_client(broker):
    sub = PahoClient(broker.port, "sub")
    sub.subscribe("long/topic/name", 0)
    raw = RawClient(broker.port, 5)
    connack = raw.connect("aliaser")
    assert connack.properties.topic_alias_maximum == 64
    raw.send_packet(Publish("long/topic/name", b"one", properties=Properties(topic_alias=1)))
    raw.send_packet(Publish("", b"two", properties=Properties(topic_alias=1)))
    assert [(m.topic, m.payload) for m in sub.expect(2)] == [
        ("long/topic/name", b"one"),
        ("long/topic/name", b"two"),
    ]


@pytest.mark.mqtt5("MQTT-3.1.2-26", "MQTT-3.3.2-8")
def test_broker_assigns_aliases_least_recently_used_first(broker):
    raw = alias_subscriber(broker, "lru", maximum=2)
    pub = PahoClient(broker.port, "pub")
    for name in ("a", "b", "a", "c", "b", "c"):
        pub.publish(f"al/{name}", name)
    assert [aliased(raw.recv()) for _ in range(6)] == [
        ("al/a", 1, b"a"),  # first use: name and alias
        ("al/b", 2, b"b"),
        ("", 1, b"a"),  # alias only; al/a is now the most recently used
        ("al/c", 2, b"c"),  # both aliases taken: al/b (least recently used) gives up 2
        ("al/b", 1, b"b"),  # and now al/a gives up 1
        ("", 2, b"c"),
    ]


@pytest.mark.mqtt5("MQTT-3.1.2-26", "MQTT-3.3.2-11")
def test_aliases_on_qos1_deliveries_and_the_maximum_is_the_brokers_if_lower(start_broker):
    broker = start_broker(mqtt={"outgoing_topic_aliases": 1})
    raw = alias_subscriber(broker, "q1", maximum=10, qos=1)
    pub = PahoClient(broker.port, "pub")
    for name in ("x", "x", "y"):
        pub.publish(f"al/{name}", name, 1)
    frames = []
    for _ in range(3):
        packet = raw.recv()
        frames.append((*aliased(packet), packet.qos))
        raw.send_packet(PubAck(packet.packet_id))
    assert frames == [("al/x", 1, b"x", 1), ("", 1, b"x", 1), ("al/y", 1, b"y", 1)]


@pytest.mark.mqtt5("MQTT-3.1.2-27")
def test_no_aliases_for_clients_that_did_not_ask_or_when_disabled(start_broker):
    broker = start_broker(mqtt={"outgoing_topic_aliases": 0})
    wants = alias_subscriber(broker, "wants", maximum=5)
    default = start_broker()
    silent = alias_subscriber(default, "silent", maximum=0)
    for running in (broker, default):
        pub = PahoClient(running.port, "pub")
        pub.publish("al/t", b"1")
        pub.publish("al/t", b"2")
    assert [aliased(wants.recv()) for _ in range(2)] == [("al/t", None, b"1"), ("al/t", None, b"2")]
    assert [aliased(silent.recv()) for _ in range(2)] == [("al/t", None, b"1"), ("al/t", None, b"2")]


@pytest.mark.mqtt5("MQTT-3.1.2-24", "MQTT-3.1.2-26")
@pytest.mark.parametrize("qos", [0, 1])
def test_a_delivery_that_fits_the_maximum_packet_size_only_without_an_alias_is_sent_without_one(broker, qos):
    """A client taking aliases whose Maximum Packet Size fits a delivery with its topic name but not with an
    alias added (3 bytes more) gets it with the name alone [MQTT-3.1.2-24]: the alias is the broker's
    choice, not the client's message to lose. The topic gets its alias with the first delivery that fits
    it, and aliases stay within the client's maximum [MQTT-3.1.2-26]."""
    large = b"x" * 50
    plain = encode(Publish("al/big", large, qos, packet_id=1 if qos else None), MQTT_5)
    raw = RawClient(broker.port, 5)
    terms = Properties(topic_alias_maximum=2, maximum_packet_size=len(plain))
    assert raw.connect("tight", properties=terms).reason_code == 0
    assert raw.subscribe("al/#", qos).reason_codes == [qos]
    pub = PahoClient(broker.port, "pub")
    frames = []
    for payload in (large, large, b"small", large):
        pub.publish("al/big", payload, qos)
        packet = raw.recv()
        frames.append(aliased(packet))
        if qos:
            raw.send_packet(PubAck(packet.packet_id))
    assert frames == [
        ("al/big", None, large),
        ("al/big", None, large),
        ("al/big", 1, b"small"),
        ("", 1, large),
    ]
    assert broker.drops("too_large") == 0


def test_retained_messages_and_a_new_connection_start_with_fresh_aliases(broker):
    pub = PahoClient(broker.port, "pub")
    pub.publish("al/state", b"on", 1, retain=True)
    first = alias_subscriber(broker, "again", maximum=4)
    assert aliased(first.recv()) == ("al/state", 1, b"on")
    first.close()
    second = alias_subscriber(broker, "again", maximum=4)  # aliases belong to the network connection
    assert aliased(second.recv()) == ("al/state", 1, b"on")
    pub.publish("al/state", b"off")
    assert aliased(second.recv()) == ("", 1, b"off")


def test_gmqtt_receives_aliased_publishes(broker):
    """gmqtt resolves the broker's aliases; it must see full topic names on every message."""

    async def scenario() -> tuple[list, dict[str, int]]:
        received: list = []
        done = asyncio.Event()
        client = GmqttClient("gmqtt-aliases", topic_alias_maximum=8)

        def on_message(client, topic, payload, qos, properties):
            received.append((topic, payload))
            if len(received) == 4:
                done.set()
            return 0

        subscribed = asyncio.Event()
        client.on_message = on_message
        client.on_subscribe = lambda *args: subscribed.set()
        await client.connect("127.0.0.1", broker.port, keepalive=30)
        client.subscribe("al/#", qos=0)
        await asyncio.wait_for(subscribed.wait(), TIMEOUT)
        for topic, payload in (("al/one", b"1"), ("al/two", b"2"), ("al/one", b"3"), ("al/one", b"4")):
            client.publish(topic, payload, qos=0)
        await asyncio.wait_for(done.wait(), TIMEOUT)
        connection = broker.connection("gmqtt-aliases")
        aliases = broker.call(lambda: dict(connection.aliases_out))
        await client.disconnect()
        return received, aliases

    received, aliases = asyncio.run(scenario())
    assert received == [("al/one", b"1"), ("al/two", b"2"), ("al/one", b"3"), ("al/one", b"4")]
    assert aliases == {"al/two": 2, "al/one": 1}  # so the 3rd and 4th PUBLISH carried only the alias
    assert broker.disconnects("protocol_error") == 0


def test_aliased_variants_are_encoded_once_per_variant():
    """Fanout keeps encoding once: every subscriber given the same alias shares one frame object."""
    message = Message("al/t", b"payload")
    setting = message.template(True, 0, False, (), 3, False)
    using = message.template(True, 0, False, (), 3, True)
    assert message.template(True, 0, False, (), 3, False) is setting
    assert message.template(True, 0, False, (), 3, True) is using
    assert setting.head != using.head and b"al/t" in setting.head and b"al/t" not in using.head
    assert message.template(True, 0, False) is message.template(True, 0, False)
    assert message.template(True, 0, False).head != setting.head
