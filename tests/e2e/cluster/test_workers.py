"""``timestone broker --workers 2``: one address served by two member processes and the etcd the command
starts itself; a member killed (SIGKILL) under QoS 1 load loses nothing acknowledged, and its clients
publish again within 5 s.

Devices publish QoS 1 one message at a time to the one port, reconnecting to it when their connection
fails and never resending: every PUBACKed payload is recorded, and must be in its topic's log once, in
acknowledgement order. Which member a device reached is read from the kernel's table of sockets: the one
whose process holds the broker's end of the device's connection.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from broker_edge.placement import partition_of
from broker_edge.protocol import PacketDecoder
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import Connect, Disconnect, PubAck, PubComp, Publish, PubRec, PubRel
from broker_edge.runtime.launcher import free_port
from tests.e2e.broker_clients import RawClient
from tests.e2e.cluster.proof import socket_owners
from tests.harness.local_cluster import EtcdServer, wait_until

pytestmark = pytest.mark.timeout(180)

BACK_WITHIN_S = 5.0


class Device(threading.Thread):
    """QoS 1 on its own topic, one message at a time, through ``port``; reconnects when the connection
    fails and never resends. ``acked``: payloads PUBACKed with success, in order."""

    def __init__(self, name: str, port: int) -> None:
        super().__init__(name=name, daemon=True)
        self.topic = f"plant/{name}/telemetry"
        self.port = port
        self.acked: list[bytes] = []
        self.ack_times: list[float] = []
        self.failed_at: list[float] = []
        self.local_port = 0
        self.connected = threading.Event()
        self.stopping = threading.Event()

    def run(self) -> None:
        sequence = 0
        sock: socket.socket | None = None
        decoder = PacketDecoder(role="client", protocol_version=5)
        while not self.stopping.is_set():
            if sock is None:
                try:
                    sock, decoder = self._connect()
                except OSError:
                    time.sleep(0.05)
                    continue
            sequence += 1
            payload = f"{self.name}:{sequence}".encode()
            try:
                sock.sendall(encode(Publish(self.topic, payload, 1, packet_id=sequence % 65535 + 1), 5))
                answer = _receive(sock, decoder)
            except OSError:
                answer = None
            if isinstance(answer, PubAck) and answer.reason_code < 0x80:
                self.acked.append(payload)
                self.ack_times.append(time.monotonic())
            elif isinstance(answer, PubAck):
                time.sleep(0.05)  # refused (no leader yet): not acknowledged, the next one is new
            else:
                self.failed_at.append(time.monotonic())
                sock.close()
                sock = None
        if sock is not None:
            sock.close()

    def _connect(self) -> tuple[socket.socket, PacketDecoder]:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        decoder = PacketDecoder(role="client", protocol_version=5)
        sock.sendall(encode(Connect(protocol_version=5, client_id=self.name, clean_start=True), 5))
        answer = _receive(sock, decoder)
        if getattr(answer, "reason_code", 1) != 0:
            sock.close()
            raise OSError(f"not connected: {answer!r}")
        self.local_port = sock.getsockname()[1]
        self.connected.set()
        return sock, decoder

    def back_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to its first acknowledgement after it (None: none)."""
        later = [t for t in self.ack_times if t > moment]
        return later[0] - moment if later else None


def _acknowledged_twice(device: Device) -> bool:
    return len(device.acked) > 1


def _receive(sock: socket.socket, decoder: PacketDecoder) -> object:
    deadline = time.monotonic() + 15
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        data = sock.recv(65536)
        if not data:
            return None
        packets = decoder.feed(data)
        if packets:
            return packets[0]


def member_pids(workers_dir: Path) -> dict[str, int]:
    return {
        path.stem: int(path.read_text())
        for path in workers_dir.glob("w*.pid")
        if path.read_text().strip().isdigit()
    }


def cluster_layout(offsets_api: str) -> dict[str, Any]:
    """The cluster as it shows itself to readers (``/v1/cluster`` of the first member)."""
    with urllib.request.urlopen(f"{offsets_api}/v1/cluster", timeout=10) as answer:
        layout: dict[str, Any] = json.load(answer)
    return layout


