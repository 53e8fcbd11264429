"""Retained messages within a byte budget, in all and per publishing client: a message over either is
delivered live but not kept, counted by reason and logged with client id, topic and size; an MQTT 5
publisher is told in its PUBACK / PUBREC's reason string (the reason code stays a success: the message was
accepted, logged and delivered), unless it asked for no problem information or the string would not fit."""

from __future__ import annotations

import logging
import queue

import paho.mqtt.client as mqtt
import pytest

from broker_edge.protocol.packets import PubAck, Publish, PubRec
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import PahoClient, RawClient, wait_for

KIB = b"x" * 1000


def test_retained_bytes_stop_at_the_client_share_and_at_the_total(start_broker, caplog):
    caplog.set_level(logging.INFO)
    broker = start_broker(retain={"max_retained_bytes": 3500, "max_retained_bytes_per_client": 2100})
    live = PahoClient(broker.port, "dashboard")
    assert live.subscribe("site/#", 1) == [1]
    greedy = PahoClient(broker.port, "greedy")
    for number in range(3):
        greedy.publish(f"site/greedy/{number}", KIB, 1, retain=True)
    assert len(live.expect(3)) == 3  # all delivered live, the third not kept
    assert wait_for(lambda: broker.drops("retained_client_bytes") == 1)

    other = PahoClient(broker.port, "other")
    other.publish("site/other/0", KIB, 1, retain=True)
    other.publish("site/other/1", KIB, 1, retain=True)  # the total would pass 3500
    assert wait_for(lambda: broker.drops("retained_bytes") == 1)
    greedy.publish("site/greedy/0", b"", 1, retain=True)  # clearing gives its bytes back
    other.publish("site/other/1", KIB, 1, retain=True)

    late = PahoClient(broker.port, "late")
    assert late.subscribe("site/#", 1) == [1]
    kept = sorted(message.topic for message in late.expect(3))
    assert kept == ["site/greedy/1", "site/other/0", "site/other/1"]
    [line] = [r for r in caplog.records if getattr(r, "reason", None) == "retained_client_bytes"]
    assert (line.client_id, line.topic, line.action, line.bytes) == (
        "greedy",
        "site/greedy/2",
        "retain",
        1013,
    )
    assert line.levelno == logging.WARNING


NOT_KEPT = "retained message not kept: this client's retained bytes are at their bound"


@pytest.mark.mqtt5("MQTT-3.4.2-1")
def test_a_v5_publisher_is_told_its_retained_message_was_not_kept(start_broker):
    broker = start_broker(retain={"max_retained_bytes_per_client": 2100})
    live = PahoClient(broker.port, "dashboard")
    assert live.subscribe("site/#", 1) == [1]
    acks: queue.Queue = queue.Queue()
    device = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="greedy", protocol=mqtt.MQTTv5)
    device.on_publish = lambda client, userdata, mid, reason, properties: acks.put((mid, reason, properties))
    device.connect("127.0.0.1", broker.port)
    device.loop_start()
    try:
        answers = []
        for number in range(3):
            info = device.publish(f"site/greedy/{number}", KIB, 1, retain=True)
            answers.append(acks.get(timeout=5))
            assert answers[-1][0] == info.mid
        assert [reason.value for _mid, reason, _props in answers] == [0, 0, 0]  # accepted, delivered
        assert [getattr(props, "ReasonString", None) for _mid, _reason, props in answers[:2]] == [None, None]
        assert answers[2][2].ReasonString.startswith(NOT_KEPT)
        assert len(live.expect(3)) == 3
    finally:
        device.loop_stop()
        device.disconnect()


@pytest.mark.mqtt5("MQTT-3.1.2-29", "MQTT-3.4.2-2", "MQTT-3.5.2-2")
def test_the_reason_string_only_to_clients_that_accept_it(start_broker):
    broker = start_broker(retain={"max_retained_bytes_per_client": 1000})
    asks = RawClient(broker.port, 5)
    asks.connect("asks")
    asks.send_packet(Publish("site/asks/0", KIB, 2, retain=True, packet_id=1))  # over its share at once
    answer = asks.recv()
    assert isinstance(answer, PubRec) and answer.reason_code == 0x10  # accepted, nobody subscribed
    assert answer.properties is not None and answer.properties.reason_string.startswith(NOT_KEPT)

    quiet = RawClient(broker.port, 5)
    quiet.connect("quiet", properties=Properties(request_problem_information=0))
    quiet.send_packet(Publish("site/quiet/0", KIB, 1, retain=True, packet_id=1))
    assert quiet.recv() == PubAck(1, 0x10)  # no reason string: Request Problem Information 0

    small = RawClient(broker.port, 5)
    small.connect("small", properties=Properties(maximum_packet_size=32))
    small.send_packet(Publish("site/small/0", KIB, 1, retain=True, packet_id=1))
    assert small.recv() == PubAck(1, 0x10)  # the string would pass its Maximum Packet Size
    assert broker.drops("retained_client_bytes") == 3
