"""``limits.messages_per_second_per_client`` holds against a client that pipelines PUBLISHes flat out.

Written as the attack: one socket sends its CONNECT and thousands of PUBLISHes without waiting for
anything. However many of them the broker has already read, it accepts at most rate x seconds + burst of
them by any moment; the rest wait (reading pauses, TCP pushes back on the client) and are handled later, in
order: no QoS 1 publish is lost, and none is acknowledged before its turn.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from broker_edge.protocol.codec import PacketDecoder, encode
from broker_edge.protocol.packets import Connect, PubAck, Publish
from tests.e2e.broker_clients import PahoClient, wait_for

RATE = 200
BURST = 100


class FloodClient:
    """CONNECT plus ``count`` PUBLISHes written in one go from a thread; acknowledgements timed on arrival."""

    def __init__(
        self,
        port: int,
        qos: int,
        count: int,
        version: int = 4,
        username: str | None = None,
        password: bytes | None = None,
    ) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        client_id = f"{username or 'flood'}-q{qos}"
        connect = Connect(protocol_version=version, client_id=client_id, username=username, password=password)
        frames = [encode(connect, version)]
        frames += [
            encode(
                Publish("flood/t", str(n).encode(), qos, packet_id=n % 65535 + 1 if qos else None), version
            )
            for n in range(count)
        ]
        self.data = b"".join(frames)
        self.decoder = PacketDecoder(role="client", protocol_version=version)
        self.acks: list[tuple[float, int]] = []
        self.started = time.monotonic()
        self._writer = threading.Thread(target=self._write, daemon=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._writer.start()
        self._reader.start()

    def _write(self) -> None:
        with contextlib.suppress(OSError):  # closed by the test
            self.sock.sendall(self.data)

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            now = time.monotonic()
            self.acks.extend((now, p.packet_id) for p in self.decoder.feed(data) if isinstance(p, PubAck))

    def allowance(self, at: float) -> float:
        """The most publishes the broker may have accepted by ``at`` (monotonic), counted from the start."""
        return RATE * (at - self.started) + BURST

    def close(self) -> None:
        self.sock.close()


def limited(start_broker):
    return start_broker(limits={"messages_per_second_per_client": RATE, "messages_burst_per_client": BURST})


def test_a_flat_out_qos0_publisher_gets_at_most_rate_times_seconds_plus_burst(start_broker):
    broker = limited(start_broker)
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("flood/t", 0)
    flood = FloodClient(broker.port, 0, 20_000)
    try:
        for _ in range(4):
            time.sleep(0.5)
            received, now = watcher.messages.qsize(), time.monotonic()
            assert received <= flood.allowance(now), (received, now - flood.started)
        assert received >= BURST  # the burst went through at once, then the rate
        assert broker.metric("timestone_broker_client_throttled_total") >= 1
        payloads = [watcher.messages.get_nowait().payload for _ in range(BURST)]
        assert payloads == [str(n).encode() for n in range(BURST)]  # in order, from the first
    finally:
        flood.close()


def test_a_flat_out_qos1_publisher_is_held_to_the_rate_and_loses_nothing(start_broker):
    """MQTT 3.1.1, where nothing limits in-flight publishes: all 700 are acknowledged, in order, none
    earlier than the rate allows."""
    broker = limited(start_broker)
    flood = FloodClient(broker.port, 1, 700)
    try:
        assert wait_for(lambda: len(flood.acks) == 700, timeout=15)
        for position, (arrived, _packet_id) in enumerate(flood.acks, 1):
            assert position <= flood.allowance(arrived), (position, arrived - flood.started)
        assert [packet_id for _, packet_id in flood.acks] == list(range(1, 701))
        assert broker.drops("queue_full") == 0
    finally:
        flood.close()


def test_a_throttled_client_is_not_taken_for_idle_by_its_keep_alive(start_broker):
    """While the broker holds a client's publishes it reads nothing from it: that is not a keep alive
    timeout, and the client's publishes keep arriving after its keep alive has passed."""
    broker = start_broker(limits={"messages_per_second_per_client": 20, "messages_burst_per_client": 1})
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("flood/t", 0)
    sock = socket.create_connection(("127.0.0.1", broker.port))
    frames = [encode(Connect(protocol_version=4, client_id="slowpoke", keep_alive=1), 4)]
    frames += [encode(Publish("flood/t", str(n).encode(), 0), 4) for n in range(60)]
    sock.sendall(b"".join(frames))
    try:
        assert wait_for(lambda: watcher.messages.qsize() == 60, timeout=10)  # about 3 s at 20/s
        assert broker.disconnects("keep_alive_timeout") == 0
    finally:
        sock.close()


def test_an_exempt_account_is_not_held_to_the_rate_but_everyone_else_still_is(start_broker, tmp_path):
    """The actions job publishes one message per targeted device in a burst: its account, named in
    ``limits.exempt_users``, is not paced, while another user flooding the same broker still is."""
    from broker_edge.security.auth import PasswordFile

    passwords = tmp_path / "passwd"
    for user in ("actions-job", "device"):
        PasswordFile.set_password(passwords, user, f"pw-{user}", create=True)
    broker = start_broker(
        auth={"password_file": str(passwords)},
        limits={
            "messages_per_second_per_client": RATE,
            "messages_burst_per_client": BURST,
            "exempt_users": ["actions-job"],
        },
    )
    count = RATE * 10  # ten seconds' worth at the rate
    job = FloodClient(broker.port, 1, count, username="actions-job", password=b"pw-actions-job")
    try:
        assert wait_for(lambda: len(job.acks) == count, timeout=8)  # paced, it would take 9.5 s
        assert [packet_id for _, packet_id in job.acks] == list(range(1, count + 1))
        assert broker.metric("timestone_broker_client_throttled_total") == 0
    finally:
        job.close()
    device = FloodClient(broker.port, 1, 400, username="device", password=b"pw-device")
    try:
        assert wait_for(lambda: len(device.acks) == 400, timeout=15)
        for position, (arrived, _packet_id) in enumerate(device.acks, 1):
            assert position <= device.allowance(arrived), (position, arrived - device.started)
        assert broker.metric("timestone_broker_client_throttled_total") >= 1
    finally:
        device.close()
