"""Publishing action messages to the edge brokers over MQTT, waiting for the brokers' acknowledgements.

``MqttPublisher`` publishes to each of several separate brokers; ``ClusterPublisher`` publishes once through
one live member of a cluster, moving to another member and resending what was not acknowledged when the
one it uses dies.

A batch of many publishes (one per listed device) is spread over several connections to the same broker, each
keeping up to the broker's Receive Maximum unacknowledged: the window is the broker's Receive Maximum times
the connections, and each broker connection is served on its own. A topic always goes over the same
connection (by a hash of its name), so two messages to one device keep their order.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import ssl
import threading
import zlib
from collections.abc import Coroutine, Sequence
from typing import Any, NamedTuple, Protocol, cast

from pipelines.fleet.client import ConnectionRefused, MqttClient, Publication, referral
from pipelines.loop_thread import LoopThread

log = logging.getLogger(__name__)

QUOTA_EXCEEDED = 0x97
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
"""What a cluster member answers while it cannot acknowledge (no leader yet, too few in-sync replicas, the
link to the leader broke): the publish is not acknowledged and may be sent again."""
CONNECTIONS = 4
"""Connections per broker for large batches (each with the broker's Receive Maximum in flight)."""
SHARD_MIN = 256
"""Publishes per connection below which a batch uses fewer connections (one for a single publish)."""
MAX_EXPIRY_INTERVAL_S = 2**32 - 1
"""The largest Message Expiry Interval MQTT 5 holds (a four-byte integer, about 136 years)."""


class Outgoing(NamedTuple):
    """One message to publish: its topic, payload, and the milliseconds it stays valid from the publish
    call (None: it never expires). Each PUBLISH carries what is left of that as its MQTT 5 Message Expiry
    Interval, in whole seconds rounded down (at least 1), so a broker never keeps or forwards it longer than
    it is valid [MQTT-3.3.2-5]; one whose time has run out before it could go out is not sent."""

    topic: str
    payload: bytes
    expires_in_ms: int | None = None


class Publisher(Protocol):
    def publish(self, topic: str, payload: bytes, expires_in_ms: int | None = None) -> None: ...

    def publish_many(self, messages: Sequence[Outgoing]) -> None: ...

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
    out pipelined over up to ``connections`` connections per broker, each with up to the broker's Receive
    Maximum unacknowledged at a time, and are waited for together. The connections live on their own
    event-loop thread; a dropped one is reopened at the next publish.
    """

    def __init__(
        self,
        brokers: Sequence[tuple[str, int]],
        client_id: str = "timestone-actions",
        username: str | None = None,
        password: str | None = None,
        timeout_s: float = 30.0,
        connections: int = CONNECTIONS,
        tls: Sequence[ssl.SSLContext | None] = (),
    ) -> None:
        if connections < 1:
            raise ValueError("connections must be at least 1")
        self.brokers = [(host, port) for host, port in brokers]
        self.tls = list(tls) or [None] * len(self.brokers)
        """Each broker's TLS (None: plain MQTT), by index."""
        self.connections = connections
        self.client_id = client_id
        self.username = username
        self.password = password.encode() if password is not None else None
        self.timeout_s = timeout_s
        self.sent = 0
        """PUBLISH packets sent, resends included."""
        self.expired = 0
        """Messages not sent because their expiry had passed when they would have gone out."""
        self._lock = threading.Lock()
        self._thread = LoopThread("actions-publisher")
        self._thread.start()
        self._clients: dict[tuple[int, int], MqttClient] = {}
        """Open connections by (broker index, slot); slot 0 is always used, the others by large batches."""
        self._run(self._open())

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return self._thread.run(coroutine, None)

    async def _open(self) -> None:
        """Connect at start, so a wrong address or credentials fail the job at once."""
        await self._connect_all(1)

    def _client_id(self, index: int, slot: int) -> str:
        return f"{self.client_id}-{index}" if slot == 0 else f"{self.client_id}-{index}-{slot}"

    async def _connect_all(self, slots: int) -> list[list[MqttClient]]:
        """``slots`` connected clients per broker, reopening any that dropped."""
        return [await self._slots(index, slots) for index in range(len(self.brokers))]

    async def _slots(self, index: int, slots: int) -> list[MqttClient]:
        """The first ``slots`` connections to broker ``index``, opened together."""
        opened = await asyncio.gather(
            *(self._connected(index, slot) for slot in range(slots)), return_exceptions=True
        )
        for result in opened:  # every attempt has ended: none stores a client after a move
            if isinstance(result, BaseException):
                raise result
        return cast(list[MqttClient], opened)

    async def _connected(self, index: int, slot: int) -> MqttClient:
        """The client of broker ``index`` in ``slot``, (re)connected if need be."""
        client = self._clients.get((index, slot))
        if client is None or not client.connected:
            host, port = self.brokers[index]
            client = await MqttClient.connect(
                host,
                port,
                self._client_id(index, slot),
                username=self.username,
                password=self.password,
                keep_alive=30,
                timeout_s=self.timeout_s,
                ssl_context=self.tls[index],
            )
            self._clients[index, slot] = client
        return client

    def publish(self, topic: str, payload: bytes, expires_in_ms: int | None = None) -> None:
        self.publish_many([Outgoing(topic, payload, expires_in_ms)])

    def publish_many(self, messages: Sequence[Outgoing]) -> None:
        """Publish every message and wait until all are acknowledged (those that expired before they could
        go out are not sent: ``expired``)."""
        if messages:
            batch = _Batch(messages, self._thread.loop.time())  # a wait for the lock counts too
            with self._lock:
                self._run(self._publish_many(batch))

    async def _publish_many(self, batch: _Batch) -> None:
        per_broker = await self._connect_all(self._slot_count(len(batch.messages)))
        messages = self._unexpired(batch, range(len(batch.messages)))[1]
        if not messages:
            return
        shards = _shards(messages, self._slot_count(len(messages)))  # no more than the clients opened
        sent = [
            client.publish_many([messages[i] for i in shard])
            for clients in per_broker
            for client, shard in zip(clients[: len(shards)], shards, strict=True)
        ]
        self.sent += len(messages) * len(per_broker)
        answers = await asyncio.wait_for(asyncio.gather(*sent), self.timeout_s)
        shard_of_answer = [shard for _ in per_broker for shard in shards]
        _raise_refused(
            [
                (messages[i][0], code)
                for shard, codes in zip(shard_of_answer, answers, strict=True)
                for i, code in zip(shard, codes, strict=True)
            ]
        )

    def _slot_count(self, messages: int) -> int:
        return max(1, min(self.connections, messages // SHARD_MIN))

    def _unexpired(self, batch: _Batch, indexes: Sequence[int]) -> tuple[list[int], list[Publication]]:
        """The messages of ``indexes`` still valid now, with the Message Expiry Interval each has left; the
        others are dropped, counted in ``expired`` and logged."""
        kept, publications = batch.unexpired(indexes, self._thread.loop.time())
        if dropped := sorted(set(indexes) - set(kept)):
            self.expired += len(dropped)
            log.warning(
                "%d action messages not sent: they expired before they could go out (e.g. on %s)",
                len(dropped),
                batch.messages[dropped[0]].topic,
            )
        return kept, publications

    def close(self) -> None:
        async def disconnect() -> None:
            for client in self._clients.values():
                if client.connected:
                    await client.disconnect()

        try:
            self._run(disconnect())
        finally:
            self._thread.close()


class ClusterPublisher(MqttPublisher):
    """QoS 1 publishes once, through one live member of a cluster (any member takes any publish and the
    cluster replicates it); raises on failure.

    It keeps one connection, to the first member that accepts it. When that member dies (the connection
    drops, or a PUBACK takes longer than ``ack_timeout_s``, well above the cluster's failover time), it
    connects to the next member in the list (or to the one a CONNACK or DISCONNECT 0x9C "use another
    server" named in its Server Reference, when that one is in the list: a member that lost its membership
    sends its clients to a live one) and resends exactly the messages that were not acknowledged (a large
    batch goes over several connections to the member, as ``MqttPublisher`` does: when one of them
    drops, all of them move, and only what no connection got acknowledged is sent again); a
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
        connections: int = CONNECTIONS,
        tls: Sequence[ssl.SSLContext | None] = (),
    ) -> None:
        self.ack_timeout_s = ack_timeout_s
        self.retry_s = retry_s
        self.resent = 0
        """Messages sent again (after a refusal 0x83 or a lost connection), counted when they go out."""
        self.moves = 0
        """Times the publisher moved to another member."""
        self._member = 0
        super().__init__(brokers, client_id, username, password, timeout_s, connections, tls)

    async def _open(self) -> None:
        await self._current(self._thread.loop.time() + self.timeout_s, 1)

    @property
    def member(self) -> tuple[str, int]:
        """The member in use (or tried next)."""
        return self.brokers[self._member]

    def _client_id(self, index: int, slot: int) -> str:
        return self.client_id if slot == 0 else f"{self.client_id}-{slot}"

    async def _current(self, deadline: float, slots: int) -> list[MqttClient]:
        """``slots`` connections to the member in use, or to the next one that accepts them."""
        while True:
            try:
                return await self._slots(self._member, slots)
            except (OSError, TimeoutError, ConnectionError) as error:
                if self._thread.loop.time() > deadline:
                    raise PublishTimedOut(f"no cluster member accepted a connection: {error}") from error
                referred = (
                    await self._sent_elsewhere(error.reason_code, error.server_reference)
                    if isinstance(error, ConnectionRefused)
                    else None
                )
                self._move(f"connecting failed: {error}", referred)
                if self._member == 0 or referred is not None:  # a pause each round, and after a referral
                    await asyncio.sleep(self.retry_s)

    async def _sent_elsewhere(self, reason_code: int | None, server_reference: str | None) -> int | None:
        """The index of the member a 0x9C "use another server" named, when it is one of the list: spelled
        as configured, else at one of the addresses its host resolves to (a cluster advertising
        ``127.0.0.1:1883`` for a member configured as ``localhost:1883``)."""
        named = referral(reason_code, server_reference)
        if named is None:
            return None
        if named in self.brokers:
            return self.brokers.index(named)
        wanted = await self._addresses(named)
        for index, member in enumerate(self.brokers):
            if member[1] == named[1] and wanted & await self._addresses(member):
                return index
        return None

    async def _addresses(self, member: tuple[str, int]) -> set[str]:
        """The IP addresses ``member``'s host resolves to (none when it does not resolve)."""
        try:
            found = await self._thread.loop.getaddrinfo(member[0], member[1], type=socket.SOCK_STREAM)
        except OSError:
            return set()
        return {str(address[4][0]) for address in found}

    def _move(self, why: str, to: int | None = None) -> None:
        """Leave the member in use for member ``to`` (one a refusal named), else for the next one."""
        for key in [key for key in self._clients if key[0] == self._member]:
            self._clients.pop(key).abort()
        self._member = (self._member + 1) % len(self.brokers) if to is None else to
        self.moves += 1
        host, port = self.brokers[self._member]
        log.warning("actions publisher moves to %s:%d (%s)", host, port, why)

    async def _publish_many(self, batch: _Batch) -> None:
        deadline = self._thread.loop.time() + self.timeout_s
        pending = list(range(len(batch.messages)))
        answers: list[tuple[str, int | None]] = []
        first_round = True
        while pending:
            clients = await self._current(deadline, self._slot_count(len(pending)))
            pending, publications = self._unexpired(batch, pending)  # what is left, as it goes out
            if not pending:
                break
            shards = _shards(publications, self._slot_count(len(pending)))  # no more than the clients
            settled = await asyncio.gather(
                *(
                    client.publish_many_settled([publications[i] for i in shard], self.ack_timeout_s)
                    for client, shard in zip(clients[: len(shards)], shards, strict=True)
                )
            )
            codes: list[int | None] = [None] * len(pending)
            for shard, shard_codes in zip(shards, settled, strict=True):
                for i, code in zip(shard, shard_codes, strict=True):
                    codes[i] = code
            self.sent += len(pending)
            self.resent += 0 if first_round else len(pending)
            first_round = False
            again = []
            for index, code in zip(pending, codes, strict=True):
                if code is None or code == IMPLEMENTATION_SPECIFIC_ERROR:
                    again.append(index)
                else:
                    answers.append((batch.messages[index].topic, code))
            if again and self._thread.loop.time() > deadline:
                raise PublishTimedOut(f"{len(again)} publishes not acknowledged within {self.timeout_s} s")
            if any(code is None for code in codes):
                to = None
                for client in clients:  # the first connection closed with a reference to a member
                    to = await self._sent_elsewhere(client.closed_with, client.server_reference)
                    if to is not None:
                        break
                self._move(f"{codes.count(None)} publishes not acknowledged", to)
            elif again:
                await asyncio.sleep(self.retry_s)
            pending = again
        _raise_refused(answers)


class PublishTimedOut(RuntimeError):
    """Publishes that no cluster member acknowledged in time (they may or may not be in the log)."""


class _Batch:
    """The messages of one ``publish_many`` call and the loop time it was made, from which each message's
    expiry counts."""

    def __init__(self, messages: Sequence[Outgoing], made_at: float) -> None:
        self.messages = messages
        self.made_at = made_at

    def unexpired(self, indexes: Sequence[int], now: float) -> tuple[list[int], list[Publication]]:
        """Of the messages at ``indexes``, those not expired at loop time ``now`` and their publications,
        each with the whole seconds it has left (rounded down, at least 1, at most what MQTT holds; None:
        it never expires)."""
        kept: list[int] = []
        publications: list[Publication] = []
        for index in indexes:
            topic, payload, expires_in_ms = self.messages[index]
            expiry_s = None
            if expires_in_ms is not None:
                left = self.made_at + expires_in_ms / 1000 - now
                if left <= 0:
                    continue
                expiry_s = min(MAX_EXPIRY_INTERVAL_S, max(1, math.floor(left)))
            kept.append(index)
            publications.append((topic, payload, expiry_s))
        return kept, publications


def _shards(messages: Sequence[Publication], count: int) -> list[list[int]]:
    """The indexes of ``messages`` split into ``count`` lists by a hash of the topic (stable across runs)."""
    if count == 1:
        return [list(range(len(messages)))]
    shards: list[list[int]] = [[] for _ in range(count)]
    for index, message in enumerate(messages):
        shards[zlib.crc32(message[0].encode()) % count].append(index)
    return shards


def _raise_refused(answers: Sequence[tuple[str, int | None]]) -> None:
    """Raise ``PublishRefused`` for the (topic, PUBACK code) answers that are failures, if any."""
    refused = [(topic, code) for topic, code in answers if code is not None and code >= 0x80]
    if refused:
        raise PublishRefused(refused[0][0], refused[0][1], refused=len(refused))