def settled_layout(offsets_api: str, members: set[str]) -> dict[str, Any]:
    """The cluster's layout once leadership has spread over ``members`` and stopped moving: each leads
    within one partition of the other, and two reads a second apart show the same partitions. Leadership
    spreads a few partitions at a time, each move a replica added, caught up and led before the old one
    goes; a test that picks a topic by its leader while partitions still move may see it move under it."""

    def led(partitions: list[dict[str, Any]]) -> dict[str, int]:
        return {member: sum(p["leader"] == member for p in partitions) for member in members}

    def settled() -> bool:
        before = cluster_layout(offsets_api)["partitions"]
        counts = led(before).values()
        if min(counts) == 0 or max(counts) - min(counts) > 1:
            return False
        time.sleep(1.0)
        return bool(cluster_layout(offsets_api)["partitions"] == before)

    wait_until(
        settled,
        90,
        "leadership spread over the members and settled",
        lambda: led(cluster_layout(offsets_api)["partitions"]),
    )
    return cluster_layout(offsets_api)


def cluster_members(offsets_api: str) -> list[dict[str, str]]:
    members: list[dict[str, str]] = cluster_layout(offsets_api)["members"]
    return members


def read_topic(offsets_api: str, topic: str) -> list[bytes]:
    """The committed payloads of ``topic`` from the member leading its partition now."""
    layout = cluster_layout(offsets_api)
    partitions = layout["partitions"]
    leader = partitions[partition_of(topic, len(partitions))]["leader"]
    base = next(m["offsets_api"] for m in layout["members"] if m["node_id"] == leader)
    quoted = urllib.parse.quote(topic, safe="")
    payloads: list[bytes] = []
    while True:
        url = f"{base}/v1/logs/{quoted}/records?offset={len(payloads)}&max_records=10000&format=jsonl"
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                lines = answer.read().splitlines()
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return payloads
            raise
        if not lines:
            return payloads
        payloads += [base64.b64decode(json.loads(line)["payload"]) for line in lines]


