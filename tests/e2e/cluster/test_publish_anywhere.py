"""Publish anywhere: three broker processes and a real etcd behave as one broker to MQTT clients.

A publish made on A, at any QoS, reaches subscribers on B and C once (QoS 1/2 publishes are logged by their
partition's leader, replicated, and routed by every broker; QoS 0 ones travel over the peer links), with
paho and gmqtt, MQTT 5 and 3.1.1. A fourth broker that joins takes leadership of its share of the
partitions, and ``timestone cluster status`` shows it.
"""

from __future__ import annotations

import asyncio

import pytest
from gmqtt import Client as GmqttClient
from gmqtt.mqtt.constants import MQTTv50, MQTTv311

from tests.e2e.broker_clients import TIMEOUT, PahoClient, close_all
from tests.e2e.cluster.proof import (
    cluster_state,
    cluster_status,
    settled,
    status_leaders,
    wait_settled,
    wait_until,
)

NODES = ("a", "b", "c")


@pytest.fixture
def three(cluster_brokers, etcd):
    brokers = {node: cluster_brokers(node) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    yield brokers
    close_all()


@pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])
def test_every_qos_published_on_a_reaches_subscribers_on_b_and_c(three, version):
    subscribers = [
        PahoClient(three["b"].port, f"sub-b-{version}", version=version),
        PahoClient(three["c"].port, f"sub-c-{version}", version=version),
    ]
    for subscriber in subscribers:
        subscriber.subscribe("plant/#", 2)
    publisher = PahoClient(three["a"].port, f"pub-a-{version}", version=version)

    sent = {(f"plant/line-{qos}/v{version}", f"qos {qos} from a".encode(), qos) for qos in (0, 1, 2)}
    for topic, payload, qos in sorted(sent, key=lambda m: m[2]):
        publisher.publish(topic, payload, qos)

    for subscriber in subscribers:
        got = {(m.topic, m.payload, m.qos) for m in subscriber.expect(3)}
        assert got == sent
        subscriber.expect_none(0.5)  # once each


@pytest.mark.parametrize("version", [MQTTv50, MQTTv311], ids=["v5", "v3.1.1"])
def test_gmqtt_publishes_on_a_and_receives_on_b(three, version):
    async def scenario() -> list[tuple[str, bytes, int]]:
        received: list[tuple[str, bytes, int]] = []
        done = asyncio.Event()
        subscribed = asyncio.Event()
        subscriber = GmqttClient(f"gmqtt-on-b-{version}")

        def on_message(client: object, topic: str, payload: bytes, qos: int, properties: object) -> int:
            received.append((topic, payload, qos))
            if len(received) == 3:
                done.set()
            return 0

        subscriber.on_message = on_message
        subscriber.on_subscribe = lambda *args: subscribed.set()
        await subscriber.connect("127.0.0.1", three["b"].port, keepalive=30, version=version)
        subscriber.subscribe("gm/#", qos=2)
        await asyncio.wait_for(subscribed.wait(), TIMEOUT)
        publisher = GmqttClient(f"gmqtt-on-a-{version}")
        await publisher.connect("127.0.0.1", three["a"].port, keepalive=30, version=version)
        for qos in (0, 1, 2):
            publisher.publish(f"gm/{qos}", f"via gmqtt {qos}".encode(), qos=qos)
        await asyncio.wait_for(done.wait(), 2 * TIMEOUT)
        await publisher.disconnect()
        await subscriber.disconnect()
        return received

    received = asyncio.run(scenario())
    assert sorted(received) == [(f"gm/{qos}", f"via gmqtt {qos}".encode(), qos) for qos in (0, 1, 2)]


def test_a_new_broker_joins_and_takes_leadership_of_its_share(cluster_brokers, etcd):
    """The cluster is made for four copies (``replication_factor: 4``, capped at the three live brokers): the
    fourth broker to join gets a copy of every partition, catches up, and takes over its share of
    leaderships."""
    three = {node: cluster_brokers(node, replication_factor=4) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    assert cluster_state(etcd).leaders().get("d", 0) == 0
    cluster_brokers("d", replication_factor=4)

    partitions = len(cluster_state(etcd).partitions)
    fair = partitions // 4
    wait_until(
        lambda: cluster_state(etcd).leaders().get("d", 0) >= fair and settled(etcd, {*NODES, "d"}, 4),
        what="d leading its share of the partitions",
        state=lambda: cluster_state(etcd),
    )
    leaders = cluster_state(etcd).leaders()
    assert max(leaders.values()) - min(leaders.values()) <= 1, leaders
    assert status_leaders(cluster_status(etcd)).get("d", 0) >= fair  # what the operator sees
    # the new broker serves publishes too
    subscriber = PahoClient(three["a"].port, "sub-on-a")
    subscriber.subscribe("joined/#", 1)
    publisher = PahoClient(port_of(cluster_state(etcd).members["d"].mqtt), "pub-on-d")
    publisher.publish("joined/x", b"from d", 1)
    assert subscriber.expect(1)[0].payload == b"from d"
    close_all()


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])
