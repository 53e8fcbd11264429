"""An observer across a failover: three broker processes, replication factor 2, a real etcd, paho clients.

A subscriber is connected to the broker that holds no copy of a partition (it observes it: it fetches the
partition's committed records from its leader). The leader is killed (SIGKILL) while devices go on
publishing QoS 1 through the two survivors. Once the new leader is elected the observer goes on from where
it was: the subscriber gets every acknowledged message, once, in per-topic order, on a topic that was busy
before the kill, on one that had been quiet since before the subscription, and on one whose first message
was published after the kill.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from broker_edge.placement import partition_of
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, close_all
from tests.e2e.cluster.proof import Device, cluster_state, wait_settled, wait_until
from tests.e2e.cluster.test_observers_sessions import NODES, PARTITIONS, spread

PUBLISH_S = 1.5


def topics_in(partition: int, prefix: str, count: int) -> list[str]:
    """``count`` topics under ``prefix`` of ``partition``."""
    topics = [f"{prefix}/{n}" for n in range(5000) if partition_of(f"{prefix}/{n}", PARTITIONS) == partition]
    return topics[:count]


def sequences(received: list[tuple[str, bytes]], device: Device) -> list[int]:
    """The sequence numbers of ``device``'s messages the subscriber got, in the order it got them."""
    prefix = f"{device.client_id}:".encode()
    return [
        int(payload[len(prefix) :])
        for name, payload in received
        if name == device.topic and payload.startswith(prefix)
    ]


def acked_of(device: Device) -> set[int]:
    prefix = len(device.client_id) + 1
    return {int(payload[prefix:]) for payload in device.acked}


@pytest.mark.mqtt5("MQTT-4.6.0-6")
def test_an_observer_resumes_on_the_new_leader_and_its_subscriber_misses_nothing(
    cluster_brokers: Callable[..., BrokerProcess], etcd, request
):
    brokers = {
        node: cluster_brokers(node, replication_factor=2, min_insync_replicas=1, replica_lag_max_ms=2000)
        for node in NODES
    }
    request.addfinalizer(close_all)
    wait_settled(etcd, set(NODES), 2, 60)
    wait_until(lambda: spread(etcd), 60, "copies spread over a, b, c", lambda: cluster_state(etcd))
    state = cluster_state(etcd)
    observer = "c"
    number, victim = next(
        (n, p.leader) for n, p in sorted(state.partitions.items()) if observer not in p.replicas
    )
    assert victim is not None
    survivors = [brokers[node] for node in NODES if node != victim]
    busy, quiet, fresh = topics_in(number, "fo", 3)

    PahoClient(brokers[victim].port, "quiet-before", version=5).publish(quiet, b"before", 1)
    subscriber = PahoClient(brokers[observer].port, "watcher", version=5)
    assert subscriber.subscribe("fo/#", 1) == [1]
    received: list[tuple[str, bytes]] = []

    def drain(quiet_s: float) -> None:
        while True:
            try:
                message = subscriber.messages.get(timeout=quiet_s)
            except Exception:
                return
            received.append((message.topic, message.payload))

    busy_device = Device("busy", busy, survivors)
    busy_device.start()
    time.sleep(PUBLISH_S)
    assert busy_device.acked
    brokers[victim].kill()
    quiet_device = Device("quiet", quiet, survivors, start_at=1)
    fresh_device = Device("fresh", fresh, survivors)
    quiet_device.start()
    fresh_device.start()
    wait_until(
        lambda: cluster_state(etcd).partitions[number].leader not in (None, victim),
        30,
        "a new leader",
        lambda: cluster_state(etcd),
    )
    wait_until(
        lambda: len(quiet_device.acked) > 20 and len(fresh_device.acked) > 20,
        30,
        "publishes acknowledged on the new leader",
        lambda: [(d.client_id, len(d.acked), d.refused, d.failures) for d in (quiet_device, fresh_device)],
    )
    time.sleep(PUBLISH_S)
    devices = (busy_device, quiet_device, fresh_device)
    for device in devices:
        device.stopping.set()
    for device in devices:
        device.join(10)

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        drain(0.5)
        if all(acked_of(device) <= set(sequences(received, device)) for device in devices):
            break
    drain(1.0)
    for device in devices:
        got = sequences(received, device)
        missing = sorted(acked_of(device) - set(got))
        assert not missing, f"{device.topic}: {len(missing)} acknowledged, never delivered: {missing[:20]}"
        twice = sorted({n for n in got if got.count(n) > 1})
        assert not twice, f"{device.topic}: delivered twice: {twice[:20]}"
        assert got == sorted(got), f"{device.topic}: out of order"
    assert (quiet, b"before") not in received  # published before the SUBACK
