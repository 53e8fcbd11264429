"""A reader is never a member: the attacks of someone holding the readers' token (what the Spark source and
notebooks are given), on a real cluster whose members prove who they are with TLS, and whose etcd has TLS
and user auth on.

Each test makes the attack as it was made, asserts it is refused at the door, and that nothing
acknowledged is lost: devices publish QoS 1 through every broker meanwhile, and every acknowledged message
is then in its topic's log on every broker, once, at one offset.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.placement import partition_of
from broker_edge.runtime.launcher import BrokerProcess
from broker_edge.runtime.local_pki import LocalPki
from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.cluster.conftest import EtcdTarget
from tests.e2e.cluster.intruders import (
    READER_SECTIONS,
    READER_TOKEN,
    client_context,
    forge_fetch,
    members_url,
    open_peer_link,
)
from tests.e2e.cluster.proof import (
    Device,
    check_nothing_acknowledged_was_lost,
    cluster_state,
    read_log,
    wait_settled,
    wait_until,
)
from tests.harness.local_cluster import leadership_settled

pytestmark = pytest.mark.timeout(180)

NODES = ("a", "b", "c")


def topic_led_by(target: EtcdTarget, leader: str, prefix: str) -> tuple[str, int]:
    """A topic whose partition ``leader`` leads, and that partition, once ``leader`` leads one and the
    controller moves no more leadership (a member that has just joined may be in every in-sync set before
    the controller hands it any leadership, and a publish to a partition whose leader moves is refused)."""
    wait_until(
        lambda: cluster_state(target).leaders().get(leader, 0) > 0 and leadership_settled(target),
        what=f"{leader} leading one, leadership settled",
        state=lambda: cluster_state(target),
    )
    state = cluster_state(target)
    count = len(state.partitions)
    for n in range(10_000):
        topic = f"{prefix}/{n}"
        number = partition_of(topic, count)
        if state.partitions[number].leader == leader:
            return topic, number
    raise AssertionError(f"no topic led by {leader}")


def start_three(cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget, **cluster: object) -> dict:
    brokers = {node: cluster_brokers(node, sections=READER_SECTIONS, **cluster) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    wait_until(lambda: all(cluster_state(etcd).leaders().get(n, 0) for n in NODES), what="every node leads")
    return brokers


def test_the_readers_token_opens_no_peer_link_and_gets_nothing_a_member_gets(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget, tmp_path: Path
) -> None:
    brokers = start_three(cluster_brokers, etcd)
    order = [brokers[node] for node in NODES]
    devices = [
        Device(f"meter-{n}", topic_led_by(etcd, node, f"plant/{node}")[0], order, start_at=n)
        for n, node in enumerate(NODES)
    ]
    for device in devices:
        device.start()
    # what a link would have carried: QoS 0 traffic, a persistent session to take over
    subscriber = PahoClient(brokers["c"].port, "dashboard")
    subscriber.subscribe("live/#", 0)
    victim = PahoClient(brokers["b"].port, "victim", clean=False, session_expiry=300)
    victim.subscribe("alerts/victim", 1)

    cluster_ca = LocalPki(tmp_path / "cluster-pki", "cluster-ca")  # the CA the members' certificates are of
    other_ca = LocalPki(tmp_path / "other-ca")
    readers, members = brokers["a"].offsets_url, members_url(etcd, "a")
    attempts = {
        # the offsets API a reader reaches: there is no peer endpoint there at all
        "reader API as a stranger": open_peer_link(readers, "zz", READER_TOKEN),
        "reader API as member b": open_peer_link(readers, "b", READER_TOKEN),
        # the members' endpoint: a TLS handshake needs a certificate of the cluster CA
        "members' endpoint, token only": open_peer_link(members, "b", READER_TOKEN, client_context()),
        "members' endpoint, another CA's certificate of b": open_peer_link(
            members, "b", READER_TOKEN, client_context(other_ca, "b")
        ),
        # a certificate of the cluster CA: only a current member, and only as itself
        "members' endpoint, a non-member's certificate": open_peer_link(
            members, "zz", None, client_context(cluster_ca, "zz")
        ),
        "members' endpoint, c's certificate claiming b": open_peer_link(
            members, "b", None, client_context(cluster_ca, "c")
        ),
    }
    for what, attempt in attempts.items():
        assert not attempt.opened and attempt.received == 0, f"{what}: {attempt}"
    assert attempts["reader API as a stranger"].status == 404
    assert attempts["reader API as member b"].status == 404
    assert attempts["members' endpoint, token only"].status is None  # no handshake, no HTTP answer
    assert attempts["members' endpoint, another CA's certificate of b"].status is None
    assert attempts["members' endpoint, a non-member's certificate"].status == 403
    assert attempts["members' endpoint, c's certificate claiming b"].status == 403

    # QoS 0 traffic still reaches the members' subscribers (a stranger's link would have had it too)
    PahoClient(brokers["a"].port, "sensor").publish("live/temp", b"21.5", 0)
    assert subscriber.expect(1)[0].payload == b"21.5"
    # the session was not taken over: its client is still connected and served
    PahoClient(brokers["a"].port, "ops").publish("alerts/victim", b"check", 1)
    assert victim.expect(1)[0].payload == b"check"
    assert victim.disconnects.empty()
    # nothing was appended or acknowledged by anyone else: every acknowledged message is on every broker
    for device in devices:
        device.stop()
    check_nothing_acknowledged_was_lost(devices, order, READER_TOKEN)


def test_a_forged_follower_fetch_moves_no_watermark_and_nothing_acknowledged_is_lost(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget, tmp_path: Path
) -> None:
    # a long lease and lag bound: a follower stopped for a while stays a member in sync, as in the attack,
    # where the follower was simply slower than the forged fetch
    brokers = start_three(cluster_brokers, etcd, lease_ttl_s=30, replica_lag_max_ms=60_000)
    topic, number = topic_led_by(etcd, "a", "meter")
    state = cluster_state(etcd).partitions[number]
    assert set(state.isr) == set(NODES)
    publisher = PahoClient(brokers["a"].port, "meter-1")
    for n in range(3):
        publisher.publish(topic, f"reading {n}".encode(), 1)
    follower = brokers["c"].process
    assert follower is not None
    os.kill(follower.pid, signal.SIGSTOP)  # c cannot fetch: the leader waits for it
    try:
        held = publisher.client.publish(topic, b"reading 3", 1)
        cluster_ca = LocalPki(tmp_path / "cluster-pki", "cluster-ca")
        members = members_url(etcd, "a")
        forged = {  # "c holds all 4 records durably": what moved the watermark
            "reader API, token": forge_fetch(
                brokers["a"].offsets_url, "c", number, state.epoch, topic, 4, READER_TOKEN
            ),
            "members' endpoint, token only": forge_fetch(
                members, "c", number, state.epoch, topic, 4, READER_TOKEN, client_context()
            ),
            "members' endpoint, b's certificate as c": forge_fetch(
                members, "c", number, state.epoch, topic, 4, None, client_context(cluster_ca, "b")
            ),
        }
        assert forged["reader API, token"].status == 404
        assert forged["members' endpoint, token only"].status is None
        assert forged["members' endpoint, b's certificate as c"].status == 403
        assert not wait_for(held.is_published, timeout=2.0)  # the leader still waits for c
    finally:
        os.kill(follower.pid, signal.SIGCONT)
    assert wait_for(held.is_published, timeout=15)  # once c has it, for real
    assert [payload for _, payload in read_log(brokers["c"], topic, READER_TOKEN)][-1] == b"reading 3"
    brokers["a"].stop()  # the leader goes: an in-sync replica takes over, with every acknowledged record
    wait_until(lambda: cluster_state(etcd).partitions[number].leader in ("b", "c"), 30, "a new leader")
    for node in ("b", "c"):
        payloads = [payload for _, payload in read_log(brokers[node], topic, READER_TOKEN)]
        assert payloads == [f"reading {n}".encode() for n in range(4)], node
