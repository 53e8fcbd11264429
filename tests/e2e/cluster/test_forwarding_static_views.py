"""Publish anywhere over real peer links: three in-process brokers, each with a hand-built ``ClusterView``.

No etcd: the views are static (every partition led by a chosen broker, the in-sync set as the test says),
so what is tested is the data side alone: the ``/v1/peer`` WebSockets between the brokers' offsets APIs,
forwarding a logged publish to its leader and acknowledging the device with the leader's answer, the
refusals, and unlogged publishes routed on every member. Real brokers, real sockets, real MQTT clients.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from broker_edge.cluster.node import ClusterNode
from broker_edge.cluster.view import ClusterView
from broker_edge.config import load_dataclass
from broker_edge.placement import PartitionState, partition_of
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import Disconnect, PubAck, Publish
from broker_edge.settings.broker import BrokerConfig
from broker_edge.settings.cluster import ClusterConfig, MemberListenConfig
from tests.e2e.broker_clients import RawClient, close_all, wait_for
from tests.e2e.conftest import RunningBroker, broker_document
from tests.fleet_harness import FleetHarness, FleetSpec, quiet_devices

PARTITIONS = 8
NODES = ("a", "b", "c")
TOKEN = "peer-secret"


def static_config(node_id: str) -> ClusterConfig:
    """The ``cluster:`` section of a node running on a given view (its etcd is never contacted)."""
    return ClusterConfig(
        node_id=node_id,
        etcd=["http://127.0.0.1:9"],
        partitions=PARTITIONS,
        forward_timeout_ms=1000,
        listen=MemberListenConfig(port=0),
    )


def topic_led_by(leader: str, prefix: str = "site/dev") -> str:
    """A topic whose partition the test's views give to ``leader``."""
    for n in range(1000):
        topic = f"{prefix}-{n}"
        if NODES[partition_of(topic, PARTITIONS) % len(NODES)] == leader:
            return topic
    raise AssertionError("no topic found")


def _node_on(running: RunningBroker, view: ClusterView) -> ClusterNode:
    return ClusterNode(running.broker, static_config(view.node_id), view)


class Cluster:
    """Three brokers on threads, joined by ``ClusterNode``s running on static views."""

    def __init__(self, tmp_path: Path) -> None:
        self.brokers: dict[str, RunningBroker] = {}
        self.nodes: dict[str, ClusterNode] = {}
        for node in NODES:
            document = broker_document(tmp_path / node, offsets_api={"token": TOKEN})
            self.brokers[node] = RunningBroker(load_dataclass(BrokerConfig, document)).start()
        for node, running in self.brokers.items():
            view = ClusterView(node, PARTITIONS, fenced=False)
            for partition in range(PARTITIONS):
                leader = NODES[partition % len(NODES)]
                view.states[partition] = PartitionState(partition, leader, 1, NODES, NODES)
            # every node's routes exist before any peer dials (the offsets API builds its app once)
            self.nodes[node] = running.call(partial(_node_on, running, view))
        members = {node: cluster_node.member for node, cluster_node in self.nodes.items()}
        for cluster_node in self.nodes.values():
            cluster_node.view.members.update(members)
        for node, running in self.brokers.items():
            running.broker.cluster_node = self.nodes[node]
            asyncio.run_coroutine_threadsafe(self.nodes[node].start(), running.loop).result(10)

    def links_up(self) -> bool:
        return all(self.brokers[node].call(partial(self._links_of_up, node)) for node in NODES)

    def _links_of_up(self, node: str) -> bool:
        return all(self.nodes[node].links.up(peer) for peer in NODES if peer != node)

    def change(self, change: Callable[[ClusterView], None], nodes: tuple[str, ...] = NODES) -> None:
        """Apply ``change`` to the views of ``nodes``, on their loops, and tell the nodes."""
        for node in nodes:
            running = self.brokers[node]
            view = self.nodes[node].view

            def apply(view: ClusterView = view) -> None:
                change(view)
                view.changed()

            running.call(apply)

    def forget(self, node: str) -> None:
        """The other members no longer count ``node`` among the members, as when etcd deleted its member key
        (its lease ran out): a fenced member sends its clients only to members that no longer list it (one
        still listed has a live lease and is only slow to prove it)."""

        def drop(view: ClusterView) -> None:
            view.members.pop(node, None)

        self.change(drop, nodes=tuple(n for n in NODES if n != node))

    def log_end(self, node: str, topic: str) -> int:
        store = self.brokers[node].broker.store
        assert store is not None
        return self.brokers[node].call(lambda: store.log_info(topic).end_offset if topic in store else 0)

    def stop(self) -> None:
        for running in self.brokers.values():
            running.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path)
    assert wait_for(running.links_up, 10), "peer links did not come up"
    yield running
    close_all()
    running.stop()


