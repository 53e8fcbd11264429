"""The codec against an independent implementation: a real paho-mqtt client talks to a loopback socket
served by our decoder and encoder, and paho's bytes re-encode to exactly the same bytes."""

import socket
import threading
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from broker_edge.protocol import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PacketDecoder,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    encode,
)
from broker_edge.protocol.properties import encode_properties

WAIT = 10


class ScriptedBroker:
    """Accepts one connection on 127.0.0.1:0 and answers like a broker, using only our codec."""

    def __init__(self, delivery: Publish) -> None:
        self.delivery = delivery
        self.received: list[Packet] = []
        self.raw = bytearray()
        self.version: int | None = None
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        decoder = PacketDecoder(max_packet_size=65536)
        with connection:
            while chunk := connection.recv(4096):
                self.raw += chunk
                for packet in decoder.feed(chunk):
                    self.received.append(packet)
                    version = self.version = decoder.protocol_version
                    assert version is not None  # decoded: the version is known
                    for reply in self._replies(packet):
                        connection.sendall(encode(reply, version))
                    if isinstance(packet, Disconnect):
                        return

    def _replies(self, packet: Packet) -> list[Packet]:
        v5 = self.version == MQTT_5
        match packet:
            case Connect():
                return [
                    ConnAck(False, 0, Properties(topic_alias_maximum=0, receive_maximum=20) if v5 else None)
                ]
            case Subscribe(packet_id=packet_id, subscriptions=subscriptions):
                return [SubAck(packet_id, [sub.qos for sub in subscriptions]), self.delivery]
            case Unsubscribe(packet_id=packet_id, topic_filters=filters):
                return [UnsubAck(packet_id, [0] * len(filters) if v5 else [])]
            case Publish(qos=1, packet_id=int(packet_id)):
                return [PubAck(packet_id)]
            case Publish(qos=2, packet_id=int(packet_id)):
                return [PubRec(packet_id)]
            case PubRel(packet_id=packet_id):
                return [PubComp(packet_id)]
            case PingReq():
                return [PingResp()]
        return []

    def close(self) -> None:
        self.thread.join(WAIT)
        self.listener.close()


def paho_properties(packet_type: int, **values) -> PahoProperties:
    props = PahoProperties(packet_type)
    for name, value in values.items():
        setattr(props, name, value)
    return props


def run_paho_session(version: int, delivery: Publish) -> tuple[ScriptedBroker, list, list]:
    """Connect, subscribe, receive one message, publish QoS 1 and 2, unsubscribe, disconnect."""
    v5 = version == MQTT_5
    broker = ScriptedBroker(delivery)
    client = paho.Client(
        paho.CallbackAPIVersion.VERSION2,
        client_id="paho-1",
        protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
    )
    connected, subscribed, unsubscribed, got_message = (threading.Event() for _ in range(4))
    messages: list[Any] = []
    connack_codes: list[int] = []

    def on_connect(client: Any, userdata: Any, flags: Any, code: Any, properties: Any) -> None:
        connack_codes.append(code.value)
        connected.set()

    def on_message(client: Any, userdata: Any, message: Any) -> None:
        messages.append(message)
        got_message.set()

    client.on_connect = on_connect
    client.on_subscribe = lambda *args: subscribed.set()
    client.on_unsubscribe = lambda *args: unsubscribed.set()
    client.on_message = on_message
    client.username_pw_set("device", "secret")
    will_props = paho_properties(PacketTypes.WILLMESSAGE, WillDelayInterval=5) if v5 else None
    client.will_set("plant/1/status", b"offline", qos=1, retain=True, properties=will_props)
    connect_props = paho_properties(PacketTypes.CONNECT, SessionExpiryInterval=30) if v5 else None

    client.connect("127.0.0.1", broker.port, keepalive=30, properties=connect_props)
    client.loop_start()
    try:
        assert connected.wait(WAIT)
        if v5:
            client.subscribe("ota/+/cmd", options=SubscribeOptions(qos=1, noLocal=True, retainHandling=1))
        else:
            client.subscribe("ota/+/cmd", qos=1)
        assert subscribed.wait(WAIT)
        assert got_message.wait(WAIT)
        publish_props = paho_properties(PacketTypes.PUBLISH, UserProperty=[("unit", "C")]) if v5 else None
        client.publish("plant/1/temp", b"21.5", qos=1, properties=publish_props).wait_for_publish(WAIT)
        client.publish("plant/1/log", b"x" * 300, qos=2).wait_for_publish(WAIT)
        client.unsubscribe("ota/+/cmd")
        assert unsubscribed.wait(WAIT)
        client.disconnect()
    finally:
        client.loop_stop()
        broker.close()
    return broker, messages, connack_codes