def start_workers(
    directory: Path, cluster: str = "", listener: str = "", runtime: str = ""
) -> tuple[subprocess.Popen[bytes], int, str]:
    """``timestone broker --workers 2`` on free ports, without a cluster section (it runs its own etcd) or
    with ``cluster``, once its two members show themselves on the port; started again on other ports when
    another process took one of them in between (the machine is shared). ``listener``: more keys of the
    listener (``, transport: native``); ``runtime``: a ``runtime:`` section."""
    nodes = ["w0", "w1"] if not cluster else ["w-0", "w-1"]
    for _ in range(3):
        port, api, admin = free_port(), free_port(), free_port()
        config = directory / "broker.yaml"
        config.write_text(
            f"listeners:\n  - {{name: default, host: 127.0.0.1, port: {port}{listener}}}\n"
            f"storage: {{directory: {directory / 'data'}}}\n"
            f"offsets_api: {{port: {api}}}\n"
            f"admin_http: {{port: {admin}}}\n"
            "limits: {messages_per_second_per_client: 0}\n" + runtime + cluster
        )
        with open(directory / "workers.log", "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config), "--workers", "2"],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        offsets_api = f"http://127.0.0.1:{api}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                members = cluster_members(offsets_api)
            except OSError:
                members = []
            if sorted(m["node_id"] for m in members) == nodes and _answers(port):
                return process, port, offsets_api
            if b"Address already in use" in (directory / "workers.log").read_bytes():
                break
            time.sleep(0.2)
        stop_workers(process)
        (directory / "workers.log").rename(directory / f"workers-{process.pid}.log")
    raise AssertionError("timestone broker --workers 2 did not start")


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def stop_workers(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture
def workers(tmp_path):
    process, port, offsets_api = start_workers(tmp_path)
    try:
        yield process, port, offsets_api, tmp_path / "data" / "workers"
    finally:
        stop_workers(process)


def test_a_member_killed_under_qos1_load_loses_nothing_and_its_clients_publish_again_soon(workers):
    process, port, offsets_api, workers_dir = workers
    probe = Device("probe", port)
    probe.start()
    wait_until(lambda: len(probe.acked) > 0 and len(member_pids(workers_dir)) == 2, 60, "both members up")
    pids = member_pids(workers_dir)
    wait_until(  # a device's connection moves to its topic's leader: both must lead some
        lambda: {p["leader"] for p in cluster_layout(offsets_api)["partitions"]} == {"w0", "w1"},
        60,
        "both members leading partitions",
    )
    devices = [probe]
    placed: dict[str, list[Device]] = {}
    while len(devices) < 40 and min((len(placed.get(n, [])) for n in pids), default=0) < 2:
        device = Device(f"device-{len(devices)}", port)
        device.start()
        assert device.connected.wait(30)
        devices.append(device)
        wait_until(partial(_acknowledged_twice, device), 30, f"{device.name} acknowledged")
        owners = socket_owners(pids, port)
        placed = {}
        for each in devices:
            placed.setdefault(owners.get(each.local_port, "?"), []).append(each)
    time.sleep(2.0)  # QoS 1 load on both members; a device's connection moves to its topic's leader
    owners = socket_owners(pids, port)
    placed = {}
    for each in devices:
        placed.setdefault(owners.get(each.local_port, "?"), []).append(each)
    assert all(len(placed.get(node, [])) >= 2 for node in pids), placed
    victim = "w1"
    on_victim = placed[victim]
    killed_at = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)
    time.sleep(BACK_WITHIN_S + 2.0)
    for device in devices:
        device.stopping.set()
    for device in devices:
        device.join(20)
    # Its clients reconnected and were acknowledged again within 5 s; the others hardly noticed.
    for device in on_victim:
        assert device.failed_at and device.failed_at[0] >= killed_at - 0.1
        back = device.back_after(device.failed_at[0])
        assert back is not None and back < BACK_WITHIN_S, (device.name, back)
    # The command started the member again, under a new process, serving its partitions.
    wait_until(lambda: member_pids(workers_dir).get(victim, pids[victim]) != pids[victim], 30, "a restart")
    wait_until(lambda: len(cluster_members(offsets_api)) == 2, 30, "the member back in the cluster")
    # Nothing acknowledged is lost: every PUBACKed payload in its topic's log, once, in order.
    for device in devices:
        assert device.acked, device.name

        def complete(device: Device = device) -> bool:
            return set(device.acked) <= set(read_topic(offsets_api, device.topic))

        def missing(device: Device = device) -> str:
            logged = read_topic(offsets_api, device.topic)
            lost = [payload for payload in device.acked if payload not in set(logged)]
            ends = {}
            for member in cluster_members(offsets_api):  # every copy, stale ones included
                with urllib.request.urlopen(f"{member['offsets_api']}/v1/logs", timeout=10) as answer:
                    logs = json.load(answer)["logs"]
                ends[member["node_id"]] = [log for log in logs if log["topic"] == device.topic]
            return (
                f"{len(lost)} of {len(device.acked)} missing, first {lost[:3]}, log holds {len(logged)}; "
                f"the members list: {ends}"
            )

        wait_until(complete, 60, f"every acknowledged message of {device.name} in its log", missing)
        acked = set(device.acked)
        logged = [payload for payload in read_topic(offsets_api, device.topic) if payload in acked]
        assert logged == device.acked, device.name
    assert process.poll() is None
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0
    assert not member_pids(workers_dir)  # every member stopped with the command


@pytest.fixture
def redirecting_workers(tmp_path):
    """``--workers 2`` joining an etcd of the test's with ``cluster.redirect_publishers`` on (and connections
    not handed over between its members, which would move the devices first)."""
    etcd = EtcdServer(tmp_path / "etcd", secure=False).start()
    cluster = (
        f"cluster: {{node_id: w, etcd: [{etcd.url}], replication_factor: 1, min_insync_replicas: 1,\n"
        "          redirect_publishers: true, hand_over_connections: false}\n"
    )
    try:
        process, port, offsets_api = start_workers(tmp_path, cluster)
        try:
            yield port, offsets_api
        finally:
            stop_workers(process)
    finally:
        etcd.kill()


@pytest.mark.parametrize("qos", [1, 2])
def test_a_v5_device_publishing_through_another_member_is_sent_to_its_partitions_leader(
    redirecting_workers, qos
):
    """Every member has an address of its own besides the shared one, which the cluster advertises for it;
    with ``cluster.redirect_publishers`` a v5 device whose publish a member forwarded to the leader of its
    topic's partition is acknowledged, then sent there: DISCONNECT 0x9C (use another server) with the
    leader's address as Server Reference [MQTT 5 3.14.2.2.2]; at QoS 2 once its flow ends (PUBCOMP), the
    PUBREL being the client's to send where it published. There, its publishes are appended where it is
    connected and it stays."""
    port, offsets_api = redirecting_workers
    layout = settled_layout(offsets_api, {"w-0", "w-1"})
    addresses = {member["node_id"]: member["mqtt"] for member in layout["members"]}
    assert len(set(addresses.values())) == 2 and f"127.0.0.1:{port}" not in addresses.values()
    partitions = layout["partitions"]
    topics = (f"plant/d-{n}/telemetry" for n in range(1000))
    topic = next(t for t in topics if leader_of(partitions, t) == "w-1")
    follower = RawClient(int(addresses["w-0"].rsplit(":", 1)[1]), 5)
    assert follower.connect("d-redirected").reason_code == 0
    follower.send_packet(Publish(topic, b"first", qos, packet_id=1))
    if qos == 1:
        assert follower.recv() == PubAck(1)
    else:
        assert follower.recv() == PubRec(1)
        follower.recv_none(0.5)  # its flow open: it stays until it ends
        follower.send_packet(PubRel(1))
        assert follower.recv() == PubComp(1)
    disconnect = follower.recv()
    assert isinstance(disconnect, Disconnect) and disconnect.reason_code == 0x9C
    assert disconnect.properties.server_reference == addresses["w-1"]
    assert follower.closed()
    leader = RawClient(int(disconnect.properties.server_reference.rsplit(":", 1)[1]), 5)
    assert leader.connect("d-redirected").reason_code == 0
    for packet_id in range(2, 6):
        leader.send_packet(Publish(topic, b"next", 1, packet_id=packet_id))
        assert leader.recv() == PubAck(packet_id)
    leader.recv_none(0.5)
    wait_until(lambda: read_topic(offsets_api, topic) == [b"first", b"next", b"next", b"next", b"next"], 30)


@pytest.fixture(
    params=[
        ("", ""),
        (", transport: native", ""),
        ("", "runtime: {event_loop: asyncio}\n"),
    ],
    ids=["uvloop", "native-transport", "asyncio-loop"],
)
def workers_on_each_transport(request, tmp_path):
    """``--workers 2`` with its listener on uvloop's transport, the broker's own, and the standard loop's."""
    listener, runtime = request.param
    process, port, offsets_api = start_workers(tmp_path, listener=listener, runtime=runtime)
    try:
        yield process, port, offsets_api, tmp_path / "data" / "workers"
    finally:
        stop_workers(process)


def test_a_device_publishing_through_another_member_is_handed_over_to_its_partitions_leader(
    workers_on_each_transport,
):
    """A member that forwarded an MQTT 3.1.1 device's publish to the member leading its topic's partition,
    on the same host, hands the device's TCP connection over to it once the publish is acknowledged: the
    leader's process holds the broker's end of the connection from then on (and only it), and the device
    publishes on over the same connection, acknowledged, nothing lost or doubled. A device whose session
    holds something (a subscription) stays where it connected."""
    _, _, offsets_api, workers_dir = workers_on_each_transport
    layout = settled_layout(offsets_api, {"w0", "w1"})
    wait_until(lambda: len(member_pids(workers_dir)) == 2, 30, "both members' process ids")
    pids = member_pids(workers_dir)
    own_port = {member["node_id"]: int(member["mqtt"].rsplit(":", 1)[1]) for member in layout["members"]}
    partitions = layout["partitions"]
    topics = [t for t in (f"plant/d-{n}/telemetry" for n in range(1000)) if leader_of(partitions, t) == "w1"]
    device = RawClient(own_port["w0"], 4)
    assert device.connect("d-moved").reason_code == 0
    local_port = device.sock.getsockname()[1]
    assert socket_owners(pids, own_port["w0"]).get(local_port) == "w0"
    device.send_packet(Publish(topics[0], b"first", 1, packet_id=1))
    assert device.recv() == PubAck(1)
    wait_until(
        lambda: socket_owners(pids, own_port["w0"]).get(local_port) == "w1", 10, "the connection held by w1"
    )
    for packet_id in range(2, 6):
        device.send_packet(Publish(topics[0], b"next", 1, packet_id=packet_id))
        assert device.recv() == PubAck(packet_id)
    device.recv_none(0.5)  # still connected: nothing else came
    wait_until(
        lambda: read_topic(offsets_api, topics[0]) == [b"first", b"next", b"next", b"next", b"next"], 30
    )
    assert b"connection handed over to w1" in (workers_dir.parent.parent / "workers.log").read_bytes()
    config = (workers_dir.parent.parent / "broker.yaml").read_text()
    admin = re.search(r"admin_http: \{port: (\d+)\}", config)
    assert admin is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{admin[1]}/metrics", timeout=10) as answer:
        metrics = answer.read().decode()  # the first member's: it handed the device over
    assert 'timestone_broker_connections_handed_over_total{outcome="out"} 1.0' in metrics

    subscriber = RawClient(own_port["w0"], 4)
    assert subscriber.connect("d-subscribed").reason_code == 0
    subscriber.subscribe("plant/d-subscribed/commands", 1)
    subscriber_port = subscriber.sock.getsockname()[1]
    subscriber.send_packet(Publish(topics[1], b"kept", 1, packet_id=1))
    assert subscriber.recv() == PubAck(1)
    subscriber.recv_none(1.0)
    assert socket_owners(pids, own_port["w0"]).get(subscriber_port) == "w0"
    device.close()
    subscriber.close()


def leader_of(partitions: list[dict[str, Any]], topic: str) -> str:
    leader: str = partitions[partition_of(topic, len(partitions))]["leader"]
    return leader
