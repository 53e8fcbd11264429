"""Observers fetch only what local subscribers want: four broker processes, replication factor 2, real etcd.

With four brokers and two copies of every partition, each broker holds no copy of half of the partitions.
It fetches one of those (as an observer) only while a local subscription can match topics of it, which
each broker says in ``GET /v1/cluster`` (``observer``: the partitions it observes and the fetches it sent
for each). A subscriber on such a broker gets every message published after its SUBACK (the SUBACK waits
until the partition's leader has fixed where this broker's routing starts), and none published before;
an observation that stops and starts again delivers nothing of the time between to new subscribers, while
a persistent session keeps its messages meanwhile; a retained message set while a broker did not observe
its partition is what a new subscriber there gets.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker_edge.placement import partition_of
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, close_all
from tests.e2e.cluster.proof import cluster_state, wait_settled, wait_until
from tests.harness.local_cluster import EtcdTarget

NODES = ("a", "b", "c", "d")
PARTITIONS = 16


def balanced(etcd: EtcdTarget) -> bool:
    """Every partition with two in-sync replicas among the four, each broker holding its share of copies
    (8) and of leadership (4, within two: leadership moves only between copies): nothing moves while the
    test runs."""
    state = cluster_state(etcd)
    if set(state.members) != set(NODES) or len(state.partitions) != PARTITIONS:
        return False
    copies = dict.fromkeys(NODES, 0)
    for partition in state.partitions.values():
        if len(partition.isr) != 2 or partition.leader not in NODES:
            return False
        for replica in partition.isr:  # (an extra replica still catching up is not counted)
            copies[replica] += 1
    leaders = [state.leaders().get(node, 0) for node in NODES]
    return max(copies.values()) - min(copies.values()) <= 1 and max(leaders) - min(leaders) <= 2


@pytest.fixture
def four_brokers(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> Iterator[dict[str, BrokerProcess]]:
    brokers = {node: cluster_brokers(node, replication_factor=2) for node in NODES}
    wait_settled(etcd, set(NODES), 2, 60)
    wait_until(
        lambda: balanced(etcd),
        90,
        "copies and leadership spread over a, b, c, d",
        lambda: cluster_state(etcd),
    )
    yield brokers
    close_all()


def observer(broker: BrokerProcess) -> dict[str, Any]:
    """What ``broker`` observes: ``{"partitions": [...], "fetches": {"<partition>": count}}``."""
    with urllib.request.urlopen(f"{broker.offsets_url}/v1/cluster", timeout=5) as answer:
        document: dict[str, Any] = json.loads(answer.read())
    return dict(document["observer"])


def unheld(etcd: EtcdTarget, node: str) -> set[int]:
    """The partitions ``node`` holds no copy of."""
    return {
        number
        for number, state in cluster_state(etcd).partitions.items()
        if node not in state.replicas and state.leader != node
    }


def topics_unheld_by(etcd: EtcdTarget, node: str, prefix: str, count: int) -> list[tuple[str, int]]:
    """``count`` topics under ``prefix``, in different partitions ``node`` holds no copy of."""
    partitions = unheld(etcd, node)
    found: dict[int, str] = {}
    index = 0
    while len(found) < count:
        topic = f"{prefix}/{index}"
        index += 1
        number = partition_of(topic, PARTITIONS)
        if number in partitions and number not in found:
            found[number] = topic
    return [(topic, number) for number, topic in found.items()]


def payloads(client: PahoClient, count: int) -> list[bytes]:
    return [message.payload for message in client.expect(count)]


@pytest.mark.mqtt5("MQTT-3.8.4-1")
@pytest.mark.mqtt311("MQTT-3.8.4-1")
@pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])
def test_a_broker_observes_only_what_its_subscribers_want_and_they_get_everything_after_the_suback(
    four_brokers, etcd, version
):
    """d fetches none of the partitions it holds no copy of until a subscriber wants one; the subscriber
    then gets every message published after its SUBACK (the first one published the moment the SUBACK
    arrived), none from before, and d fetches that partition alone; a wildcard filter wants them all."""
    a, d = four_brokers["a"], four_brokers["d"]
    (topic, number), (other_topic, _other) = topics_unheld_by(etcd, "d", f"obs{version}", 2)
    assert observer(d)["partitions"] == []
    assert observer(d)["fetches"] == {}  # not one fetch for a partition nobody here wants
    publisher = PahoClient(a.port, f"publisher-{version}", version=version)
    publisher.publish(topic, b"before", 1)  # committed before the subscription: not for it

    subscriber = PahoClient(d.port, f"subscriber-{version}", version=version)
    assert subscriber.subscribe(topic, 1) == [1]
    for index in range(10):  # the first one right after the SUBACK
        publisher.publish(topic, f"m{index}".encode(), 1)
    assert payloads(subscriber, 10) == [f"m{index}".encode() for index in range(10)]
    subscriber.expect_none(0.5)  # not "before"
    status = observer(d)
    assert status["partitions"] == [number]
    assert set(status["fetches"]) == {str(number)} and status["fetches"][str(number)] > 0
    publisher.publish(other_topic, b"elsewhere", 1)  # a partition d does not observe: not fetched
    assert set(observer(d)["fetches"]) == {str(number)}

    wildcard = PahoClient(d.port, f"wildcard-{version}", version=version)
    wildcard.subscribe(f"obs{version}/#", 1)
    assert observer(d)["partitions"] == sorted(unheld(etcd, "d"))  # a wildcard can match any topic
    publisher.publish(other_topic, b"now observed", 1)
    assert payloads(wildcard, 1) == [b"now observed"]
    wildcard.disconnect()
    wait_until(lambda: observer(d)["partitions"] == [number], what="d observing only the exact topic's")


@pytest.mark.mqtt5("MQTT-3.8.4-1")
@pytest.mark.mqtt311("MQTT-3.8.4-1")
@pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])
def test_an_observation_that_stops_and_starts_again_delivers_no_past_and_loses_nothing_of_a_session(
    four_brokers, etcd, version
):
    """The last subscriber leaves: d stops fetching the partition. Messages published meanwhile are not
    delivered to the next subscriber (they precede its SUBACK). A persistent session's subscription keeps
    the partition observed while its client is away, and the client gets what was published meanwhile."""
    a, d = four_brokers["a"], four_brokers["d"]
    ((topic, number),) = topics_unheld_by(etcd, "d", f"again{version}", 1)
    publisher = PahoClient(a.port, f"publisher-{version}", version=version)

    first = PahoClient(d.port, f"first-{version}", version=version)
    first.subscribe(topic, 1)
    publisher.publish(topic, b"one", 1)
    assert payloads(first, 1) == [b"one"]
    first.disconnect()  # a clean session: its subscription ends with it
    wait_until(lambda: observer(d)["partitions"] == [], what="d no longer observing")
    for index in range(3):
        publisher.publish(topic, f"gap{index}".encode(), 1)
    fetches = observer(d)["fetches"][str(number)]
    time.sleep(1.5)
    assert observer(d)["fetches"][str(number)] == fetches  # nothing fetched while nothing wants it

    second = PahoClient(d.port, f"second-{version}", version=version)
    second.subscribe(topic, 1)
    publisher.publish(topic, b"two", 1)
    assert payloads(second, 1) == [b"two"]  # not the gap: it was published before this SUBACK
    second.expect_none(0.5)

    expiry = 300 if version == 5 else None
    persistent = PahoClient(
        d.port, f"persistent-{version}", version=version, clean=False, session_expiry=expiry
    )
    persistent.subscribe(topic, 1)
    persistent.disconnect()
    second.disconnect()
    time.sleep(0.5)
    assert observer(d)["partitions"] == [number]  # the session away still wants the partition
    for index in range(5):
        publisher.publish(topic, f"away{index}".encode(), 1)
    back = PahoClient(d.port, f"persistent-{version}", version=version, clean=False, session_expiry=expiry)
    assert payloads(back, 5) == [f"away{index}".encode() for index in range(5)]


@pytest.mark.mqtt5("MQTT-3.3.1-6")
@pytest.mark.mqtt311("MQTT-3.3.1-6")
@pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])
def test_a_retained_message_set_while_a_broker_did_not_observe_it_reaches_a_new_subscriber_there(
    four_brokers, etcd, version
):
    """A retained message set, replaced and cleared on a while d observes nothing of its partition: each
    new subscriber on d gets the current one (d refreshes the partition's retained messages from its
    leader when its observation starts)."""
    a, d = four_brokers["a"], four_brokers["d"]
    ((topic, _number),) = topics_unheld_by(etcd, "d", f"kept{version}", 1)
    publisher = PahoClient(a.port, f"retainer-{version}", version=version)

    def first_message_of_a_new_subscriber(name: str) -> tuple[bytes, bool]:
        """(payload, RETAIN) of the first message a new subscriber on d gets; it leaves, and d stops
        observing the partition."""
        client = PahoClient(d.port, f"{name}-{version}", version=version)
        client.subscribe(topic, 1)
        if name == "third":
            publisher.publish(topic, b"live", 1)
        (message,) = client.expect(1)
        client.disconnect()
        wait_until(lambda: observer(d)["partitions"] == [], what="d no longer observing")
        return message.payload, message.retain

    publisher.publish(topic, b"r1", 1, retain=True)
    assert observer(d)["partitions"] == []
    assert first_message_of_a_new_subscriber("first") == (b"r1", True)
    publisher.publish(topic, b"r2", 1, retain=True)  # replaced while d does not observe it
    assert first_message_of_a_new_subscriber("second") == (b"r2", True)
    publisher.publish(topic, b"", 1, retain=True)  # cleared while d does not observe it
    assert first_message_of_a_new_subscriber("third") == (b"live", False)  # no retained message first
