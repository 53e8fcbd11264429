"""Publishing action messages to the edge brokers over MQTT, waiting for each broker's acknowledgement."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from pipelines.fleet.client import MqttClient

QUOTA_EXCEEDED = 0x97


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
    out pipelined, up to each broker's Receive Maximum unacknowledged at a time, and are waited for together.
    The connections live on their own event-loop thread; a dropped one is reopened at the next publish.
    """

    def __init__(
        self,
        brokers: Sequence[tuple[str, int]],
        client_id: str = "timestone-actions",
        username: str | None = None,
        password: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.brokers = list(brokers)
        self.client_id = client_id
        self.username = username
        self.password = password.encode() if password is not None else None
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="actions-publisher", daemon=True)
        self._thread.start()
        self._clients: list[MqttClient | None] = [None] * len(self.brokers)
        self._run(self._connect_all())

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _connect_all(self) -> list[MqttClient]:
        """A connected client per broker, reopening any that dropped."""
        connected = []
        for index, (host, port) in enumerate(self.brokers):
            client = self._clients[index]
            if client is None or not client.connected:
                client = await MqttClient.connect(
                    host,
                    port,
                    f"{self.client_id}-{index}",
                    username=self.username,
                    password=self.password,
                    keep_alive=30,
                    timeout_s=self.timeout_s,
                )
                self._clients[index] = client
            connected.append(client)
        return connected

    def publish(self, topic: str, payload: bytes) -> None:
        self.publish_many([(topic, payload)])

    def publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """Publish every (topic, payload) to every broker and wait until all are acknowledged."""
        if messages:
            with self._lock:
                self._run(self._publish_many(messages))

    async def _publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        clients = await self._connect_all()
        sent = [client.publish_many(messages) for client in clients]
        answers = await asyncio.wait_for(asyncio.gather(*sent), self.timeout_s)
        refused = [
            (topic, code)
            for codes in answers
            for (topic, _), code in zip(messages, codes, strict=True)
            if code >= 0x80
        ]
        if refused:
            raise PublishRefused(refused[0][0], refused[0][1], len(refused))

    def close(self) -> None:
        async def disconnect() -> None:
            for client in self._clients:
                if client is not None:
                    await client.disconnect()

        try:
            self._run(disconnect())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
