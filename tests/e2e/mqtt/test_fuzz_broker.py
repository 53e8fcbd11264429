"""Broken packets against a broker process (``timestone broker``) while a paho-mqtt client publishes beside.

Each frame goes on a connection of its own, after a valid MQTT 5 CONNECT. The decoder in this process says
what the frame is: one the decoder refuses must be answered with DISCONNECT carrying the decoder's reason
code and a close; one that decodes must be handled (a PINGREQ after it is answered) or refused with an
error code of the protocol's, never 0x83 (a broker bug). A CONNECT broken at random gets a CONNACK or is
closed. All along the publisher's QoS 1 messages keep getting their PUBACK; at the end the broker stops
cleanly with no traceback in its log. The frames are the decoder fuzzer's (``mqtt_mutations``), drawn
derandomized and bounded in number: the same few seconds every run.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from broker_edge.protocol import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    MQTTError,
    PacketDecoder,
    PingResp,
    encode,
)
from broker_edge.protocol.properties import WILL
from tests.conftest import free_port
from tests.e2e.broker_clients import PahoClient
from tests.e2e.mqtt.test_run_broker import TIMESTONE, wait_for_port
from tests.unit.broker_edge.protocol.mqtt_mutations import (
    MISPLACED_PROPERTIES,
    SINGLE_PROPERTIES,
    block,
    client_frames,
    frame,
    mutated,
    packet_frame,
    string,
    valid_property,
)

CONNECT = encode(Connect(protocol_version=MQTT_5, client_id="fuzzed"), MQTT_5)
PINGREQ = b"\xc0\x00"
FUZZ = settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))


class Broker:
    """A ``timestone broker`` process on free ports of 127.0.0.1, its log in a file."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        config = {
            "listeners": [{"name": "tcp", "type": "tcp", "host": "127.0.0.1", "port": self.port}],
            "admin_http": {"port": free_port()},
            "storage": {"enabled": False},
            "offsets_api": {"enabled": False},
            "sys_topics": {"enabled": False},
            "limits": {"messages_per_second_per_client": 0},
        }
        (directory / "broker.yaml").write_text(yaml.safe_dump(config))
        self.log = directory / "broker.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [*TIMESTONE, "broker", "--config", str(directory / "broker.yaml")], stdout=log, stderr=log
            )
        wait_for_port(self.port, self.process)

    def stop(self) -> str:
        """SIGTERM; a clean exit is asserted; its log."""
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=15) == 0
        return self.log.read_text()


class Publisher:
    """A paho-mqtt client publishing QoS 1 on a thread, each publish waiting for its PUBACK."""

    def __init__(self, port: int) -> None:
        self.client = PahoClient(port, "fuzz-bystander")
        self.acknowledged = 0
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.client.publish("fuzz/bystander", b"%d" % self.acknowledged, 1)
                self.acknowledged += 1
        except BaseException as exc:  # reported by ``still_acknowledged``
            self.failure = exc

    def still_acknowledged(self) -> None:
        """The next PUBACKs come (a few, within seconds)."""
        start = self.acknowledged
        deadline = time.monotonic() + 5
        while self.acknowledged < start + 2 and self.failure is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert self.failure is None, self.failure
        assert self.acknowledged >= start + 2, "the publisher's PUBACKs stopped"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.client.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    running = Broker(tmp_path_factory.mktemp("fuzz-broker"))
    try:
        yield running
    finally:
        log = running.stop()
        assert "Traceback" not in log, log[log.index("Traceback") - 2000 :][:6000]


@pytest.fixture(scope="module")
def publisher(broker: Broker) -> Iterator[Publisher]:
    beside = Publisher(broker.port)
    yield beside
    beside.stop()


def decoder_says(data: bytes) -> tuple[int | None, bool, bool]:
    """The reason code the broker's decoder raises on ``data`` after CONNECT (None: none), whether it would
    wait for more bytes, and whether packets decoded before the error come first (the broker handles them
    before it closes: a DISCONNECT among them closes the connection first, a packet the session refuses
    has its own code)."""
    decoder = PacketDecoder(1 << 20)
    decoder.feed(CONNECT)
    try:
        decoder.feed(data)
    except MQTTError as error:
        return error.reason_code, False, bool(error.packets_before)
    return None, decoder.buffered > 0, False


def answer(sock: socket.socket, decoder: PacketDecoder, until_pong: bool, timeout: float = 5) -> list[object]:
    """Packets from the broker until it closes (``None`` last) or, ``until_pong``, a PINGRESP comes."""
    got: list[object] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(deadline - time.monotonic())
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            return [*got, None]
        got += decoder.feed(data)
        if until_pong and any(isinstance(packet, PingResp) for packet in got):
            return got
    raise AssertionError(f"neither a close nor a PINGRESP within {timeout} s: {got}")


