"""A fenced member keeps its MQTT clients while the fence may still lift (``cluster.fenced_clients_hold_ms``)
and sends them to the other members once it has lasted that long: etcd restarting fences every member at
once, and moving the clients then would send each to a member as fenced as its own, the whole fleet
reconnecting for an etcd restart. Real broker processes, a real etcd, paho clients."""

from __future__ import annotations

import contextlib
import queue
import signal
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from functools import partial
from pathlib import Path
from queue import Empty

from broker_edge.protocol.packets import Disconnect
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, RawClient
from tests.e2e.cluster.conftest import EtcdTarget, cluster_broker
from tests.e2e.cluster.proof import EtcdProxy, logged, started, wait_settled, wait_until

NODES = ("a", "b", "c")
FENCED = "cannot prove its etcd lease alive"
HOLD_S = 3.0  # the default fenced_clients_hold_ms


def test_an_etcd_restart_shorter_than_the_hold_moves_no_client_of_any_member(
    cluster_brokers: Callable[..., BrokerProcess], private_etcd: EtcdTarget
) -> None:
    # a hold well past the restart below, so that a loaded machine's slow etcd start is still "a moment"
    brokers = {
        node: cluster_brokers(node, target=private_etcd, fenced_clients_hold_ms=20_000) for node in NODES
    }
    wait_settled(private_etcd, set(NODES), 3)
    clients: dict[str, PahoClient] = {}
    for node in NODES:
        for version in (5, 4):
            clients[f"{node}-v{version}"] = PahoClient(
                brokers[node].port, f"{node}-v{version}", version=version
            )
    subscriber = PahoClient(brokers["c"].port, "watcher", version=5)
    subscriber.subscribe("after/#", 1)

    private_etcd.server.kill()
    wait_until(lambda: all(logged(b, FENCED) for b in brokers.values()), 15, "every member fenced")
    private_etcd.server.start()
    wait_until(
        lambda: all(logged(b, "unfenced: lease proven alive again") for b in brokers.values()),
        30,
        "every member unfenced under its own lease",
    )

    for client_id, client in clients.items():
        try:
            reason = client.disconnects.get_nowait()
        except Empty:
            continue
        raise AssertionError(f"{client_id} was disconnected ({reason}) by the etcd restart")
    assert not any(logged(b, "): disconnected") for b in brokers.values())  # "fenced (why): disconnected n"
    wait_settled(private_etcd, set(NODES), 3)
    for client_id, client in clients.items():
        client.publish(f"after/{client_id}", b"still here", 1)  # QoS 1, on the connection it had
    got = sorted(message.topic for message in subscriber.expect(len(clients), timeout=20))
    assert got == sorted(f"after/{client_id}" for client_id in clients)


def test_a_member_cut_off_from_etcd_sends_its_clients_away_once_the_hold_is_over(
    tmp_path: Path, etcd: EtcdTarget
) -> None:
    """``b`` alone loses etcd (the others take its partitions over when its lease ends; it cannot learn
    that): it keeps its clients for the default hold after its fence, then sends them to ``a`` and ``c``."""
    proxy = EtcdProxy(etcd.url)
    brokers: dict[str, BrokerProcess] = {}
    try:
        for node in NODES:
            section = {"etcd": [proxy.url] if node == "b" else [etcd.url]}
            brokers[node] = started(partial(cluster_broker, tmp_path, etcd, node, section))
        wait_settled(etcd, set(NODES), 3)
        v5 = RawClient(brokers["b"].port, version=5)
        assert v5.connect("on-b-v5", keep_alive=0).reason_code == 0
        v3 = PahoClient(brokers["b"].port, "on-b-v3", version=4)
        others = {f"127.0.0.1:{brokers[n].port}" for n in ("a", "c")}

        cut_at = time.monotonic()
        proxy.cut()
        wait_until(lambda: logged(brokers["b"], FENCED) == 1, 15, "b fenced")
        fenced_at = time.monotonic()
        v5.recv_none(1.0)  # held: the fence may still lift
        assert v3.disconnects.empty()

        moved = v5.recv(timeout=HOLD_S + 15)
        moved_at = time.monotonic()
        assert isinstance(moved, Disconnect) and moved.reason_code == 0x9C  # use another server
        assert moved.properties is not None and moved.properties.server_reference in others
        assert v5.closed()
        assert v3.disconnects.get(timeout=5) is not None
        assert moved_at - cut_at >= HOLD_S and moved_at - fenced_at >= HOLD_S - 1.0
        assert logged(brokers["b"], "fenced_clients_hold_ms (3 s)") == 1
    finally:
        proxy.close()
        for broker in brokers.values():
            broker.stop()