def test_a_publish_on_a_follower_is_appended_by_the_leader_and_acknowledged_with_its_answer(cluster):
    topic = topic_led_by("b")
    client = RawClient(cluster.brokers["a"].port, 5)
    client.connect("device-on-a")

    client.send(b"".join(encode(Publish(topic, f"m{n}".encode(), 1, packet_id=n + 1), 5) for n in range(5)))
    acks = [client.recv() for _ in range(5)]

    assert [(type(ack), ack.packet_id) for ack in acks] == [(PubAck, n + 1) for n in range(5)]
    assert all(ack.reason_code in (0, 0x10) for ack in acks)
    assert cluster.log_end("b", topic) == 5
    assert cluster.log_end("a", topic) == 0  # appended by the leader only


def test_acks_keep_order_across_topics_led_here_and_elsewhere_mqtt_4_6_0_2(cluster):
    here, there = topic_led_by("a"), topic_led_by("c")
    client = RawClient(cluster.brokers["a"].port, 5)
    client.connect("mixed")

    packets = [Publish(there if n % 2 else here, f"m{n}".encode(), 1, packet_id=n + 1) for n in range(40)]
    for packet in packets:  # one read each: many batches, forwarded and local interleaved
        client.send_packet(packet)
    acks = [client.recv() for _ in range(40)]

    assert [ack.packet_id for ack in acks] == list(range(1, 41))
    assert all(ack.reason_code in (0, 0x10) for ack in acks)
    assert cluster.log_end("a", here) == 20 and cluster.log_end("c", there) == 20


def test_a_leader_with_too_few_in_sync_replicas_refuses_a_forwarded_publish_with_0x83(cluster):
    topic = topic_led_by("b")
    partition = partition_of(topic, PARTITIONS)
    cluster.change(
        lambda view: view.states.__setitem__(partition, PartitionState(partition, "b", 2, NODES, ("b",)))
    )
    client = RawClient(cluster.brokers["a"].port, 5)
    client.connect("at-risk")

    client.send_packet(Publish(topic, b"x", 1, packet_id=7))
    ack = client.recv()

    assert (type(ack), ack.packet_id, ack.reason_code) == (PubAck, 7, 0x83)
    assert "min_insync_replicas" in ack.properties.reason_string
    assert cluster.log_end("b", topic) == 0


def test_without_a_leader_a_publish_waits_then_is_refused_after_forward_timeout(cluster):
    topic = topic_led_by("b")
    partition = partition_of(topic, PARTITIONS)
    cluster.change(
        lambda view: view.states.__setitem__(partition, PartitionState(partition, None, 2, NODES, ("a", "c")))
    )
    client = RawClient(cluster.brokers["a"].port, 4)
    client.connect("v3-device")

    client.send_packet(Publish(topic, b"x", 1, packet_id=3))
    assert client.closed(5)  # v3 cannot be told: the connection closes, never a PUBACK


def test_a_publish_waiting_for_a_leader_goes_to_the_one_elected_in_time(cluster):
    topic = topic_led_by("b")
    partition = partition_of(topic, PARTITIONS)
    cluster.change(
        lambda view: view.states.__setitem__(partition, PartitionState(partition, None, 2, NODES, ("a", "c")))
    )
    client = RawClient(cluster.brokers["a"].port, 5)
    client.connect("patient")
    client.send_packet(Publish(topic, b"x", 1, packet_id=3))
    client.recv_none(0.3)

    cluster.change(
        lambda view: view.states.__setitem__(partition, PartitionState(partition, "c", 3, NODES, ("a", "c")))
    )
    ack = client.recv()
    assert ack.packet_id == 3 and ack.reason_code in (0, 0x10)
    assert cluster.log_end("c", topic) == 1


