"""Forwarded properties reach subscribers exactly as published; the log offset only for those that asked.

A broker at its defaults logs QoS 1/2 publishes. Subscribers that never asked for log delivery must see the
publisher's user properties unaltered and in order [MQTT-3.3.2-17], [MQTT-3.3.2-18], whether the message
came live or from the log (offline session, restart). A client that subscribed from an offset, or opted in
on CONNECT (user property ``offsets: on``), also gets ``offset``, after the publisher's own properties.

Real clients only: paho MQTT 5, gmqtt and the project's lean client.
"""

from __future__ import annotations

import asyncio

import pytest
from gmqtt import Client as GmqttClient
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker_edge.engine.message import OFFSETS_OPT_IN
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import MQTT_5, Publish, SubAck, Will
from broker_edge.protocol.properties import Properties
from pipelines.fleet.client import MqttClient
from tests.e2e.broker_clients import TIMEOUT, PahoClient, RawClient, wait_for
from tests.e2e.commitlog.e2e_helpers import OPTED_IN, LoopThread, replay_from

PUBLISHED = [("site", "north"), ("unit", "7"), ("site", "south"), ("offset", "mine")]
"""Repeated keys, and a key named like the broker's own property: all must arrive as they are."""


def publish_with_properties(broker, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
    props = PahoProperties(PacketTypes.PUBLISH)
    props.UserProperty = list(PUBLISHED)
    props.ContentType = "text/plain"
    publisher = PahoClient(broker.port, f"publisher-{topic}")
    publisher.publish(topic, payload, qos, retain=retain, properties=props)
    publisher.disconnect()


def user_properties(message) -> list[tuple[str, str]]:
    return list(getattr(message.properties, "UserProperty", None) or [])


@pytest.mark.mqtt5("MQTT-3.3.2-17", "MQTT-3.3.2-18")
@pytest.mark.parametrize("qos", [1, 2])
def test_paho_subscriber_gets_the_published_user_properties_live_and_from_the_log(brokers, qos):
    broker = brokers()
    live = PahoClient(broker.port, "live")
    live.subscribe("plant/#", qos)
    away = PahoClient(broker.port, "away", clean=False, session_expiry=300)
    away.subscribe("plant/#", qos)
    away.disconnect()

    publish_with_properties(broker, "plant/1", b"reading", qos)

    [message] = live.expect(1)
    assert user_properties(message) == PUBLISHED
    assert message.properties.ContentType == "text/plain"
    back = PahoClient(broker.port, "away", clean=False, session_expiry=300)
    [held] = back.expect(1)  # read from the log: the session was offline
    assert (held.payload, user_properties(held)) == (b"reading", PUBLISHED)


@pytest.mark.mqtt5("MQTT-3.3.2-17", "MQTT-3.3.2-18")
def test_user_properties_stay_unaltered_after_a_restart(brokers):
    broker = brokers()
    away = PahoClient(broker.port, "away", clean=False, session_expiry=300)
    away.subscribe("plant/#", 1)
    away.disconnect()
    publish_with_properties(broker, "plant/2", b"before restart")
    broker.stop()

    broker = brokers()
    back = PahoClient(broker.port, "away", clean=False, session_expiry=300)
    [message] = back.expect(1)
    assert (message.payload, user_properties(message)) == (b"before restart", PUBLISHED)


@pytest.mark.mqtt5("MQTT-3.3.2-17", "MQTT-3.3.2-18")
def test_gmqtt_subscriber_gets_exactly_the_published_user_properties(brokers):
    broker = brokers()
    loop = LoopThread()
    got: list[tuple[bytes, dict]] = []
    arrived = asyncio.Event()

    def on_message(_client, _topic, payload, _qos, properties):
        got.append((payload, properties))
        loop.loop.call_soon(arrived.set)
        return 0

    async def subscribe() -> GmqttClient:
        client = GmqttClient("gmqtt-subscriber")
        client.on_message = on_message
        await client.connect("127.0.0.1", broker.port, keepalive=30)
        client.subscribe("plant/#", qos=1)
        await asyncio.sleep(0.2)  # SUBACK
        return client

    async def received() -> None:
        await asyncio.wait_for(arrived.wait(), TIMEOUT)

    try:
        client = loop.run(subscribe())
        publish_with_properties(broker, "plant/3", b"gm")
        loop.run(received())
        loop.run(client.disconnect())
    finally:
        loop.close()
    [(payload, properties)] = got
    assert payload == b"gm"
    assert [tuple(pair) for pair in properties["user_property"]] == PUBLISHED


def test_a_client_that_opts_in_on_connect_gets_the_offset_after_the_published_properties(brokers):
    broker = brokers()
    opted = PahoClient(broker.port, "opted", connect_properties=OPTED_IN)
    opted.subscribe("plant/#", 1)
    plain = PahoClient(broker.port, "plain")
    plain.subscribe("plant/#", 1)

    publish_with_properties(broker, "plant/4", b"a")
    publish_with_properties(broker, "plant/4", b"b")

    assert [user_properties(m) for m in opted.expect(2)] == [
        [*PUBLISHED, ("offset", "0")],
        [*PUBLISHED, ("offset", "1")],
    ]
    assert [user_properties(m) for m in plain.expect(2)] == [PUBLISHED, PUBLISHED]


def test_a_client_that_subscribes_from_an_offset_gets_offsets_and_keeps_them_across_a_restart(brokers):
    broker = brokers()
    publish_with_properties(broker, "plant/5", b"old")
    reader = PahoClient(broker.port, "reader", clean=False, session_expiry=300)
    assert reader.subscribe("plant/5", 1, properties=replay_from("earliest")) == [1]
    [replayed] = reader.expect(1)
    assert user_properties(replayed) == [*PUBLISHED, ("offset", "0")]
    reader.disconnect()
    broker.stop()

    broker = brokers()
    back = PahoClient(broker.port, "reader", clean=False, session_expiry=300)
    publish_with_properties(broker, "plant/5", b"new")
    [live] = back.expect(1)
    assert user_properties(live) == [*PUBLISHED, ("offset", "1")]


def test_the_fleet_client_reads_offsets_only_when_it_opts_in(brokers):
    broker = brokers()
    loop = LoopThread()
    got: dict[str, list] = {"opted": [], "plain": []}

    async def connect(client_id: str, log_offsets: bool) -> MqttClient:
        client = await MqttClient.connect(
            "127.0.0.1", broker.port, client_id, on_message=got[client_id].append, log_offsets=log_offsets
        )
        await client.subscribe("plant/#", 1)
        return client

    try:
        clients = [loop.run(connect("opted", True)), loop.run(connect("plain", False))]
        publish_with_properties(broker, "plant/6", b"x")
        for name in got:
            loop.run(_until(lambda name=name: len(got[name]) == 1))
        for client in clients:
            loop.run(client.disconnect())
    finally:
        loop.close()
    assert (got["opted"][0].offset, got["opted"][0].user_properties[-1]) == (0, ("offset", "0"))
    assert (got["plain"][0].offset, list(got["plain"][0].user_properties)) == (None, PUBLISHED)


async def _until(condition, timeout: float = TIMEOUT) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.01)


