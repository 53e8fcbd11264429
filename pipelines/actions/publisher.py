"""Publishing action messages to the edge brokers over MQTT, waiting for the brokers' acknowledgements.

``MqttPublisher`` publishes to each of several separate brokers; ``ClusterPublisher`` publishes once through
one live member of a cluster, moving to another member and resending what was not acknowledged when the
one it uses dies.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from pipelines.fleet.client import MqttClient

log = logging.getLogger(__name__)

QUOTA_EXCEEDED = 0x97
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
"""What a cluster member answers while it cannot acknowledge (no leader yet, too few in-sync replicas, the
link to the leader broke): the publish is not acknowledged and may be sent again."""


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
        self.sent = 0
        """PUBLISH packets sent, resends included."""
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="actions-publisher", daemon=True)
        self._thread.start()
        self._clients: list[MqttClient | None] = [None] * len(self.brokers)
        self._run(self._open())

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _open(self) -> None:
        """Connect at start, so a wrong address or credentials fail the job at once."""
        await self._connect_all()

    async def _connect_all(self) -> list[MqttClient]:
        """A connected client per broker, reopening any that dropped."""
        return [
            await self._connected(index, f"{self.client_id}-{index}") for index in range(len(self.brokers))
        ]

    async def _connected(self, index: int, client_id: str) -> MqttClient:
        """The client of broker ``index``, (re)connected if need be."""
        client = self._clients[index]
        if client is None or not client.connected:
            host, port = self.brokers[index]
            client = await MqttClient.connect(
                host,
                port,
                client_id,
                username=self.username,
                password=self.password,
                keep_alive=30,
                timeout_s=self.timeout_s,
            )
            self._clients[index] = client
        return client

    def publish(self, topic: str, payload: bytes) -> None:
        self.publish_many([(topic, payload)])

    def publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """Publish every (topic, payload) and wait until all are acknowledged."""
        if messages:
            with self._lock:
                self._run(self._publish_many(messages))

    async def _publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        clients = await self._connect_all()
        sent = [client.publish_many(messages) for client in clients]
        self.sent += len(messages) * len(clients)
        answers = await asyncio.wait_for(asyncio.gather(*sent), self.timeout_s)
        _raise_refused(
            [(topic, code) for codes in answers for (topic, _), code in zip(messages, codes, strict=True)]
        )

    def close(self) -> None:
        async def disconnect() -> None:
            for client in self._clients:
                if client is not None and client.connected:
                    await client.disconnect()

        try:
            self._run(disconnect())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


class ClusterPublisher(MqttPublisher):
    """QoS 1 publishes once, through one live member of a cluster (any member takes any publish and the
    cluster replicates it); raises on failure.

    It keeps one connection, to the first member that accepts it. When that member dies (the connection
    drops, or a PUBACK takes longer than ``ack_timeout_s``, well above the cluster's failover time), it
    connects to the next member in the list and resends exactly the messages that were not acknowledged; a
    publish answered 0x83 (the cluster cannot acknowledge it yet, e.g. while it elects a new leader) is sent
    again after ``retry_s``. A resent message may be in the log twice (its first copy was appended but not
    acknowledged): devices act once per action
    id. Gives up after ``timeout_s`` without every acknowledgement.
    """

    def __init__(
        self,
        brokers: Sequence[tuple[str, int]],
        client_id: str = "timestone-actions",
        username: str | None = None,
        password: str | None = None,
        timeout_s: float = 120.0,
        ack_timeout_s: float = 30.0,
        retry_s: float = 0.25,
    ) -> None:
        self.ack_timeout_s = ack_timeout_s
        self.retry_s = retry_s
        self.resent = 0
        """Messages sent again (after a refusal 0x83 or a lost connection)."""
        self.moves = 0
        """Times the publisher moved to another member."""
        self._member = 0
        super().__init__(brokers, client_id, username, password, timeout_s)

    async def _open(self) -> None:
        await self._current(self._loop.time() + self.timeout_s)

    async def _current(self, deadline: float) -> MqttClient:
        """The connection to the member in use, or to the next one that accepts it."""
        while True:
            try:
                return await self._connected(self._member, self.client_id)
            except (OSError, TimeoutError, ConnectionError) as error:
                if self._loop.time() > deadline:
                    raise PublishTimedOut(f"no cluster member accepted a connection: {error}") from error
                self._move(f"connecting failed: {error}")
                if self._member == 0:
                    await asyncio.sleep(self.retry_s)

    def _move(self, why: str) -> None:
        old = self._clients[self._member]
        if old is not None:
            old.abort()
            self._clients[self._member] = None
        self._member = (self._member + 1) % len(self.brokers)
        self.moves += 1
        host, port = self.brokers[self._member]
        log.warning("actions publisher moves to %s:%d (%s)", host, port, why)

    async def _publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        deadline = self._loop.time() + self.timeout_s
        pending = list(range(len(messages)))
        answers: list[tuple[str, int | None]] = []
        while pending:
            client = await self._current(deadline)
            codes = await client.publish_many_settled([messages[i] for i in pending], self.ack_timeout_s)
            self.sent += len(pending)
            again = []
            for index, code in zip(pending, codes, strict=True):
                if code is None or code == IMPLEMENTATION_SPECIFIC_ERROR:
                    again.append(index)
                else:
                    answers.append((messages[index][0], code))
            if again and self._loop.time() > deadline:
                raise PublishTimedOut(f"{len(again)} publishes not acknowledged within {self.timeout_s} s")
            if any(code is None for code in codes):
                self._move(f"{codes.count(None)} publishes not acknowledged")
            elif again:
                await asyncio.sleep(self.retry_s)
            self.resent += len(again)
            pending = again
        _raise_refused(answers)


class PublishTimedOut(RuntimeError):
    """Publishes that no cluster member acknowledged in time (they may or may not be in the log)."""


def _raise_refused(answers: Sequence[tuple[str, int | None]]) -> None:
    """Raise ``PublishRefused`` for the (topic, PUBACK code) answers that are failures, if any."""
    refused = [(topic, code) for topic, code in answers if code is not None and code >= 0x80]
    if refused:
        raise PublishRefused(refused[0][0], refused[0][1], refused=len(refused))