def test_members_all_fenced_point_no_client_at_each_other_and_refuse_connects_server_unavailable(
    cluster_brokers: Callable[..., BrokerProcess], private_etcd: EtcdTarget
) -> None:
    """etcd out of reach for every member: no member can know another is healthy, so none sends its clients
    to another (they would bounce between fenced members, reconnecting without end). Clients stay; a new
    CONNECT is refused server unavailable (v5 CONNACK 0x88 without a Server Reference, 3.1.1 return code 3),
    and the device backs off."""
    brokers = {node: cluster_brokers(node, target=private_etcd, fenced_clients_hold_ms=2000) for node in "ab"}
    wait_settled(private_etcd, {"a", "b"}, 2)
    held = RawClient(brokers["a"].port, version=5)
    assert held.connect("held-v5", keep_alive=0).reason_code == 0

    private_etcd.server.kill()
    wait_until(lambda: all(logged(b, FENCED) for b in brokers.values()), 15, "every member fenced")
    time.sleep(2.0 + 1.0)  # the hold (each member fenced within a renewal of the other), and the asking
    held.recv_none(0.5)  # not pointed at b, as fenced as a
    for node, broker in brokers.items():
        v5 = RawClient(broker.port, version=5)
        connack = v5.connect(f"new-v5-{node}", keep_alive=0)
        assert connack.reason_code == 0x88, connack  # server unavailable
        assert connack.properties is None or connack.properties.server_reference is None
        v3 = RawClient(broker.port, version=4)
        assert v3.connect(f"new-v3-{node}", keep_alive=0).reason_code == 3


def test_a_fenced_member_that_hears_from_no_other_member_disconnects_its_clients_0x8b(
    tmp_path: Path, etcd: EtcdTarget
) -> None:
    """``b`` cut off from etcd, ``a`` frozen (SIGSTOP): ``b`` hears from no member, so it cannot tell whether
    it is the one cut off (the others healthy, out of its reach) or the last one standing. It names nobody
    (no Server Reference to a member it could not ask) but does not keep its clients either: MQTT 5 ones get
    DISCONNECT 0x8B (server shutting down), 3.1.1 ones are disconnected, and each finds a member by itself."""
    proxy = EtcdProxy(etcd.url)
    brokers: dict[str, BrokerProcess] = {}
    try:
        for node in "ab":
            section = {"etcd": [proxy.url] if node == "b" else [etcd.url], "fenced_clients_hold_ms": 500}
            brokers[node] = started(partial(cluster_broker, tmp_path, etcd, node, section))
        wait_settled(etcd, {"a", "b"}, 2)
        v5 = RawClient(brokers["b"].port, version=5)
        assert v5.connect("on-b-v5", keep_alive=0).reason_code == 0
        v3 = PahoClient(brokers["b"].port, "on-b-v3", version=4)

        assert brokers["a"].process is not None
        brokers["a"].process.send_signal(signal.SIGSTOP)
        proxy.cut()
        wait_until(lambda: logged(brokers["b"], FENCED) == 1, 15, "b fenced")
        gone = v5.recv(timeout=10)
        assert isinstance(gone, Disconnect) and gone.reason_code == 0x8B, gone
        assert gone.properties is None or gone.properties.server_reference is None
        assert v3.disconnects.get(timeout=5) is not None
    finally:
        proxy.close()
        for broker in brokers.values():
            if broker.process is not None:
                broker.process.send_signal(signal.SIGCONT)
            broker.stop()


