"""Devices hold their offsets across brokers: three broker processes and a real etcd, paho clients.

A device that read a topic's log from an offset (docs/device-protocol.md) on one broker, and reconnects to
another, subscribes from the next offset it has not processed and gets every record from there, once, in
order, then live ones: offsets are the same on every replica, so any broker serves the device's position.
"""

from __future__ import annotations

import pytest

from tests.e2e.broker_clients import PahoClient
from tests.e2e.commitlog.e2e_helpers import OPTED_IN, offset_of, replay_from


def device_from(port: int, client_id: str, topic: str, start: str, version: int) -> PahoClient:
    """A device reading ``topic`` from ``start``: the v5 SUBSCRIBE user property, or 3.1.1's filter form."""
    if version == 5:
        device = PahoClient(port, client_id, connect_properties=OPTED_IN)
        assert device.subscribe(topic, 1, properties=replay_from(start)) == [1]
    else:
        device = PahoClient(port, client_id, version=4)
        assert device.subscribe(f"$offset/{start}/{topic}", 1) == [1]
    return device


def numbered(publisher: PahoClient, topic: str, first: int, stop: int) -> None:
    """Publish the offsets ``first`` to ``stop`` as payloads (the topic's log starts empty)."""
    for number in range(first, stop):
        publisher.publish(topic, str(number).encode(), 1)


@pytest.mark.shares_cluster  # the module's one cluster: the test harms none of its brokers
@pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])
def test_a_device_resumes_its_offset_on_another_broker_and_misses_nothing(three_brokers, version):
    a, b, c = three_brokers["a"], three_brokers["b"], three_brokers["c"]
    topic = f"actions/devices/dev-{version}"
    publisher = PahoClient(c.port, f"platform-{version}", version=version)
    numbered(publisher, topic, 0, 6)
    device = device_from(a.port, f"dev-{version}", topic, "earliest", version)
    first = device.expect(6, timeout=15)
    assert [m.payload for m in first] == [str(n).encode() for n in range(6)]
    if version == 5:
        assert [offset_of(m) for m in first] == list(range(6))
    processed = 4  # the device got as far as offset 3 when it lost a
    device.kill()
    numbered(publisher, topic, 6, 10)  # while it is away

    moved = device_from(b.port, f"dev-{version}", topic, str(processed), version)

    resumed = moved.expect(6, timeout=15)
    assert [m.payload for m in resumed] == [str(n).encode() for n in range(processed, 10)]
    if version == 5:
        assert [offset_of(m) for m in resumed] == list(range(processed, 10))
    numbered(PahoClient(a.port, f"platform-a-{version}", version=version), topic, 10, 11)
    [live] = moved.expect(1, timeout=15)  # then live, published on yet another broker
    assert live.payload == b"10"
    moved.expect_none(1.0)  # once each: no duplicate at the switch from the log to live delivery
