"""Devices hold their offsets: subscribe from an offset, get the offset on every delivery, resume anywhere.

Real clients only: paho MQTT 5 and 3.1.1, gmqtt, the project's lean client, and a raw client where the
test must choose exactly which deliveries to acknowledge.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from gmqtt import Client as GmqttClient

from broker_edge.protocol.packets import PubAck, Publish
from pipelines.fleet.client import MqttClient
from tests.e2e.broker_clients import TIMEOUT, PahoClient, RawClient
from tests.e2e.commitlog.e2e_helpers import (
    OPTED_IN,
    LoopThread,
    offset_of,
    opted_in,
    publish_numbered,
    replay_from,
)


def _payloads(messages) -> list[bytes]:
    return [message.payload for message in messages]


def _numbers(first: int, stop: int) -> list[bytes]:
    return [str(number).encode() for number in range(first, stop)]


# -- subscribing from an offset -------------------------------------------------------------------------


def test_v5_subscription_starts_at_a_number_earliest_latest_or_a_time(brokers):
    broker = brokers()
    publish_numbered(broker, "plant/1/temp", 4)
    time.sleep(0.01)
    between = int(time.time() * 1000)
    time.sleep(0.01)
    publish_numbered(broker, "plant/1/temp", 4, first=4)
    devices = {start: PahoClient(broker.port, f"from-{start}") for start in ("2", "earliest", "latest")}
    devices[f"time:{between}"] = PahoClient(broker.port, "from-time")

    for start, device in devices.items():
        assert device.subscribe("plant/+/temp", 1, properties=replay_from(start)) == [1]
    PahoClient(broker.port, "live").publish("plant/1/temp", "8", 1)

    got = {
        start: device.expect(count)
        for start, device, count in zip(devices, devices.values(), (7, 9, 1, 5), strict=True)
    }
    assert [offset_of(m) for m in got["2"]] == list(range(2, 9))
    assert [offset_of(m) for m in got["earliest"]] == list(range(9))
    assert [offset_of(m) for m in got["latest"]] == [8]
    assert [offset_of(m) for m in got[f"time:{between}"]] == list(range(4, 9))
    for start, messages in got.items():
        assert _payloads(messages) == [str(offset_of(m)).encode() for m in messages], start
        devices[start].expect_none()  # no duplicate at the switch from the log to live delivery


def test_every_delivery_from_a_logged_topic_carries_its_offset_live_or_replayed(brokers):
    broker = brokers()
    live = PahoClient(broker.port, "live-device", connect_properties=OPTED_IN)
    live.subscribe("fleet/#", 1)
    publish_numbered(broker, "fleet/a", 3)
    publish_numbered(broker, "fleet/b", 2)

    got = live.expect(5)

    assert sorted((m.topic, offset_of(m)) for m in got) == [
        ("fleet/a", 0),
        ("fleet/a", 1),
        ("fleet/a", 2),
        ("fleet/b", 0),
        ("fleet/b", 1),
    ]


@pytest.mark.parametrize(
    ("start", "expected"), [("earliest", range(6)), ("3", range(3, 6)), ("latest", range(5, 6))]
)
def test_v311_offset_filter_form(brokers, start, expected):
    broker = brokers()
    publish_numbered(broker, "line/7/count", 5)
    device = PahoClient(broker.port, "v311-device", version=4)

    assert device.subscribe(f"$offset/{start}/line/+/count", 1) == [1]
    PahoClient(broker.port, "live").publish("line/7/count", "5", 1)

    assert _payloads(device.expect(len(expected))) == _numbers(expected.start, expected.stop)
    device.expect_none()


def test_gmqtt_reads_the_offsets_it_asked_for(brokers):
    broker = brokers()
    publish_numbered(broker, "gm/log", 6)

    async def scenario() -> list[tuple[int, bytes]]:
        got: list[tuple[int, bytes]] = []
        done = asyncio.Event()
        client = GmqttClient("gmqtt-device")

        def on_message(_client, _topic, payload, _qos, properties):
            got.append((int(dict(properties["user_property"])["offset"]), payload))
            if len(got) == 3:
                done.set()
            return 0

        client.on_message = on_message
        await client.connect("127.0.0.1", broker.port, keepalive=30)
        client.subscribe("gm/log", qos=1, user_property=("offset", "3"))
        await asyncio.wait_for(done.wait(), TIMEOUT)
        await client.disconnect()
        return got

    assert asyncio.run(scenario()) == [(offset, str(offset).encode()) for offset in (3, 4, 5)]


# -- resuming with the offset the device kept -----------------------------------------------------------


def test_v5_device_resumes_after_reconnecting_with_the_offset_it_stored(brokers):
    broker = brokers()
    publish_numbered(broker, "meter/9", 10)
    device = PahoClient(broker.port, "meter-9")
    device.subscribe("meter/9", 1, properties=replay_from("earliest"))
    first = device.expect(6)
    stored = offset_of(first[-1])
    device.disconnect()
    publish_numbered(broker, "meter/9", 3, first=10)

    again = PahoClient(broker.port, "meter-9")
    again.subscribe("meter/9", 1, properties=replay_from(str(stored + 1)))
    rest = again.expect(7)

    assert [offset_of(m) for m in first + rest] == list(range(13))
    assert _payloads(first + rest) == _numbers(0, 13)
    again.expect_none()


def test_v311_device_resumes_after_reconnecting_with_the_offset_it_counted(brokers):
    broker = brokers()
    publish_numbered(broker, "meter/3", 8)
    device = PahoClient(broker.port, "meter-3", version=4)
    device.subscribe("$offset/earliest/meter/3", 1)
    first = device.expect(5)
    device.disconnect()

    again = PahoClient(broker.port, "meter-3", version=4)
    again.subscribe(f"$offset/{len(first)}/meter/3", 1)

    assert _payloads(first + again.expect(3)) == _numbers(0, 8)
    again.expect_none()


def test_a_device_reads_half_from_one_broker_and_the_rest_from_another(brokers):
    broker_a, broker_b = brokers("a"), brokers("b")
    for broker in (broker_a, broker_b):  # both logs hold the same records (as a replica would)
        publish_numbered(broker, "orders/eu", 20, client_id="origin")
    device = PahoClient(broker_a.port, "roaming")
    device.subscribe("orders/eu", 1, properties=replay_from("earliest"))
    first_half = device.expect(10)
    kept = offset_of(first_half[-1]) + 1
    device.disconnect()

    moved = PahoClient(broker_b.port, "roaming")
    moved.subscribe("orders/eu", 1, properties=replay_from(str(kept)))
    second_half = moved.expect(10)

    assert [offset_of(m) for m in first_half + second_half] == list(range(20))
    assert _payloads(first_half + second_half) == _numbers(0, 20)
    moved.expect_none()


def test_the_lean_fleet_client_resumes_on_another_broker_too(brokers):
    broker_a, broker_b = brokers("a"), brokers("b")
    for broker in (broker_a, broker_b):
        publish_numbered(broker, "ota/rollout", 6, client_id="origin")
    loop = LoopThread()

    async def read(port: int, start: str, count: int) -> list[tuple[int, bytes]]:
        got: list[tuple[int, bytes]] = []
        done = asyncio.Event()

        def on_message(message) -> None:
            got.append((message.offset, message.payload))
            if len(got) == count:
                done.set()

        client = await MqttClient.connect("127.0.0.1", port, "lean-device", on_message=on_message)
        await client.subscribe("ota/rollout", 1, user_properties=[("offset", start)])
        await asyncio.wait_for(done.wait(), TIMEOUT)
        await client.disconnect()
        return got[:count]  # what the device processed before it went away

    try:
        first = loop.run(read(broker_a.port, "earliest", 2))
        rest = loop.run(read(broker_b.port, str(first[-1][0] + 1), 4))
    finally:
        loop.close()

    assert first + rest == [(offset, str(offset).encode()) for offset in range(6)]


# -- persistent sessions: the log is the offline queue --------------------------------------------------


def test_a_persistent_session_redelivers_everything_after_the_last_acknowledged_offset(brokers):
    broker = brokers(limits={"max_offline_messages": 2})
    device = RawClient(broker.port, 5)
    device.connect("keeper", clean_start=True, properties=opted_in())
    device.subscribe("vault/a", 1)
    publish_numbered(broker, "vault/a", 10)
    delivered = [device.recv() for _ in range(10)]
    for publish in delivered[:4]:  # the device acknowledges 0..3, then loses power
        device.send_packet(PubAck(publish.packet_id))
    device.recv_none(0.2)
    device.close()
    publish_numbered(broker, "vault/a", 10, first=10)  # while it is away: more than the queue bound

    offline = broker.call(lambda: broker.broker.router.sessions["keeper"])
    assert broker.call(lambda: (offline.queue, dict(offline.cursors or {}))) == (None, {"vault/a": 10})

    again = RawClient(broker.port, 5)
    connack = again.connect("keeper", clean_start=False, properties=opted_in())
    redelivered = [again.recv() for _ in range(16)]
    for publish in redelivered:
        again.send_packet(PubAck(publish.packet_id))
    again.recv_none(0.3)

    assert connack.session_present
    assert all(isinstance(p, Publish) for p in delivered + redelivered)
    offsets = [int(dict(p.properties.user_properties)["offset"]) for p in redelivered]
    assert offsets == list(range(4, 20))  # nothing acknowledged again, nothing missing
    assert [p.payload for p in redelivered] == _numbers(4, 20)
    assert [p.dup for p in redelivered[:6]] == [True] * 6  # 4..9 were in flight: resent as duplicates
    assert broker.drops("queue_full") == 0


def test_a_v311_persistent_session_reads_what_it_missed_from_the_log(brokers):
    broker = brokers(limits={"max_offline_messages": 2})
    device = PahoClient(broker.port, "v311-keeper", version=4, clean=False)
    device.subscribe("vault/b", 1)
    publish_numbered(broker, "vault/b", 3)
    seen = device.expect(3)
    device.disconnect()
    publish_numbered(broker, "vault/b", 12, first=3)

    again = PahoClient(broker.port, "v311-keeper", version=4, clean=False)

    assert _payloads(seen + again.expect(12)) == _numbers(0, 15)
    again.expect_none()
    assert broker.drops("queue_full") == 0
