"""A follower that will not truncate is out of sync, not a partition that waits for it.

A member whose leader epochs of one partition are gone (its `log/NN/leader-epochs` deleted while it was
stopped) cannot show the leader that its committed records are the leader's: the leader tells it to cut
them, and it refuses (acknowledged records are never truncated without `unclean_election`), session after
session. The leader used to count it caught up (its positions were the leader's ends) and add it back to the
partition's in-sync set, whose watermark then waited for it: no publish on the partition was acknowledged
again. The leader now counts a replica behind a topic from the time its position first diverged until it
reports one that does not, across its sessions: it leaves the in-sync set after `replica_lag_max_ms`, is
not added back while it refuses, and every publish is acknowledged and kept; its refusal names the lost
journal and what to do. The partition's leader may change as c comes back (the balancing gives c
leaderships and evens out the others): the one leading once that is done keeps c out just the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient
from tests.e2e.cluster.proof import cluster_state, leadership_spread, wait_settled, wait_until
from tests.e2e.cluster.test_trust_members import topic_led_by
from tests.harness.local_cluster import EtcdTarget

pytestmark = pytest.mark.timeout(120)

LAG_MS = 2000
COUNT = 20


def test_a_replica_refusing_to_truncate_leaves_the_in_sync_set_and_publishes_go_on(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> None:
    brokers = {node: cluster_brokers(node, replica_lag_max_ms=LAG_MS) for node in "abc"}
    wait_settled(etcd, set("abc"), 3, processes=brokers)
    # no leadership move under way: one moving this partition to c while it refuses would end the refusals
    wait_until(lambda: leadership_spread(etcd, ("a", "b", "c")), what="leadership spread over a, b, c")
    topic, number = topic_led_by(etcd, "a", "epochs-lost")
    publisher = PahoClient(brokers["a"].port, "before")
    for n in range(COUNT):
        publisher.publish(topic, f"before {n}", 1)
    publisher.close()
    victim = brokers["c"]
    victim.stop()  # acknowledged by all three: c holds them committed
    # out of the in-sync set before it comes back: one back in time (its stop not noticed yet) is in sync
    # and as far as the leader, so the balancing may give it the partition
    wait_until(lambda: "c" not in cluster_state(etcd).partitions[number].isr, what="c out of the in-sync set")
    journal = victim.config_path.parent / "data" / "log" / f"{number:02d}" / "leader-epochs"
    journal.unlink()
    victim.start()
    refused = f"below its committed end {COUNT}: refused"
    wait_until(lambda: refused in victim.log_path.read_text(), what="c refusing to truncate")
    assert (
        f"holds no leader epoch of it ({journal} lost or damaged): stop this broker"
        in victim.log_path.read_text()
    )

    # c back as a member takes leaderships over, and the balancing may move this partition from a to b
    # meanwhile: publishes start once every move is done (one made while its partition moves may be refused)
    wait_until(
        lambda: leadership_spread(etcd, ("a", "b", "c")) and in_sync_elsewhere(etcd, "c", number),
        what="leaderships spread again with c in sync on its other partitions",
    )
    leader = cluster_state(etcd).partitions[number].leader
    assert leader in ("a", "b"), story(brokers, number)  # never c, which is out of the in-sync set

    acknowledged: list[int] = []
    publisher = PahoClient(brokers["a"].port, "after")
    publisher.client.on_publish = lambda _client, _data, mid, _reason, _props: acknowledged.append(mid)
    sent: list[int] = []
    for n in range(COUNT):  # over three times the lag: the leader's checks of its in-sync set run meanwhile
        sent.append(publisher.client.publish(topic, f"after {n}", 1).mid)
        time.sleep(3 * LAG_MS / 1000 / COUNT)
    wait_until(
        lambda: set(sent) <= set(acknowledged),
        LAG_MS / 1000 + 15,
        "every publish acknowledged with c refusing",
        lambda: (len(acknowledged), cluster_state(etcd).partitions[number]),
    )
    publisher.close()

    state = cluster_state(etcd).partitions[number]
    assert state.leader == leader, state  # c's refusals moved no leadership
    assert "c" not in state.isr
    deadline = time.monotonic() + 2 * LAG_MS / 1000
    while time.monotonic() < deadline:  # not added back while it refuses
        assert "c" not in cluster_state(etcd).partitions[number].isr
        time.sleep(0.2)
    wait_until(lambda: in_sync_elsewhere(etcd, "c", number), what="c in sync on every other partition")
    with OffsetsClient(brokers["a"].offsets_url) as client:
        rows = client.fetch(topic, 0, max_records=1000).data.to_pylist()
    assert [row["payload"] for row in rows] == [f"before {n}".encode() for n in range(COUNT)] + [
        f"after {n}".encode() for n in range(COUNT)
    ]


def in_sync_elsewhere(etcd: EtcdTarget, node: str, number: int) -> bool:
    """Whether ``node`` is in the in-sync set of every partition but ``number``."""
    return all(node in state.isr for n, state in cluster_state(etcd).partitions.items() if n != number)


def story(brokers: dict[str, BrokerProcess], number: int) -> str:
    """What each broker logged of partition ``number`` and of its refusals: how c came back in sync."""
    said = f"partition {number}"
    return "\n".join(
        f"{node}: {line}"
        for node, broker in brokers.items()
        for line in broker.log_path.read_text(errors="replace").splitlines()
        if said in line or "refused" in line
    )
