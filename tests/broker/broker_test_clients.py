"""Test clients: a paho-mqtt wrapper that collects messages in a queue, and a raw-socket MQTT client.

The paho wrapper (``PahoClient``) is how a device sees the broker; the raw client (``RawClient``) speaks
bytes through the project's codec so tests can send malformed input and read exact reason codes and flags.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker_edge.protocol.codec import PacketDecoder, encode
from broker_edge.protocol.packets import MQTT_5, Connect, Subscribe, Subscription

TIMEOUT = 5.0


class PahoClient:
    """A connected paho client; ``messages`` is a queue of received ``MQTTMessage`` objects."""

    def __init__(
        self,
        port: int,
        client_id: str = "",
        version: int = 5,
        clean: bool = True,
        session_expiry: int | None = None,
        username: str | None = None,
        password: str | None = None,
        will: tuple[str, bytes, int, bool] | None = None,
        will_delay: int | None = None,
        connect: bool = True,
        keepalive: int = 60,
    ) -> None:
        protocol = {5: mqtt.MQTTv5, 4: mqtt.MQTTv311, 3: mqtt.MQTTv31}[version]
        kwargs: dict[str, Any] = {"client_id": client_id, "protocol": protocol}
        if version != 5:
            kwargs["clean_session"] = clean
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, **kwargs)
        self.version = version
        self.port = port
        self.clean = clean
        self.session_expiry = session_expiry
        self.keepalive = keepalive
        self.messages: queue.Queue = queue.Queue()
        self.connack: queue.Queue = queue.Queue()
        self.disconnects: queue.Queue = queue.Queue()
        self.subacks: queue.Queue = queue.Queue()
        self.client.on_message = lambda c, u, m: self.messages.put(m)
        self.client.on_connect = lambda c, u, flags, rc, props: self.connack.put((flags, rc, props))
        self.client.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(rc)
        self.client.on_subscribe = lambda c, u, mid, rcs, props: self.subacks.put((mid, rcs))
        if username is not None:
            self.client.username_pw_set(username, password)
        if will is not None:
            will_props = None
            if will_delay is not None:
                will_props = PahoProperties(PacketTypes.WILLMESSAGE)
                will_props.WillDelayInterval = will_delay
            self.client.will_set(will[0], will[1], will[2], will[3], properties=will_props)
        if connect:
            self.connect()

    def connect(self) -> Any:
        """Connect and wait for CONNACK; returns (flags, reason code, properties)."""
        props = None
        kwargs: dict[str, Any] = {"keepalive": self.keepalive}
        if self.version == 5:
            props = PahoProperties(PacketTypes.CONNECT)
            if self.session_expiry is not None:
                props.SessionExpiryInterval = self.session_expiry
            kwargs["clean_start"] = self.clean
            kwargs["properties"] = props
        self.client.connect("127.0.0.1", self.port, **kwargs)
        self.client.loop_start()
        result = self.connack.get(timeout=TIMEOUT)
        self.connack_result = result
        return result

    def subscribe(self, topic: str, qos: int = 0, **options: Any) -> list:
        """Subscribe and wait for SUBACK; returns the reason codes."""
        props = options.pop("properties", None)
        if self.version == 5:
            opts = mqtt.SubscribeOptions(qos=qos, **options)
            result, mid = self.client.subscribe(topic, options=opts, properties=props)
        else:
            result, mid = self.client.subscribe(topic, qos)
        assert result == mqtt.MQTT_ERR_SUCCESS
        got_mid, codes = self.subacks.get(timeout=TIMEOUT)
        assert got_mid == mid
        return [c.value if hasattr(c, "value") else c for c in codes]

    def publish(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False, **kwargs: Any):
        info = self.client.publish(topic, payload, qos, retain, **kwargs)
        if qos:
            info.wait_for_publish(TIMEOUT)
        return info

    def expect(self, count: int = 1, timeout: float = TIMEOUT) -> list:
        """Wait for ``count`` messages and return them."""
        return [self.messages.get(timeout=timeout) for _ in range(count)]

    def expect_none(self, timeout: float = 0.3) -> None:
        """Assert that nothing arrives within ``timeout`` (only after an event proved delivery happens)."""
        try:
            message = self.messages.get(timeout=timeout)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message on {message.topic}: {message.payload!r}")

    def disconnect(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def kill(self) -> None:
        """Drop the TCP connection without DISCONNECT (as a device losing power would)."""
        self.client.loop_stop()
        sock = self.client.socket()
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class RawClient:
    """MQTT over a plain socket, bytes through the project's codec, for malformed input and exact checks."""

    def __init__(self, port: int, version: int = 5) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.version = version
        self.decoder = PacketDecoder(role="client", protocol_version=version)
        self.pending: list = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_packet(self, packet: Any) -> None:
        self.sock.sendall(encode(packet, self.version))

    def connect(self, client_id: str = "raw", **fields: Any) -> Any:
        self.send_packet(Connect(protocol_version=self.version, client_id=client_id, **fields))
        return self.recv()

    def subscribe(self, topic_filter: str, qos: int = 0, packet_id: int = 1, **options: Any) -> Any:
        props = options.pop("properties", None)
        self.send_packet(Subscribe(packet_id, [Subscription(topic_filter, qos, **options)], props))
        return self.recv()

    def recv(self, timeout: float = TIMEOUT) -> Any:
        """The next packet; None if the broker closed the connection."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no packet from the broker")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return None
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def closed(self, timeout: float = TIMEOUT) -> bool:
        """True once the broker closed the connection (packets before that are skipped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.recv(deadline - time.monotonic()) is None:
                    return True
            except TimeoutError:
                return False
        return False

    def close(self) -> None:
        self.sock.close()


def v5(version: int) -> bool:
    return version == MQTT_5


class Waiter:
    """A threading.Event with a payload, for callbacks."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None

    def set(self, value: Any = None) -> None:
        self.value = value
        self.event.set()

    def wait(self, timeout: float = TIMEOUT) -> Any:
        assert self.event.wait(timeout), "timed out"
        return self.value
