"""A broker whose log is slow does not read an MQTT 3.1.1 client's QoS 1 publishes past a bound.

A real broker process (`BrokerProcess`) whose log makes each batch durable only after a group-commit window
of `storage.group_commit_ms`, and paho speaking MQTT 3.1.1 (no Receive Maximum of its own) with a large
in-flight window, publishing QoS 1 as fast as it can. The broker's count of publishes read and not yet
answered (`timestone_broker_publishes_unanswered` on its admin /metrics) never goes above
`limits.receive_maximum`; every publish is still acknowledged and in the log exactly once. An MQTT 5
client, told the bound in CONNACK, that sends more is held the same way (said in a refusal line), or with
`limits.receive_maximum_exceeded: disconnect` disconnected (0x93).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import Publish
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, RawClient, wait_for

RECEIVE_MAXIMUM = 16
PUBLISHES = 600
TOPIC = "plant/meter-1"


def _metric(admin_port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            metric, _, value = line.partition(" ")
            if metric == name:
                return float(value)
    raise AssertionError(f"{name} not in /metrics")


def _logged_payloads(offsets_url: str) -> list[str]:
    payloads: list[str] = []
    while True:
        url = f"{offsets_url}/v1/logs/plant%2Fmeter-1/records?offset={len(payloads)}&format=jsonl"
        with urllib.request.urlopen(url, timeout=10) as answer:
            lines = [json.loads(line) for line in answer.read().splitlines()]
        if not lines:
            return payloads
        payloads += [line["payload_text"] for line in lines]


@pytest.fixture
def slow_broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BrokerProcess]:
    """A broker process whose log makes a batch durable only after a 100 ms group-commit window (its
    ``limits.receive_maximum_exceeded`` the test's parameter, if it has one)."""
    limits = {"receive_maximum": RECEIVE_MAXIMUM}
    if hasattr(request, "param"):
        limits["receive_maximum_exceeded"] = request.param
    with BrokerProcess(tmp_path / "broker", limits=limits, storage={"group_commit_ms": 100}) as broker:
        yield broker


def test_a_3_1_1_publisher_is_read_only_up_to_receive_maximum_unanswered_publishes(slow_broker):
    broker = slow_broker
    publisher = PahoClient(broker.port, "meter-1", version=4, connect=False)
    publisher.client.max_inflight_messages_set(PUBLISHES)  # paho itself would stop at 20
    publisher.connect()
    counts: list[float] = []
    flooding = threading.Event()

    def watch() -> None:
        while flooding.is_set():
            counts.append(_metric(broker.admin_port, "timestone_broker_publishes_unanswered"))
            time.sleep(0.01)

    flooding.set()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        sent = [publisher.client.publish(TOPIC, str(n).encode(), 1) for n in range(PUBLISHES)]
        for info in sent:
            info.wait_for_publish(60)
    finally:
        flooding.clear()
        watcher.join()
    held = _metric(broker.admin_port, "timestone_broker_client_held_for_acks_total")
    unanswered_after = _metric(broker.admin_port, "timestone_broker_publishes_unanswered")
    publisher.disconnect()
    logged = _logged_payloads(broker.offsets_url)

    assert all(info.rc == mqtt.MQTT_ERR_SUCCESS and info.is_published() for info in sent)
    assert len(counts) >= 10 and max(counts) <= RECEIVE_MAXIMUM, counts
    assert held >= 1  # the bound was reached: the client went unread while the log caught up
    assert unanswered_after == 0
    assert logged == [str(n) for n in range(PUBLISHES)]


@pytest.mark.parametrize("slow_broker", ["disconnect"], indirect=True)
def test_an_mqtt_5_publisher_past_receive_maximum_is_disconnected_0x93_when_so_configured(slow_broker):
    """[MQTT-3.3.4-7] is the Client's rule; with ``receive_maximum_exceeded: disconnect`` a v5 client breaking
    it while the log is behind is answered with DISCONNECT 0x93 (3.3.4), not held like a 3.1.1 client."""
    raw = RawClient(slow_broker.port, 5)
    assert raw.connect("flood").properties.receive_maximum == RECEIVE_MAXIMUM
    sent = RECEIVE_MAXIMUM + 20  # the 17th is one too many; what follows it in the same read is not taken
    raw.send(b"".join(encode(Publish(TOPIC, str(n).encode(), 1, packet_id=n), 5) for n in range(1, sent + 1)))
    raw.expect_disconnect(0x93)
    taken = [str(n) for n in range(1, RECEIVE_MAXIMUM + 1)]
    assert wait_for(lambda: len(_logged_payloads(slow_broker.offsets_url)) >= RECEIVE_MAXIMUM)
    time.sleep(0.3)  # three group commits more: anything taken after the 16th would be durable by now
    assert _logged_payloads(slow_broker.offsets_url) == taken
    lines = slow_broker.log_path.read_text().splitlines()
    said = [line for line in lines if "receive_maximum_exceeded" in line]
    assert len(said) == 1, said


def test_a_paho_mqtt_5_client_resending_what_it_queued_past_receive_maximum_is_held_and_all_land_once(
    slow_broker,
):
    """paho-mqtt resends at once every QoS 1 publish it queued while disconnected, whatever Receive Maximum
    the broker told it (its reconnect does not count them). Disconnected with 0x93 at the first one too many,
    it sent them all again at every connection, for ever, and the log took those before it again each
    time. Held until half are answered, it gets every publish acknowledged, each in the log once, in order;
    the broker says once that it broke the bound."""
    publisher = PahoClient(slow_broker.port, "queued-while-away", version=5, connect=False)
    queued = [publisher.client.publish(TOPIC, str(n).encode(), 1) for n in range(200)]  # not connected yet
    publisher.connect()
    mids = {info.mid for info in queued}  # (each rc says MQTT_ERR_NO_CONN: wait_for_publish would raise)
    acknowledged = wait_for(lambda: mids <= set(publisher.publish_reasons), timeout=60)
    publisher.disconnect()

    assert acknowledged and {publisher.publish_reasons[mid] for mid in mids} == {0x10}  # no subscriber
    assert _logged_payloads(slow_broker.offsets_url) == [str(n) for n in range(200)]
    lines = slow_broker.log_path.read_text().splitlines()
    assert not [line for line in lines if "disconnected: receive_maximum_exceeded" in line]
    said = [line for line in lines if "receive maximum exceeded" in line and "queued-while-away" in line]
    assert len(said) == 1, said
