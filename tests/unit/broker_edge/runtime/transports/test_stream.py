"""The transport adapter: what a ``StreamConnection`` does with the state machine's output, over a transport
kept in memory (writes, reading paused or not, closed or aborted)."""

from __future__ import annotations

from typing import Any

from broker_edge.engine.connection.states import CLOSED
from broker_edge.protocol import PacketDecoder
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import (
    MQTT_5,
    Connect,
    Disconnect,
    PingReq,
    PubAck,
    Publish,
    Subscribe,
    Subscription,
)
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.runtime.transports.stream import JOINED_UP_TO, StreamConnection
from broker_edge.runtime.transports.tcp import TcpConnection
from broker_edge.runtime.transports.turns import ReadTurns
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, make_core


class MemoryTransport:
    """A transport keeping what was written, whether reading is paused and how it was closed."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.ended = ""
        self.reading = True

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def writelines(self, parts: list[bytes]) -> None:
        self.writes.append(b"".join(parts))

    def is_closing(self) -> bool:
        return bool(self.ended)

    def close(self) -> None:
        self.ended = self.ended or "closed"

    def abort(self) -> None:
        self.ended = "aborted"

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 50001) if name == "peername" else default


def connected(
    core: HandDrivenCore, client_id: str, kind: type[StreamConnection] = StreamConnection
) -> tuple[StreamConnection, MemoryTransport]:
    transport = MemoryTransport()
    conn = kind(core, core.listener)
    conn.attach_transport(transport)
    conn.data_received(encode(Connect(client_id=client_id, protocol_version=MQTT_5), MQTT_5))
    core.run_soon()
    transport.writes.clear()
    return conn, transport


def test_a_turn_of_output_is_one_write_at_the_flush():
    core = make_core()
    conn, transport = connected(core, "batched")
    conn.data_received(encode(PingReq(), MQTT_5) * 3)
    assert transport.writes == [], "nothing is written before the end of the turn"
    core.run_soon()
    assert transport.writes == [b"\xd0\x00" * 3]


class PiecesTransport(MemoryTransport):
    """A ``MemoryTransport`` that also keeps how each write was handed over: one piece, or several."""

    def __init__(self) -> None:
        super().__init__()
        self.pieces: list[int] = []

    def write(self, data: bytes) -> None:
        self.pieces.append(1)
        super().write(data)

    def writelines(self, parts: list[bytes]) -> None:
        self.pieces.append(len(parts))
        super().writelines(parts)


def test_a_turn_of_small_deliveries_is_joined_and_a_large_one_handed_over_in_its_pieces():
    """QoS 1 deliveries are a head, a packet id and a payload each: up to ``JOINED_UP_TO`` bytes in a
    turn they are written as one piece, beyond it as the pieces (a shared payload is not copied)."""
    core = make_core()
    consumer, _ = connected(core, "consumer")
    transport = PiecesTransport()
    consumer.attach_transport(transport)
    device, _ = connected(core, "device")
    consumer.data_received(encode(Subscribe(packet_id=1, subscriptions=[Subscription("fleet/+", 1)]), MQTT_5))
    core.run_soon()
    transport.writes.clear()
    transport.pieces.clear()
    small = [Publish(topic="fleet/d-1", payload=b"21.5", qos=1, packet_id=n) for n in (1, 2, 3)]
    device.data_received(b"".join(encode(publish, MQTT_5) for publish in small))
    core.run_soon()
    large = bytes(JOINED_UP_TO)
    device.data_received(encode(Publish(topic="fleet/d-2", payload=large, qos=1, packet_id=4), MQTT_5))
    core.run_soon()
    assert transport.pieces == [1, 3]
    delivered = PacketDecoder(role="client", protocol_version=MQTT_5).feed(b"".join(transport.writes))
    assert [(p.topic, p.payload) for p in delivered if isinstance(p, Publish)] == [
        *[("fleet/d-1", b"21.5")] * 3,
        ("fleet/d-2", large),
    ]


def test_a_close_decided_by_a_read_is_carried_out_when_the_read_returns():
    core = make_core()
    conn, transport = connected(core, "twice")
    conn.data_received(encode(Connect(client_id="twice", protocol_version=MQTT_5), MQTT_5))
    assert transport.ended == "closed", "closed before the turn ends"
    written = PacketDecoder(role="client", protocol_version=MQTT_5).feed(b"".join(transport.writes))
    assert [(type(packet), packet.reason_code) for packet in written] == [
        (Disconnect, ReasonCode.PROTOCOL_ERROR)
    ]
    conn.connection_lost(None)
    assert conn.state == CLOSED


def test_an_abort_after_a_close_aborts_and_the_end_is_told_once():
    core = make_core()
    conn, transport = connected(core, "stopping")
    conn.close(ReasonCode.SERVER_SHUTTING_DOWN, "stopping")
    conn.flush()
    assert transport.ended == "closed"
    conn.abort()
    conn.flush()
    assert transport.ended == "aborted"
    conn.connection_lost(None)
    conn.connection_lost(None)
    assert core.connections == []


def test_a_hold_stops_reading_at_once_and_a_release_resumes_it_at_the_flush():
    core = make_core()
    conn, transport = connected(core, "held")
    conn.hold(1)
    conn.data_received(b"")
    assert not transport.reading
    conn.release(1)
    assert not transport.reading, "resumed by the flush, not inside the release"
    core.run_soon()
    assert transport.reading


def test_the_peer_address_comes_from_the_transport():
    core = make_core()
    conn, _ = connected(core, "addressed")
    assert conn.peer_host() == "127.0.0.1"


def test_a_tcp_connection_owes_acknowledgements_while_a_qos_1_delivery_to_it_is_unacknowledged():
    """What puts a subscriber at the front of the read turns' line (``ReadTurns``): deliveries in flight."""
    core = make_core()
    core.read_turns = ReadTurns(64 * 1024, core.call_soon)  # type: ignore[attr-defined]  # a Broker's, not a core's
    consumer, transport = connected(core, "consumer", TcpConnection)
    device, _ = connected(core, "device", TcpConnection)
    assert isinstance(consumer, TcpConnection) and isinstance(device, TcpConnection)
    consumer.data_received(encode(Subscribe(packet_id=1, subscriptions=[Subscription("fleet/+", 1)]), MQTT_5))
    core.run_soon()
    assert not consumer.awaits_acknowledgements()
    device.data_received(encode(Publish(topic="fleet/d-1", payload=b"21.5", qos=1, packet_id=7), MQTT_5))
    core.run_soon()
    delivered = [
        p
        for p in PacketDecoder(role="client", protocol_version=MQTT_5).feed(b"".join(transport.writes))
        if isinstance(p, Publish)
    ]
    assert len(delivered) == 1 and delivered[0].qos == 1 and delivered[0].packet_id is not None
    assert consumer.awaits_acknowledgements() and not device.awaits_acknowledgements()
    consumer.data_received(encode(PubAck(packet_id=delivered[0].packet_id), MQTT_5))
    core.run_soon()
    assert not consumer.awaits_acknowledgements()
