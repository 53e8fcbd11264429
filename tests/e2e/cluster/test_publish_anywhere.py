"""Publish anywhere: three broker processes and a real etcd behave as one broker to MQTT clients.

A publish made on A, at any QoS, reaches subscribers on B and C once (QoS 1/2 publishes are logged by their
partition's leader, replicated, and routed by every broker; QoS 0 ones travel over the peer links), with
paho and gmqtt, MQTT 5 and 3.1.1. A fourth broker that joins a cluster whose replication factor is met
gets its share of the replicas and of the leaderships, and ``timestone cluster status`` shows it, while
no acknowledged publish is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections import Counter

import pytest
from gmqtt import Client as GmqttClient
from gmqtt.mqtt.constants import MQTTv50, MQTTv311

from broker_edge.placement import partition_of
from tests.e2e.broker_clients import TIMEOUT, PahoClient, close_all
from tests.e2e.cluster.proof import (
    Device,
    check_nothing_acknowledged_was_lost,
    cluster_state,
    cluster_status,
    leadership_spread,
    read_log,
    session_record,
    settled,
    socket_owners,
    status_in_sync,
    status_leaders,
    wait_settled,
    wait_until,
)

NODES = ("a", "b", "c")
DEVICES = 4


@pytest.mark.shares_cluster  # the module's one cluster: the test harms none of its brokers
@pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])
def test_every_qos_published_on_a_reaches_subscribers_on_b_and_c(three_brokers, version):
    subscribers = [
        PahoClient(three_brokers["b"].port, f"sub-b-{version}", version=version),
        PahoClient(three_brokers["c"].port, f"sub-c-{version}", version=version),
    ]
    for subscriber in subscribers:
        subscriber.subscribe("plant/#", 2)
    publisher = PahoClient(three_brokers["a"].port, f"pub-a-{version}", version=version)

    sent = {(f"plant/line-{qos}/v{version}", f"qos {qos} from a".encode(), qos) for qos in (0, 1, 2)}
    for topic, payload, qos in sorted(sent, key=lambda m: m[2]):
        publisher.publish(topic, payload, qos)

    for subscriber in subscribers:
        got = {(m.topic, m.payload, m.qos) for m in subscriber.expect(3)}
        assert got == sent
        subscriber.expect_none(0.5)  # once each


@pytest.mark.shares_cluster  # the module's one cluster: the test harms none of its brokers
@pytest.mark.parametrize("version", [MQTTv50, MQTTv311], ids=["v5", "v3.1.1"])
def test_gmqtt_publishes_on_a_and_receives_on_b(three_brokers, version):
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
        await subscriber.connect("127.0.0.1", three_brokers["b"].port, keepalive=30, version=version)
        subscriber.subscribe("gm/#", qos=2)
        await asyncio.wait_for(subscribed.wait(), TIMEOUT)
        publisher = GmqttClient(f"gmqtt-on-a-{version}")
        await publisher.connect("127.0.0.1", three_brokers["a"].port, keepalive=30, version=version)
        for qos in (0, 1, 2):
            publisher.publish(f"gm/{qos}", f"via gmqtt {qos}".encode(), qos=qos)
        await asyncio.wait_for(done.wait(), 2 * TIMEOUT)
        await publisher.disconnect()
        await subscriber.disconnect()
        return received

    received = asyncio.run(scenario())
    assert sorted(received) == [(f"gm/{qos}", f"via gmqtt {qos}".encode(), qos) for qos in (0, 1, 2)]


def test_a_new_broker_joins_and_takes_leadership_of_its_share(cluster_brokers, etcd):
    """Three brokers hold three copies of every partition (``replication_factor: 3``, already met); a fourth
    joins while devices publish QoS 1 through all of them. Replicas move to it a few partitions at a time
    (an extra copy, caught up, then one of the most loaded broker's dropped), it leads about a quarter of
    the partitions, ``timestone cluster status`` shows it, and every acknowledged publish is on every
    replica of its partition once, at the same offset."""
    brokers = {node: cluster_brokers(node, replication_factor=3) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    assert cluster_state(etcd).leaders().get("d", 0) == 0
    topics = [f"joining/dev-{n}" for n in range(DEVICES)]
    order = [brokers[node] for node in NODES]
    devices = [Device(f"joiner-{n}", topic, order, start_at=n) for n, topic in enumerate(topics)]
    for device in devices:
        device.start()
    time.sleep(1.0)
    brokers["d"] = cluster_brokers("d", replication_factor=3)
    members = {*NODES, "d"}
    watcher = PahoClient(brokers["d"].port, "watcher-on-d")  # on d while its copies arrive
    watcher.subscribe("joining/#", 1)
    watching_from = time.monotonic()

    partitions = len(cluster_state(etcd).partitions)
    fair = partitions * 3 // 4

    def joined() -> bool:
        state = cluster_state(etcd)
        held = Counter(node for p in state.partitions.values() for node in p.replicas)
        return (
            settled(etcd, members, 3)
            and all(len(p.replicas) == 3 for p in state.partitions.values())
            and all(abs(held[node] - fair) <= 1 for node in members)
            and state.leaders().get("d", 0) >= partitions // 4
        )

    wait_until(joined, timeout=90, what="d holding and leading its share", state=lambda: cluster_state(etcd))
    time.sleep(1.0)
    for device in devices:
        device.stop()
    leaders = cluster_state(etcd).leaders()
    assert max(leaders.values()) - min(leaders.values()) <= 1, leaders
    status = cluster_status(etcd)  # what the operator sees
    assert status_leaders(status).get("d", 0) >= partitions // 4
    assert status_in_sync(status, "d") >= fair - 1
    # d's subscriber saw each record once, from its subscription on, while d went from routing what it
    # observed to routing its own copies
    seen = Counter(message.payload for message in drained(watcher))
    assert max(seen.values()) == 1, [payload for payload, n in seen.items() if n > 1][:5]
    for device in devices:
        later = [p for p, t in zip(device.acked, device.ack_times, strict=True) if t > watching_from + 0.5]
        assert later and set(later) <= set(seen), device.client_id
    state = cluster_state(etcd)
    for device in devices:
        holders = state.partitions[partition_of(device.topic, partitions)].replicas
        check_nothing_acknowledged_was_lost([device], [brokers[node] for node in holders])
        # a broker whose copy moved away keeps what it had: the same records at the same offsets
        held = read_log(brokers[holders[0]], device.topic)
        for node in members.difference(holders):
            stale = read_log(brokers[node], device.topic)
            assert stale == held[: len(stale)], f"{node}: {device.topic} differs from its replicas'"
    # the new broker serves publishes too
    subscriber = PahoClient(brokers["a"].port, "sub-on-a")
    subscriber.subscribe("joined/#", 1)
    publisher = PahoClient(port_of(cluster_state(etcd).members["d"].mqtt), "pub-on-d")
    publisher.publish("joined/x", b"from d", 1)
    assert subscriber.expect(1)[0].payload == b"from d"
    close_all()


def test_a_device_handed_over_publishes_on_and_its_will_goes_with_it(cluster_brokers, etcd):
    """``cluster.hand_over_connections`` between members started one by one on this host (mutual TLS
    between them): a paho MQTT 3.1.1 device connected to ``a`` and publishing on a topic ``b`` leads is
    handed to ``b`` once its first publish is acknowledged (``b``'s process holds the broker's end of its
    TCP connection from then on); it publishes on over the same connection, every publish acknowledged and
    in the log once, in order; the session registry's record ``a`` wrote goes with it (``b`` swaps it, the
    next generation); its will goes with it, unpublished by ``a``, and is published once, by ``b``'s side of
    the cluster, when the connection drops."""
    brokers = {node: cluster_brokers(node, hand_over_connections=True) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    wait_until(lambda: leadership_spread(etcd, NODES), what="leadership spread over a, b, c")
    state = cluster_state(etcd)
    partitions = state.partitions
    topics = (f"plant/d-{n}/telemetry" for n in range(1000))
    topic = next(t for t in topics if partitions[partition_of(t, len(partitions))].leader == "b")
    watcher = PahoClient(brokers["c"].port, "watcher", version=4)
    assert watcher.subscribe("plant/+/status", 1) == [1]
    device = PahoClient(
        brokers["a"].port, "d-handed", version=4, will=("plant/d-handed/status", b"gone", 1, False)
    )
    device.publish(topic, b"0", 1)
    local_port = device.client.socket().getsockname()[1]
    pids = {node: broker.process.pid for node, broker in brokers.items() if broker.process is not None}
    wait_until(
        lambda: socket_owners(pids, brokers["a"].port).get(local_port) == "b", 10, "the connection held by b"
    )

    def claimed_by_b() -> bool:  # a's record, swapped by b as it came: never removed in between
        record = session_record(etcd, "d-handed")
        return record is not None and (record.node, record.generation) == ("b", 2)

    wait_until(claimed_by_b, 10, "the registry's record swapped by b")
    for n in range(1, 50):
        device.publish(topic, str(n).encode(), 1)
    expected = [str(n).encode() for n in range(50)]
    wait_until(lambda: [p for _, p in read_log(brokers["c"], topic)] == expected, 30, "all 50 once, in order")
    watcher.expect_none(0.5)  # no will when a let the connection go
    device.kill()
    (will,) = watcher.expect(1)
    assert (will.topic, will.payload) == ("plant/d-handed/status", b"gone")
    watcher.expect_none(1.0)
    assert b"connection handed over to b" in brokers["a"].log_path.read_bytes()


def drained(client: PahoClient, quiet_s: float = 2.0) -> list:
    """Every message ``client`` has received, once nothing more arrives for ``quiet_s``."""
    messages = []
    with contextlib.suppress(queue.Empty):
        while True:
            messages.append(client.messages.get(timeout=quiet_s))
    return messages


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])
