"""The actions publisher on a real Timestone broker: many per-device messages pipelined over several
connections, each within the broker's Receive Maximum, and after a dropped connection only what was not
acknowledged is sent again.

A small TCP relay between the publisher and the broker reads the MQTT packets going each way (it forwards
whole packets only), so the tests see how many PUBLISHes are unacknowledged on each connection, and can drop
every connection once a given number of PUBACKs reached the publisher.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from bench.stream import parse_fixed_header
from broker_edge.runtime.launcher import BrokerProcess, free_ports
from pipelines.actions.model import device_topic
from pipelines.actions.publisher import ClusterPublisher, MqttPublisher, Outgoing
from pipelines.fleet.client import Message, MqttClient
from pipelines.loop_thread import LoopThread
from tests.referrer import Referrer

PUBLISH, PUBACK = 3, 4
RECEIVE_MAXIMUM = 64
LIMITS = {"messages_per_second_per_client": 0, "max_topics_per_client": 0, "receive_maximum": RECEIVE_MAXIMUM}


def split_packets(buffer: bytearray) -> list[bytes]:
    """Whole MQTT packets at the start of ``buffer`` (removed from it)."""
    packets: list[bytes] = []
    while (header := parse_fixed_header(buffer, 0)) is not None and len(buffer) >= header[1]:
        packets.append(bytes(buffer[: header[1]]))
        del buffer[: header[1]]
    return packets


class Relay:
    """A TCP relay to ``target`` on its own event loop, counting PUBLISH and PUBACK packets per connection.

    ``drop_after_acks``: once that many PUBACKs in all reached the client side, every connection is closed
    (the client reads those PUBACKs, then end of stream) and new ones are refused.
    """

    def __init__(self, target: tuple[str, int], drop_after_acks: int | None = None) -> None:
        self.target = target
        self.drop_after_acks = drop_after_acks
        self.connections = 0
        self.acks_forwarded = 0
        self.in_flight: list[int] = []
        """Unacknowledged PUBLISHes on each connection, now."""
        self.max_in_flight: list[int] = []
        self.max_total_in_flight = 0
        self.dropped = False
        self._writers: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._thread = LoopThread("relay")
        self._thread.start()
        self._server = self._thread.run(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.address = ("127.0.0.1", self._server.sockets[0].getsockname()[1])

    async def _accept(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        if self.dropped:
            client.close()
            return
        broker_reader, broker = await asyncio.open_connection(*self.target)
        number = self.connections
        self.connections += 1
        self.in_flight.append(0)
        self.max_in_flight.append(0)
        self._writers.append((client, broker))

        def sent(packet: bytes) -> None:
            if packet[0] >> 4 == PUBLISH and packet[0] & 0x06:
                self.in_flight[number] += 1
                self.max_in_flight[number] = max(self.max_in_flight[number], self.in_flight[number])
                self.max_total_in_flight = max(self.max_total_in_flight, sum(self.in_flight))

        def acked(packet: bytes) -> bool:
            if packet[0] >> 4 != PUBACK:
                return True
            if self.dropped:
                return False
            self.in_flight[number] -= 1
            self.acks_forwarded += 1
            if self.drop_after_acks is not None and self.acks_forwarded >= self.drop_after_acks:
                self.dropped = True
                self._thread.loop.call_soon(self._drop_all)
            return True

        await asyncio.gather(
            self._pump(client_reader, broker, sent_hook=sent),
            self._pump(broker_reader, client, forward_hook=acked),
            return_exceptions=True,
        )

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        sent_hook: Callable[[bytes], None] | None = None,
        forward_hook: Callable[[bytes], bool] | None = None,
    ) -> None:
        buffer = bytearray()
        while data := await reader.read(65536):
            buffer += data
            for packet in split_packets(buffer):
                if forward_hook is not None and not forward_hook(packet):
                    return
                if sent_hook is not None:
                    sent_hook(packet)
                if not writer.is_closing():
                    writer.write(packet)
            # after a drop, what the client still sends is read and discarded until it closes: closing a
            # socket with unread data would reset it, and the client's kernel would discard PUBACKs it had
            # received but the client had not read yet
            if not writer.is_closing():
                await writer.drain()
        if forward_hook is None or not self.dropped:
            writer.close()
        # after a drop the broker's end is aborted, which ends the pump towards the client: closing the
        # client's socket there, while bytes the client sent since are unread, would reset it as well; it
        # had its end of stream (``_drop_all``) and is closed by ``close``

    def _drop_all(self) -> None:
        for client, broker in self._writers:
            if not client.is_closing():
                client.write_eof()  # the client reads what was forwarded, then end of stream
            broker.transport.abort()

    def close(self) -> None:
        def stop() -> None:
            self._drop_all()
            for client, _ in self._writers:
                client.close()
            self._server.close()

        self._thread.loop.call_soon_threadsafe(stop)
        self._thread.close()


class Subscriber:
    """A device-side view: every message received on ``actions/devices/+``, counted per topic."""

    def __init__(self, broker: tuple[str, int]) -> None:
        self.received: Counter[str] = Counter()
        self._thread = LoopThread("devices-view")
        self._thread.start()
        self.client = self._run(self._connect(broker))

    def _run(self, coroutine):
        return self._thread.run(coroutine, 30)

    async def _connect(self, broker: tuple[str, int]) -> MqttClient:
        def on_message(message: Message) -> None:
            self.received[message.topic] += 1

        client = await MqttClient.connect(*broker, "devices-view", on_message=on_message)
        await client.subscribe(device_topic("+"), qos=1)
        return client

    def wait_for_topics(self, topics: set[str], timeout_s: float = 30.0) -> None:
        """Until every topic of ``topics`` had a message, and then until nothing more arrives for a moment."""

        async def wait() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while not topics <= self.received.keys() and loop.time() < deadline:
                await asyncio.sleep(0.05)
            total = -1
            while total != sum(self.received.values()):
                total = sum(self.received.values())
                await asyncio.sleep(0.3)

        self._run(wait())

    def close(self) -> None:
        try:
            self._run(self.client.disconnect())
        finally:
            self._thread.close()


def messages(count: int) -> list[Outgoing]:
    return [Outgoing(device_topic(f"dev-{n:05d}"), b'{"action_id":"a-1"}') for n in range(count)]


def topics(count: int) -> set[str]:
    return {message.topic for message in messages(count)}


@contextmanager
def relayed(
    broker: tuple[str, int], publisher: Callable[[tuple[str, int]], MqttPublisher], drop_after_acks=None
) -> Iterator[tuple[Relay, MqttPublisher, Subscriber]]:
    """A subscriber on the broker, a relay to it and a publisher made with the relay's address."""
    subscriber = Subscriber(broker)
    relay = Relay(broker, drop_after_acks)
    made = publisher(relay.address)
    try:
        yield relay, made, subscriber
    finally:
        made.close()
        relay.close()
        subscriber.close()


