"""MQTT over WebSocket as clients see it: a client that stops reading is still ended by the broker (at stop,
or when it closes the connection) in bounded time; a packet over the Maximum Packet Size is answered as on
TCP, whatever the WebSocket messages carrying it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import struct
import threading
import time
from functools import partial

import aiohttp
import pytest

from broker_edge.protocol import PacketDecoder
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import ConnAck, Connect, Disconnect, Publish, Subscribe, Subscription
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.runtime.transports.turns import packets_per_turn
from broker_edge.runtime.transports.websocket import PING_PACKETS
from tests.e2e.broker_clients import PahoClient, wait_for

UPGRADE = (
    "GET /mqtt HTTP/1.1\r\nHost: broker\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
)


def frame(payload: bytes) -> bytes:
    """One masked binary frame from a client, payload under 126 bytes."""
    mask = os.urandom(4)
    return bytes([0x82, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def stalled_websocket_subscriber(port: int, client_id: str) -> socket.socket:
    """A WebSocket client subscribed to ``t/#`` with a small receive window, that the test does not read."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    sock.sendall(UPGRADE.format(key=base64.b64encode(os.urandom(16)).decode()).encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 101")
    connect = encode(Connect(protocol_version=5, client_id=client_id, keep_alive=60), 5)
    sock.sendall(frame(connect) + frame(encode(Subscribe(1, [Subscription("t/#", 0)]), 5)))
    return sock


def paused(broker, client_id: str) -> bool:
    """Whether the broker's writes to ``client_id`` are paused: its client stopped reading them."""
    connections = broker.broker.connections
    return broker.call(lambda: next(c for c in connections if c.client_id == client_id).terms.paused)


