"""Sessions and device offsets on a broker that holds no copy of their topics' partition: three broker
processes, replication factor 2 (each partition has one broker that only observes it), a real etcd, paho
clients.

A persistent session that moves to such a broker is redelivered everything after its last acknowledged
offset, read from the partition's leader, before live delivery goes on: once each, in order. A device that
subscribes there from an offset reads the log from that offset the same way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from broker_edge.placement import partition_of
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, close_all
from tests.e2e.cluster.proof import cluster_state, copies_spread, wait_settled, wait_until
from tests.e2e.cluster.test_device_offsets import device_from, numbered
from tests.e2e.commitlog.e2e_helpers import offset_of
from tests.harness.local_cluster import EtcdServer, EtcdTarget, cluster_broker

NODES = ("a", "b", "c")
PARTITIONS = 16
EXPIRY = 3600
VERSIONS = pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])


def spread(etcd: EtcdTarget) -> bool:
    """Every partition with two in-sync replicas among the three, copies spread within one: nothing moves
    while the test runs."""
    return copies_spread(etcd, NODES, PARTITIONS)


@pytest.fixture(scope="module")
def rf2(
    tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdServer
) -> Iterator[tuple[dict[str, BrokerProcess], EtcdTarget]]:
    """One cluster for the tests of this module (each uses its own client ids and topics)."""
    target = EtcdTarget(etcd_server, f"/observers-sessions-{os.getpid()}")
    directory = tmp_path_factory.mktemp("observers-sessions")
    brokers: dict[str, BrokerProcess] = {}
    try:
        for node in NODES:
            brokers[node] = cluster_broker(directory, target, node, {"replication_factor": 2}).start()
        wait_settled(target, set(NODES), 2, 60)
        wait_until(lambda: spread(target), 60, "copies spread over a, b, c", lambda: cluster_state(target))
        yield brokers, target
    finally:
        for broker in brokers.values():
            broker.stop()


@pytest.fixture
def three_rf2(rf2: tuple[dict[str, BrokerProcess], EtcdTarget]) -> Iterator[dict[str, BrokerProcess]]:
    yield rf2[0]
    close_all()


@pytest.fixture
def etcd(rf2: tuple[dict[str, BrokerProcess], EtcdTarget]) -> EtcdTarget:
    return rf2[1]


def topic_and_roles(etcd: EtcdTarget, prefix: str) -> tuple[str, str, str, str]:
    """A topic under ``prefix``, its partition's leader, its other replica, and the broker holding no copy
    of it."""
    state = cluster_state(etcd)
    for index in range(1000):
        topic = f"{prefix}/{index}"
        partition = state.partitions[partition_of(topic, PARTITIONS)]
        leader = partition.leader
        assert leader is not None
        follower = next(node for node in partition.replicas if node != leader)
        observer = next(node for node in NODES if node not in partition.replicas)
        return topic, leader, follower, observer
    raise AssertionError("unreachable")


def persistent(port: int, client_id: str, version: int) -> PahoClient:
    expiry = EXPIRY if version == 5 else None
    return PahoClient(port, client_id, version=version, clean=False, session_expiry=expiry)


def payloads(client: PahoClient, count: int) -> list[bytes]:
    return [message.payload for message in client.expect(count, timeout=15)]


@VERSIONS
@pytest.mark.mqtt5("MQTT-3.1.2-5", "MQTT-4.6.0-6")
@pytest.mark.mqtt311("MQTT-3.1.2-4", "MQTT-3.1.2-5", "MQTT-4.6.0-6")
@pytest.mark.parametrize("start_on", ["leader", "follower"])
def test_a_session_moving_to_a_broker_without_a_copy_gets_its_backlog_once_in_order(
    three_rf2, etcd, version, start_on
):
    """The session subscribed on a replica of the topic's partition, went away, and the messages published
    meanwhile were acknowledged; it comes back on the broker holding no copy of that partition: every one
    of them arrives, once, in order, then live ones (published on yet another broker)."""
    topic, leader, follower, observer = topic_and_roles(etcd, f"backlog/{version}/{start_on}")
    first = three_rf2[leader if start_on == "leader" else follower]
    elsewhere = three_rf2[follower if start_on == "leader" else leader]
    client_id = f"backlog-{version}-{start_on}"
    publisher = PahoClient(elsewhere.port, f"pub-{client_id}", version=version)

    subscriber = persistent(first.port, client_id, version)
    assert subscriber.subscribe(topic, 1) == [1]
    for n in range(3):
        publisher.publish(topic, f"m{n}".encode(), 1)
    assert payloads(subscriber, 3) == [b"m0", b"m1", b"m2"]
    subscriber.disconnect()  # the session stays (Clean Session 0 / Session Expiry Interval 3600)
    for n in range(3, 40):  # acknowledged while the client is away
        publisher.publish(topic, f"m{n}".encode(), 1)

    back = persistent(three_rf2[observer].port, client_id, version)

    assert back.connack_result[0].session_present
    assert payloads(back, 37) == [f"m{n}".encode() for n in range(3, 40)]
    back.expect_none(1.0)
    for n in range(40, 45):  # live again, published on the broker the session left
        PahoClient(first.port, f"late-{client_id}-{n}", version=version).publish(topic, f"m{n}".encode(), 1)
    assert payloads(back, 5) == [f"m{n}".encode() for n in range(40, 45)]
    back.expect_none(1.0)  # once each: nothing twice at the switch from the backlog to live delivery


@VERSIONS
@pytest.mark.mqtt5("MQTT-3.1.2-5", "MQTT-4.6.0-6")
@pytest.mark.mqtt311("MQTT-3.1.2-4", "MQTT-3.1.2-5", "MQTT-4.6.0-6")
def test_a_session_moving_to_a_broker_without_a_copy_while_messages_keep_coming_misses_none(
    three_rf2, etcd, version
):
    """Messages go on being published on the partition's leader while the session moves to the broker
    holding no copy: the backlog and the live messages join without a gap or a duplicate."""
    topic, leader, follower, observer = topic_and_roles(etcd, f"busy/{version}")
    client_id = f"busy-{version}"
    publisher = PahoClient(three_rf2[leader].port, f"pub-{client_id}", version=version)
    subscriber = persistent(three_rf2[follower].port, client_id, version)
    subscriber.subscribe(topic, 1)
    publisher.publish(topic, b"0", 1)
    assert payloads(subscriber, 1) == [b"0"]
    subscriber.disconnect()
    for n in range(1, 20):
        publisher.publish(topic, str(n).encode(), 1)
    infos = [publisher.client.publish(topic, str(n).encode(), 1) for n in range(20, 60)]  # not awaited
    back = persistent(three_rf2[observer].port, client_id, version)
    infos += [publisher.client.publish(topic, str(n).encode(), 1) for n in range(60, 200)]
    for info in infos:
        info.wait_for_publish(15)
        assert info.is_published()

    assert payloads(back, 199) == [str(n).encode() for n in range(1, 200)]
    back.expect_none(1.0)


@VERSIONS
def test_a_device_reads_its_offset_on_a_broker_without_a_copy_and_misses_nothing(three_rf2, etcd, version):
    """A device subscribes from an offset on the broker holding no copy of its topic's partition (having
    read part of the log elsewhere): it gets every record from that offset, once, in order, then live ones."""
    topic, leader, follower, observer = topic_and_roles(etcd, f"actions/devices/far-{version}")
    publisher = PahoClient(three_rf2[leader].port, f"platform-{version}", version=version)
    numbered(publisher, topic, 0, 10)
    device = device_from(three_rf2[follower].port, f"far-{version}", topic, "earliest", version)
    assert [m.payload for m in device.expect(10, timeout=15)] == [str(n).encode() for n in range(10)]
    device.kill()
    numbered(publisher, topic, 10, 14)  # while it is away

    moved = device_from(three_rf2[observer].port, f"far-{version}", topic, "6", version)

    resumed = moved.expect(8, timeout=15)
    assert [m.payload for m in resumed] == [str(n).encode() for n in range(6, 14)]
    if version == 5:
        assert [offset_of(m) for m in resumed] == list(range(6, 14))
    numbered(PahoClient(three_rf2[follower].port, f"platform-b-{version}", version=version), topic, 14, 15)
    [live] = moved.expect(1, timeout=15)
    assert live.payload == b"14"
    moved.expect_none(1.0)


@VERSIONS
@pytest.mark.mqtt5("MQTT-3.1.2-5")
@pytest.mark.mqtt311("MQTT-3.1.2-4", "MQTT-3.1.2-5")
def test_a_session_caught_up_on_a_broker_without_a_copy_moves_to_a_replica_without_its_past(
    three_rf2, etcd, version
):
    """A session that had everything on the broker observing its topic moves to a replica: nothing it
    already had comes again (its positions in the observed topic moved with it), what follows does."""
    topic, leader, follower, observer = topic_and_roles(etcd, f"caught/{version}")
    client_id = f"caught-{version}"
    publisher = PahoClient(three_rf2[leader].port, f"pub-{client_id}", version=version)
    subscriber = persistent(three_rf2[observer].port, client_id, version)
    subscriber.subscribe(topic, 1)
    for n in range(5):
        publisher.publish(topic, f"m{n}".encode(), 1)
    assert payloads(subscriber, 5) == [f"m{n}".encode() for n in range(5)]
    subscriber.disconnect()

    back = persistent(three_rf2[follower].port, client_id, version)

    assert back.connack_result[0].session_present
    back.expect_none(1.0)  # not m0..m4 again
    publisher.publish(topic, b"m5", 1)
    assert payloads(back, 1) == [b"m5"]
    back.expect_none(0.5)
