"""A fleet's persistent sessions survive the death of the member holding them: hundreds of devices, a
topic each (QoS 1, Clean Start 0, a Session Expiry Interval), on one member that is then SIGKILLed; every
device resumes its session on another member (Session Present 1, its subscription restored) and gets the
QoS 1 command published to it meanwhile, once.

A member saves the state of the persistent sessions it holds every ``session_save_interval_ms``; a fleet's
sessions must all be saved within about that interval, not one etcd call after another (hundreds of
sessions then took longer than a member lives between two faults, and most were lost with it). A fleet
resuming while some of its topics have no live copy is said in a few log lines, not one per device.
"""

from __future__ import annotations

import asyncio
import collections
import time

from broker_edge.cluster.features.sessions_records import SessionRecord
from broker_edge.protocol import PacketDecoder
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import ConnAck, Connect, PubAck, Publish, SubAck, Subscribe, Subscription
from broker_edge.protocol.properties import Properties
from tests.e2e.cluster.proof import cluster_state, wait_settled, wait_until
from tests.harness.local_cluster import EtcdTarget

DEVICES = 1000
VERSION = 5


class FleetDevice:
    """One device's connection: CONNECT with Clean Start 0, then what it receives (PUBACKed)."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.session_present: bool | None = None
        self.received: collections.Counter[bytes] = collections.Counter()
        self.writer: asyncio.StreamWriter | None = None
        self.reader_task: asyncio.Task[None] | None = None
        self.suback = asyncio.Event()

    async def connect(self, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        self.writer = writer
        decoder = PacketDecoder(role="client", protocol_version=VERSION)
        properties = Properties(session_expiry_interval=3600)
        connect = Connect(
            protocol_version=VERSION, client_id=self.client_id, clean_start=False, properties=properties
        )
        writer.write(encode(connect, VERSION))
        connack: asyncio.Future[ConnAck] = asyncio.get_running_loop().create_future()
        self.reader_task = asyncio.create_task(self._read(reader, decoder, connack))
        answer = await asyncio.wait_for(connack, 20)
        assert answer.reason_code == 0, f"{self.client_id}: CONNACK {answer.reason_code:#x}"
        self.session_present = answer.session_present

    async def _read(
        self, reader: asyncio.StreamReader, decoder: PacketDecoder, connack: asyncio.Future[ConnAck]
    ) -> None:
        while data := await reader.read(65536):
            for packet in decoder.feed(data):
                if isinstance(packet, ConnAck) and not connack.done():
                    connack.set_result(packet)
                elif isinstance(packet, SubAck):
                    self.suback.set()
                elif isinstance(packet, Publish):
                    self.received[packet.payload] += 1
                    assert self.writer is not None and packet.packet_id is not None
                    self.writer.write(encode(PubAck(packet.packet_id), VERSION))

    async def subscribe(self, topic_filter: str) -> None:
        assert self.writer is not None
        self.writer.write(encode(Subscribe(1, [Subscription(topic_filter, 1)]), VERSION))
        await asyncio.wait_for(self.suback.wait(), 20)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.reader_task is not None:
            self.reader_task.cancel()


async def _connect_all(devices: list[FleetDevice], port: int) -> None:
    for start in range(0, len(devices), 100):
        await asyncio.gather(*(device.connect(port) for device in devices[start : start + 100]))


async def _publish_commands(port: int, topics: list[str]) -> None:
    """One QoS 1 command per topic, each acknowledged (a new publisher, Clean Start 1)."""
    publisher = FleetDevice("backend")
    reader_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    decoder = PacketDecoder(role="client", protocol_version=VERSION)
    writer.write(encode(Connect(protocol_version=VERSION, client_id=publisher.client_id), VERSION))
    acked: set[int] = set()
    refused: set[int] = set()
    connacked = asyncio.Event()

    async def read() -> None:
        while data := await reader.read(65536):
            for packet in decoder.feed(data):
                if isinstance(packet, ConnAck):
                    assert packet.reason_code == 0
                    connacked.set()
                elif isinstance(packet, PubAck):
                    (acked if packet.reason_code < 0x80 else refused).add(packet.packet_id)
        reader_done.set_result(None)

    task = asyncio.create_task(read())
    await asyncio.wait_for(connacked.wait(), 20)
    deadline = time.monotonic() + 20
    for packet_id, topic in enumerate(topics, 1):
        while packet_id - len(acked) - len(refused) > 32 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # within the broker's Receive Maximum
        writer.write(encode(Publish(topic, f"command {topic}".encode(), 1, packet_id=packet_id), VERSION))
    while len(acked) < len(topics) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    writer.close()
    task.cancel()
    assert len(acked) == len(topics), f"{len(topics) - len(acked)} commands not acknowledged, {refused=}"


def _wait_saved(etcd: EtcdTarget, devices: list[FleetDevice]) -> None:
    """Until the registry holds every device's session saved with its subscription (saved every
    ``session_save_interval_ms``; a member killed before a save leaves that session without its state)."""

    def unsaved() -> list[str]:
        filters: dict[str, list[str]] = {}
        for key, value in etcd.server.range(f"{etcd.prefix}/sessions/"):
            state = SessionRecord.from_json(value).state or {}
            filters[key.rsplit("/", 1)[-1]] = [entry["filter"] for entry in state.get("subscriptions", [])]
        return [d.client_id for d in devices if f"cmd/{d.client_id}" not in filters.get(d.client_id, [])]

    wait_until(lambda: not unsaved(), 30, "every session saved with its subscription", lambda: unsaved()[:3])


async def _fleet_moves(three_brokers, etcd) -> list[FleetDevice]:
    a, b = three_brokers["a"], three_brokers["b"]
    devices = [FleetDevice(f"fleet-{n}") for n in range(DEVICES)]
    await _connect_all(devices, a.port)
    await asyncio.gather(*(device.subscribe(f"cmd/{device.client_id}") for device in devices))
    await asyncio.to_thread(_wait_saved, etcd, devices)
    a.kill()
    for device in devices:
        device.close()
    await asyncio.to_thread(
        wait_until, lambda: "a" not in cluster_state(etcd).members, 20, "a gone from the members"
    )
    await _publish_commands(b.port, [f"cmd/{device.client_id}" for device in devices])
    moved = [FleetDevice(device.client_id) for device in devices]
    await _connect_all(moved, b.port)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(device.received for device in moved):
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # a second copy would come by now
    for device in moved:
        device.close()
    return moved


def test_a_fleet_of_persistent_sessions_resumes_on_another_member_after_its_member_is_killed(
    three_brokers, etcd
):
    moved = asyncio.run(_fleet_moves(three_brokers, etcd))

    lost = [device.client_id for device in moved if not device.session_present]
    assert not lost, f"{len(lost)} of {DEVICES} sessions lost (Session Present 0), e.g. {lost[:3]}"
    missing = [device.client_id for device in moved if not device.received]
    assert not missing, f"{len(missing)} devices never got their queued command, e.g. {missing[:3]}"
    twice = [device.client_id for device in moved if max(device.received.values()) > 1]
    assert not twice, f"{len(twice)} devices got their command twice"


async def _fleet_back_while_partitions_offline(brokers, etcd) -> None:
    a, b = brokers["a"], brokers["b"]
    devices = [FleetDevice(f"offline-{n}") for n in range(OFFLINE_DEVICES)]
    await _connect_all(devices, b.port)
    await asyncio.gather(*(device.subscribe(f"cmd/{device.client_id}") for device in devices))
    await asyncio.to_thread(_wait_saved, etcd, devices)
    b.kill()
    for device in devices:
        device.close()
    await asyncio.to_thread(
        wait_until, lambda: "b" not in cluster_state(etcd).members, 20, "b gone from the members"
    )
    moved = [FleetDevice(device.client_id) for device in devices]
    await _connect_all(moved, a.port)
    assert all(device.session_present for device in moved)
    for device in moved:
        device.close()


OFFLINE_DEVICES = 200
UNANSWERED = "no broker answered for partitions"


def test_a_fleet_resuming_while_its_partitions_are_offline_is_said_in_a_few_lines_not_one_per_device(
    cluster_brokers, etcd
):
    """Sessions restored on ``a`` while the only copy of some of their topics is on ``b``, dead (one copy
    per partition): each replay that no broker answers was a WARNING of its own, a line per device of a
    fleet reconnecting. The lines are now summarised: one per interval, the next saying how many more."""
    brokers = {node: cluster_brokers(node, replication_factor=1, min_insync_replicas=1) for node in "ab"}
    wait_settled(etcd, {"a", "b"}, 1)

    asyncio.run(_fleet_back_while_partitions_offline(brokers, etcd))

    time.sleep(0.5)
    lines = [line for line in brokers["a"].log_path.read_text().splitlines() if UNANSWERED in line]
    assert 1 <= len(lines) <= 3, f"{len(lines)} lines of {UNANSWERED!r}"