def test_a_broker_with_a_websocket_client_that_stopped_reading_stops_at_once(start_broker):
    broker = start_broker(
        listeners=[
            {"name": "tcp", "type": "tcp", "host": "127.0.0.1", "port": 0},
            {"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0},
        ],
        limits={"outgoing_buffer_bytes": 65_536, "messages_per_second_per_client": 0},
    )
    stalled = stalled_websocket_subscriber(broker.port_of("ws"), "stalled")
    assert wait_for(lambda: broker.connected("stalled"))
    publisher = PahoClient(broker.port_of("tcp"), "publisher", version=5)
    for _ in range(10_000):
        publisher.client.publish("t/x", b"z" * 1000)
    assert wait_for(lambda: paused(broker, "stalled"))
    started = time.monotonic()
    broker.stop()
    assert time.monotonic() - started < 4  # not aiohttp's 60 s shutdown timeout
    stalled.close()


def open_websocket_sockets(broker) -> int:
    """Sockets the broker's WebSocket listener holds open (its HTTP guard's count)."""
    listener = broker.broker._runners[0]
    return broker.call(lambda: len(listener.guard.open))


def test_a_websocket_client_that_stopped_reading_loses_its_socket_when_the_broker_closes_it(start_broker):
    broker = start_broker(
        listeners=[
            {"name": "tcp", "type": "tcp", "host": "127.0.0.1", "port": 0},
            {"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0},
        ],
        limits={"outgoing_buffer_bytes": 65_536, "messages_per_second_per_client": 0},
    )
    stalled = stalled_websocket_subscriber(broker.port_of("ws"), "device")
    assert wait_for(lambda: broker.connected("device"))
    publisher = PahoClient(broker.port_of("tcp"), "publisher", version=5)
    for _ in range(10_000):
        publisher.client.publish("t/x", b"z" * 1000)
    assert wait_for(lambda: paused(broker, "device"))
    PahoClient(broker.port_of("tcp"), "device", version=5)  # takes the client id over: the old one is closed
    assert wait_for(lambda: open_websocket_sockets(broker) == 0, timeout=8)  # 2 s after its close
    stalled.close()


def test_a_websocket_message_over_max_packet_size_gets_disconnect_0x95_as_on_tcp(start_broker):
    """A v5 client sending a packet larger than the Maximum Packet Size of its CONNACK gets DISCONNECT 0x95
    (Packet too large) before the close, whether the packet comes in one WebSocket message or in several."""
    broker = start_broker(
        listeners=[{"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0}],
        limits={"max_packet_size": 1024},
    )
    connect = encode(Connect(protocol_version=5, client_id="big", keep_alive=60), 5)
    oversized = encode(Publish(topic="t", payload=b"x" * 2000), 5)

    async def session(frames: list[bytes]) -> tuple[bytes, aiohttp.WSMsgType]:
        async with (
            aiohttp.ClientSession() as client,
            client.ws_connect(f"http://127.0.0.1:{broker.port_of('ws')}/mqtt", protocols=("mqtt",)) as ws,
        ):
            await ws.send_bytes(connect)
            received = (await ws.receive(timeout=5)).data
            for data in frames:
                await ws.send_bytes(data)
            while (message := await ws.receive(timeout=5)).type == aiohttp.WSMsgType.BINARY:
                received += message.data
            return received, message.type

    for frames in ([oversized], [oversized[:1000], oversized[1000:]]):
        received, end = asyncio.run(session(frames))
        connack, disconnect = PacketDecoder(role="client", protocol_version=5).feed(received)
        assert isinstance(connack, ConnAck) and connack.reason_code == 0
        assert isinstance(disconnect, Disconnect) and disconnect.reason_code == ReasonCode.PACKET_TOO_LARGE
        assert end in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    assert broker.disconnects("packet_too_large") == 2


def ping(payload: bytes = b"") -> bytes:
    """A masked WebSocket ping frame from a client."""
    mask = os.urandom(4)
    return bytes([0x89, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_a_websocket_client_gone_while_its_pings_are_answered_is_no_traceback(start_broker, caplog):
    broker = start_broker(listeners=[{"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0}])
    for client_id in ("pinger-1", "pinger-2", "pinger-3"):
        sock = stalled_websocket_subscriber(broker.port_of("ws"), client_id)
        assert wait_for(partial(broker.connected, client_id))
        sock.sendall(ping() * 30_000)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset while the broker answers the pings
        assert wait_for(lambda: not broker.connected(client_id))  # noqa: B023 (waited for here)
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


def test_websocket_pings_are_read_within_the_turns_budget_and_all_answered(start_broker):
    """A flood of WebSocket pings is read over many turns of the loop, as a flood of MQTT packets is
    (``limits.read_bytes_per_turn``), each answered with a pong."""
    broker = start_broker(
        listeners=[{"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0}],
        limits={"read_bytes_per_turn": 4096},
    )
    sock = stalled_websocket_subscriber(broker.port_of("ws"), "pinger")
    assert wait_for(lambda: broker.connected("pinger"))
    pings = 20_000
    sock.sendall(ping(b"p") * pings)
    received = b""
    while received.count(b"\x8a\x01p") < pings:  # a pong carries the ping's payload back
        received += sock.recv(1 << 20)
    assert broker.metric("timestone_broker_read_turns_cut_total") > 0
    sock.close()


def test_a_websocket_ping_counts_as_eight_packets_of_a_turn_so_a_ping_flood_holds_no_turn_long(start_broker):
    """Each ping is answered with a write of its own: counted as one packet, a turn of 1,024 of them took
    about 10 ms (a healthy client's PINGREQ 11 ms at the median while they flooded); counted as eight
    (``PING_PACKETS``), a turn answers 128, and a flood of them is read over eight times as many turns."""
    broker = start_broker(listeners=[{"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0}])
    sock = stalled_websocket_subscriber(broker.port_of("ws"), "pinger")
    assert wait_for(lambda: broker.connected("pinger"))
    pings = 40_000
    sock.sendall(ping() * pings)
    received = b""
    while received.count(b"\x8a\x00") < pings:  # every ping answered
        received += sock.recv(1 << 20)
    cut = broker.metric("timestone_broker_read_turns_cut_total")
    assert cut >= pings / 128 / 2, f"{pings} pings answered in {cut} turns cut"  # 1,024 a turn: about 40
    assert packets_per_turn(broker.config.limits.read_bytes_per_turn) // PING_PACKETS == 128
    sock.close()


def test_permessage_deflate_is_not_negotiated(start_broker):
    """A client offering permessage-deflate gets the upgrade without it: compression would cost a zlib state
    per connection (hundreds of KiB) and a compression of every message to every such subscriber."""
    broker = start_broker(listeners=[{"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0}])

    async def session() -> tuple[int, bytes]:
        async with (
            aiohttp.ClientSession() as client,
            client.ws_connect(
                f"http://127.0.0.1:{broker.port_of('ws')}/mqtt", protocols=("mqtt",), compress=15
            ) as ws,
        ):
            await ws.send_bytes(encode(Connect(protocol_version=5, client_id="deflater", keep_alive=60), 5))
            message = await ws.receive(timeout=5)
            return ws.compress, message.data

    compress, received = asyncio.run(session())
    assert compress == 0  # the broker's answer named no extension
    assert isinstance(PacketDecoder(role="client", protocol_version=5).feed(received)[0], ConnAck)


def test_a_held_websocket_connection_waits_without_polling_and_reads_again_once_released(start_broker):
    """A WebSocket client over its message rate is held as a TCP one is: its transport stops reading (no
    wake-up per 10 ms while it waits), and once the bucket refills its messages are read, none lost."""
    broker = start_broker(
        listeners=[
            {"name": "tcp", "type": "tcp", "host": "127.0.0.1", "port": 0},
            {"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0},
        ],
        limits={"messages_per_second_per_client": 2, "messages_burst_per_client": 1},
    )
    watcher = PahoClient(broker.port_of("tcp"), "watcher", version=5)
    watcher.subscribe("held/#")
    sock = stalled_websocket_subscriber(broker.port_of("ws"), "held")
    assert wait_for(lambda: broker.connected("held"))
    for n in range(4):
        sock.sendall(frame(encode(Publish(topic=f"held/{n}", payload=b"x"), 5)))

    def state() -> tuple[bool, bool]:
        """Whether the connection is held, and whether its transport reads."""
        connection = next(c for c in broker.broker.connections if c.client_id == "held")
        return bool(connection.held), connection.transport.is_reading()

    assert wait_for(lambda: broker.call(state) == (True, False))  # held: its transport does not read
    assert sorted(m.topic for m in watcher.expect(4)) == [f"held/{n}" for n in range(4)]
    assert wait_for(lambda: broker.call(state) == (False, True))
    sock.close()


def test_a_flood_of_empty_websocket_fragments_is_read_within_the_turns_budget(start_broker):
    """A client sending a message that never ends, as empty continuation frames (six bytes each, no byte of
    a packet), is read a turn's bytes at a time like any other flood: its frames used to be parsed as fast
    as the socket gave them, and a PUBACK to another client took about a second meanwhile."""
    broker = start_broker(
        listeners=[
            {"name": "tcp", "type": "tcp", "host": "127.0.0.1", "port": 0},
            {"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0},
        ],
        limits={"messages_per_second_per_client": 0},
    )
    sock = stalled_websocket_subscriber(broker.port_of("ws"), "fragments")
    assert wait_for(lambda: broker.connected("fragments"))
    publisher = PahoClient(broker.port_of("tcp"), "publisher", version=5)
    sock.sendall(bytes([0x02, 0x80]) + bytes(4))  # a binary message begun, its FIN never sent
    empty_fragments = (bytes([0x00, 0x80]) + bytes(4)) * 40_000
    sent: list[int] = []
    flooding = threading.Event()
    flooding.set()

    def flood() -> None:
        with contextlib.suppress(OSError):
            while flooding.is_set():
                sock.sendall(empty_fragments)
                sent.append(len(empty_fragments))

    def puback_times() -> list[float]:
        answered = []
        for _ in range(20):
            started = time.monotonic()
            publisher.publish("t/x", b"x", 1)
            answered.append(time.monotonic() - started)
        return sorted(answered)

    alone = puback_times()  # this machine's pace now, without the flood
    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        time.sleep(0.3)
        answered = puback_times()
        read_on = broker.connected("fragments")  # asked before its socket closes below
    finally:
        flooding.clear()
        sock.close()
        flooder.join(timeout=5)
    assert len(sent) > 10 and read_on  # it flooded all along, and was read
    bound = max(0.08, 15 * alone[10])  # 0.12-0.2 s unbounded on a quiet machine
    assert answered[10] < bound, f"PUBACKs took {answered} s, {alone} s without the flood"
    assert broker.metric("timestone_broker_read_turns_cut_total") > 0  # its bytes were read turn by turn


def upgrade_with(port: int, protocols: str | None) -> bytes:
    """What the broker answers to a WebSocket upgrade offering ``protocols`` (None: no such header)."""
    request = UPGRADE.format(key=base64.b64encode(os.urandom(16)).decode())
    offered = "" if protocols is None else f"Sec-WebSocket-Protocol: {protocols}\r\n"
    request = request.replace("Sec-WebSocket-Protocol: mqtt\r\n", offered)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request.encode())
        answer = b""
        while b"\r\n\r\n" not in answer and (data := sock.recv(4096)):
            answer += data
        return answer


@pytest.mark.mqtt5("MQTT-6.0.0-4")
@pytest.mark.mqtt311("MQTT-6.0.0-4")
def test_an_upgrade_offering_subprotocols_but_not_mqtt_is_refused_400_naming_it(start_broker, caplog):
    """[MQTT-6.0.0-4] The subprotocol the broker selects is ``mqtt``: an upgrade offering others only (a
    chat client, a browser tab on the wrong URL) gets 400 in JSON naming what it offered, one WARNING at a
    bounded rate, and no upgrade; one offering none is still upgraded, as other brokers do."""
    broker = start_broker(listeners=[{"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0}])
    port = broker.port_of("ws")
    for offered in ("chat", "chat, superchat", "MQTT5"):
        answer = upgrade_with(port, offered)
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert b"application/json" in answer.split(b"\r\n\r\n", 1)[0]
    answer = upgrade_with(port, "chat")
    assert b'"error": "bad_request"' in answer and b"offers no subprotocol mqtt" in answer, answer
    assert b"Sec-WebSocket-Protocol: mqtt" in upgrade_with(port, "chat, mqtt")
    assert upgrade_with(port, None).startswith(b"HTTP/1.1 101")
    logged = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [m for m in logged if "offers no subprotocol mqtt" in m], logged
    assert not [m for m in logged if "overlap" in m], logged  # aiohttp's own line, once an attempt
