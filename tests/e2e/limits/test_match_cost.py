"""``limits.max_match_nodes``: no set of filters, however many sessions hold it, lets one publish to a new
topic walk more of the subscription tree than the limit (docs/security.md, "The cost of a match")."""

from __future__ import annotations

import itertools
import logging

import pytest

from broker_edge.protocol.packets import Subscribe, Subscription, Unsubscribe
from tests.e2e.broker_clients import PahoClient, RawClient

BRANCHING = ["/".join(levels) + "/z" for levels in itertools.product("a+", repeat=7)]
"""128 filters that branch on ``+`` at every level: together, one match of ``a/a/a/a/a/a/a/...`` visits
every one of their nodes."""


def _refusals(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "reason", None) == "subscribe_match_cost"]


def test_filters_that_would_make_a_match_walk_past_the_limit_are_refused_0x97_v3_0x80(start_broker, caplog):
    broker = start_broker(limits={"max_match_nodes": 120, "max_subscriptions_per_client": 1000})
    v5 = RawClient(broker.port, 5)
    v5.connect("branchy-5")
    v5.send_packet(Subscribe(1, [Subscription(f) for f in BRANCHING[:64]]))
    codes = v5.recv().reason_codes
    granted = [f for f, code in zip(BRANCHING, codes, strict=False) if code == 0]
    assert granted and set(codes) == {0, 0x97} and codes.index(0x97) > 0
    v3 = PahoClient(broker.port, "branchy-3", version=4)
    assert v3.subscribe(BRANCHING[64], 0) == [0x80]  # another session's filter counts the same
    assert v3.subscribe("fleet/+/telemetry", 0) == [0]  # a filter that adds little still fits
    assert broker.drops("subscribe_match_cost") == codes.count(0x97) + 1
    [first, *_] = _refusals(caplog)
    assert (
        first.levelno == logging.WARNING
        and getattr(first, "topic", None) in BRANCHING
        and "max_match_nodes" in first.getMessage()
    )
    walk = broker.call(lambda: broker.broker.router.trie._root.walk)
    assert walk <= 120
    # What was granted is served: a publish to a topic no one has published to yet reaches the session
    # whose filters match it, once (its matching subscriptions merged).
    publisher = PahoClient(broker.port, "p")
    publisher.publish("a/a/a/a/a/a/a/z", b"new", 1)
    assert v5.recv().payload == b"new"
    with pytest.raises(TimeoutError):
        v5.recv(timeout=0.3)


def test_unsubscribing_makes_room_again(start_broker):
    broker = start_broker(limits={"max_match_nodes": 120, "max_subscriptions_per_client": 1000})
    first = RawClient(broker.port, 5)
    first.connect("first")
    first.send_packet(Subscribe(1, [Subscription(f) for f in BRANCHING[:64]]))
    granted = [f for f, code in zip(BRANCHING, first.recv().reason_codes, strict=False) if code == 0]
    second = RawClient(broker.port, 5)
    second.connect("second")
    assert second.subscribe(BRANCHING[100]).reason_codes == [0x97]
    first.send_packet(Unsubscribe(2, granted))
    assert set(first.recv().reason_codes) == {0}
    assert second.subscribe(BRANCHING[100], packet_id=2).reason_codes == [0]


def test_a_fleets_filters_all_fit_the_default(start_broker):
    """Devices' own command filters (one exact branch each) and the consumers' wildcards: all granted."""
    broker = start_broker()
    filters = [f"devices/d-{n:04}/+/cmd" for n in range(2_000)] + [
        "fleet/+/telemetry",
        "fleet/#",
        "spBv1.0/+/NDATA/+",
        "$share/ingest/fleet/+/telemetry",
    ]
    gateways = []
    for start in range(0, len(filters), 100):
        gateway = RawClient(broker.port, 5)
        gateway.connect(f"gateway-{start}")
        gateway.send_packet(Subscribe(1, [Subscription(f) for f in filters[start : start + 100]]))
        assert set(gateway.recv().reason_codes) == {0}
        gateways.append(gateway)
    assert broker.drops("subscribe_match_cost") == 0