def send_after_connect(port: int, data: bytes) -> None:
    """``data`` on a connection of its own; checks the broker's answer against the decoder's."""
    code, waits, first = decoder_says(data)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        decoder = PacketDecoder(role="client", protocol_version=MQTT_5)
        sock.sendall(CONNECT)
        assert answer_connack(sock, decoder).reason_code == 0
        if waits:  # a packet cut short: the broker waits for the rest; the connection is dropped
            sock.sendall(data)
            return
        sock.sendall(data + (PINGREQ if code is None else b""))
        got = answer(sock, decoder, until_pong=code is None)
    if code is not None and not first:
        assert [type(p) for p in got] == [Disconnect, type(None)], (data, got)
        disconnect = got[0]
        assert isinstance(disconnect, Disconnect)
        assert disconnect.reason_code == code, (data, disconnect)
        assert disconnect.properties is not None and disconnect.properties.reason_string
        return
    refusals = [p for p in got if isinstance(p, Disconnect)]
    for refusal in refusals:
        assert 0x80 <= refusal.reason_code != 0x83, (data, refusal)


def answer_connack(sock: socket.socket, decoder: PacketDecoder) -> ConnAck:
    sock.settimeout(5)
    packets = decoder.feed(sock.recv(65536))
    assert packets and isinstance(packets[0], ConnAck), packets
    return packets[0]


def interesting_frames() -> list[bytes]:
    """The decoder fuzzer's cases that follow a CONNECT: every property twice or misplaced, the variable
    byte integer, UTF-8, alias, identifier, flag and AUTH edges."""
    frames = [
        packet_frame(t, block(valid_property(s), valid_property(s)))
        for t, s in SINGLE_PROPERTIES
        if t not in (1, WILL)
    ]
    frames += [
        packet_frame(t, block(valid_property(s))) for t, s in MISPLACED_PROPERTIES if t not in (1, WILL)
    ]
    frames += [
        b"\x30\xff\xff\xff\xff\x01",
        b"\x30\xff\xff\xff\x7f",
        b"\x30\x80\x00",
        frame(0x30, string("t") + b"\xff\xff\xff\xff\x01"),
        frame(0x82, b"\x00\x01\x06\x0b\xff\xff\xff\xff\x01" + string("t") + b"\x00"),
        frame(0x82, b"\x00\x01\x02\x0b\x00" + string("t") + b"\x00"),
        frame(0x82, b"\x00\x01\x05\x0b\xff\xff\xff\x7f" + string("t") + b"\x00"),
        frame(0x30, string("") + b"\x00"),
        frame(0x30, string("") + block(b"\x23\x00\x07")),  # an alias never set: 0x82 from the session
        frame(0x30, string("t") + block(b"\x23\x00\x00")),
        frame(0x30, string("t") + block(b"\x23\xff\xff")),  # above the maximum: 0x94 from the session
        frame(0x32, string("t") + b"\x00\x00\x00"),
        b"\x40\x02\x00\x00",
        b"\x36\x03\x00\x01t",
        b"\x38\x03\x00\x01t",
        b"\x42\x02\x00\x01",
        b"\xf0\x00",
        frame(0xF0, b"\x18" + block(b"\x15" + string("SCRAM-SHA-1"))),
        frame(0x82, b"\x00\x01\x00" + string("$share/+/t") + b"\x01"),
        frame(0x82, b"\x00\x01\x00" + string("$share/g/t") + b"\x05"),
    ]
    for bad in (b"\x00", b"\xff", b"\xed\xa0\x80"):
        frames += [
            frame(0x30, string(b"t" + bad) + b"\x00"),
            frame(0x82, b"\x00\x01\x00" + string(b"t" + bad) + b"\x00"),
            frame(0x30, string("t") + block(b"\x26" + string(bad) + string("v"))),
            frame(0xE0, b"\x00" + block(b"\x1f" + string(bad))),
        ]
    return frames


def test_interesting_frames_close_only_their_connection_with_the_decoders_code(
    broker: Broker, publisher: Publisher
) -> None:
    for data in interesting_frames():
        send_after_connect(broker.port, data)
    publisher.still_acknowledged()


@FUZZ
@given(client_frames().flatmap(mutated))
def test_randomly_broken_frames_get_the_decoders_code_and_nobody_else_notices(
    broker: Broker, publisher: Publisher, data: bytes
) -> None:
    send_after_connect(broker.port, data)
    publisher.still_acknowledged()


@FUZZ
@given(mutated(CONNECT))
def test_a_randomly_broken_connect_gets_a_connack_or_a_close(
    broker: Broker, publisher: Publisher, data: bytes
) -> None:
    received = b""
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # a CONNECT cut short ends here: the broker sees the end
        while chunk := sock.recv(65536):
            received += chunk
    assert not received or received[0] == 0x20, received  # a CONNACK (v3 or v5 form), then the close
    publisher.still_acknowledged()
