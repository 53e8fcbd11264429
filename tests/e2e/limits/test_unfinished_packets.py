"""What half-sent packets may hold: a small first packet before CONNECT, a broker-wide budget for packets
in progress, and a time limit for one packet to arrive.

Written as the attack: many sockets each send the first half of a large packet and then nothing, before
CONNECT and after it (MQTT 3.1.1 with keep alive 0, which no keep alive timeout ends); and one address
filling the budget while a client at another address sends a large packet in two reads.
"""

from __future__ import annotations

import contextlib
import socket
import time

from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import Connect, PubAck, Publish
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import TIMEOUT, PahoClient, RawClient, raw_client_from, wait_for


def half_of(frame: bytes) -> bytes:
    return frame[: len(frame) // 2]


def large_connect(size: int) -> bytes:
    """A v5 CONNECT frame of ``size`` bytes (its properties padded with user properties)."""
    pad = [("k", "v" * 60_000)] * (size // 60_000)
    body = encode(Connect(protocol_version=5, client_id="x", properties=Properties(user_properties=pad)), 5)
    return body


def partial_bytes(broker) -> int:
    return broker.call(lambda: broker.broker.partial_bytes)


def test_half_a_large_connect_is_refused_at_its_header_and_holds_nothing(start_broker):
    broker = start_broker(limits={"new_connections_per_second": 0})
    big_connect = large_connect(1_000_000)
    attackers = [socket.create_connection(("127.0.0.1", broker.port), timeout=TIMEOUT) for _ in range(50)]
    for sock in attackers:
        sock.sendall(half_of(big_connect))
    for sock in attackers:  # closed at once (not after the 10 s CONNECT timeout), after CONNACK 0x95
        answer = b""
        with contextlib.suppress(ConnectionResetError):  # the rest of what it sent was never read
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer in (b"", b"\x20\x03\x00\x95\x00")
        sock.close()
    assert partial_bytes(broker) == 0
    assert broker.refused("connect_too_large") == 50
    ok = RawClient(broker.port, 5)  # a CONNECT of normal size is still welcome
    assert ok.connect("device", password=b"p" * 1000, username="u").reason_code == 0


def test_half_sent_publishes_share_a_broker_wide_budget_and_a_time_limit(start_broker):
    budget = 2 * 1024 * 1024
    broker = start_broker(
        limits={
            "max_partial_packet_bytes": budget,
            "partial_packet_timeout_s": 2,
            "messages_per_second_per_client": 0,
        }
    )
    half = half_of(encode(Publish("big", b"x" * 512 * 1024, 0), 4))
    clients = []
    for n in range(12):
        client = RawClient(broker.port, 4)
        assert client.connect(f"slow-{n}", keep_alive=0).reason_code == 0
        client.send(half)
        clients.append(client)
    assert wait_for(lambda: partial_bytes(broker) > 0)
    closed = [client for client in clients if client.closed(timeout=0.2)]
    assert 0 < partial_bytes(broker) <= budget
    assert len(closed) >= 12 - budget // len(half)  # those that would have passed the budget
    assert wait_for(lambda: all(client.closed(timeout=0.1) for client in clients), timeout=6)  # time limit
    assert partial_bytes(broker) == 0

    sub = PahoClient(broker.port, "sub")
    sub.subscribe("big", 0)
    PahoClient(broker.port, "pub").publish("big", b"y" * 1_000_000, 0)  # a whole large packet still passes
    assert len(sub.expect(1)[0].payload) == 1_000_000


def test_a_peer_holding_the_partial_budget_gives_way_to_a_client_at_another_address(start_broker):
    budget = 2 * 1024 * 1024
    broker = start_broker(
        limits={
            "max_partial_packet_bytes": budget,
            "messages_per_second_per_client": 0,
            "new_connections_per_second": 0,
        }
    )
    almost = encode(Publish("big", b"x" * 500_000, 0), 5)[:-10]  # all but the last 10 bytes
    hogs = []
    for n in range(4):  # one address, 4 x 500 KB half-sent: just under the budget
        hog = raw_client_from(broker.port, "127.0.0.1")
        assert hog.connect(f"hog-{n}").reason_code == 0
        hog.send(almost)
        hogs.append(hog)
    assert wait_for(lambda: partial_bytes(broker) == 4 * len(almost))

    sub = PahoClient(broker.port, "sub")
    sub.subscribe("plant/upload", 1)
    victim = raw_client_from(broker.port, "127.0.0.2")
    assert victim.connect("victim").reason_code == 0
    upload = encode(Publish("plant/upload", b"v" * 200_000, 1, packet_id=7), 5)
    victim.send(upload[:100_000])  # the budget is passed: the hogs' address holds the most, not the victim's
    assert hogs[0].expect_disconnect(0x89)  # the oldest of the largest gives way, and one is enough
    assert not any(hog.closed(timeout=0.2) for hog in hogs[1:])
    time.sleep(0.3)
    victim.send(upload[100_000:])
    answer = victim.recv()
    assert isinstance(answer, PubAck) and answer.packet_id == 7 and answer.reason_code == 0
    assert len(sub.expect(1)[0].payload) == 200_000
    assert partial_bytes(broker) == 3 * len(almost)
