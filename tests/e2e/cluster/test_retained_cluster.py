"""Retained messages across a cluster: three broker processes and a real etcd keep one retained set.

A retained message set through any broker, at any QoS, is what a new subscriber on any broker gets; an empty
retained publish on another broker clears it everywhere; a broker that was down while the set changed (a
QoS 0 change included, which is not logged) serves the current set as soon as it is back; expiry, retain
handling and retain as published behave as on a broker alone.
"""

from __future__ import annotations

import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.cluster.proof import wait_until


def retained_on(
    port: int, topic_filter: str, client_id: str, version: int = 5, first_within_s: float = 2.0, **options
) -> dict:
    """topic → payload of the retained messages (RETAIN set) a new subscription to ``topic_filter`` gets.

    They follow the SUBACK together, the first within ``first_within_s``; a short quiet time ends them. (A
    broker catching up after a restart also routes, live and without RETAIN, the publishes committed while
    it was down: not counted here.)
    """
    subscriber = PahoClient(port, client_id, version=version)
    subscriber.subscribe(topic_filter, 1, **options)
    got: dict = {}
    wait_for(lambda: subscriber.messages.qsize() > 0, first_within_s)
    time.sleep(0.3)
    while not subscriber.messages.empty():
        message = subscriber.messages.get()
        if message.retain:
            assert message.topic not in got, f"{message.topic} retained twice"
            got[message.topic] = message.payload
    subscriber.close()
    return got


def wait_retained(port: int, topic_filter: str, expected: dict, what: str, version: int = 5) -> None:
    """Poll with new subscribers until the retained set under ``topic_filter`` is ``expected``."""
    seen: list[dict] = []
    count = iter(range(1_000_000))

    def matches() -> bool:
        got = retained_on(port, topic_filter, f"probe-{port}-{next(count)}", version)
        seen.append(got)
        return got == expected

    wait_until(matches, 20, what, lambda: seen[-1] if seen else None)


@pytest.mark.shares_cluster  # the module's one cluster: the test harms none of its brokers
@pytest.mark.mqtt5("MQTT-3.3.1-5", "MQTT-3.3.1-6", "MQTT-3.3.1-7")
@pytest.mark.mqtt311("MQTT-3.3.1-5", "MQTT-3.3.1-6", "MQTT-3.3.1-8", "MQTT-3.3.1-10", "MQTT-3.3.1-11")
@pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])
def test_a_retained_message_set_on_a_is_served_on_b_and_c_and_cleared_from_c_everywhere(
    three_brokers, version
):
    a, b, c = (three_brokers[node] for node in "abc")
    publisher = PahoClient(a.port, f"retainer-{version}", version=version)
    expected = {f"site/{version}/q{qos}": f"state at qos {qos}".encode() for qos in (0, 1, 2)}
    for qos in (0, 1, 2):
        publisher.publish(f"site/{version}/q{qos}", expected[f"site/{version}/q{qos}"], qos, retain=True)

    for broker, name in ((b, "b"), (c, "c")):
        wait_retained(broker.port, f"site/{version}/#", expected, f"the retained set on {name}", version)

    clearer = PahoClient(c.port, f"clearer-{version}", version=version)
    clearer.publish(f"site/{version}/q2", b"", 1, retain=True)  # an empty retained payload clears it
    del expected[f"site/{version}/q2"]
    for broker, name in ((a, "a"), (b, "b"), (c, "c")):
        wait_retained(broker.port, f"site/{version}/#", expected, f"q2 cleared on {name}", version)


@pytest.mark.mqtt5("MQTT-3.3.1-5", "MQTT-3.3.1-6")
@pytest.mark.mqtt311("MQTT-3.3.1-5", "MQTT-3.3.1-6", "MQTT-3.3.1-10")
def test_a_broker_that_was_down_serves_the_current_retained_set_when_it_is_back(three_brokers):
    """b is killed; meanwhile a retained message is set on a (QoS 1, logged), another on c at QoS 0 (not
    logged: b can only learn it from a peer) and a third cleared. The first subscriber on b after its
    restart gets exactly the current set."""
    a, b, c = (three_brokers[node] for node in "abc")
    PahoClient(a.port, "before").publish("plant/kept", b"kept", 1, retain=True)
    PahoClient(a.port, "before-2").publish("plant/cleared", b"soon gone", 1, retain=True)
    wait_retained(b.port, "plant/#", {"plant/kept": b"kept", "plant/cleared": b"soon gone"}, "the set on b")

    b.kill()
    PahoClient(a.port, "while-down").publish("plant/logged", b"set while b was down", 1, retain=True)
    PahoClient(c.port, "while-down-0").publish("plant/unlogged", b"qos 0 while b was down", 0, retain=True)
    PahoClient(c.port, "while-down-clear").publish("plant/cleared", b"", 1, retain=True)
    current = {
        "plant/kept": b"kept",
        "plant/logged": b"set while b was down",
        "plant/unlogged": b"qos 0 while b was down",
    }
    wait_retained(a.port, "plant/#", current, "the current set on a")
    b.start()
    # held until a peer's snapshot is applied (at most retained_snapshot_timeout_ms, 5 s)
    assert retained_on(b.port, "plant/#", "first-on-b", first_within_s=10.0) == current


