"""etcd authenticated and never believed blindly: what someone able to write the cluster's keys in etcd
(an etcd operator's account, a leaked root password) achieves, and what a stranger to etcd achieves, on a
real cluster whose members prove who they are with TLS and whose etcd has TLS and user auth on.

Records written into etcd by hand (as root over etcd's own gateway) are the attacks: a member that is no
member, a leader that never proved itself, a leader that lacks acknowledged records, and each malformed
value that once stopped the controller, left partitions without a leader or made publishes hang. Each test
asserts the attack gets nothing (no request, no copy, no truncation) and that nothing acknowledged is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from broker_edge.cluster.coordination.etcd import EtcdError
from broker_edge.cluster.coordination.etcd_values import BadValue, parse_partition_state
from broker_edge.placement import Member, PartitionState, partition_of
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.cluster.intruders import READER_SECTIONS, READER_TOKEN, Recorder
from tests.e2e.cluster.proof import (
    Device,
    check_nothing_acknowledged_was_lost,
    cluster_state,
    copies_spread,
    read_log,
    wait_settled,
    wait_until,
)
from tests.e2e.cluster.test_trust_members import topic_led_by
from tests.harness.local_cluster import EtcdTarget

pytestmark = pytest.mark.timeout(180)

NODES = ("a", "b", "c")
LEASE_TTL_S = 3.0
"""The members' lease (``cluster.lease_ttl_s`` of these clusters)."""
GRACE_S = 2 * LEASE_TTL_S
"""How long a registered member has to prove its node id (``member_proofs``: twice the lease)."""


