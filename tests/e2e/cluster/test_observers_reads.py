"""Reading the log through a broker that holds no copy of the topics' partitions: four broker processes,
replication factor 2 (each broker holds no copy of about half of the partitions), a real etcd, real clients.

A wildcard SUBSCRIBE from an offset reads every matching topic's log, those of partitions the broker only
observes from their leaders, then goes on live without a gap or a duplicate; a time start is resolved at
the leader; an offset outside the log is told in the MQTT 5 SUBACK as on a broker holding the log; topics
named ``.`` and ``..`` read through the broker; a persistent session away from such a broker keeps log
positions, not messages, so it gets more than its offline queue would hold, and loses nothing acknowledged
when that broker dies and it resumes elsewhere.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest

from broker_edge.placement import partition_of
from broker_edge.protocol.packets import Publish
from broker_edge.protocol.properties import Properties
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, RawClient, close_all
from tests.e2e.cluster.proof import cluster_state, copies_spread, session_record, wait_settled, wait_until
from tests.e2e.cluster.test_device_offsets import device_from, numbered
from tests.e2e.commitlog.e2e_helpers import offset_of
from tests.harness.local_cluster import EtcdServer, EtcdTarget, cluster_broker

NODES = ("a", "b", "c", "d")
PARTITIONS = 16
OFFLINE_MESSAGES = 5
"""Each broker's ``limits.max_offline_messages``: a session away gets more than this only from the log."""
VERSIONS = pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])


@pytest.fixture(scope="module")
def rf2(
    tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdServer
) -> Iterator[tuple[dict[str, BrokerProcess], EtcdTarget]]:
    """One cluster for the tests of this module (each uses its own client ids and topics)."""
    target = EtcdTarget(etcd_server, f"/observers-reads-{os.getpid()}")
    directory = tmp_path_factory.mktemp("observers-reads")
    brokers: dict[str, BrokerProcess] = {}
    limits = {"max_offline_messages": OFFLINE_MESSAGES}
    try:
        for node in NODES:
            brokers[node] = cluster_broker(directory, target, node, {"replication_factor": 2}, limits=limits)
            brokers[node].start()
        wait_settled(target, set(NODES), 2, 60)
        wait_until(
            lambda: copies_spread(target, NODES, PARTITIONS),
            90,
            "copies spread over a, b, c, d",
            lambda: cluster_state(target),
        )
        yield brokers, target
    finally:
        for broker in brokers.values():
            broker.stop()


@pytest.fixture
def brokers(rf2: tuple[dict[str, BrokerProcess], EtcdTarget]) -> Iterator[dict[str, BrokerProcess]]:
    yield rf2[0]
    close_all()


@pytest.fixture
def etcd(rf2: tuple[dict[str, BrokerProcess], EtcdTarget]) -> EtcdTarget:
    return rf2[1]


def holders(etcd: EtcdTarget, topic: str) -> set[str]:
    partition = cluster_state(etcd).partitions[partition_of(topic, PARTITIONS)]
    return {*partition.replicas, *([partition.leader] if partition.leader else [])}


def topics_by_copy(etcd: EtcdTarget, node: str, prefix: str, count: int) -> tuple[list[str], list[str]]:
    """``count`` topics under ``prefix`` in different partitions ``node`` holds no copy of, and ``count`` in
    partitions it holds."""
    elsewhere: dict[int, str] = {}
    here: dict[int, str] = {}
    index = 0
    while len(elsewhere) < count or len(here) < count:
        topic = f"{prefix}/{index}"
        index += 1
        number = partition_of(topic, PARTITIONS)
        chosen = here if node in holders(etcd, topic) else elsewhere
        if len(chosen) < count:
            chosen.setdefault(number, topic)
    return list(elsewhere.values()), list(here.values())


def per_topic(messages: list) -> dict[str, list[bytes]]:
    received: dict[str, list[bytes]] = defaultdict(list)
    for message in messages:
        received[message.topic].append(message.payload)
    return dict(received)


def counted(first: int, stop: int) -> list[bytes]:
    return [str(number).encode() for number in range(first, stop)]


