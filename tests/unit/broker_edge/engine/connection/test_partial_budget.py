"""The broker-wide budget of unfinished packets (``limits.max_partial_packet_bytes``): over it, the client
address holding the most gives way (the connection whose bytes passed it when that is its address, else
that address's largest), and what a closed connection held leaves the budget at once, so the clients after
it are not refused for bytes that will never be read."""

from __future__ import annotations

import logging

from broker_edge.engine.connection.states import CONNECTED
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import MQTT_5, ConnAck, Connect, PubAck, Publish
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, WireClient, WireConnection, make_core

BUDGET = 1024


def test_a_connection_closed_over_the_budget_frees_it_at_once_and_is_not_read_any_more():
    core = make_core(limits={"max_partial_packet_bytes": BUDGET})
    frame = encode(Publish("plant/firmware", b"x" * 2000), MQTT_5)
    holder, offender = core.client(), core.client()
    holder.connect("holder")
    offender.connect("offender")
    holder.send_bytes(frame[:900])
    assert core.partial_bytes == 900
    offender.send_bytes(frame[:200])  # 1,100 bytes unfinished: the one that sent the last is closed
    assert offender.closed and not holder.closed
    assert core.partial_bytes == 900, "the closed connection's bytes left the budget"
    offender.send_bytes(frame[200:400])
    assert core.partial_bytes == 900, "nothing it sends after its close is counted"

    newcomer = core.client()  # its CONNECT split by the reads: the first byte alone is unfinished too
    connect = encode(Connect(client_id="newcomer", protocol_version=MQTT_5, clean_start=True), MQTT_5)
    newcomer.send_bytes(connect[:1])
    assert not newcomer.closed
    (answer,) = newcomer.send_bytes(connect[1:])
    assert type(answer) is ConnAck and answer.reason_code == 0
    assert newcomer.conn.state == CONNECTED and core.partial_bytes == 900


class ConnectionElsewhere(WireConnection):
    """A client at another address than the other wire clients."""

    __slots__ = ()

    def peer_address(self) -> tuple[str, int] | None:
        return ("192.0.2.7", 40000)


class ClientElsewhere(WireClient):
    def __init__(self, core: HandDrivenCore) -> None:
        self.core = core
        self.version = MQTT_5
        self.conn = ConnectionElsewhere(core, core.listener)
        self.conn.opened()
        self.received = b""


def test_over_the_budget_the_address_holding_the_most_gives_way_not_the_newcomer():
    core = make_core(limits={"max_partial_packet_bytes": BUDGET})
    frame = encode(Publish("plant/firmware", b"x" * 2000, 1, packet_id=1), MQTT_5)
    hogs = [core.client() for _ in range(3)]  # one address, three half-sent packets
    for n, hog in enumerate(hogs):
        hog.connect(f"hog-{n}")
        hog.send_bytes(frame[: 200 + 100 * n])  # 200, 300 and 400 bytes
    assert core.partial_bytes == 900
    victim = ClientElsewhere(core)
    victim.connect("victim")
    victim.send_bytes(frame[:400])  # 1,300 bytes: the hogs' address holds the most, its largest give way
    assert not victim.closed
    assert [hog.closed for hog in hogs] == [False, False, True]
    assert core.partial_bytes == 900 and {a: p.bytes for a, p in core.partial_peers.items()} == {
        "127.0.0.1": 500,
        "192.0.2.7": 400,
    }
    (answer,) = victim.send_bytes(frame[400:])  # its publish completes and is accepted
    assert (
        type(answer) is PubAck and answer.packet_id == 1 and answer.reason_code < 0x80
    )  # 0x10: no subscriber
    assert core.partial_bytes == 500 and set(core.partial_peers) == {"127.0.0.1"}

    hogs[0].send_bytes(frame[200:1000])  # the hogs' address passes the budget again: its own sender goes
    assert hogs[0].closed and not hogs[1].closed
    assert core.partial_bytes == 300 and {a: p.bytes for a, p in core.partial_peers.items()} == {
        "127.0.0.1": 300
    }


def test_connections_closed_over_the_budget_are_said_in_the_rate_limited_refusal_lines(caplog):
    """Each connection closed over the budget wrote its own WARNING: an address sending half packets from
    connection after connection filled the log. They are refusal lines now, at most 20 per 10 s."""
    core = make_core(limits={"max_partial_packet_bytes": BUDGET})
    frame = encode(Publish("plant/firmware", b"x" * 2000), MQTT_5)
    holder = core.client()
    holder.connect("holder")
    holder.send_bytes(frame[:600])
    with caplog.at_level(logging.INFO):
        for n in range(40):
            hog = core.client()
            hog.connect(f"hog-{n}")
            hog.send_bytes(frame[:600])  # 1,200 bytes unfinished: the one that sent the last is closed
            assert hog.closed
    said = [r.getMessage() for r in caplog.records if "max_partial_packet_bytes" in r.getMessage()]
    assert 1 <= len(said) <= 20
    assert "closed: partial_budget" in said[0]
