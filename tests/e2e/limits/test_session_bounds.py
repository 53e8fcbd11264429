"""Persistent sessions are bounded: how many the broker keeps, and how many filter bytes each may hold.

Written as the attack: many anonymous clients with clean session 0, each subscribing to as many ~1 KB
filters as it is allowed.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker_edge.protocol.packets import Disconnect, SubAck, Subscribe, Subscription
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import RawClient

PERSISTENT = {5: {"clean_start": False, "properties": Properties(session_expiry_interval=3600)}, 4: {}}
REFUSED = {5: 0x97, 4: 0x03}


def connect(broker, client_id: str, version: int, **fields) -> tuple[RawClient, Any]:
    client = RawClient(broker.port, version)
    fields = {**({"clean_start": False} if version == 4 else PERSISTENT[5]), **fields}
    return client, client.connect(client_id, **fields)


@pytest.mark.parametrize("version", [5, 4])
def test_the_number_of_persistent_sessions_is_bounded(start_broker, version):
    broker = start_broker(sessions={"max_persistent": 20})
    codes = []
    for n in range(30):
        client, ack = connect(broker, f"hoarder-{n}", version)
        codes.append(ack.reason_code)
        client.send_packet(Disconnect())
    assert codes == [0] * 20 + [REFUSED[version]] * 10
    assert broker.refused("session_quota") == 10
    assert broker.call(lambda: len(broker.broker.router.sessions)) == 20
    _, resumed = connect(broker, "hoarder-3", version)  # an existing session still resumes
    assert resumed.reason_code == 0 and resumed.session_present is True
    clean = RawClient(broker.port, version)  # a clean session is not persistent: not counted
    assert clean.connect("passer-by", clean_start=True).reason_code == 0
    ended = RawClient(broker.port, version)  # ending one persistent session frees its place
    assert ended.connect("hoarder-0", clean_start=True).reason_code == 0
    ended.send_packet(Disconnect())
    assert ended.closed()
    _, newcomer = connect(broker, "newcomer", version)
    assert newcomer.reason_code == 0


@pytest.mark.parametrize("version", [5, 4])
def test_filter_bytes_per_session_are_bounded(start_broker, version):
    broker = start_broker(limits={"max_subscription_bytes_per_client": 8192})
    client, ack = connect(broker, "greedy", version)
    assert ack.reason_code == 0
    filters = [f"f/{n}/" + "x" * 1000 for n in range(100)]
    client.send_packet(Subscribe(1, [Subscription(f, 1) for f in filters]))
    suback = client.recv()
    assert isinstance(suback, SubAck)
    granted = [f for f, code in zip(filters, suback.reason_codes, strict=True) if code == 1]
    assert len(granted) == 8 and sum(len(f) for f in granted) <= 8192
    assert set(suback.reason_codes[8:]) == {0x97 if version == 5 else 0x80}
    held = broker.call(lambda: sum(len(key) for key in broker.broker.router.sessions["greedy"].subscriptions))
    assert held <= 8192
