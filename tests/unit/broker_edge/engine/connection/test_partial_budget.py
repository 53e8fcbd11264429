"""The broker-wide budget of unfinished packets (``limits.max_partial_packet_bytes``): the connection whose
bytes pass it is closed, and what it held leaves the budget at once, so the clients after it are not
refused for bytes that will never be read."""

from __future__ import annotations

from broker_edge.engine.connection.states import CONNECTED
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import MQTT_5, ConnAck, Connect, Publish
from tests.unit.broker_edge.engine.handlers.wire import make_core

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
