"""Action messages carry their expiry to the broker: each PUBLISH's MQTT 5 Message Expiry Interval is the
whole seconds left until the message's ``expires_at``, so a broker drops an action queued for a device that
comes back too late, and forwards what is left of the interval to one that comes back in time
(docs/ota.md, "Devices that never take an action").

A real Timestone broker process on 127.0.0.1, the actions engine on Delta tables with the real clock, and
paho-mqtt v5 devices with persistent sessions (``clean_start`` False) that are offline when the action goes
out.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import MQTT_5, ConnAck
from broker_edge.protocol.properties import Properties
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.runtime.launcher import BrokerProcess
from pipelines.actions.engine import ActionsEngine
from pipelines.actions.model import group_topic
from pipelines.actions.publisher import ClusterPublisher, MqttPublisher, Outgoing
from sinks import open_table_store
from tests.e2e.broker_clients import PahoClient
from tests.e2e.ota.conftest import action_row, register_devices

LIMITS = {"messages_per_second_per_client": 0, "max_topics_per_client": 0}
EXPIRY_S = 2
SESSION_EXPIRY_S = 3600


@contextmanager
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path / "broker", limits=LIMITS) as running:
        yield running


def offline_device(port: int, device_id: str, topic: str) -> PahoClient:
    """A device with a persistent session subscribed to ``topic`` at QoS 1, then gone offline."""
    device = PahoClient(port, device_id, clean=False, session_expiry=SESSION_EXPIRY_S)
    device.subscribe(topic, 1)
    device.disconnect()
    return device


def expiry_of(message: Any) -> int | None:
    return getattr(message.properties, "MessageExpiryInterval", None)


def back_in_time(device: PahoClient) -> tuple[dict[str, Any], int, int]:
    """``device`` connects again and receives one action: its body, its Message Expiry Interval and the
    whole seconds (rounded up) left until its ``expires_at`` when it arrived."""
    device.connect()
    (message,) = device.expect(1)
    received_at = time.time() * 1000
    body = json.loads(message.payload)
    interval = expiry_of(message)
    assert interval is not None, "the action was published without a Message Expiry Interval"
    device.disconnect()
    return body, interval, math.ceil((body["expires_at"] - received_at) / 1000)


@pytest.mark.mqtt5("MQTT-3.3.2-5", "MQTT-3.3.2-6")
def test_an_action_queued_for_an_offline_session_expires_at_the_broker_mqtt_3_3_2_5_and_6(
    tmp_path: Path,
) -> None:
    """[MQTT-3.3.2-5] [MQTT-3.3.2-6]: the engine publishes a group's action with message_expiry_s 2 while
    both devices are offline; the one back in time receives it with a Message Expiry Interval no larger than
    what is left until its ``expires_at``, the one back after it never receives it (whatever its clock)."""
    store = open_table_store(None, str(tmp_path / "tables"), backend="delta-rs")
    register_devices(store, {"dev-soon": "g", "dev-late": "g"})
    with broker(tmp_path) as running:
        topic = group_topic("g")
        soon = offline_device(running.port, "dev-soon", topic)
        late = offline_device(running.port, "dev-late", topic)
        publisher = MqttPublisher([running.address], client_id="actions-test")
        try:
            engine = ActionsEngine(store, publisher, compliance_interval_s=0, message_expiry_s=EXPIRY_S)
            engine.on_action_rows([action_row("a-1", group="g")], "fanout", 0)
        finally:
            publisher.close()

        body, interval, left_s = back_in_time(soon)
        assert body["action_id"] == "a-1"
        assert 1 <= interval <= left_s <= EXPIRY_S

        time.sleep(max(0.0, (body["expires_at"] - time.time() * 1000) / 1000) + 0.2)
        late.connect()
        assert late.connack_result[0].session_present  # its session, subscription and queue were kept
        late.expect_none(1.0)
        late.disconnect()


@pytest.mark.mqtt5("MQTT-3.3.2-5")
def test_the_time_the_rows_write_takes_before_the_publish_is_taken_off_the_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine writes the rows it is about to send (marked as being sent) before it publishes: an
    interval worked out before that write, and counted by the publisher from the publish, let a broker keep
    the message past its ``expires_at`` by as long as the write took (a slow object store: seconds), so a
    device back after it still got an action the job records as expired. Here the write takes 2.2 s of a
    10 s expiry: the interval is what is left at the publish."""
    store = open_table_store(None, str(tmp_path / "tables"), backend="delta-rs")
    register_devices(store, {"dev-soon": "g"})
    with broker(tmp_path) as running:
        soon = offline_device(running.port, "dev-soon", group_topic("g"))
        publisher = MqttPublisher([running.address], client_id="actions-test")
        try:
            engine = ActionsEngine(store, publisher, compliance_interval_s=0, message_expiry_s=10)
            write = engine.tables.write_executions
            slowed: list[float] = []

            def slow_write(*args: Any) -> None:
                if not slowed:  # the fan-out's write, before its publish
                    slowed.append(2.2)
                    time.sleep(2.2)
                write(*args)

            monkeypatch.setattr(engine.tables, "write_executions", slow_write)
            engine.on_action_rows([action_row("a-1", group="g")], "fanout", 0)
        finally:
            publisher.close()

        _, interval, left_s = back_in_time(soon)
        assert slowed
        assert interval <= left_s  # 9 > 8 before