@pytest.mark.mqtt5("MQTT-3.3.2-4", "MQTT-3.3.2-15", "MQTT-3.3.2-16", "MQTT-3.3.2-17", "MQTT-3.3.2-20")
def test_every_forwarded_property_survives_the_log_and_a_restart(brokers):
    broker = brokers()
    away = PahoClient(broker.port, "away", clean=False, session_expiry=300)
    away.subscribe("req/#", 1)
    away.disconnect()
    props = PahoProperties(PacketTypes.PUBLISH)
    props.PayloadFormatIndicator = 1
    props.ContentType = "application/json"
    props.ResponseTopic = "replies/7"
    props.CorrelationData = b"\x00\x07"
    props.UserProperty = list(PUBLISHED)
    publisher = PahoClient(broker.port, "requester")
    publisher.publish("req/7", b"{}", 1, properties=props)
    publisher.disconnect()
    broker.stop()

    broker = brokers()
    [message] = PahoClient(broker.port, "away", clean=False, session_expiry=300).expect(1)
    got = message.properties
    assert (got.PayloadFormatIndicator, got.ContentType) == (1, "application/json")
    assert (got.ResponseTopic, got.CorrelationData) == ("replies/7", b"\x00\x07")
    assert user_properties(message) == PUBLISHED


def delivery_bytes(topic: str, payload: bytes, retain: bool = False) -> int:
    """The size of a QoS 1 delivery of a ``publish_with_properties`` message, without ``offset``."""
    properties = Properties(content_type="text/plain", user_properties=list(PUBLISHED))
    return len(encode(Publish(topic, payload, 1, retain, packet_id=1, properties=properties), MQTT_5))


