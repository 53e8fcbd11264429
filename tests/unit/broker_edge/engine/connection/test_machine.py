"""The connection as a sans-IO state machine: bytes and time in, packets and events out, no socket, no loop.

Each test feeds a real ``Connection`` of a real ``BrokerCore`` (``wire.py``) what a transport would hand it
(bytes, the transport's end, its buffer filling) and the time, and reads what it puts out: the packets to
write (``take_output``), whether it holds reading (``held``) and how it ends (``closing``).
"""

from __future__ import annotations

from typing import Any

import pytest

from broker_edge.engine.connection.outgoing import ABORT, CLOSE
from broker_edge.engine.connection.states import CLOSED, CONNECTED, HELD_FOR_CONNECT, HELD_FOR_SUBSCRIBERS
from broker_edge.protocol import PacketDecoder
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import (
    MQTT_3_1_1,
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Publish,
    Subscribe,
    Subscription,
    Will,
)
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.security.auth import hash_password
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, WireClient, make_core


def decoded(client: WireClient, data: bytes) -> list[Any]:
    return PacketDecoder(role="client", protocol_version=client.version).feed(data)


def subscriber(core: HandDrivenCore, topic: str, version: int = MQTT_5) -> WireClient:
    client = core.client(version)
    client.connect(f"sub-{topic}")
    client.send(Subscribe(1, [Subscription(topic, 0)]))
    return client


def test_bytes_in_any_split_give_one_answer_per_packet():
    core = make_core()
    client = core.client(MQTT_5)
    frame = encode(Connect(client_id="split", protocol_version=MQTT_5, clean_start=True), MQTT_5)
    for byte in frame[:-1]:
        client.conn.receive(bytes((byte,)))
        core.run_soon()
        assert client.conn.take_output() is None, "nothing is answered before the packet is complete"
    client.conn.receive(frame[-1:])
    core.run_soon()
    answer = decoded(client, b"".join(client.conn.take_output() or ()))
    assert len(answer) == 1 and isinstance(answer[0], ConnAck) and answer[0].reason_code == 0
    assert client.conn.state == CONNECTED


def test_what_one_turn_writes_comes_out_as_one_batch_in_order():
    core = make_core()
    client = core.client(MQTT_5)
    client.connect("batch")
    client.conn.receive(encode(PingReq(), MQTT_5) * 3)
    assert client.conn.take_output() == [b"\xd0\x00"] * 3, "three packets, one batch, before the turn ends"
    assert client.conn.take_output() is None


@pytest.mark.mqtt5("MQTT-3.1.0-1")
def test_a_packet_before_connect_ends_the_connection_with_nothing_written():
    """[MQTT-3.1.0-1] The first packet sent from the Client to the Server MUST be a CONNECT packet."""
    core = make_core()
    client = core.client(MQTT_5)
    client.conn.receive(encode(PingReq(), MQTT_5))
    core.run_soon()
    assert client.conn.closing == CLOSE and client.conn.state == CLOSED
    assert client.conn.take_output() is None


@pytest.mark.mqtt5("MQTT-3.1.0-2")
def test_a_second_connect_is_a_protocol_error_said_in_a_disconnect():
    """[MQTT-3.1.0-2] The Server MUST process a second CONNECT packet sent from a Client as a Protocol Error
    and close the Network Connection."""
    core = make_core()
    client = core.client(MQTT_5)
    client.connect("twice")
    answer = client.send(Connect(client_id="twice", protocol_version=MQTT_5))
    assert [type(packet) for packet in answer] == [Disconnect]
    assert answer[0].reason_code == ReasonCode.PROTOCOL_ERROR
    assert client.conn.closing == CLOSE


@pytest.mark.mqtt5("MQTT-3.14.4-1")
def test_nothing_is_written_after_the_disconnect():
    """[MQTT-3.14.4-1] After sending a DISCONNECT packet the sender MUST NOT send any more MQTT Control
    Packets on that Network Connection. A delivery routed to a connection the broker is closing, in the
    same turn, is dropped rather than written after its DISCONNECT."""
    core = make_core()
    listening = subscriber(core, "plant/a")
    publisher = core.client(MQTT_5)
    publisher.connect("publisher")
    listening.conn.close(ReasonCode.SERVER_SHUTTING_DOWN, "closing")
    publisher.send(Publish("plant/a", b"late"))
    written = decoded(listening, b"".join(listening.conn.take_output() or ()))
    assert [type(packet) for packet in written] == [Disconnect]
    assert written[0].reason_code == ReasonCode.SERVER_SHUTTING_DOWN
    assert listening.conn.closing == CLOSE and listening.conn.take_output() is None


@pytest.mark.mqtt5("MQTT-3.1.2-22")
def test_the_time_handed_in_closes_a_silent_client_after_one_and_a_half_keep_alives():
    """[MQTT-3.1.2-22] If the Keep Alive value is non-zero and the Server does not receive an MQTT Control
    Packet from the Client within one and a half times the Keep Alive time period, it MUST close the
    Network Connection to the Client as if the network had failed."""
    core = make_core()
    client = core.client(MQTT_5)
    client.connect("quiet", keep_alive=10)
    start = core.now()
    client.conn.check_timers(start + 1)  # the sweep sets the deadline from the last packet heard
    client.conn.check_timers(start + 14)
    assert not client.conn.closing, "within one and a half keep alives"
    client.send(PingReq())
    client.conn.check_timers(start + 16)  # heard from: a new deadline from now
    client.conn.check_timers(start + 30)
    assert not client.conn.closing
    client.conn.check_timers(start + 32)
    core.run_soon()
    assert client.conn.closing == CLOSE
    written = decoded(client, b"".join(client.conn.take_output() or ()))
    assert [packet.reason_code for packet in written] == [ReasonCode.KEEP_ALIVE_TIMEOUT]


