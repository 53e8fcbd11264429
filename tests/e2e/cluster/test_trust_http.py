"""Fair HTTP endpoints on a real cluster: strangers holding every connection they can get, and a reader's
token asking for the largest answers it can, starve neither readers nor members.

- Strangers without a token hold twice the offsets API's and the admin endpoint's connections on every
  broker, reopening each one the broker closes, some sending requests without a token (401, closed at
  once): readers with a token are still served, /metrics still answers, a member killed meanwhile rejoins
  every in-sync set it was in (members have their own endpoint), and QoS 1 publishes are acknowledged
  throughout, none lost.
- A token holder asks a dozen times at once for fetches of up to 64 MiB and reads the answers slowly: the
  broker holds at most its HTTP memory budget (the rest get 503 with Retry-After), its memory stays
  bounded, and replication, which has the members' share of the budget, goes on.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Callable

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient
from tests.e2e.cluster.conftest import EtcdTarget
from tests.e2e.cluster.intruders import READER_TOKEN
from tests.e2e.cluster.proof import (
    Device,
    check_nothing_acknowledged_was_lost,
    cluster_state,
    leadership_spread,
    settled,
    wait_settled,
    wait_until,
)
from tests.e2e.cluster.test_trust_members import topic_led_by
from tests.e2e.offsets_api.api_harness import status_of
from tests.harness.local_cluster import cluster_broker

pytestmark = pytest.mark.timeout(240)

NODES = ("a", "b", "c")


class Strangers(threading.Thread):
    """Holds ``count`` connections to ``port`` open without a token, opening a new one for each the broker
    closes; every fifth asks for ``/v1/logs`` without a token."""

    def __init__(self, port: int, count: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.count = count
        self.stopping = threading.Event()
        self.opened = 0
        self.refused_401 = 0

    def run(self) -> None:
        held: list[socket.socket] = []
        while not self.stopping.is_set():
            while len(held) < self.count and not self.stopping.is_set():
                try:
                    sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
                except OSError:
                    time.sleep(0.05)  # the broker is restarting
                    break
                self.opened += 1
                sock.setblocking(False)
                if self.opened % 5 == 0:
                    sock.sendall(b"GET /v1/logs HTTP/1.1\r\nHost: b\r\n\r\n")
                held.append(sock)
            for sock in list(held):
                with contextlib.suppress(BlockingIOError):
                    try:
                        data = sock.recv(4096)
                    except OSError:
                        data = b""
                    if data.startswith(b"HTTP/1.1 401"):
                        self.refused_401 += 1
                    if not data or b"Connection: close" in data:
                        held.remove(sock)
                        sock.close()
            time.sleep(0.02)
        for sock in held:
            sock.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


def test_strangers_holding_every_connection_starve_neither_readers_nor_members(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> None:
    limits = {"max_connections": 32, "request_timeout_s": 30.0}
    sections = {
        "offsets_api": {"tokens": [{"name": "notebook", "token": READER_TOKEN}], **limits},
        "admin_http": {"max_connections": 16, "request_timeout_s": 30.0},
    }
    brokers = {node: cluster_brokers(node, sections=sections, lease_ttl_s=2) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    wait_until(lambda: leadership_spread(etcd, NODES), what="leadership spread over a, b, c")
    order = [brokers[node] for node in NODES]
    devices = [
        Device(f"flood-{n}", topic_led_by(etcd, node, f"flood/{node}")[0], order, start_at=n)
        for n, node in enumerate(NODES)
    ]
    for device in devices:
        device.start()
    strangers = [Strangers(broker.offsets_port, 64) for broker in order]
    strangers += [Strangers(broker.admin_port, 32) for broker in order]
    for flood in strangers:
        flood.start()
    try:
        wait_until(lambda: all(flood.opened >= flood.count for flood in strangers), what="the flood up")
        for broker in order:
            assert status_of(broker.offsets_port, "/v1/logs", READER_TOKEN, timeout_s=10) == 200
            assert status_of(broker.offsets_port, "/v1/cluster", READER_TOKEN, timeout_s=10) == 200
            assert status_of(broker.admin_port, "/metrics", READER_TOKEN, timeout_s=10) == 200
        # a member dies and comes back while strangers hold everything readers can reach
        brokers["c"].kill()
        wait_until(lambda: "c" not in cluster_state(etcd).members, 20, "c gone")
        brokers["c"].start()
        wait_until(lambda: settled(etcd, set(NODES), 3), 60, "c back in every in-sync set")
        assert status_of(brokers["c"].offsets_port, "/v1/logs", READER_TOKEN, timeout_s=10) == 200
    finally:
        for flood in strangers:
            flood.stop()
    assert all(flood.refused_401 > 0 for flood in strangers[:3])  # answered 401, and closed
    for device in devices:
        device.stop()
    check_nothing_acknowledged_was_lost(devices, order, READER_TOKEN)


def _rss(broker: BrokerProcess) -> int:
    assert broker.process is not None
    with open(f"/proc/{broker.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _metric(broker: BrokerProcess, name: str) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", broker.admin_port, timeout=10)
    connection.request("GET", "/metrics")
    for line in connection.getresponse().read().decode().splitlines():
        if line.startswith(f"timestone_broker_{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def test_oversized_fetches_hold_at_most_the_budget_and_replication_goes_on(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> None:
    budget = {"http_buffer_bytes": 24 << 20, "http_buffer_members_bytes": 8 << 20}
    sections = {
        "offsets_api": {"tokens": [{"name": "notebook", "token": READER_TOKEN}]},
        "limits": {"messages_per_second_per_client": 0, **budget},
    }
    brokers = {node: cluster_brokers(node, sections=sections) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    topic, _ = topic_led_by(etcd, "a", "bulk")
    loader = PahoClient(brokers["a"].port, "loader")
    for number in range(40):  # 8 MB in one log
        loader.publish(topic, bytes([65 + number % 26]) * 200_000, 1)
    order = [brokers[node] for node in NODES]
    devices = [
        Device(f"busy-{n}", topic_led_by(etcd, "a", f"busy/{n}")[0], order, start_at=n) for n in range(3)
    ]
    for device in devices:
        device.start()
    before = _rss(brokers["a"])
    statuses: list[int | None] = []
    readers: list[socket.socket] = []
    for max_bytes in [64 << 20] * 6 + [8 << 20] * 6:  # the attack's size, and one the budget can take
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that takes its time
        sock.connect(("127.0.0.1", brokers["a"].offsets_port))
        path = f"/v1/logs/{topic.replace('/', '%2F')}/records?offset=0&max_bytes={max_bytes}&format=frames"
        request = f"GET {path} HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {READER_TOKEN}\r\n\r\n"
        sock.sendall(request.encode())
        readers.append(sock)
    time.sleep(1.0)
    for sock in readers:
        sock.settimeout(5)
        head = sock.recv(4096)
        statuses.append(int(head.split()[1]) if head.startswith(b"HTTP/1.1") else None)
        if b" 503 " in head[:16]:
            assert b"Retry-After: 1" in head
    held = _metric(brokers["a"], "http_buffer_bytes")
    grown = _rss(brokers["a"]) - before
    counts = [len(device.acked) for device in devices]
    wait_until(  # replication goes on meanwhile: the members' share of the budget is theirs
        lambda: all(len(d.acked) > count + 10 for d, count in zip(devices, counts, strict=True)),
        what="publishes acknowledged during the fetches",
    )
    for sock in readers:
        sock.close()
    assert statuses.count(503) >= 10  # at most 16 MiB for readers: two 8 MiB fetches, no 64 MiB one
    assert 200 in statuses
    assert held <= 24 << 20
    assert grown < 96 << 20, f"the broker grew by {grown >> 20} MiB"  # the attack once took +723 MiB
    assert _metric(brokers["a"], "http_requests_over_budget") >= 10
    for device in devices:
        device.stop()
    check_nothing_acknowledged_was_lost(devices, order, READER_TOKEN)


def members_port(etcd: EtcdTarget, node: str) -> int:
    """The port of ``node``'s members' endpoint, from what it registered in etcd."""
    wait_until(lambda: node in cluster_state(etcd).members, what=f"{node} a member")
    peer = cluster_state(etcd).members[node].peer
    assert peer is not None
    return int(peer.rsplit(":", 1)[1].rstrip("/"))


def test_a_member_that_stops_reading_its_answers_is_closed_and_frees_the_members_endpoint(
    tmp_path, etcd: EtcdTarget
) -> None:
    """A client of the members' endpoint sending requests whose answers it never reads held its connection
    (and each answer's share of the budget) for ever, as readers did on the offsets API before
    ``min_read_bytes_per_s``: it is now closed once an answer of N bytes is not taken within
    ``request_timeout_s`` + N / ``cluster.listen.min_read_bytes_per_s`` seconds."""
    listen = {"port": 0, "max_connections": 1, "request_timeout_s": 2.0}
    broker = cluster_broker(tmp_path, etcd, "a", {"listen": listen}, member_tls=False).start()
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", members_port(etcd, "a")))
        request = b"GET /v1/cluster HTTP/1.1\r\nHost: x\r\nX-Timestone-Node: a\r\n\r\n"
        sock.sendall(request * 10_000)  # answers far beyond what the sockets' buffers hold, none read
        time.sleep(4.0)  # 2 s, plus what an answer's size gives at 64 KiB/s, passed long ago
        sock.settimeout(2)
        try:  # what the broker had sent is there to read, then the end (or a reset: requests left unread)
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        sock.close()
        with socket.create_connection(("127.0.0.1", members_port(etcd, "a")), timeout=10) as again:
            again.sendall(b"GET /v1/cluster HTTP/1.1\r\nHost: x\r\nX-Timestone-Node: a\r\n\r\n")
            assert again.recv(65536).startswith(b"HTTP/1.1 200"), "its one connection is free again"
    finally:
        broker.stop()


def test_a_mirrored_append_whose_body_trickles_is_answered_408_in_time(tmp_path, etcd: EtcdTarget) -> None:
    """A ``POST /v1/mirror/append`` on the members' endpoint whose body never finished arriving held its
    connection, and the budget its length reserved, for ever: its body is read within
    ``cluster.listen.request_timeout_s``, as a replica fetch's is."""
    listen = {"port": 0, "request_timeout_s": 1.0}
    broker = cluster_broker(tmp_path, etcd, "a", {"listen": listen}, member_tls=False).start()
    try:
        sock = socket.create_connection(("127.0.0.1", members_port(etcd, "a")), timeout=5)
        sock.sendall(
            b"POST /v1/mirror/append HTTP/1.1\r\nHost: x\r\nX-Timestone-Node: a\r\n"
            b"Content-Length: 100000\r\n\r\nab"
        )
        started = time.monotonic()
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive in time" in answer, answer
        assert time.monotonic() - started < 3
        sock.close()
    finally:
        broker.stop()