def test_many_per_device_messages_go_once_each_over_several_windows_MQTT_3_3_4_7(tmp_path):
    """[MQTT-3.3.4-7]: no connection has more than the broker's Receive Maximum unacknowledged; the
    publisher keeps several such windows full at once, and each message is in the log once."""
    count = 3000
    with BrokerProcess(tmp_path / "broker", limits=LIMITS) as broker:
        with relayed(broker.address, lambda a: MqttPublisher([a], "actions-test", connections=4)) as (
            relay,
            publisher,
            subscriber,
        ):
            publisher.publish_many(messages(count))
            subscriber.wait_for_topics(topics(count))
        assert publisher.sent == count
        assert relay.connections == 4
        assert all(0 < peak <= RECEIVE_MAXIMUM for peak in relay.max_in_flight)
        assert relay.max_total_in_flight > RECEIVE_MAXIMUM
        assert subscriber.received == Counter(dict.fromkeys(topics(count), 1))


def test_a_single_publish_and_a_small_batch_use_one_connection(tmp_path):
    with BrokerProcess(tmp_path / "broker", limits=LIMITS) as broker:
        with relayed(broker.address, lambda a: MqttPublisher([a], "actions-test", connections=4)) as (
            relay,
            publisher,
            subscriber,
        ):
            publisher.publish("actions/groups/g", b"{}")
            publisher.publish_many(messages(10))
            subscriber.wait_for_topics(topics(10))
        assert relay.connections == 1