def test_an_etcd_paused_past_the_leases_leaves_no_client_without_a_member_to_go_to(
    cluster_brokers: Callable[..., BrokerProcess], private_etcd: EtcdTarget
) -> None:
    """etcd frozen (SIGSTOP) past the members' leases and the hold: every member fenced, none sends its
    clients anywhere. When etcd resumes it expires every lease at once and deletes every member's key, so
    for a moment each member knows of no other: that is no sign that it is cut off, and no client is
    disconnected naming nobody (0x8B). One may be sent (0x9C) to a member that registered again first: its
    own member's lease is gone, which sends clients to a member at once."""
    brokers = {node: cluster_brokers(node, target=private_etcd, fenced_clients_hold_ms=500) for node in "ab"}
    wait_settled(private_etcd, {"a", "b"}, 2)
    held = RawClient(brokers["a"].port, version=5)
    assert held.connect("held-v5", keep_alive=0).reason_code == 0
    etcd_process = private_etcd.server.process
    assert etcd_process is not None

    etcd_process.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: all(logged(b, FENCED) for b in brokers.values()), 15, "every member fenced")
        time.sleep(0.5 + 3.0)  # the hold, and past every lease
    finally:
        etcd_process.send_signal(signal.SIGCONT)
    wait_until(
        lambda: all(logged(b, "unfenced: registered under a new lease") >= 2 for b in brokers.values()),
        20,
        "every member registered again",
    )
    time.sleep(1.5)  # each member asked the others at least once more meanwhile
    assert not any(logged(b, "none named") for b in brokers.values())
    with contextlib.suppress(TimeoutError):
        moved = held.recv(timeout=0.5)
        assert isinstance(moved, Disconnect) and moved.reason_code == 0x9C, moved
        assert moved.properties is not None
        assert moved.properties.server_reference == f"127.0.0.1:{brokers['b'].port}"


class SlowRelay:
    """A TCP relay on a free loopback port to ``target_url`` that delays everything by ``delay_s`` (set at
    any time) each way, as if etcd were far from one member: its calls take a round trip of twice that."""

    def __init__(self, target_url: str, delay_s: float = 0.0) -> None:
        parts = urllib.parse.urlsplit(target_url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 2379)
        self.delay_s = delay_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"{parts.scheme}://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                if self.listener.fileno() < 0:
                    return
                continue
            upstream.settimeout(None)
            for source, sink in ((client, upstream), (upstream, client)):
                chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()
                threading.Thread(target=self._read, args=(source, chunks), daemon=True).start()
                threading.Thread(target=self._write, args=(sink, chunks), daemon=True).start()

    def _read(self, source: socket.socket, chunks: queue.Queue[tuple[float, bytes]]) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                chunks.put((time.monotonic() + self.delay_s, data))
        chunks.put((0.0, b""))

    @staticmethod
    def _write(sink: socket.socket, chunks: queue.Queue[tuple[float, bytes]]) -> None:
        with contextlib.suppress(OSError):
            while (chunk := chunks.get())[1]:
                time.sleep(max(0.0, chunk[0] - time.monotonic()))
                sink.sendall(chunk[1])
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


def test_a_member_slower_than_the_others_to_reach_etcd_again_keeps_its_clients(
    cluster_brokers: Callable[..., BrokerProcess], private_etcd: EtcdTarget
) -> None:
    """etcd restarted after longer than the hold: every member is fenced, and is still registered under
    its own lease when etcd is back (etcd restores leases). ``b``, 0.1 s from etcd each way, proves its lease
    and reads the cluster state again later than ``a`` and ``c``; asking them meanwhile, it found them
    members and sent its clients to them for nothing. They still count ``b`` among the members: it keeps
    its clients."""
    relay = SlowRelay(private_etcd.url)
    try:
        far = {"b": {"etcd": [relay.url]}}
        brokers = {node: cluster_brokers(node, target=private_etcd, **far.get(node, {})) for node in NODES}
        wait_settled(private_etcd, set(NODES), 3)
        on_b = RawClient(brokers["b"].port, version=5)
        assert on_b.connect("on-b", keep_alive=0).reason_code == 0

        relay.delay_s = 0.1
        private_etcd.server.kill()
        wait_until(lambda: all(logged(b, FENCED) for b in brokers.values()), 15, "every member fenced")
        time.sleep(HOLD_S + 1.0)  # the hold is over: each member asks the others, all fenced
        private_etcd.server.start()
        wait_until(
            lambda: all(logged(b, "unfenced: lease proven alive again") for b in brokers.values()),
            30,
            "every member unfenced under its own lease",
        )
        on_b.recv_none(1.0)
        assert not on_b.closed()
        assert not logged(brokers["b"], "): disconnected")  # "fenced (why): disconnected n clients"
    finally:
        relay.close()