@VERSIONS
@pytest.mark.parametrize("start", ["earliest", "3"])
def test_a_wildcard_from_an_offset_reads_every_topic_on_a_broker_without_their_copies_then_goes_on_live(
    brokers, etcd, version, start
):
    """Topics in partitions d holds no copy of and in partitions it holds, eight records each, then a
    wildcard SUBSCRIBE on d from ``start`` while one of the topics keeps getting publishes: every topic
    is read from ``start``, once, in order, and the busy one goes on live without a gap or a duplicate."""
    prefix = f"wild/{version}/{start}"
    elsewhere, here = topics_by_copy(etcd, "d", prefix, 3)
    publisher = PahoClient(brokers["a"].port, f"wild-pub-{version}-{start}", version=version)
    for topic in elsewhere + here:
        numbered(publisher, topic, 0, 8)
    busy = elsewhere[0]
    busy_publisher = PahoClient(brokers["b"].port, f"wild-busy-{version}-{start}", version=version)
    stop = 208

    def keep_publishing() -> None:
        numbered(busy_publisher, busy, 8, stop)

    thread = threading.Thread(target=keep_publishing)
    thread.start()
    time.sleep(0.05)
    device = device_from(brokers["d"].port, f"wild-{version}-{start}", f"{prefix}/#", start, version)
    thread.join()
    first = 0 if start == "earliest" else int(start)
    owed = {topic: counted(first, 8) for topic in elsewhere + here} | {busy: counted(first, stop)}

    messages = device.expect(sum(len(payloads) for payloads in owed.values()), timeout=30)

    assert per_topic(messages) == owed
    if version == 5:
        assert all(offset_of(m) == int(m.payload) for m in messages)
    device.expect_none(1.0)
    for topic in elsewhere + here:  # live from here on, published on a broker holding no copy either
        publisher.publish(topic, b"8", 1)
    assert per_topic(device.expect(6, timeout=15)) == {topic: [b"8"] for topic in elsewhere + here}
    device.expect_none(0.5)


@VERSIONS
def test_a_time_start_on_a_broker_without_a_copy_is_resolved_at_the_leader(brokers, etcd, version):
    """Five records, a moment, five more: a device subscribing on d (no copy of the topic's partition)
    from the time between gets the last five, then live ones; so does a wildcard."""
    (topic, _, _), _here = topics_by_copy(etcd, "d", f"timed/{version}", 3)
    publisher = PahoClient(brokers["a"].port, f"timed-pub-{version}", version=version)
    numbered(publisher, topic, 0, 5)
    time.sleep(0.2)
    between = int(time.time() * 1000)
    time.sleep(0.2)
    numbered(publisher, topic, 5, 10)

    exact = device_from(brokers["d"].port, f"timed-{version}", topic, f"time:{between}", version)
    wildcard = device_from(
        brokers["d"].port, f"timed-w-{version}", f"timed/{version}/+", f"time:{between}", version
    )

    assert [m.payload for m in exact.expect(5, timeout=15)] == counted(5, 10)
    assert [m.payload for m in wildcard.expect(5, timeout=15)] == counted(5, 10)
    numbered(publisher, topic, 10, 11)
    assert [m.payload for m in exact.expect(1, timeout=15)] == [b"10"]
    assert [m.payload for m in wildcard.expect(1, timeout=15)] == [b"10"]
    exact.expect_none(0.5)
    wildcard.expect_none(0.5)


def _offset_property(start: str) -> Properties:
    return Properties(user_properties=[("offset", start)])


@pytest.mark.mqtt5("MQTT-3.9.2-1")
@pytest.mark.parametrize("form", ["exact", "wildcard"])
def test_an_offset_past_the_log_is_told_in_the_v5_suback_on_a_broker_without_a_copy(brokers, etcd, form):
    """Ten records; a v5 device asks d (no copy of the partition) for offset 100: the SUBACK grants it and
    says the log is [0, 10], as a broker holding the log does; delivery starts at the end (10)."""
    (topic, _, _), _here = topics_by_copy(etcd, "d", f"past/{form}", 3)
    publisher = PahoClient(brokers["a"].port, f"past-pub-{form}")
    numbered(publisher, topic, 0, 10)
    device = RawClient(brokers["d"].port, 5)
    device.connect(f"past-{form}")
    topic_filter = topic if form == "exact" else f"past/{form}/#"

    suback = device.subscribe(topic_filter, 1, properties=_offset_property("100"))

    assert suback.reason_codes == [1]
    reason = f"offset 100 of {topic!r} is outside [0, 10]: replaying from 10"
    assert suback.properties.reason_string == reason
    told = [
        json.loads(value) for key, value in suback.properties.user_properties if key == "offset_out_of_range"
    ]
    assert told == [{"topic": topic, "offset": 100, "start_offset": 0, "end_offset": 10}]
    publisher.publish(topic, b"10", 1)
    publish = device.recv()
    assert isinstance(publish, Publish) and publish.payload == b"10"


def test_a_v311_offset_past_the_log_on_a_broker_without_a_copy_starts_at_its_end(brokers, etcd):
    """MQTT 3.1.1 has no way to be told: the replay starts at the log's end, as on a broker with the log."""
    (topic, _, _), _here = topics_by_copy(etcd, "d", "past/v311", 3)
    publisher = PahoClient(brokers["a"].port, "past-pub-v311", version=4)
    numbered(publisher, topic, 0, 10)
    device = device_from(brokers["d"].port, "past-v311", topic, "100", 4)
    device.expect_none(1.0)
    publisher.publish(topic, b"10", 1)
    assert [m.payload for m in device.expect(1, timeout=15)] == [b"10"]