@pytest.mark.mqtt5("MQTT-3.3.2-5")
@pytest.mark.parametrize("kind", [MqttPublisher, ClusterPublisher])
def test_the_publisher_sends_the_seconds_left_and_never_a_message_already_expired(
    tmp_path: Path, kind: type[MqttPublisher]
) -> None:
    """[MQTT-3.3.2-5]: a message valid for 5.5 s goes out with 5 (rounded down), one with half a second left
    with 1 (at least 1), one with no time left is not sent at all, and one without an expiry carries none;
    the same through the cluster publisher (which works out what is left again for every resend)."""
    with broker(tmp_path) as running:
        device = PahoClient(running.port, "dev-1")
        device.subscribe("actions/devices/dev-1", 1)
        publisher = kind([running.address], client_id="actions-test")
        try:
            publisher.publish_many(
                [
                    Outgoing("actions/devices/dev-1", b"5.5", 5_500),
                    Outgoing("actions/devices/dev-1", b"0.5", 500),
                    Outgoing("actions/devices/dev-1", b"gone", 0),
                    Outgoing("actions/devices/dev-1", b"late", -3_000),
                    Outgoing("actions/devices/dev-1", b"never"),
                ]
            )
            assert publisher.expired == 2
        finally:
            publisher.close()
        received = {m.payload: expiry_of(m) for m in device.expect(3)}
        assert received == {b"5.5": 5, b"0.5": 1, b"never": None}
        device.expect_none(0.5)
        device.disconnect()


def test_an_action_created_far_ahead_goes_out_with_the_longest_interval_mqtt_has(tmp_path: Path) -> None:
    """A row written by hand with ``created_at`` in the year 9999 (a valid row) expires thousands of years
    ahead, more than MQTT's four-byte Message Expiry Interval holds: it goes out with the largest, 2^32 - 1
    seconds, where its send failed at every tick."""
    store = open_table_store(None, str(tmp_path / "tables"), backend="delta-rs")
    register_devices(store, {"dev-1": "g"})
    with broker(tmp_path) as running:
        device = PahoClient(running.port, "dev-1")
        device.subscribe(group_topic("g"), 1)
        publisher = MqttPublisher([running.address], client_id="actions-test")
        try:
            engine = ActionsEngine(store, publisher, compliance_interval_s=0)
            far = datetime(9999, 1, 1, tzinfo=UTC)
            engine.on_action_rows([action_row("a-far", group="g", created_at=far)], "fanout", 0)
        finally:
            publisher.close()
        (message,) = device.expect(1)
        assert json.loads(message.payload)["action_id"] == "a-far"
        assert expiry_of(message) == 2**32 - 1
        device.disconnect()


class Stalling:
    """A member that accepts MQTT 5 connections (CONNACK 0x00) and then never acknowledges a PUBLISH: one
    that hangs, which the cluster publisher leaves after its ``ack_timeout_s``."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = ("127.0.0.1", self.sock.getsockname()[1])
        self._held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        accepted = encode(ConnAck(False, ReasonCode.SUCCESS, Properties()), MQTT_5)
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.recv(65536)  # the CONNECT
            conn.sendall(accepted)
            self._held.append(conn)  # read nothing more: nothing is acknowledged

    def close(self) -> None:
        self.sock.close()
        for conn in self._held:
            conn.close()


@pytest.mark.mqtt5("MQTT-3.3.2-5")
def test_a_cluster_resend_carries_the_time_left_and_drops_what_expired_meanwhile(tmp_path: Path) -> None:
    """[MQTT-3.3.2-5]: the first member takes the publishes and never acknowledges them; after 1.5 s the
    cluster publisher resends through the next member. A message valid for 5.5 s goes out again with 3 s
    (what is left, rounded down), one valid for 1 s has expired meanwhile and is not sent again."""
    stalling = Stalling()
    with broker(tmp_path) as running:
        device = PahoClient(running.port, "dev-1")
        device.subscribe("actions/devices/dev-1", 1)
        members = [stalling.address, running.address]
        publisher = ClusterPublisher(members, client_id="actions-test", ack_timeout_s=1.5, retry_s=0.05)
        try:
            publisher.publish_many(
                [
                    Outgoing("actions/devices/dev-1", b"long", 5_500),
                    Outgoing("actions/devices/dev-1", b"short", 1_000),
                ]
            )
            assert (publisher.moves, publisher.expired) == (1, 1)
        finally:
            publisher.close()
            stalling.close()
        (message,) = device.expect(1)
        interval = expiry_of(message)
        assert message.payload == b"long" and interval is not None and 1 <= interval <= 3  # 5.5 s - 1.5 s
        device.expect_none(0.5)
        device.disconnect()
