"""The uvloop floor the ingest benches read Timestone against: a relay that must still carry the load
generator's traffic whole (every acknowledged message delivered, the frames logged), or its figures say
nothing."""

from __future__ import annotations

import socket
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from bench import frames
from bench.brokers import Floor
from bench.loadgen.flow import Timing, run_flow
from bench.scenarios import fanin, fleet
from bench.sysinfo import dir_bytes

SHORT = Timing(warmup_s=0.3, measure_s=0.7, drain_s=4.0, connect_timeout_s=20.0)


def test_the_fleet_through_the_floor_delivers_every_acknowledged_message_and_logs_it() -> None:
    with Floor().running() as broker:
        result = run_flow(broker, fleet.spec(40), SHORT, cpus=None)
        on_disk = dir_bytes(broker.data_dir)
    assert result.acked == result.sent > 40
    assert result.delivered == result.expected == result.acked
    assert on_disk >= result.sent * fleet.PAYLOAD  # every PUBLISH frame appended before its PUBACK


def test_qos0_fan_in_through_the_floor_reaches_the_subscriber() -> None:
    with Floor().running() as broker:
        result = run_flow(broker, fanin.spec(0, 4), SHORT, cpus=None)
    assert result.delivered == result.sent > 0


def test_mqtt5_clients_publish_and_subscribe_through_it_at_qos1() -> None:
    subscribed = threading.Event()
    received: list[mqtt.MQTTMessage] = []
    done = threading.Event()

    def on_message(_client: mqtt.Client, _userdata: object, message: mqtt.MQTTMessage) -> None:
        received.append(message)
        if len(received) == 3:
            done.set()

    with Floor().running() as broker:
        subscriber = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        subscriber.on_subscribe = lambda *_args: subscribed.set()
        subscriber.on_message = on_message
        subscriber.connect("127.0.0.1", broker.port)
        subscriber.loop_start()
        publisher = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        try:
            subscriber.subscribe("any/#", qos=1)
            assert subscribed.wait(5)
            publisher.connect("127.0.0.1", broker.port)
            publisher.loop_start()
            for number in range(3):
                publisher.publish("any/topic", f"m{number}".encode(), qos=1).wait_for_publish(5)
            assert done.wait(5)
        finally:
            publisher.loop_stop()
            subscriber.loop_stop()
    assert [m.payload for m in received] == [b"m0", b"m1", b"m2"]
    assert all(m.qos == 1 for m in received)


def _read_publishes(sock: socket.socket, count: int, timeout: float) -> list[bytes]:
    """Up to `count` PUBLISH frames (of one-byte remaining lengths) read within `timeout` seconds."""
    sock.settimeout(timeout)
    data = b""
    frames_read: list[bytes] = []
    try:
        while len(frames_read) < count:
            data += sock.recv(65536)
            while len(data) >= 2 and len(data) >= 2 + data[1]:
                frame, data = data[: 2 + data[1]], data[2 + data[1] :]
                if frame[0] >> 4 == 3:
                    frames_read.append(frame)
    except TimeoutError:
        pass
    return frames_read


def test_a_qos1_subscriber_has_at_most_the_window_unacknowledged() -> None:
    """The floor pays for the same window as the brokers it is read against: 64 deliveries, then one per
    PUBACK."""
    with Floor().running() as broker, socket.create_connection(("127.0.0.1", broker.port)) as subscriber:
        subscriber.sendall(frames.connect("window-sub") + frames.subscribe(1, "w/#", 1))
        subscriber.settimeout(5)
        assert subscriber.recv(4)[0] == frames.CONNACK and subscriber.recv(5)[0] == frames.SUBACK
        with socket.create_connection(("127.0.0.1", broker.port)) as publisher:
            publish = (frames.publish("w/t", b"x", 1, n) for n in range(1, 101))
            publisher.sendall(frames.connect("window-pub") + b"".join(publish))
            first = _read_publishes(subscriber, 100, timeout=1.0)
            subscriber.sendall(frames.puback(int.from_bytes(first[0][7:9], "big")))
            more = _read_publishes(subscriber, 100, timeout=1.0)
    assert len(first) == 64
    assert len(more) == 1
    assert [f[7:9] for f in first[:2]] == [b"\x00\x01", b"\x00\x02"]  # ids of the subscriber's own
