"""Wills cluster-wide: three broker processes and a real etcd, paho clients.

A will is published once, wherever its client was connected, and reaches subscribers on every broker: when
its client's connection is lost, after its Will Delay Interval (MQTT 5); when the broker holding the
connection is killed (a survivor publishes it, once), or killed and restarted at once, or cut off from etcd
as the connection drops; not at all when the client reconnects to another broker within the delay, whether
its broker is alive or dead.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.broker_clients import PahoClient, expect_none_on
from tests.e2e.cluster.proof import EtcdProxy, cluster_state, session_record, wait_settled, wait_until

QUIET_S = 2.0
"""How long nothing more may arrive once a will has (every broker would have published it by then)."""


def watchers(brokers: dict, topic_filter: str, version: int) -> list[PahoClient]:
    """A subscriber to ``topic_filter`` on each broker."""
    clients = []
    for node, broker in sorted(brokers.items()):
        client = PahoClient(broker.port, f"watch-{node}-{version}-{topic_filter}", version=version)
        client.subscribe(topic_filter, 1)
        clients.append(client)
    return clients


def with_will(
    port: int, client_id: str, topic: str, version: int, delay: int, clean: bool = True
) -> PahoClient:
    """A client with a will on ``topic`` (v5: delayed by ``delay``, in a session of 60 s)."""
    return PahoClient(
        port,
        client_id,
        version=version,
        clean=clean,
        session_expiry=60 if version == 5 else None,
        will=(topic, b"gone", 1, False),
        will_delay=delay if version == 5 else None,
    )


@pytest.mark.shares_cluster  # the module's one cluster: the test harms none of its brokers
@pytest.mark.parametrize(
    ("version", "delay"), [(5, 0), (4, 0), (5, 2)], ids=["v5", "v3.1.1", "v5-will-delay"]
)
@pytest.mark.mqtt311("MQTT-3.1.2-8")
@pytest.mark.mqtt5("MQTT-3.1.2-8")
def test_a_lost_clients_will_reaches_every_broker_once_after_its_delay(three_brokers, version, delay):
    topic = f"wills/lost/{version}/{delay}"
    seen = watchers(three_brokers, topic, version)
    device = with_will(three_brokers["a"].port, f"lost-{version}-{delay}", topic, version, delay)

    lost_at = time.monotonic()
    device.kill()  # no DISCONNECT: the will is due

    for watcher in seen:
        [message] = watcher.expect(1, timeout=15)
        assert (message.topic, message.payload) == (topic, b"gone")
    assert time.monotonic() - lost_at >= delay - 0.1
    expect_none_on(seen, QUIET_S)


@pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])
@pytest.mark.mqtt311("MQTT-3.1.2-8")
@pytest.mark.mqtt5("MQTT-3.1.2-8")
def test_the_will_of_a_client_of_a_killed_broker_is_published_once_by_a_survivor(
    three_brokers, etcd, version
):
    topic = f"wills/killed/{version}"
    seen = watchers({node: three_brokers[node] for node in ("b", "c")}, topic, version)
    client_id = f"orphan-{version}"
    with_will(three_brokers["a"].port, client_id, topic, version, 1)
    wait_until(
        lambda: (r := session_record(etcd, client_id)) is not None and r.will is not None,
        what="the will in etcd",
    )

    three_brokers["a"].kill()

    for watcher in seen:
        [message] = watcher.expect(1, timeout=20)  # after the lease expires, then the delay
        assert (message.topic, message.payload) == (topic, b"gone")
    expect_none_on(seen, QUIET_S)
    record = session_record(etcd, client_id)
    assert record is None or record.will is None  # taken out by the one that published it


@pytest.mark.shares_cluster  # the module's one cluster: the test harms none of its brokers
@pytest.mark.mqtt5("MQTT-3.1.2-8", "MQTT-3.1.3-9")
def test_a_reconnect_on_another_broker_within_the_will_delay_cancels_the_will(three_brokers):
    topic = "wills/cancelled"
    seen = watchers(three_brokers, topic, 5)
    device = with_will(three_brokers["a"].port, "returner", topic, 5, 3)

    device.kill()
    back = with_will(three_brokers["b"].port, "returner", topic, 5, 3, clean=False)

    assert back.connack_result[0].session_present
    expect_none_on(seen, 3 + QUIET_S)  # past the delay: the new connection cancelled it
    back.kill()  # the new connection's own will still works, from b
    for watcher in seen:
        [message] = watcher.expect(1, timeout=15)
        assert message.payload == b"gone"


@pytest.mark.mqtt5("MQTT-3.1.2-8")
def test_the_will_of_a_client_of_a_broker_killed_and_restarted_at_once_is_published_once(three_brokers, etcd):
    """Restarted before its lease expired, a's departure may never be seen by b and c: a publishes the
    wills its records held from before (and if they did see it, the compare-and-swap still lets one)."""
    topic = "wills/restarted"
    seen = watchers({node: three_brokers[node] for node in ("b", "c")}, topic, 5)
    with_will(three_brokers["a"].port, "restarted", topic, 5, 0)

    def will_registered() -> bool:
        record = session_record(etcd, "restarted")
        return record is not None and record.will is not None

    wait_until(will_registered, what="the will in etcd")

    three_brokers["a"].kill()
    three_brokers["a"].start()

    for watcher in seen:
        [message] = watcher.expect(1, timeout=20)
        assert (message.topic, message.payload) == (topic, b"gone")
    expect_none_on(seen, QUIET_S)


@pytest.mark.mqtt5("MQTT-3.1.2-8", "MQTT-3.1.3-9")
def test_a_reconnect_within_the_will_delay_after_its_broker_died_cancels_the_will(three_brokers, etcd):
    """a dies with the client's connection; the survivors schedule its will for the delay; the client
    resumes its session (saved by a) on b before the delay has passed: nothing is published."""
    topic = "wills/outlived"
    seen = watchers({node: three_brokers[node] for node in ("b", "c")}, topic, 5)
    device = with_will(three_brokers["a"].port, "outliver", topic, 5, 8)

    def saved() -> bool:
        record = session_record(etcd, "outliver")
        return record is not None and record.will is not None and record.state is not None

    wait_until(saved, what="the session and its will in etcd")
    three_brokers["a"].kill()
    device.kill()
    wait_settled(etcd, {"b", "c"}, 2)  # a has left: the survivors count the delay from now

    back = with_will(three_brokers["b"].port, "outliver", topic, 5, 8, clean=False)

    assert back.connack_result[0].session_present
    expect_none_on(seen, 8 + QUIET_S)


@pytest.mark.mqtt5("MQTT-3.1.2-8")
def test_a_will_due_while_its_broker_is_cut_off_from_etcd_is_published_once(cluster_brokers, etcd):
    """a loses etcd just as its client's connection drops: a cannot take the will out of the registry and
    keeps trying; its lease expires, b or c publishes the will; when a reaches etcd again it finds the will
    gone and publishes nothing."""
    proxy = EtcdProxy(etcd.url)
    try:
        brokers = {"a": cluster_brokers("a", etcd=[proxy.url])}
        brokers |= {node: cluster_brokers(node) for node in ("b", "c")}
        wait_settled(etcd, {"a", "b", "c"}, 3)
        topic = "wills/cut-off"
        seen = watchers({node: brokers[node] for node in ("b", "c")}, topic, 5)
        device = with_will(brokers["a"].port, "cut-off", topic, 5, 0)

        def will_registered() -> bool:
            record = session_record(etcd, "cut-off")
            return record is not None and record.will is not None

        wait_until(will_registered, what="the will in etcd")

        proxy.cut()
        device.kill()
        wait_until(lambda: "a" not in cluster_state(etcd).members, what="a's lease expired")
        for watcher in seen:
            [message] = watcher.expect(1, timeout=20)
            assert (message.topic, message.payload) == (topic, b"gone")
        proxy.mend()
        wait_until(lambda: "a" in cluster_state(etcd).members, what="a back in the cluster")

        expect_none_on(seen, 2 * QUIET_S)  # a, back, found the will published
    finally:
        proxy.close()