@pytest.mark.mqtt5("MQTT-3.1.2-22")
def test_a_silent_client_is_closed_when_its_deadline_comes_not_at_the_sweep_after_it():
    """[MQTT-3.1.2-22] The sweep that sees a deadline due before the next sweep sets a timer for it: a 1 s
    keep alive heard last at connection is closed at 1.5 s, where it waited for the sweep at 2 s (a sweep
    late at any keep alive)."""
    core = make_core()
    client = core.client(MQTT_5)
    client.connect("quiet", keep_alive=1)
    core.advance(1.0)  # the sweep: due at 1.5 s, before the next
    assert not client.conn.closing
    core.time += 0.5
    for _, due in [entry for entry in core.timers if entry[0] <= core.time]:
        due()  # the timer alone, no sweep
    core.run_soon()
    assert client.conn.closing == CLOSE
    written = decoded(client, b"".join(client.conn.take_output() or ()))
    assert [packet.reason_code for packet in written] == [ReasonCode.KEEP_ALIVE_TIMEOUT]


def test_a_packet_before_the_deadlines_timer_keeps_the_client():
    core = make_core()
    client = core.client(MQTT_5)
    client.connect("talking", keep_alive=1)
    core.advance(1.0)  # its timer set for 1.5 s
    core.time += 0.2
    client.send(PingReq())  # heard from before it
    core.time += 0.3
    for _, due in [entry for entry in core.timers if entry[0] <= core.time]:
        due()
    core.run_soon()
    assert not client.conn.closing


def test_a_connection_without_connect_in_time_is_aborted():
    core = make_core(limits={"connect_timeout_s": 5})
    client = core.client(MQTT_5)
    client.conn.check_timers(core.now() + 4)
    assert not client.conn.closing
    client.conn.check_timers(core.now() + 6)
    assert client.conn.closing == ABORT and client.conn.take_output() is None


def test_reading_is_held_as_an_event_and_what_arrived_meanwhile_is_handled_in_order(tmp_path):
    passwords = tmp_path / "passwd"
    passwords.write_text(f"alice:{hash_password('secret', 'pbkdf2-sha512')}\n")
    passwords.chmod(0o600)
    core = make_core(auth={"password_file": str(passwords)})
    client = core.client(MQTT_5)
    connect = Connect(client_id="slow", protocol_version=MQTT_5, username="alice", password=b"secret")
    client.conn.receive(encode(connect, MQTT_5) + encode(PingReq(), MQTT_5))
    assert client.conn.held == HELD_FOR_CONNECT, "the transport stops reading while the check runs"
    assert client.conn.take_output() is None
    core.run_soon()  # the password check answers
    assert not client.conn.held
    answer = decoded(client, b"".join(client.conn.take_output() or ()))
    assert [type(packet) for packet in answer] == [ConnAck, PingResp]


@pytest.mark.mqtt5("MQTT-3.1.2-8")
def test_the_transport_closing_publishes_the_will():
    """[MQTT-3.1.2-8] The Will Message MUST be published after the Network Connection is subsequently
    closed, unless it was deleted on receipt of a DISCONNECT with Reason Code 0x00."""
    core = make_core()
    listening = subscriber(core, "wills/meter")
    client = core.client(MQTT_5)
    client.connect("meter", will=Will("wills/meter", b"gone", 0, False))
    client.conn.transport_closed(None)
    assert client.conn.state == CLOSED
    delivered = listening.read()
    assert [(packet.topic, packet.payload) for packet in delivered] == [("wills/meter", b"gone")]


def test_a_full_transport_buffer_holds_the_publishers_of_its_qos0_deliveries_until_it_drains():
    core = make_core(limits={"messages_per_second_per_client": 0})
    listening = subscriber(core, "plant/b", MQTT_3_1_1)
    publisher = core.client(MQTT_5)
    publisher.connect("publisher")
    listening.conn.writing_paused()
    publisher.send(Publish("plant/b", b"written all the same"))
    assert publisher.conn.held == HELD_FOR_SUBSCRIBERS  # its reading stops: TCP slows it down
    assert [packet.payload for packet in listening.read()] == [b"written all the same"]
    listening.conn.writing_resumed()
    assert publisher.conn.held == 0
    publisher.send(Publish("plant/b", b"sent"))
    assert [packet.payload for packet in listening.read()] == [b"sent"]


def test_with_drop_qos0_a_full_transport_buffer_drops_qos0_deliveries_until_it_drains():
    core = make_core(limits={"slow_subscriber_policy": "drop_qos0"})
    listening = subscriber(core, "plant/b", MQTT_3_1_1)
    publisher = core.client(MQTT_5)
    publisher.connect("publisher")
    listening.conn.writing_paused()
    publisher.send(Publish("plant/b", b"dropped"))
    assert listening.read() == []
    assert publisher.conn.held == 0
    listening.conn.writing_resumed()
    publisher.send(Publish("plant/b", b"sent"))
    assert [packet.payload for packet in listening.read()] == [b"sent"]