def opted_in_subscriber(
    broker, client_id: str, maximum_packet_size: int, topic_filter: str = "plant/#"
) -> RawClient:
    """A v5 client asking for ``offset`` on deliveries, with ``maximum_packet_size``, subscribed to
    ``topic_filter`` at QoS 1 (its SUBACK read; a retained message may follow)."""
    client = RawClient(broker.port, 5)
    client.connect(
        client_id,
        properties=Properties(maximum_packet_size=maximum_packet_size, user_properties=[OFFSETS_OPT_IN]),
    )
    assert isinstance(client.subscribe(topic_filter, 1), SubAck)
    return client


def publish_as_will(broker, topic: str, payload: bytes) -> None:
    """Connect a client whose will is ``publish_with_properties``'s message (QoS 1) and drop its socket."""
    properties = Properties(content_type="text/plain", user_properties=list(PUBLISHED))
    dying = RawClient(broker.port, 5)
    dying.connect(f"dying-{topic}", will=Will(topic, payload, 1, properties=properties))
    dying.close()


@pytest.mark.mqtt5("MQTT-3.1.2-24", "MQTT-3.1.2-25", "MQTT-3.3.2-17", "MQTT-3.3.2-18")
@pytest.mark.parametrize("arrival", ["live", "retained", "will"])
def test_the_offset_property_is_left_out_of_a_delivery_it_alone_makes_too_large(brokers, arrival):
    """A delivery that fits the client's Maximum Packet Size with the publisher's properties but not with the
    broker's own ``offset`` added goes without ``offset`` [MQTT-3.1.2-24], counted, where it was dropped
    [MQTT-3.1.2-25]: live, as a retained message and as a will alike. The publisher's user properties are
    never left out [MQTT-3.3.2-17]: one too large with them alone is dropped, counted ``too_large``."""
    broker = brokers()
    payload = b"r" * 100
    fits = delivery_bytes("plant/8", payload, retain=arrival == "retained")
    if arrival == "retained":
        publish_with_properties(broker, "plant/8", payload, retain=True)
    exact = opted_in_subscriber(broker, "exact", fits)
    under = opted_in_subscriber(broker, "under", fits - 1)
    if arrival == "live":
        publish_with_properties(broker, "plant/8", payload)
    elif arrival == "will":
        publish_as_will(broker, "plant/8", payload)

    delivery = exact.recv()
    assert (delivery.payload, delivery.properties.user_properties) == (payload, PUBLISHED)
    assert broker.metric("timestone_broker_offset_properties_left_out_total") == 1
    assert wait_for(lambda: broker.drops("too_large") == 1)  # "under": too large without ``offset`` too
    publish_with_properties(broker, "plant/9", b"small")
    for client in (exact, under):
        small = client.recv()
        assert (small.payload, small.properties.user_properties[-1][0]) == (b"small", "offset")
    assert broker.metric("timestone_broker_offset_properties_left_out_total") == 1


@pytest.mark.mqtt5("MQTT-3.1.2-24")
def test_a_shared_member_the_offset_property_alone_makes_too_large_for_takes_its_turn(brokers):
    """A member of a shared group that a message fits only without ``offset`` is not passed over for
    another member: it gets its turn, the message without ``offset`` [MQTT-3.1.2-24]."""
    broker = brokers()
    payload = b"s" * 100
    exact = opted_in_subscriber(broker, "exact", delivery_bytes("plant/10", payload), "$share/g/plant/#")
    other = PahoClient(broker.port, "other")
    other.subscribe("$share/g/plant/#", 1)
    for _ in range(2):
        publish_with_properties(broker, "plant/10", payload)
    delivery = exact.recv()
    assert (delivery.payload, delivery.properties.user_properties) == (payload, PUBLISHED)
    assert [m.payload for m in other.expect(1)] == [payload]
