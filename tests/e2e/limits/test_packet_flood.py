"""A flood of tiny packets from one connection (PINGREQs of 2 bytes, QoS 0 PUBLISHes of 6) is handled a
bounded number of packets per turn of the loop (one for each 64 bytes of ``limits.read_bytes_per_turn``:
1,024), on every transport and loop, and every packet of it is still handled (all PINGREQs answered, all
messages delivered), while another client's PINGREQs are answered throughout. Before, only bytes bounded a
turn: 64 KiB of such packets, 11,000 to 32,000 of them, held the loop 30-60 ms at every turn of a flood.

What a turn handles is counted on the broker's loop (``TurnWatch``): its time depends on how loaded the
machine is, its count of packets does not. The flood comes from another process (``FLOODER``: plain
sockets, no decoding), so that the test's own threads do not slow the broker down.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from broker_edge.protocol.packets import PingReq, PingResp
from broker_edge.runtime.transports.turns import packets_per_turn
from tests.e2e.broker_clients import TIMEOUT, RawClient
from tests.tls_certs import make_test_pki

NO_RATE_LIMITS = {"messages_per_second_per_client": 0, "new_connections_per_second": 0}
PINGS = 1_000_000
PUBLISHES = 300_000
PINGREQ_SIZE = 2
PUBLISH_SIZE = 6


class TurnWatch:
    """The most bytes a connection's listener handled in one turn of the broker's loop: a callback that runs
    once a turn (it schedules itself again) reads the listener's ``bytes_in``."""

    def __init__(self, broker, client_id: str) -> None:
        self.loop = broker.loop
        self.stats = broker.connection(client_id).terms.stats
        self.last = self.stats.bytes_in
        self.most = 0
        self.watching = True
        self.loop.call_soon_threadsafe(self.tick)

    def tick(self) -> None:
        now = self.stats.bytes_in
        self.most = max(self.most, now - self.last)
        self.last = now
        if self.watching:
            self.loop.call_soon(self.tick)

    def stop(self) -> int:
        self.watching = False
        return self.most


FLOODER = r"""
import base64, os, socket, ssl, sys, threading
port, listener, kind, count, cafile, sub_port = sys.argv[1:7]
count = int(count)

def connect(port, client_id, listener="tcp"):
    sock = socket.create_connection(("127.0.0.1", int(port)), timeout=30)
    if listener == "tls":
        sock = ssl.create_default_context(cafile=cafile).wrap_socket(sock, server_hostname="localhost")
    cid = client_id.encode()
    body = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(cid).to_bytes(2, "big") + cid
    packet = b"\x10" + bytes([len(body)]) + body
    if listener == "websocket":
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall((
            "GET /mqtt HTTP/1.1\r\nHost: b\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
        ).encode())
        assert read_until(sock, b"\r\n\r\n").startswith(b"HTTP/1.1 101")
        send = lambda data: sock.sendall(frame(data))
    else:
        send = sock.sendall
    send(packet)
    read_until(sock, b"\x20\x02\x00\x00")
    return sock, send

def read_until(sock, end):
    answer = b""
    while end not in answer:
        data = sock.recv(1)
        assert data, answer
        answer += data
    return answer

def frame(payload):  # a binary frame from a client, masked with a zero key
    size = len(payload)
    if size < 126:
        head = bytes([0x82, 0x80 | size])
    elif size < 65536:
        head = bytes([0x82, 0xFE]) + size.to_bytes(2, "big")
    else:
        head = bytes([0x82, 0xFF]) + size.to_bytes(8, "big")
    return head + b"\0\0\0\0" + payload

def count_bytes(sock, total, found):
    while found[0] < total:
        data = sock.recv(1 << 20)
        if not data:
            break
        found[0] += len(data)

if kind == "ping":
    sock, send = connect(port, "flood-ping")
    packet, answer, reader_sock = b"\xc0\x00", 2, sock
else:
    reader_sock, _ = connect(sub_port, "subscriber")
    reader_sock.sendall(b"\x82\x06\x00\x01\x00\x01f\x00")
    read_until(reader_sock, b"\x90\x03\x00\x01\x00")
    sock, send = connect(port, "flood-" + listener, listener)
    packet, answer = b"\x30\x04\x00\x01fx", 6
found = [0]
reader = threading.Thread(target=count_bytes, args=(reader_sock, count * answer, found), daemon=True)
reader.start()
print("flooding", flush=True)
for _ in range(count // 10_000):
    send(packet * 10_000)
reader.join(60)
print(found[0] // answer, flush=True)
"""


