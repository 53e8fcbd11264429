"""Publishing action messages to the edge brokers over MQTT, waiting for each broker's acknowledgement."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import paho.mqtt.client as mqtt


class Publisher(Protocol):
    def publish(self, topic: str, payload: bytes) -> None: ...

    def close(self) -> None: ...


class MqttPublisher:
    """QoS 1 publishes to every broker (each logs the message with its own offset); raises on failure.

    A PUBACK from a Timestone broker means the message is in its commitlog under the broker's durability
    policy, so a device that is offline now still gets it from the log when it comes back.
    """

    def __init__(
        self,
        brokers: Sequence[tuple[str, int]],
        client_id: str = "timestone-actions",
        username: str | None = None,
        password: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._clients: list[mqtt.Client] = []
        for index, (host, port) in enumerate(brokers):
            client = mqtt.Client(
                mqtt.CallbackAPIVersion.VERSION2, client_id=f"{client_id}-{index}", protocol=mqtt.MQTTv5
            )
            if username is not None:
                client.username_pw_set(username, password)
            client.connect(host, port, keepalive=30)
            client.loop_start()
            self._clients.append(client)

    def publish(self, topic: str, payload: bytes) -> None:
        with self._lock:
            infos = [client.publish(topic, payload, qos=1) for client in self._clients]
            for info in infos:
                info.wait_for_publish(self.timeout_s)
                if not info.is_published():
                    raise TimeoutError(f"no PUBACK for {topic} within {self.timeout_s} s")

    def close(self) -> None:
        for client in self._clients:
            client.disconnect()
            client.loop_stop()
