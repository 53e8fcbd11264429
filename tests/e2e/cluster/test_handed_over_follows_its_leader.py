"""A device handed over to the member leading its topic's partition follows that leadership when it moves.

Members started one by one on this host hand a device's connection to the leader of its topic once a
publish of it is forwarded there (``cluster.hand_over_connections``). A fourth member joins and takes over
the leadership of about a quarter of the partitions: the devices of those partitions, each already handed
over once, were left on their old leader, every publish of theirs forwarded for as long as they stayed
connected. Each now moves to the new leader at its next publish, and nothing acknowledged is lost.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker_edge.placement import partition_of
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, close_all
from tests.e2e.cluster.proof import (
    cluster_state,
    leadership_spread,
    read_log,
    socket_owners,
    wait_settled,
    wait_until,
)
from tests.harness.local_cluster import EtcdTarget, placement_settled

pytestmark = pytest.mark.timeout(180)

NODES = ("a", "b", "c")


class HandedDevice:
    """An MQTT 3.1.1 device publishing QoS 1 on its own topic, connected to ``entry`` (a member that does
    not lead its topic's partition)."""

    def __init__(self, topic: str, entry: str, brokers: dict[str, BrokerProcess]) -> None:
        self.topic, self.entry = topic, entry
        self.port = brokers[entry].port
        self.client = PahoClient(self.port, f"dev-{topic.rsplit('/', 1)[1]}", version=4)
        self.local_port = self.client.client.socket().getsockname()[1]
        self.sent: list[bytes] = []

    def publish(self) -> None:
        payload = str(len(self.sent)).encode()
        self.client.publish(self.topic, payload, 1)  # returns once acknowledged
        self.sent.append(payload)


def test_a_device_handed_over_moves_on_when_its_partitions_leadership_moves(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> None:
    brokers = {node: cluster_brokers(node, hand_over_connections=True) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    wait_until(lambda: leadership_spread(etcd, NODES), what="leadership spread over a, b, c")
    partitions = cluster_state(etcd).partitions
    count = len(partitions)
    topics: dict[int, str] = {}
    for n in range(10_000):
        topics.setdefault(partition_of(f"plant/d{n}", count), f"plant/d{n}")
        if len(topics) == count:
            break
    devices = []
    for partition, topic in sorted(topics.items()):
        leader = partitions[partition].leader
        entry = NODES[(NODES.index(leader) + 1) % len(NODES)]  # not the leader: its publish is forwarded
        devices.append(HandedDevice(topic, entry, brokers))
    for device in devices:
        device.publish()

    def holders() -> dict[str, str | None]:
        """Each device's topic → the member whose process holds the broker's end of its connection."""
        pids = {node: b.process.pid for node, b in brokers.items() if b.process is not None}
        owners = {port: socket_owners(pids, port) for port in {device.port for device in devices}}
        return {device.topic: owners[device.port].get(device.local_port) for device in devices}

    def each_held_by_its_leader() -> bool:
        state = cluster_state(etcd).partitions
        held = holders()
        return all(held[d.topic] == state[partition_of(d.topic, count)].leader for d in devices)

    wait_until(each_held_by_its_leader, 20, "every device handed to its topic's leader")
    first_holders = holders()

    brokers["d"] = cluster_brokers("d", hand_over_connections=True)
    members = (*NODES, "d")
    wait_until(
        lambda: (
            leadership_spread(etcd, members)
            and cluster_state(etcd).leaders().get("d", 0) >= count // 4
            and placement_settled(etcd, 3)
        ),
        90,
        "d leading its share, its copies taken, leadership settled",
        lambda: cluster_state(etcd),
    )
    moved_to_d = [
        device
        for device in devices
        if cluster_state(etcd).partitions[partition_of(device.topic, count)].leader == "d"
    ]
    assert len(moved_to_d) >= count // 4
    assert all(first_holders[device.topic] != "d" for device in moved_to_d)

    def publish_and_check() -> bool:
        for device in devices:
            device.publish()
        return each_held_by_its_leader()

    wait_until(publish_and_check, 20, "every device held by its topic's new leader")
    for device in devices:
        for _ in range(3):
            device.publish()
    state = cluster_state(etcd).partitions
    for device in devices:
        leader = state[partition_of(device.topic, count)].leader
        assert leader is not None
        assert [payload for _, payload in read_log(brokers[leader], device.topic)] == device.sent, (
            device.topic
        )
    for holder in {first_holders[device.topic] for device in moved_to_d}:
        assert holder is not None
        assert b"connection handed over to d" in brokers[holder].log_path.read_bytes()
    close_all()
