"""The in-sync set: a follower that stops leaves it and rejoins once caught up after a restart (``timestone
cluster status`` shows both); with fewer in-sync replicas than ``min_insync_replicas`` QoS 1/2 publishes are
refused (v5: 0x83 with a reason string; v3.1.1: the connection closes), never acknowledged.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from broker_edge.placement import partition_of
from broker_edge.protocol.packets import PubAck, Publish, PubRec
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, RawClient, close_all
from tests.e2e.cluster.proof import (
    cluster_state,
    cluster_status,
    logged,
    metric,
    read_log,
    status_in_sync,
    wait_settled,
    wait_until,
)

NODES = ("a", "b", "c")
LAG_MS = 1000


def _same_log(one: BrokerProcess, other: BrokerProcess, topic: str) -> bool:
    return read_log(one, topic) == read_log(other, topic)


def partition_gauges(broker: BrokerProcess) -> dict[str, float]:
    """The member's ``partitions_*`` gauges (docs/observability.md)."""
    kinds = ("led", "under_replicated", "below_min_insync", "leaderless")
    return {kind: metric(broker, f"timestone_broker_partitions_{kind}") for kind in kinds}


def _short_of_c(broker: BrokerProcess, node: str, etcd) -> bool:
    led = sum(p.leader == node for p in cluster_state(etcd).partitions.values())
    gauges = partition_gauges(broker)
    return gauges == {"led": led, "under_replicated": led, "below_min_insync": led, "leaderless": 0}


def _healthy(brokers: Iterable[BrokerProcess], partitions: int) -> bool:
    gauges = [partition_gauges(broker) for broker in brokers]
    return sum(g["led"] for g in gauges) == partitions and all(
        g["under_replicated"] == g["below_min_insync"] == g["leaderless"] == 0 for g in gauges
    )


def test_a_stopped_follower_leaves_the_in_sync_set_and_rejoins_after_restart(cluster_brokers, etcd):
    brokers = {node: cluster_brokers(node, replica_lag_max_ms=LAG_MS) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    publisher = PahoClient(brokers["a"].port, "writer")

    brokers["c"].stop()
    wait_until(
        lambda: all("c" not in p.isr for p in cluster_state(etcd).partitions.values()),
        what="c out of every in-sync set",
    )
    assert not any("c" in p.isr for p in cluster_state(etcd).partitions.values())
    # the operator sees it too, once c's lease is gone (a leader may drop a stopping follower from its
    # in-sync set for lag before the lease is revoked)
    wait_until(
        lambda: (
            (away := cluster_status(etcd)) is not None
            and status_in_sync(away, "c") == 0
            and "c" not in [m["node_id"] for m in away["members"]]
        ),
        what="cluster status showing c gone and out of every in-sync set",
    )
    for n in range(50):  # written while c is away: c must catch up on them to rejoin
        publisher.publish(f"isr/dev-{n % 5}", f"m{n}".encode(), 1)

    brokers["c"].start()
    wait_settled(etcd, set(NODES), 3)
    assert status_in_sync(cluster_status(etcd), "c") == len(cluster_state(etcd).partitions)
    for n in range(5):
        topic = f"isr/dev-{n}"
        wait_until(partial(_same_log, brokers["c"], brokers["a"], topic), what=f"{topic} on c")
        assert len(read_log(brokers["c"], topic)) == 10
    close_all()


def test_fewer_in_sync_replicas_than_min_insync_refuses_publishes(cluster_brokers, etcd):
    brokers = {
        node: cluster_brokers(node, replica_lag_max_ms=LAG_MS, min_insync_replicas=3) for node in NODES
    }
    wait_settled(etcd, set(NODES), 3)
    partitions = len(cluster_state(etcd).partitions)
    # each member's gauges read its own view, which follows etcd's watch a moment behind: settled in etcd,
    # a member may still count a partition whose leadership just moved away from it
    wait_until(
        partial(_healthy, brokers.values(), partitions),
        what="every partition led once and fully in sync in the members' gauges",
        state=lambda: {node: partition_gauges(broker) for node, broker in brokers.items()},
    )
    brokers["c"].stop()
    wait_until(
        lambda: all("c" not in p.isr for p in cluster_state(etcd).partitions.values()),
        what="c out of every in-sync set",
    )
    state = cluster_state(etcd)
    for node in ("a", "b"):  # every partition a member leads is short of c's copy, and of min_insync
        wait_until(
            partial(_short_of_c, brokers[node], node, etcd),
            what=f"{node}'s gauges missing c's copies",
            state=partial(partition_gauges, brokers[node]),
        )
    led_by_a = next(
        f"risk/{n}"
        for n in range(1000)
        if state.partitions[partition_of(f"risk/{n}", partitions)].leader == "a"
    )
    led_by_b = next(
        f"risk/{n}"
        for n in range(1000)
        if state.partitions[partition_of(f"risk/{n}", partitions)].leader == "b"
    )

    v5 = RawClient(brokers["a"].port, 5)
    v5.connect("v5-device")
    v5.send_packet(Publish(led_by_a, b"here", 1, packet_id=1))
    v5.send_packet(Publish(led_by_b, b"forwarded", 2, packet_id=2))
    acks = [v5.recv(), v5.recv()]
    assert [(type(a), a.packet_id, a.reason_code) for a in acks] == [(PubAck, 1, 0x83), (PubRec, 2, 0x83)]
    assert all("min_insync_replicas" in a.properties.reason_string for a in acks)

    v3 = RawClient(brokers["a"].port, 4)
    v3.connect("v3-device")
    v3.send_packet(Publish(led_by_b, b"forwarded", 1, packet_id=3))
    assert v3.closed(), "a v3.1.1 publisher is disconnected, never acknowledged"

    for topic in (led_by_a, led_by_b):
        assert read_log(brokers["a"], topic) == [] and read_log(brokers["b"], topic) == []
    close_all()


def test_an_in_sync_set_change_etcd_does_not_answer_is_said_in_a_line_and_tried_again(
    cluster_brokers, private_etcd
):
    """etcd stopped (SIGSTOP) while the leases still hold (10 s): the leader's removal of a killed follower
    from the in-sync sets fails (etcd does not answer), is said in one line per partition and try, and is
    tried again at a later check, where it ended its task with the exception, which asyncio logged at ERROR
    with a traceback (``Task exception was never retrieved``)."""
    brokers = {
        node: cluster_brokers(
            node, target=private_etcd, replica_lag_max_ms=LAG_MS, lease_ttl_s=10, replication_factor=2
        )
        for node in ("a", "b")
    }
    wait_settled(private_etcd, {"a", "b"}, 2)
    leader = brokers["a"]
    tried = "b not removed from the in-sync replicas of partition"
    private_etcd.server.pause()
    try:
        brokers["b"].kill()
        wait_until(
            lambda: logged(leader, tried) > 0 or logged(leader, "Task exception was never retrieved") > 0,
            what="a's removal of b from the in-sync sets failed",
        )
    finally:
        private_etcd.server.resume()
    wait_until(
        lambda: all(p.isr == ("a",) for p in cluster_state(private_etcd).partitions.values()),
        what="b out of every in-sync set once etcd answers",
    )
    assert logged(leader, "Task exception was never retrieved") == 0
    assert logged(leader, "Traceback") == 0