DOTS_PUBLISHED = {".": 0, "..": 0}
"""Records published so far on the topics ``.`` and ``..`` by this module (payloads are their offsets)."""


@VERSIONS
@pytest.mark.parametrize("topic", [".", ".."])
def test_a_topic_named_dot_or_dot_dot_reads_through_a_broker_without_its_copy(brokers, etcd, version, topic):
    """The topic's log, written through a broker holding a copy, read from its start through one holding
    none (the leader is asked for the topic by its escaped path segment, not a normalised one)."""
    observer = next(node for node in NODES if node not in holders(etcd, topic))
    publisher_node = next(node for node in NODES if node != observer)
    publisher = PahoClient(brokers[publisher_node].port, f"dots-pub-{version}-{len(topic)}", version=version)
    first = DOTS_PUBLISHED[topic]  # the log is shared with the other version's run
    numbered(publisher, topic, first, first + 5)
    DOTS_PUBLISHED[topic] = first + 5

    reader = device_from(brokers[observer].port, f"dots-{version}-{len(topic)}", topic, "earliest", version)

    assert [m.payload for m in reader.expect(first + 5, timeout=15)] == counted(0, first + 5)
    numbered(publisher, topic, first + 5, first + 6)
    DOTS_PUBLISHED[topic] = first + 6
    assert [m.payload for m in reader.expect(1, timeout=15)] == counted(first + 5, first + 6)
    reader.expect_none(0.5)


def persistent(port: int, client_id: str, version: int) -> PahoClient:
    expiry = 3600 if version == 5 else None
    return PahoClient(port, client_id, version=version, clean=False, session_expiry=expiry)


@pytest.mark.mqtt5("MQTT-3.1.2-5", "MQTT-4.6.0-6")
@pytest.mark.mqtt311("MQTT-3.1.2-4", "MQTT-3.1.2-5", "MQTT-4.6.0-6")
def test_a_session_away_from_a_broker_without_a_copy_keeps_positions_and_survives_that_brokers_death(
    brokers, etcd
):
    """Persistent sessions (MQTT 5 and 3.1.1) subscribed on d, which holds no copy of their topic's
    partition. Away, they are sent 30 messages, six times d's offline queue: back on d they get all 30
    (read from the leader). Away again, 30 more are acknowledged, then d is killed (SIGKILL): resumed on
    the other broker holding no copy, each session gets those 30, once, in order, then live ones."""
    (topic, *_), _here = topics_by_copy(etcd, "d", "away", 3)
    other = next(node for node in NODES if node != "d" and node not in holders(etcd, topic))
    publisher_node = next(iter(holders(etcd, topic)))
    publisher = PahoClient(brokers[publisher_node].port, "away-pub")
    sessions = {version: persistent(brokers["d"].port, f"away-{version}", version) for version in (5, 4)}
    for session in sessions.values():
        assert session.subscribe(topic, 1) == [1]
        session.disconnect()

    numbered(publisher, topic, 0, 30)
    for version in sessions:
        back = persistent(brokers["d"].port, f"away-{version}", version)
        assert [m.payload for m in back.expect(30, timeout=15)] == counted(0, 30)
        back.expect_none(0.5)
        back.disconnect()
    numbered(publisher, topic, 30, 60)
    wait_until(  # saved every session_save_interval_ms (1 s), a loaded member's save taking longer
        lambda: all(saved_cursor(etcd, f"away-{version}", topic) == 30 for version in sessions),
        30,
        "the sessions' positions saved",
    )
    brokers["d"].kill()
    wait_until(lambda: "d" not in cluster_state(etcd).members, 30, "d gone from the members")

    moved = {version: persistent(brokers[other].port, f"away-{version}", version) for version in sessions}

    for client in moved.values():
        assert client.connack_result[0].session_present
        assert [m.payload for m in client.expect(30, timeout=20)] == counted(30, 60)
    for client in moved.values():
        client.expect_none(1.0)
    publisher.publish(topic, b"60", 1)
    for client in moved.values():
        assert [m.payload for m in client.expect(1, timeout=15)] == [b"60"]


def saved_cursor(etcd: EtcdTarget, client_id: str, topic: str) -> int | None:
    """The position on ``topic`` of ``client_id``'s session as last saved in the registry."""
    record = session_record(etcd, client_id)
    state = record.state if record is not None else None
    return None if state is None else state.get("cursors", {}).get(topic)
