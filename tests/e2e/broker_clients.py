"""Test clients: a paho-mqtt wrapper that collects messages in a queue, and a raw-socket MQTT client.

The paho wrapper (``PahoClient``) is how a device sees the broker; the raw client (``RawClient``) speaks
bytes through the project's codec so tests can send malformed input and read exact reason codes and flags.

Neither ever reconnects on its own, and every wait has a timeout: a client that outlived its test and
kept reconnecting could take over a later test's session (client ids repeat between tests and ports are
reused). Every client made during a test is closed by ``close_all`` when the test ends (the broker fixture
calls it before stopping the broker).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker_edge.protocol.codec import PacketDecoder, encode
from broker_edge.protocol.packets import Connect, Disconnect, Subscribe, Subscription

TIMEOUT = 5.0

_open_clients: list[PahoClient | RawClient] = []
_open_lock = threading.Lock()


def _track(client: PahoClient | RawClient) -> None:
    with _open_lock:
        _open_clients.append(client)


def close_all() -> None:
    """Close every client made since the last call (called when a test ends)."""
    with _open_lock:
        clients = list(_open_clients)
        _open_clients.clear()
    for client in clients:
        with contextlib.suppress(OSError):
            client.close()


def wait_for(condition: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
    """Poll ``condition()`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def expect_none_on(clients: list[PahoClient], timeout: float) -> None:
    """Assert that none of ``clients`` receives anything within one window of ``timeout``: their messages
    queue meanwhile, so the window is waited once, not once per client."""
    time.sleep(timeout)
    for client in clients:
        client.expect_none(0)


class PahoClient:
    """A connected paho client; ``messages`` is a queue of received ``MQTTMessage`` objects.

    ``transport="websockets"`` with ``ws_path`` speaks MQTT over WebSocket; ``tls_context`` wraps the
    connection in TLS. ``connect_properties`` are extra v5 CONNECT properties (paho attribute names).
    """

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
        transport: str = "tcp",
        ws_path: str = "/mqtt",
        tls_context: ssl.SSLContext | None = None,
        connect_properties: dict[str, Any] | None = None,
    ) -> None:
        protocol = {5: mqtt.MQTTv5, 4: mqtt.MQTTv311, 3: mqtt.MQTTv31}[version]
        kwargs: dict[str, Any] = {
            "client_id": client_id,
            "protocol": protocol,
            "transport": transport,
            "reconnect_on_failure": False,
        }
        if version != 5:
            kwargs["clean_session"] = clean
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, **kwargs)
        if transport == "websockets":
            self.client.ws_set_options(path=ws_path)
        if tls_context is not None:
            self.client.tls_set_context(tls_context)
        self.version = version
        self.port = port
        self.clean = clean
        self.session_expiry = session_expiry
        self.keepalive = keepalive
        self.connect_properties = connect_properties or {}
        self.messages: queue.Queue = queue.Queue()
        self.connack: queue.Queue = queue.Queue()
        self.disconnects: queue.Queue = queue.Queue()
        self.subacks: queue.Queue = queue.Queue()
        self.unsubacks: queue.Queue = queue.Queue()
        self.client.on_message = lambda c, u, m: self.messages.put(m)
        self.client.on_connect = lambda c, u, flags, rc, props: self.connack.put((flags, rc, props))
        self.client.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(rc)
        self.client.on_subscribe = lambda c, u, mid, rcs, props: self.subacks.put((mid, rcs))
        self.client.on_unsubscribe = lambda c, u, mid, rcs, props: self.unsubacks.put((mid, rcs))
        self.publish_reasons: dict[int, int] = {}
        """The reason code of each QoS 1/2 publish's PUBACK (or PUBCOMP) by message id, until ``publish``
        takes it: paho calls a publish with a failure code published all the same."""
        self.publish_reason_strings: dict[int, str] = {}
        """The reason string of each acknowledgement that had one, by message id (a refusal says why)."""
        self.client.on_publish = self._acknowledged
        if username is not None:
            self.client.username_pw_set(username, password)
        if will is not None:
            will_props = None
            if will_delay is not None:
                will_props = PahoProperties(PacketTypes.WILLMESSAGE)
                will_props.WillDelayInterval = will_delay
            self.client.will_set(will[0], will[1], will[2], will[3], properties=will_props)
        _track(self)
        if connect:
            self.connect()

    def connect(self) -> Any:
        """Connect and wait for CONNACK; returns (flags, reason code, properties)."""
        kwargs: dict[str, Any] = {"keepalive": self.keepalive}
        if self.version == 5:
            props = PahoProperties(PacketTypes.CONNECT)
            if self.session_expiry is not None:
                props.SessionExpiryInterval = self.session_expiry
            for name, value in self.connect_properties.items():
                setattr(props, name, value)
            kwargs["clean_start"] = self.clean
            kwargs["properties"] = props
        self.client.connect("127.0.0.1", self.port, **kwargs)
        self.client.loop_start()
        try:
            result = self.connack.get(timeout=TIMEOUT)
        except queue.Empty:
            self.close()
            raise TimeoutError("no CONNACK from the broker") from None
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

    def unsubscribe(self, topic: str) -> list:
        """Unsubscribe and wait for UNSUBACK; returns its reason codes (MQTT 3.1.1 has none: empty)."""
        result, mid = self.client.unsubscribe(topic)
        assert result == mqtt.MQTT_ERR_SUCCESS
        got_mid, codes = self.unsubacks.get(timeout=TIMEOUT)
        assert got_mid == mid
        return [c.value if hasattr(c, "value") else c for c in codes]

    def _acknowledged(self, client, userdata, mid: int, reason, properties) -> None:
        self.publish_reasons[mid] = reason.value
        said = getattr(properties, "ReasonString", None)
        if said:
            self.publish_reason_strings[mid] = said

    def publish(
        self,
        topic: str,
        payload: bytes | str,
        qos: int = 0,
        retain: bool = False,
        *,
        refusal: int | None = None,
        **kwargs: Any,
    ):
        """Publish; a QoS 1/2 publish waits for the broker's acknowledgement and asserts its reason code:
        a success, or the failure code ``refusal`` when given (MQTT 5; 3.1.1 has no codes)."""
        info = self.client.publish(topic, payload, qos, retain, **kwargs)
        if qos:
            info.wait_for_publish(TIMEOUT)
            assert info.is_published(), f"no acknowledgement for {topic}"
            reason = self.publish_reasons.pop(info.mid, None)
            said = self.publish_reason_strings.pop(info.mid, "")
            assert reason is not None or refusal is None, f"no reason code kept for {refusal:#04x}"
            if reason is not None:  # (None: a test replaced the callback and checks the codes itself)
                if refusal is None:
                    assert reason < 0x80, f"publish on {topic} refused: reason code {reason:#04x} ({said})"
                else:
                    assert reason == refusal, (
                        f"publish on {topic}: reason code {reason:#04x}, not {refusal:#04x}"
                    )
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
        """Send DISCONNECT and wait until paho has written it and closed the socket."""
        self.client.disconnect()
        try:
            self.disconnects.get(timeout=TIMEOUT)
        finally:
            self.client.loop_stop()

    def kill(self) -> None:
        """Drop the TCP connection without DISCONNECT (as a device losing power would).

        The socket is shut down before the network thread is stopped: paho's ``loop_stop`` otherwise waits
        for unacknowledged QoS 1/2 publishes, which a test may have made on purpose.
        """
        sock = self.client.socket()
        raw = getattr(sock, "_socket", sock)  # a WebSocket wrapper holds the socket
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)
        self.client.loop_stop()
        if sock is not None:
            sock.close()

    def close(self) -> None:
        """Stop the network thread and drop the socket, whatever state the client is in."""
        self.kill()


class RawClient:
    """MQTT over a plain socket, bytes through the project's codec, for malformed input and exact checks."""

    def __init__(self, port: int, version: int = 5, sock: socket.socket | None = None) -> None:
        self.sock = (
            sock if sock is not None else socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        )
        self.version = version
        self.decoder = PacketDecoder(role="client", protocol_version=version)
        self.pending: list = []
        _track(self)

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
            except (ConnectionResetError, ssl.SSLError):
                data = b""
            if not data:
                return None
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def expect_disconnect(self, reason_code: int) -> Any:
        """The next packet is a v5 DISCONNECT with ``reason_code`` and a reason string, then the close."""
        packet = self.recv()
        assert isinstance(packet, Disconnect), packet
        assert packet.reason_code == reason_code, packet
        assert packet.properties.reason_string, "a DISCONNECT from the broker says why"
        assert self.closed()
        return packet

    def recv_none(self, timeout: float = 0.3) -> None:
        """Assert that no packet arrives within ``timeout`` (after an event proved traffic flows)."""
        try:
            packet = self.recv(timeout)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected packet {packet!r}")

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


def raw_client_from(port: int, source: str, version: int = 5) -> RawClient:
    """A raw client whose connection comes from ``source`` (any 127.x.y.z address is this machine's
    loopback): what the broker counts per client address sees it as another peer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT, source_address=(source, 0))
    return RawClient(port, version, sock)


def stalled_subscriber(port: int, client_id: str, filters: list[Subscription], version: int = 5) -> RawClient:
    """A client subscribed to ``filters`` with a small receive window, that the test does not read: the
    broker's buffer towards it fills."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.settimeout(TIMEOUT)
    sock.connect(("127.0.0.1", port))
    raw = RawClient(port, version, sock=sock)
    raw.connect(client_id)
    raw.send_packet(Subscribe(1, filters))
    assert raw.recv().reason_codes == [f.qos for f in filters]
    return raw