def test_a_publish_sent_to_a_former_leader_goes_to_the_leader_learnt_next(cluster):
    topic = topic_led_by("b")
    partition = partition_of(topic, PARTITIONS)
    moved = PartitionState(partition, "c", 2, NODES, NODES)
    cluster.change(lambda view: view.states.__setitem__(partition, moved), ("b", "c"))  # a has not heard yet
    client = RawClient(cluster.brokers["a"].port, 5)
    client.connect("stale-view")

    client.send_packet(Publish(topic, b"x", 1, packet_id=4))
    client.recv_none(0.3)  # b answers "not the leader": a keeps it until it learns of the new leader
    cluster.change(lambda view: view.states.__setitem__(partition, moved), ("a",))
    ack = client.recv()

    assert ack.packet_id == 4 and ack.reason_code in (0, 0x10)
    assert cluster.log_end("c", topic) == 1 and cluster.log_end("b", topic) == 0


def test_unlogged_publishes_reach_subscribers_on_every_member(cluster):
    subscribers = {node: RawClient(cluster.brokers[node].port, 5) for node in ("b", "c")}
    for node, client in subscribers.items():
        client.connect(f"listener-{node}")
        client.subscribe("live/#", 0)
    publisher = RawClient(cluster.brokers["a"].port, 5)
    publisher.connect("talker")

    publisher.send_packet(Publish("live/temperature", b"21.5", 0))

    for client in subscribers.values():
        delivery = client.recv()
        assert (delivery.topic, delivery.payload) == ("live/temperature", b"21.5")


def test_a_fenced_node_moves_its_v5_clients_to_the_live_members_with_0x9c(cluster):
    """Each client is named one live member in its Server Reference, in turn: the members share a fenced
    member's clients instead of one of them taking them all."""
    clients = [RawClient(cluster.brokers["a"].port, 5) for _ in range(4)]
    for index, client in enumerate(clients):
        client.connect(f"mover-{index}")

    running = cluster.brokers["a"]
    view = cluster.nodes["a"].view

    def fence() -> None:
        view.fenced = True
        view.changed()

    cluster.forget("a")
    running.call(fence)
    references: list[str] = []
    for client in clients:
        packet = client.recv()
        assert isinstance(packet, Disconnect) and packet.reason_code == 0x9C
        assert packet.properties is not None and packet.properties.server_reference is not None
        references.append(packet.properties.server_reference)
        assert client.closed()
    assert sorted(references) == sorted(
        [f"127.0.0.1:{cluster.brokers[node].port}" for node in ("b", "c")] * 2
    )


def test_a_simulated_device_follows_the_server_reference_of_a_fenced_member(cluster):
    """A device of the fleet simulator sent away with 0x9C reconnects to the member the Server Reference
    names, not to the fenced one (which, under load, keeps it busy with attempts that fail)."""
    address = {node: ("127.0.0.1", cluster.brokers[node].port) for node in NODES}
    spec = FleetSpec(brokers=[address["a"]], count=1, groups=["g"])
    with FleetHarness(address["b"], spec, quiet_devices(offline_duration_s=(0.05, 0.05))) as harness:
        harness.wait_until(lambda: harness.fleet.connected() == 1)
        device = harness.fleet.devices[0]
        cluster.forget("a")
        cluster.change(lambda view: setattr(view, "fenced", True), nodes=("a",))
        harness.wait_until(lambda: harness.fleet.stats["connects"] == 2, timeout_s=10)
        stats = harness.call(lambda: dict(harness.fleet.stats))
        assert harness.call(lambda: device.broker) in (address["b"], address["c"])
        assert harness.fleet.connected() == 1
        assert (stats["dropped_0x9c"], stats["server_references_followed"]) == (1, 1)
        assert not any(key.startswith("connect_failed") for key in stats)


def test_a_peer_without_the_token_is_refused(cluster):
    import urllib.error
    import urllib.request

    port = cluster.brokers["b"].broker.offsets_port
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/peer", headers={"X-Timestone-Node": "intruder"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 401


def test_a_cluster_answers_0x00_for_a_publish_whose_subscriber_is_on_another_member(cluster):
    """(Delivery to ``b`` goes through its observation of ``c``'s partition, which these static views do not
    run: tests/e2e/cluster covers it with etcd.)"""
    topic = topic_led_by("c")
    watcher = RawClient(cluster.brokers["b"].port, 5)
    watcher.connect("watcher-b")
    watcher.subscribe(topic, 1)
    publisher = RawClient(cluster.brokers["a"].port, 5)
    publisher.connect("meter-a")

    publisher.send_packet(Publish(topic, b"7.2", 1, packet_id=5))

    ack = publisher.recv()
    assert ack == PubAck(5, 0)  # never 0x10: neither a nor the leader c knows of b's subscriber
    assert wait_for(lambda: cluster.log_end("c", topic) == 1)
