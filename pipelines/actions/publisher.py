"""Publishing action messages to the edge brokers over MQTT, waiting for each broker's acknowledgement."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Protocol

import paho.mqtt.client as mqtt

QUOTA_EXCEEDED = 0x97
CHUNK = 16_384
"""Publishes handed to a client before waiting for their acknowledgements (well below 65,535 packet ids)."""


class Publisher(Protocol):
    def publish(self, topic: str, payload: bytes) -> None: ...

    def publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None: ...

    def close(self) -> None: ...


class PublishRefused(RuntimeError):
    """A broker answered a PUBLISH with a failure reason code (the message is not in its log)."""

    def __init__(self, topic: str, reason_code: int, refused: int) -> None:
        hint = ""
        if reason_code == QUOTA_EXCEEDED:
            hint = (
                " (quota exceeded: the broker's limits.max_topics_per_client bounds the per-device topics "
                "the actions job's client may create; see docs/ota.md)"
            )
        super().__init__(
            f"{refused} publishes refused, e.g. {topic} with reason code 0x{reason_code:02x}{hint}"
        )
        self.topic = topic
        self.reason_code = reason_code


class MqttPublisher:
    """QoS 1 publishes to every broker (each logs the message with its own offset); raises on failure.

    A PUBACK from a Timestone broker means the message is in its commitlog under the broker's durability
    policy, so a device that is offline now still gets it from the log when it comes back. Many publishes go
    out pipelined, up to the broker's Receive Maximum unacknowledged at a time, and are waited for together.
    """

    def __init__(
        self,
        brokers: Sequence[tuple[str, int]],
        client_id: str = "timestone-actions",
        username: str | None = None,
        password: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._refused: dict[tuple[int, int], int] = {}
        self._clients: list[mqtt.Client] = []
        for index, (host, port) in enumerate(brokers):
            client = mqtt.Client(
                mqtt.CallbackAPIVersion.VERSION2, client_id=f"{client_id}-{index}", protocol=mqtt.MQTTv5
            )
            if username is not None:
                client.username_pw_set(username, password)
            client.on_connect = _note_receive_maximum
            client.on_publish = self._on_publish
            receive_maximum = self._connect(client, host, port)
            if receive_maximum != client.max_inflight_messages:  # paho sets it only while disconnected
                client.disconnect()
                client.loop_stop()
                client.max_inflight_messages = receive_maximum
                self._connect(client, host, port)
            self._clients.append(client)

    def _connect(self, client: mqtt.Client, host: str, port: int) -> int:
        """Connect and start the network thread; returns the broker's Receive Maximum from its CONNACK."""
        connack: dict[str, int] = {}
        client.user_data_set(connack)
        client.connect(host, port, keepalive=30)
        client.loop_start()
        deadline = time.monotonic() + self.timeout_s
        while "receive_maximum" not in connack:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no CONNACK from {host}:{port} within {self.timeout_s} s")
            time.sleep(0.01)
        return connack["receive_maximum"]

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        if reason_code.is_failure:
            self._refused[id(client), mid] = reason_code.value

    def publish(self, topic: str, payload: bytes) -> None:
        self.publish_many([(topic, payload)])

    def publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """Publish every (topic, payload) to every broker and wait until all are acknowledged."""
        with self._lock:
            for first in range(0, len(messages), CHUNK):
                self._publish_chunk(messages[first : first + CHUNK])

    def _publish_chunk(self, messages: Sequence[tuple[str, bytes]]) -> None:
        self._refused.clear()
        sent = [
            (client, topic, client.publish(topic, payload, qos=1))
            for client in self._clients
            for topic, payload in messages
        ]
        refused = []
        for client, topic, info in sent:
            info.wait_for_publish(self.timeout_s)
            if not info.is_published():
                raise TimeoutError(f"no PUBACK for {topic} within {self.timeout_s} s")
            reason_code = self._refused.get((id(client), info.mid))
            if reason_code is not None:
                refused.append((topic, reason_code))
        if refused:
            raise PublishRefused(refused[0][0], refused[0][1], len(refused))

    def close(self) -> None:
        for client in self._clients:
            client.disconnect()
            client.loop_stop()


def _note_receive_maximum(client: mqtt.Client, connack: dict, flags, reason_code, properties) -> None:
    """Remember how many QoS 1 publishes the broker accepts in flight (65,535 when it does not say)."""
    connack["receive_maximum"] = getattr(properties, "ReceiveMaximum", None) or 65_535