def test_members_that_cannot_be_reached_are_passed_in_list_order(tmp_path):
    """Two members with nothing listening, then a live one: the publisher tries each in turn (a refused
    TCP connection names no other member) and publishes through the third."""
    with BrokerProcess(tmp_path / "broker", limits=LIMITS) as broker:
        dead = [("127.0.0.1", port) for port in free_ports(2)]
        subscriber = Subscriber(broker.address)
        publisher = ClusterPublisher([*dead, broker.address], "actions-test", timeout_s=20, retry_s=0.05)
        try:
            publisher.publish_many(messages(10))
            subscriber.wait_for_topics(topics(10))
            assert (publisher.member, publisher.moves) == (broker.address, 2)
        finally:
            publisher.close()
            subscriber.close()


def test_after_a_dropped_connection_only_unacknowledged_messages_are_sent_again(tmp_path):
    """Every connection to the first member drops once 700 PUBACKs of 3000 reached the publisher: it moves
    to the next member and sends exactly the 2300 others again; devices get every message, and those
    acknowledged before the drop once."""
    count, acked_first = 3000, 700
    with BrokerProcess(tmp_path / "broker", limits=LIMITS) as broker:

        def publisher(relay: tuple[str, int]) -> MqttPublisher:
            members = [relay, broker.address]
            return ClusterPublisher(members, "actions-test", retry_s=0.05, connections=4)

        with relayed(broker.address, publisher, drop_after_acks=acked_first) as (relay, made, subscriber):
            made.publish_many(messages(count))
            subscriber.wait_for_topics(topics(count))
        assert isinstance(made, ClusterPublisher)
        assert relay.connections == 4 and relay.acks_forwarded == acked_first
        assert made.moves == 1
        assert made.resent == count - acked_first
        assert made.sent == count + made.resent
        assert set(subscriber.received) == topics(count)
        once = [topic for topic in topics(count) if subscriber.received[topic] == 1]
        # a resent message may be in the log twice (its first copy was appended, its PUBACK lost)
        assert len(once) >= acked_first
        assert sum(subscriber.received.values()) <= count + made.resent


@pytest.mark.parametrize("at", ["connect", "publish"])
def test_a_member_sending_the_publisher_elsewhere_with_0x9c_is_followed_to_the_member_it_names(tmp_path, at):
    """A member answering CONNACK 0x9C, or DISCONNECT 0x9C at the first PUBLISH, with a Server Reference
    (MQTT 5 4.11, what a member that lost its membership does): the publisher moves to the member named, not
    to the next of its list, and every message lands there."""
    with (
        BrokerProcess(tmp_path / "named", limits=LIMITS) as named,
        BrokerProcess(tmp_path / "next", limits=LIMITS) as following,
    ):
        referrer = Referrer(f"127.0.0.1:{named.port}", at=at)
        subscriber = Subscriber(named.address)
        members = [referrer.address, following.address, named.address]
        publisher = ClusterPublisher(members, "actions-test", retry_s=0.05)
        try:
            publisher.publish_many(messages(10))
            subscriber.wait_for_topics(topics(10))
            assert (publisher.moves, referrer.connections) == (1, 1)
            assert publisher.member == named.address
        finally:
            publisher.close()
            subscriber.close()
            referrer.close()


def test_a_server_reference_naming_a_listed_member_by_another_spelling_is_followed(tmp_path):
    """The job lists a member as ``localhost:PORT``, the cluster refers by ``127.0.0.1:PORT``: the same
    member, found by the addresses its host resolves to, not taken for a stranger (the next of the list)."""
    with (
        BrokerProcess(tmp_path / "named", limits=LIMITS) as named,
        BrokerProcess(tmp_path / "next", limits=LIMITS) as following,
    ):
        referrer = Referrer(f"127.0.0.1:{named.port}", at="connect")
        subscriber = Subscriber(named.address)
        members = [referrer.address, following.address, ("localhost", named.port)]
        publisher = ClusterPublisher(members, "actions-test", retry_s=0.05)
        try:
            publisher.publish_many(messages(10))
            subscriber.wait_for_topics(topics(10))
            assert (publisher.moves, publisher.member) == (1, ("localhost", named.port))
        finally:
            publisher.close()
            subscriber.close()
            referrer.close()