def start_three(cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget, **cluster: object) -> dict:
    brokers = {node: cluster_brokers(node, sections=READER_SECTIONS, **cluster) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    wait_until(lambda: all(cluster_state(etcd).leaders().get(n, 0) for n in NODES), what="every node leads")
    return brokers


def start_devices(brokers: dict[str, BrokerProcess], etcd: EtcdTarget, prefix: str) -> list[Device]:
    order = [brokers[node] for node in NODES]
    devices = [
        Device(f"{prefix}-{n}", topic_led_by(etcd, node, f"{prefix}/{node}")[0], order, start_at=n)
        for n, node in enumerate(NODES)
    ]
    for device in devices:
        device.start()
    return devices


def stop_and_check(devices: list[Device], brokers: list[BrokerProcess]) -> None:
    for device in devices:
        device.stop()
    check_nothing_acknowledged_was_lost(devices, brokers, READER_TOKEN)


def logs_of(brokers: dict[str, BrokerProcess]) -> str:
    return "".join(broker.log_path.read_text(errors="replace") for broker in brokers.values())


def forged_member(node: str, recorder: Recorder) -> Member:
    address = f"127.0.0.1:{recorder.port}"
    return Member(node, address, f"http://{address}", f"https://{address}")


def test_etcd_refuses_strangers_and_a_clusters_user_reaches_its_prefix_only(etcd: EtcdTarget) -> None:
    async def scenario() -> None:
        user = etcd.client(timeout_s=1.0)
        try:
            await user.put(f"{etcd.prefix}/probe", b"1")  # its own prefix: yes
            with pytest.raises(EtcdError, match="permission denied"):
                await user.put("/another-cluster/config", b"{}")
            with pytest.raises(EtcdError, match="permission denied"):
                await user.get_prefix("/")
        finally:
            await user.close()
        tls_only = etcd.client(timeout_s=1.0)
        tls_only._client._auth = None  # a client certificate, no user: etcd knows it as nobody
        try:
            with pytest.raises(EtcdError, match=r"permission denied|user name"):
                await tls_only.get(f"{etcd.prefix}/probe")
        finally:
            await tls_only.close()
        from broker_edge.cluster.coordination.etcd import Etcd

        plain = Etcd([etcd.url.replace("https://", "http://")], 1.0)  # no TLS: no connection at all
        try:
            with pytest.raises(EtcdError):
                await plain.get(f"{etcd.prefix}/probe")
        finally:
            await plain.close()

    asyncio.run(scenario())


def test_a_member_record_written_into_etcd_gets_no_request_no_token_and_no_copy(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> None:
    brokers = start_three(cluster_brokers, etcd)
    devices = start_devices(brokers, etcd, "m")
    with Recorder() as recorder:
        # "zz" sorts after a, b and c: every broker dials it, as it dials any member after it
        etcd.server.put(f"{etcd.prefix}/members/zz", forged_member("zz", recorder).to_json().encode())
        assert wait_for(lambda: recorder.connections >= 3, timeout=10)
        time.sleep(GRACE_S + 2)  # past the time it had to prove it is zz: the controller's passes ran
        assert recorder.received[:1] == b"\x16"  # a TLS ClientHello is all it was sent
        for secret in (b"HTTP/1.1", b"/v1/", b"Authorization", READER_TOKEN.encode(), b"X-Timestone-Node"):
            assert not recorder.saw(secret), secret
        state = cluster_state(etcd)
        assert "zz" in state.members
        for partition in state.partitions.values():
            assert "zz" not in (partition.leader, *partition.replicas, *partition.isr), partition
    assert "peer link to zz up" not in logs_of(brokers)
    stop_and_check(devices, list(brokers.values()))


def test_a_member_a_record_invents_leaves_the_replica_lists_once_it_is_not_live(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> None:
    brokers = start_three(cluster_brokers, etcd)
    devices = start_devices(brokers, etcd, "r")
    _, number = topic_led_by(etcd, "a", "r/a")
    wait_until(lambda: len(devices[0].acked) >= 5, what="acknowledged records on a's partition")

    def replicas() -> tuple[str, ...]:
        return cluster_state(etcd).partitions[number].replicas

    def name(node: str) -> None:
        before = cluster_state(etcd).partitions[number]
        etcd.server.put(
            f"{etcd.prefix}/partitions/{number}",
            replace(before, replicas=(*before.replicas, node)).to_json().encode(),
        )

    # a replica no member record names is not live: it leaves at the controller's next pass
    name("ghost")
    wait_until(lambda: "ghost" not in replicas(), LEASE_TTL_S, "ghost left the replicas", replicas)
    with Recorder() as recorder:
        # one with a record of its own is live while it has time to prove who it is, then taken for dead
        etcd.server.put(f"{etcd.prefix}/members/zz", forged_member("zz", recorder).to_json().encode())
        name("zz")
        wait_until(lambda: "zz" not in replicas(), GRACE_S + LEASE_TTL_S, "zz left the replicas", replicas)
    state = cluster_state(etcd).partitions[number]
    assert state.leader == "a" and set(state.replicas) == set(NODES) == set(state.isr)
    assert "dead ghost left the replicas" in logs_of(brokers) and "dead zz left the replicas" in logs_of(
        brokers
    )
    acknowledged = len(devices[0].acked)
    wait_until(lambda: len(devices[0].acked) > acknowledged + 5, what="publishes acknowledged all along")
    stop_and_check(devices, list(brokers.values()))


def test_a_partition_record_naming_a_leader_that_never_proved_itself_truncates_nothing(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> None:
    brokers = start_three(cluster_brokers, etcd)
    devices = start_devices(brokers, etcd, "p")
    _, number = topic_led_by(etcd, "a", "p/a")  # the partition of devices[0]'s topic
    wait_until(lambda: len(devices[0].acked) >= 5, what="acknowledged records on a's partition")
    with Recorder() as recorder:
        etcd.server.put(f"{etcd.prefix}/members/zz", forged_member("zz", recorder).to_json().encode())
        before = cluster_state(etcd).partitions[number]
        forged = replace(before, leader="zz", epoch=before.epoch + 1, isr=("zz", *before.isr))
        forged = replace(forged, replicas=("zz", *before.replicas))
        etcd.server.put(f"{etcd.prefix}/partitions/{number}", forged.to_json().encode())
        # the replicas cannot reach "zz" as zz; once its time to prove it has passed, the controller takes it
        # for dead and elects an in-sync replica, as for a leader that died
        wait_until(
            lambda: (
                cluster_state(etcd).partitions[number].leader in NODES
                and cluster_state(etcd).partitions[number].epoch > forged.epoch
            ),
            30,
            "a member elected again",
            lambda: cluster_state(etcd).partitions[number],
        )
        assert not recorder.saw(b"/v1/") and not recorder.saw(b"HTTP/1.1")
    wait_until(lambda: len(devices[0].acked) > 10, what="publishes acknowledged again")
    # a replica may cut a tail nobody acknowledged (appended by the leader the forged record deposed: the
    # epoch rule); what was acknowledged is on every broker, once, at one offset
    stop_and_check(devices, list(brokers.values()))


def test_a_partition_record_electing_a_member_that_lacks_acknowledged_records_truncates_nothing(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> None:
    # Four brokers, three copies of each partition: a partition that d holds no copy of is given to d as
    # its leader by hand, a well-formed lie about a real member (proven, alive) that lacks every record of
    # it. Its replicas hold acknowledged records d lacks, and must not cut them.
    nodes = ("a", "b", "c", "d")
    brokers = {node: cluster_brokers(node, sections=READER_SECTIONS) for node in nodes}
    wait_until(lambda: copies_spread(etcd, nodes, 16, 3), 60, "copies spread over a, b, c, d")
    time.sleep(1.0)  # a controller pass after the last move: nothing left to move
    state = cluster_state(etcd)
    count = len(state.partitions)
    number, topic = next(
        (partition_of(t, count), t)
        for t in (f"meter/{n}" for n in range(10_000))
        if "d" not in state.partitions[partition_of(t, count)].replicas
    )
    before = state.partitions[number]
    assert before.leader is not None
    publisher = PahoClient(brokers[before.leader].port, "meter-9")
    acknowledged = [f"r{n}".encode() for n in range(10)]
    for payload in acknowledged:
        publisher.publish(topic, payload, 1)
    publisher.close()
    forged = replace(before, leader="d", epoch=before.epoch + 1, replicas=("d", *before.replicas), isr=("d",))
    etcd.server.put(f"{etcd.prefix}/partitions/{number}", forged.to_json().encode())
    refused = "below its committed end 10: refused"
    wait_until(
        lambda: logs_of(brokers).count(refused) >= 3,
        20,
        "every replica refusing to cut its log",
        lambda: cluster_state(etcd).partitions[number],
    )
    for node in before.replicas:
        assert [payload for _, payload in read_log(brokers[node], topic, READER_TOKEN)] == acknowledged
    # an operator puts the record right: the old leader leads again, and nothing was lost anywhere
    fixed = replace(before, epoch=forged.epoch + 1)
    etcd.server.put(f"{etcd.prefix}/partitions/{number}", fixed.to_json().encode())
    publisher = PahoClient(brokers[before.leader].port, "meter-9")
    publisher.publish(topic, b"r10", 1)
    for node in before.replicas:

        def complete(node: str = node) -> bool:
            return [p for _, p in read_log(brokers[node], topic, READER_TOKEN)] == [*acknowledged, b"r10"]

        wait_until(complete, 30, f"every acknowledged record on {node}")
    assert "diverged from the leader" not in logs_of(brokers)


def _bad_partition(etcd: EtcdTarget, value: Callable[[PartitionState], bytes]) -> Callable[[], int]:
    def write() -> int:
        number = 1
        state = cluster_state(etcd).partitions[number]
        etcd.server.put(f"{etcd.prefix}/partitions/{number}", value(state))
        return number

    return write


def readable(etcd: EtcdTarget, number: int) -> PartitionState | None:
    """Partition ``number``'s record as etcd holds it, when it passes the brokers' checks."""
    for _, value in etcd.server.range(f"{etcd.prefix}/partitions/{number}"):
        with contextlib.suppress(BadValue):
            return parse_partition_state(number, value, 16)
    return None


MALFORMED = {
    "an unparsable partition record": lambda etcd: _bad_partition(etcd, lambda s: b"{not json")(),
    "an epoch of 2**64": lambda etcd: _bad_partition(
        etcd, lambda s: json.dumps({**json.loads(s.to_json()), "epoch": 2**64}).encode()
    )(),
    "a leader outside its in-sync set": lambda etcd: _bad_partition(
        etcd, lambda s: json.dumps({**json.loads(s.to_json()), "leader": "nobody"}).encode()
    )(),
    "a stored partition count of 0": lambda etcd: etcd.server.put(
        f"{etcd.prefix}/config", b'{"partitions": 0}'
    ),
    "a controller key held by no member": lambda etcd: etcd.server.put(f"{etcd.prefix}/controller", b"\xff"),
    "a member record that is not JSON": lambda etcd: etcd.server.put(f"{etcd.prefix}/members/zz", b"[1,2"),
}


@pytest.mark.parametrize("malformed", sorted(MALFORMED))
def test_a_malformed_value_stops_neither_the_controller_nor_failovers_nor_publishes(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget, malformed: str
) -> None:
    brokers = start_three(cluster_brokers, etcd, lease_ttl_s=2)
    devices = start_devices(brokers, etcd, "v")
    wait_until(lambda: all(len(device.acked) >= 3 for device in devices), what="publishes acknowledged")
    good = cluster_state(etcd)
    tampered = MALFORMED[malformed](etcd)
    time.sleep(1.0)
    counts = [len(device.acked) for device in devices]
    wait_until(
        lambda: all(len(d.acked) > count + 5 for d, count in zip(devices, counts, strict=True)),
        what="every device still acknowledged",
    )
    if isinstance(tampered, int):  # a partition's record: written back from the last good one
        wait_until(lambda: readable(etcd, tampered) is not None, 20, "the record repaired")
        repaired = readable(etcd, tampered)
        assert repaired is not None and repaired.epoch >= good.partitions[tampered].epoch
    # a failover after it: the controller still runs, and elects
    victim = "c"
    led = {n for n, p in cluster_state(etcd).partitions.items() if p.leader == victim}
    assert led
    brokers[victim].kill()
    wait_until(
        lambda: all(cluster_state(etcd).partitions[n].leader in ("a", "b") for n in led),
        30,
        f"{victim}'s partitions led by a and b",
        lambda: cluster_state(etcd),
    )
    counts = [len(device.acked) for device in devices]
    wait_until(
        lambda: all(len(d.acked) > count + 3 for d, count in zip(devices, counts, strict=True)),
        30,
        "acknowledged after the failover",
    )
    assert "ignoring etcd key" in logs_of(brokers)  # it was seen, and said so
    stop_and_check(devices, [brokers["a"], brokers["b"]])


def test_an_etcd_restart_forgets_every_token_and_the_members_authenticate_again(
    cluster_brokers: Callable[..., BrokerProcess], private_etcd: EtcdTarget, tmp_path: Path
) -> None:
    brokers = {node: cluster_brokers(node, target=private_etcd, sections=READER_SECTIONS) for node in NODES}
    wait_settled(private_etcd, set(NODES), 3)
    devices = start_devices(brokers, private_etcd, "r")
    wait_until(lambda: all(len(device.acked) >= 3 for device in devices), what="publishes acknowledged")
    private_etcd.server.kill()  # kill -9: its auth tokens are gone with it
    private_etcd.server.start()
    counts = [len(device.acked) for device in devices]
    wait_until(
        lambda: all(len(d.acked) > count + 10 for d, count in zip(devices, counts, strict=True)),
        30,
        "acknowledged again after etcd came back",
    )
    brokers["b"].kill()  # and the cluster still fails over: the controller reads and writes etcd again
    wait_until(
        lambda: (
            "b" not in cluster_state(private_etcd).leaders() and len(cluster_state(private_etcd).members) == 2
        ),
        30,
        "b's partitions led by a and c",
    )
    stop_and_check(devices, [brokers["a"], brokers["c"]])