@pytest.fixture
def flood() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """``flood(broker, listener, kind, count, cafile)``: the flood from another process, returned once its
    connections are made; it prints how many answers (kind ``ping``: PINGRESPs) or deliveries (``publish``:
    to a subscriber of its topic, on the TCP listener) it got, once it got them all (or a minute passed)."""
    processes: list[subprocess.Popen[str]] = []

    def start(broker, listener: str, kind: str, count: int, cafile: str = "") -> subprocess.Popen[str]:
        args = [str(broker.port_of(listener)), listener, kind, str(count), cafile, str(broker.port_of("tcp"))]
        process = subprocess.Popen([sys.executable, "-c", FLOODER, *args], stdout=subprocess.PIPE, text=True)
        processes.append(process)
        assert process.stdout is not None and process.stdout.readline() == "flooding\n"
        return process

    yield start
    for process in processes:
        process.kill()
        process.communicate()


def pings_while(process: subprocess.Popen[str], client: RawClient) -> int:
    """The healthy client's PINGREQs, one after another while ``process`` runs, each answered (within
    ``TIMEOUT``): how many."""
    pings = 0
    while process.poll() is None:
        client.send_packet(PingReq())
        assert isinstance(client.recv(), PingResp)
        pings += 1
    return pings


def healthy(broker) -> RawClient:
    client = RawClient(broker.port, 4)
    client.connect("healthy")
    return client


def most_packets_per_turn(broker) -> int:
    """What ``TurnWatch`` may see the flood's listener handle in one turn: ``TurnWatch`` counts from one of
    its calls to the next, which may hold the end of a turn and the start of the next (and the healthy
    client's few packets); a turn of 64 KiB held 11,000 to 32,000 of these packets."""
    return 3 * packets_per_turn(broker.config.limits.read_bytes_per_turn)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_pingreq_flood_is_read_in_bounded_turns_and_every_pingreq_answered(start_broker, flood, loop):
    broker = start_broker(limits=NO_RATE_LIMITS, runtime={"event_loop": loop})
    client = healthy(broker)
    process = flood(broker, "tcp", "ping", PINGS)
    watch = TurnWatch(broker, "flood-ping")
    assert pings_while(process, client) > 0
    most = watch.stop()
    answered, _ = process.communicate(timeout=TIMEOUT)
    assert int(answered) == PINGS, "every PINGREQ of the flood is answered"
    assert most <= most_packets_per_turn(broker) * PINGREQ_SIZE, (
        f"{most // PINGREQ_SIZE} PINGREQs in one turn"
    )
    assert broker.metric("timestone_broker_read_turns_cut_total") > 0


@pytest.mark.parametrize(
    ("listener", "loop"),
    [
        ("tcp", "uvloop"),
        ("tls", "uvloop"),
        ("websocket", "uvloop"),
        ("tcp", "asyncio"),
        ("websocket", "asyncio"),
    ],
)
def test_a_flood_of_tiny_publishes_is_read_in_bounded_turns_and_every_message_delivered(
    start_broker, flood, tmp_path, listener, loop
):
    pki = make_test_pki(tmp_path / "pki")
    listeners = [{"name": "tcp", "type": "tcp", "host": "127.0.0.1", "port": 0}]
    if listener == "tls":
        tls = {"certfile": str(pki.server_cert), "keyfile": str(pki.server_key)}
        listeners.append({"name": "tls", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls})
    elif listener == "websocket":
        listeners.append({"name": "websocket", "type": "websocket", "host": "127.0.0.1", "port": 0})
    broker = start_broker(listeners=listeners, limits=NO_RATE_LIMITS, runtime={"event_loop": loop})
    client = healthy(broker)
    process = flood(broker, listener, "publish", PUBLISHES, str(pki.ca_cert))
    watch = TurnWatch(broker, f"flood-{listener}")
    assert pings_while(process, client) > 0
    most = watch.stop()
    delivered, _ = process.communicate(timeout=TIMEOUT)
    assert int(delivered) == PUBLISHES, "every message of the flood is delivered"
    assert most <= most_packets_per_turn(broker) * PUBLISH_SIZE, (
        f"{most // PUBLISH_SIZE} PUBLISHes in one turn"
    )
    assert broker.drops("slow_subscriber") == 0