@pytest.mark.mqtt5("MQTT-3.1.3-1")
@pytest.mark.parametrize("version", [4, MQTT_5])
def test_paho_session_against_our_codec(version):
    v5 = version == MQTT_5
    delivery_props = (
        Properties(subscription_identifiers=[7], user_properties=[("origin", "backend")]) if v5 else None
    )
    delivery = Publish("ota/dev-1/cmd", b"reboot", 1, packet_id=41, properties=delivery_props)

    broker, messages, connack_codes = run_paho_session(version, delivery)

    connect = broker.received[0]
    assert isinstance(connect, Connect)
    assert (connect.protocol_version, connect.client_id, connect.keep_alive) == (version, "paho-1", 30)
    assert (connect.username, connect.password) == ("device", b"secret")
    assert (connect.will.topic, connect.will.payload, connect.will.qos, connect.will.retain) == (
        "plant/1/status",
        b"offline",
        1,
        True,
    )
    if v5:
        assert connect.properties.session_expiry_interval == 30
        assert connect.will.properties.will_delay_interval == 5
    [subscribe] = [p for p in broker.received if isinstance(p, Subscribe)]
    [subscription] = subscribe.subscriptions
    assert (subscription.topic_filter, subscription.qos) == ("ota/+/cmd", 1)
    assert (subscription.no_local, subscription.retain_handling) == ((True, 1) if v5 else (False, 0))
    publishes = [p for p in broker.received if isinstance(p, Publish)]
    assert [(p.topic, p.payload, p.qos) for p in publishes] == [
        ("plant/1/temp", b"21.5", 1),
        ("plant/1/log", b"x" * 300, 2),
    ]
    if v5:
        assert publishes[0].properties.user_properties == [("unit", "C")]
    assert PubAck(41) in broker.received  # paho acknowledged our PUBLISH
    assert any(isinstance(p, PubRel) for p in broker.received)
    assert isinstance(broker.received[-1], Disconnect)

    assert connack_codes == [0]
    [message] = messages
    assert (message.topic, message.payload, message.qos) == ("ota/dev-1/cmd", b"reboot", 1)
    if v5:
        assert message.properties.SubscriptionIdentifier == [7]
        assert message.properties.UserProperty == [("origin", "backend")]

    # paho's encoding of every packet it sent is byte for byte ours
    assert b"".join(encode(packet, version) for packet in broker.received) == bytes(broker.raw)


def test_property_encoding_matches_paho():
    ours = Properties(
        payload_format_indicator=1,
        message_expiry_interval=3600,
        content_type="application/json",
        response_topic="reply/dev-1",
        correlation_data=b"\x00\x01",
        user_properties=[("a", "1"), ("b", "2")],
    )
    theirs = paho_properties(
        PacketTypes.PUBLISH,
        PayloadFormatIndicator=1,
        MessageExpiryInterval=3600,
        ContentType="application/json",
        ResponseTopic="reply/dev-1",
        CorrelationData=b"\x00\x01",
        UserProperty=[("a", "1"), ("b", "2")],
    )
    assert encode_properties(ours) == theirs.pack()

    connack = Properties(
        session_expiry_interval=0, receive_maximum=100, maximum_qos=1, assigned_client_identifier="x"
    )
    assert (
        encode_properties(connack)
        == paho_properties(
            PacketTypes.CONNACK,
            SessionExpiryInterval=0,
            ReceiveMaximum=100,
            MaximumQoS=1,
            AssignedClientIdentifier="x",
        ).pack()
    )
