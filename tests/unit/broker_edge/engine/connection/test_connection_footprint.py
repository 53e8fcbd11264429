"""What an idle client costs the broker: the Python objects a connection and its session keep, in bytes.

Real connections (the state machine in its stream adapter, as the broker runs them) of a real ``BrokerCore``
(no socket: the bytes of CONNECT are fed to them), counted with
``tracemalloc``: the budget holds the connection, the session, the client id and its entry in the broker's
map of sessions (a connected client has no entry of its own in a map of connections); a decoder of its own, a
float of its own or an empty container made per connection would each exceed it. (The transport's own memory
is measured by ``bench/footprint_bench.py``.)
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from broker_edge.engine.connection.states import CONNECTED
from broker_edge.protocol.codec import encode
from broker_edge.protocol.errors import MalformedPacket
from broker_edge.protocol.packets import MQTT_3_1_1, MQTT_5, Connect, PingReq, PingResp, Publish
from broker_edge.runtime.transports.stream import StreamConnection
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, make_core
from tests.unit.broker_edge.engine.stand_ins import NullTransport

BYTES_PER_IDLE_CONNECTION = 296
"""Room for the connection, the session, a 17-character client id and the entry in one map, not for one
more object per connection, even a float (24 bytes): what it holds now is in docs/broker.md, "Speed and
memory"."""


def _connect_all(core: HandDrivenCore, frames: list[bytes], transport: NullTransport) -> None:
    for frame in frames:
        conn = StreamConnection(core, core.listener)
        conn.attach_transport(transport)
        conn.data_received(frame)
        core.run_soon()


def _connect_frames(prefix: str, count: int) -> list[bytes]:
    """CONNECT of MQTT 3.1.1 clients with 17-character client ids, clean session, keep alive 600 s."""
    return [
        encode(
            Connect(client_id=f"{prefix}{n:012d}", protocol_version=MQTT_3_1_1, keep_alive=600), MQTT_3_1_1
        )
        for n in range(count)
    ]


def test_an_idle_connection_and_its_session_stay_within_their_byte_budget(quiet_broker_log):
    core = make_core()
    transport = NullTransport()
    warm, measured = _connect_frames("warm-", 100), _connect_frames("idle-", 400)
    _connect_all(core, warm, transport)  # the maps are not empty, the shared decoder and deadline exist
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        _connect_all(core, measured, transport)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert len(core.connections) == 500 and all(c.state == CONNECTED for c in core.connections)
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    per_connection = grown / len(measured)
    assert per_connection <= BYTES_PER_IDLE_CONNECTION, (
        f"{per_connection:.0f} bytes per idle connection; by file:\n"
        + "\n".join(str(stat) for stat in after.compare_to(before, "lineno")[:12])
    )


def test_idle_connections_share_their_decoder_and_their_keepalive_deadline():
    core = make_core()
    transport = NullTransport()
    _connect_all(core, _connect_frames("device-", 3), transport)
    first, second, third = core.connections
    assert first.decoder.shared and first.decoder is second.decoder is third.decoder
    assert first.deadline == second.deadline >= core.now() + 900, "1.5 times the keep alive"
    assert first.deadline is second.deadline is third.deadline, "connected in the same quarter second"


def test_a_packet_split_across_reads_gets_a_decoder_of_its_own_until_it_is_complete():
    core = make_core()
    client = core.client(MQTT_5)
    client.connect("splitter")
    shared = client.conn.decoder
    assert shared.shared
    frame = encode(Publish("plant/meter", b"x" * 100), MQTT_5)
    client.send_bytes(frame[:40])
    own = client.conn.decoder
    assert not own.shared and own.buffered == 40 and core.partial_bytes == 40
    assert shared.buffered == 0, "the shared decoder holds nothing of it"
    answer = client.send_bytes(frame[40:] + encode(PingReq(), MQTT_5))
    assert [type(packet) for packet in answer] == [PingResp]
    assert client.conn.decoder is shared and core.partial_bytes == 0


def test_a_malformed_packet_on_a_shared_decoder_closes_only_its_connection():
    core = make_core()
    bad, good = core.client(MQTT_5), core.client(MQTT_5)
    bad.connect("bad")
    good.connect("good")
    assert bad.conn.decoder is good.conn.decoder
    bad.send_bytes(bytes((0x30, 0x03, 0x00, 0x05, 0x61)))  # the topic length runs past the packet
    assert bad.closed
    assert bad.conn.decoder.failed and not bad.conn.decoder.shared
    assert not good.conn.decoder.failed, "the shared decoder was left clean"
    assert good.send(PingReq()) and good.connected
    with pytest.raises(MalformedPacket):
        bad.conn.decoder.feed(b"")
