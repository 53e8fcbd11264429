"""Which partitions a broker's subscriptions want (``LocalInterest``): exact filters name one partition, a
wildcard wants them all, listeners hear only when that set changes; a node's observers follow it."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from broker_edge.cluster.reads.interest import LocalInterest, is_wildcard
from broker_edge.cluster.replication.delivery import LocalDelivery
from broker_edge.cluster.replication.fetcher import FollowerConfig
from broker_edge.cluster.replication.follower import Followers
from broker_edge.cluster.view import ClusterView
from broker_edge.placement import Member, PartitionState
from broker_edge.storage import LogStore, StorageConfig


def test_exact_filters_want_their_partition_and_a_wildcard_wants_all() -> None:
    view = ClusterView("b1", 16)
    interest = LocalInterest(view)
    changes: list[None] = []
    interest.on_change(lambda: changes.append(None))
    topic = "plant/1/telemetry"
    partition = view.partition_of(topic)
    other = next(number for number in range(16) if number != partition)
    assert not interest.wants(partition)

    interest.interest_changed(topic, True)
    interest.interest_changed(topic, True)  # a second subscriber of the same topic changes nothing
    assert interest.wants(partition) and not interest.wants(other)
    assert len(changes) == 1

    interest.interest_changed("plant/+/telemetry", True)
    assert interest.everything and interest.wants(other)
    assert len(changes) == 2
    interest.interest_changed("plant/+/telemetry", False)
    assert not interest.wants(other) and interest.wants(partition)
    assert len(changes) == 3

    interest.interest_changed(topic, False)
    assert interest.wants(partition)  # one subscriber left
    interest.interest_changed(topic, False)
    assert not interest.wants(partition)
    assert len(changes) == 4
    interest.interest_changed(topic, False)  # never counted: ignored
    assert len(changes) == 4


def test_existing_subscriptions_count_and_a_new_partition_count_places_them_again() -> None:
    view = ClusterView("b1", 16)
    interest = LocalInterest(view)
    interest.count_existing([("a/b", object(), None, None), ("c/#", object(), None, "group")])
    assert interest.everything
    interest.interest_changed("c/#", False)
    assert interest.wants(view.partition_of("a/b"))
    view.partitions = 7  # the count stored in etcd wins over the configuration
    assert interest.wants(view.partition_of("a/b"))
    assert sum(interest.wants(number) for number in range(7)) == 1


def test_wildcards() -> None:
    assert is_wildcard("#") and is_wildcard("a/+/c") and is_wildcard("a/#")
    assert not is_wildcard("a/b/c")


def test_a_node_observes_only_wanted_partitions_and_a_suback_waits_for_their_observation(
    tmp_path: Path,
) -> None:
    """b3 holds a copy of partition 1, none of partition 0: it observes 0 only while a subscription wants
    it. A SUBACK then waits for the observer's session; with the leader unreachable it goes after
    ``subscribe_wait_s``."""

    async def scenario() -> None:
        store = LogStore(tmp_path / "store", StorageConfig(durability="none"))
        store.open()
        view = ClusterView("b3", 2)
        closed = f"http://127.0.0.1:{_closed_port()}"
        view.members["b1"] = Member("b1", "127.0.0.1:1", closed, closed)
        view.states[0] = PartitionState(0, "b1", 1, ("b1", "b2"), ("b1", "b2"))
        view.states[1] = PartitionState(1, "b1", 1, ("b1", "b3"), ("b1", "b3"))
        interest = LocalInterest(view)
        config = FollowerConfig(retry_s=0.05, subscribe_wait_s=0.3)
        delivery = LocalDelivery(store, lambda _message: None, None)
        followers = Followers(view, store, delivery, None, config, interest=interest)
        followers.start()
        topic = next(f"t/{n}" for n in range(100) if view.partition_of(f"t/{n}") == 0)
        try:
            assert followers.fetchers == {("b1", False): {1: 1}}  # the copy, and nothing observed
            assert not followers.subscribe_gate(lambda: None)
            interest.interest_changed(topic, True)
            assert followers.observed == [0]
            sent: list[float] = []
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert followers.subscribe_gate(lambda: sent.append(loop.time()))
            await asyncio.sleep(0.5)
            assert len(sent) == 1 and sent[0] - started >= 0.3  # the leader never answered
            assert followers.observer_fetches.get(0, 0) > 0
            interest.interest_changed(topic, False)
            assert followers.observed == []
            interest.interest_changed("t/#", True)
            assert followers.observed == [0]
        finally:
            await followers.stop()
            store.close()

    asyncio.run(scenario())


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