@pytest.mark.shares_cluster  # the module's one cluster: the test harms none of its brokers
@pytest.mark.mqtt5("MQTT-3.3.2-5", "MQTT-3.3.2-6")
def test_a_retained_message_expires_on_every_broker(three_brokers):
    a, b, c = (three_brokers[node] for node in "abc")
    expiring = PahoProperties(PacketTypes.PUBLISH)
    expiring.MessageExpiryInterval = 3
    PahoClient(a.port, "expiring").publish(
        "meter/expiring", b"short-lived", 1, retain=True, properties=expiring
    )
    set_at = time.monotonic()
    PahoClient(a.port, "lasting").publish("meter/lasting", b"kept", 1, retain=True)
    subscriber = PahoClient(b.port, "early-on-b")
    subscriber.subscribe("meter/expiring", 1)
    early = subscriber.expect(1)[0]
    assert early.payload == b"short-lived"
    assert 1 <= early.properties.MessageExpiryInterval <= 3  # what remains of it
    time.sleep(max(0.0, set_at + 3.5 - time.monotonic()))  # the interval has passed everywhere
    for broker, name in ((b, "b"), (c, "c")):
        assert retained_on(broker.port, "meter/#", f"late-on-{name}") == {"meter/lasting": b"kept"}


@pytest.mark.shares_cluster  # the module's one cluster: the test harms none of its brokers
@pytest.mark.mqtt5("MQTT-3.3.1-9", "MQTT-3.3.1-10", "MQTT-3.3.1-11", "MQTT-3.3.1-12", "MQTT-3.3.1-13")
@pytest.mark.mqtt311("MQTT-3.3.1-9")
def test_retain_handling_and_retain_as_published_behave_as_on_one_broker(three_brokers):
    a, b, c = (three_brokers[node] for node in "abc")
    PahoClient(a.port, "setter").publish("opts/t", b"retained", 1, retain=True)
    wait_retained(b.port, "opts/#", {"opts/t": b"retained"}, "the retained message on b")

    assert retained_on(b.port, "opts/#", "rh2", retainHandling=2) == {}  # never on subscribe
    once = PahoClient(c.port, "rh1")
    once.subscribe("opts/#", 1, retainHandling=1)  # only for a new subscription
    assert once.expect(1)[0].payload == b"retained"
    once.subscribe("opts/#", 1, retainHandling=1)
    once.expect_none(0.5)

    plain = PahoClient(b.port, "live-plain")
    plain.subscribe("opts/#", 1, retainHandling=2)
    as_published = PahoClient(c.port, "live-rap")
    as_published.subscribe("opts/#", 1, retainHandling=2, retainAsPublished=True)
    v3 = PahoClient(b.port, "live-v3", version=4)
    v3.subscribe("opts/#", 1)
    v3.expect(1)  # its retained message on subscribe
    PahoClient(a.port, "live-setter").publish("opts/t", b"live", 1, retain=True)
    assert plain.expect(1)[0].retain is False  # live delivery: RETAIN cleared
    assert as_published.expect(1)[0].retain is True  # unless retain as published
    assert v3.expect(1)[0].retain is False


@pytest.mark.mqtt5("MQTT-3.3.1-5", "MQTT-3.3.1-6")
def test_a_broker_that_joins_later_serves_the_retained_set(three_brokers, cluster_brokers):
    a, c = three_brokers["a"], three_brokers["c"]
    PahoClient(a.port, "early-1").publish("fleet/logged", b"qos 1 before d", 1, retain=True)
    PahoClient(c.port, "early-0").publish("fleet/unlogged", b"qos 0 before d", 0, retain=True)
    expected = {"fleet/logged": b"qos 1 before d", "fleet/unlogged": b"qos 0 before d"}
    wait_retained(a.port, "fleet/#", expected, "the set on a")
    d = cluster_brokers("d")
    assert retained_on(d.port, "fleet/#", "first-on-d") == expected
