"""A lean asyncio MQTT 5 client over the sans-IO codec: simulated fleets, load tests, the actions job.

One ``asyncio.Protocol`` per connection and no task per connection, so one process can hold ten thousand
devices. It speaks what a device needs: CONNECT, SUBSCRIBE (with user properties, e.g. a log ``offset``),
PUBLISH at QoS 0/1 both ways (incoming QoS 1/2 acknowledged automatically), keepalive and DISCONNECT.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from broker_edge.engine.message import OFFSETS_OPT_IN
from broker_edge.protocol import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    MQTTError,
    PacketDecoder,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Will,
    encode,
)
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.protocol.wire import encode_varint

MessageHandler = Callable[["Message"], None]


Publication = tuple[str, bytes, int | None]
"""A QoS 1 publish of a batch: topic, payload and its v5 Message Expiry Interval in whole seconds (None: the
message never expires)."""


def qos1_publish_frame(topic: str, payload: bytes, packet_id: int, expiry_s: int | None = None) -> bytes:
    """An MQTT 5 QoS 1 PUBLISH with no property but its Message Expiry Interval (when set), as ``encode``
    writes it but without a packet object: a batch of thousands of publishes costs a few byte joins each."""
    name = topic.encode()
    properties = b"\x00" if expiry_s is None else b"\x05\x02" + expiry_s.to_bytes(4, "big")
    body_length = 2 + len(name) + 2 + len(properties) + len(payload)
    header = b"\x32" + encode_varint(body_length) + len(name).to_bytes(2, "big")
    return b"".join((header, name, packet_id.to_bytes(2, "big"), properties, payload))


class ConnectionRefused(ConnectionError):
    """The broker answered CONNECT with a failure reason code (0x9C: and the broker to use instead)."""

    def __init__(self, reason_code: int, server_reference: str | None = None) -> None:
        super().__init__(f"CONNECT refused with reason code 0x{reason_code:02x}")
        self.reason_code = reason_code
        self.server_reference = server_reference


def past_the_end(suback: SubAck) -> bool:
    """Whether the SUBACK of a replay says an asked offset is past its log's end (``offset_out_of_range``):
    the broker's store is not the one the offset was read from, since offsets never go back in one."""
    for key, value in suback.properties.user_properties if suback.properties else ():
        if key == "offset_out_of_range":
            with contextlib.suppress(ValueError, TypeError, KeyError):
                told = json.loads(value)
                if int(told["offset"]) > int(told["end_offset"]):
                    return True
    return False


def server_address(reference: str) -> tuple[str, int] | None:
    """The first ``host:port`` (``[v6 address]:port``) of a Server Reference, as Timestone's cluster members
    send it with DISCONNECT or CONNACK 0x9C; None when it names no port."""
    references = reference.split()
    host, _, port = references[0].rpartition(":") if references else ("", "", "")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def referral(reason_code: int | None, server_reference: str | None) -> tuple[str, int] | None:
    """The broker a CONNACK or DISCONNECT sends its client to: with 0x9C "use another server", the first
    address of its Server Reference; None for any other reason code, or a reference naming no port."""
    if reason_code != ReasonCode.USE_ANOTHER_SERVER:
        return None
    return server_address(server_reference or "")


def connect_failure(error: BaseException) -> str:
    """What made a connection attempt fail, as a counter's suffix: ``refused_0x88`` (the CONNACK's reason),
    ``timed_out``, ``unreachable`` (nothing listening), ``closed`` (the broker closed or reset it first) or
    the error's type."""
    if isinstance(error, ConnectionRefused):
        return f"refused_0x{error.reason_code:02x}"
    if isinstance(error, TimeoutError):
        return "timed_out"
    if isinstance(error, ConnectionRefusedError):
        return "unreachable"
    if isinstance(error, ConnectionError):
        return "closed"
    return type(error).__name__


@dataclass(slots=True)
class Message:
    """An application message delivered to this client; ``offset`` is the broker log offset when present."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    offset: int | None
    user_properties: list[tuple[str, str]]


class MqttClient(asyncio.Protocol):
    """One MQTT 5 connection; create with :meth:`connect`."""

    def __init__(self, client_id: str, on_message: MessageHandler | None, keep_alive: int) -> None:
        self.client_id = client_id
        self.on_message = on_message
        self.keep_alive = keep_alive
        self.on_disconnect: Callable[[Exception | None], None] | None = None
        self.closed_with: int | None = None
        """The reason code of the broker's DISCONNECT, when the broker closed the connection with one."""
        self.server_reference: str | None = None
        """The Server Reference of that DISCONNECT (0x9C "use another server": where to connect instead)."""
        self._transport: asyncio.Transport | None = None
        self._decoder = PacketDecoder(role="client", protocol_version=MQTT_5)
        self._packet_ids = itertools.cycle(range(1, 65536))
        self._waiters: dict[tuple[str, int], asyncio.Future] = {}
        self._connack: asyncio.Future[ConnAck] | None = None
        self._closed: asyncio.Future[None] | None = None
        self._ping_handle: asyncio.TimerHandle | None = None
        self.receive_maximum = 65_535
        """QoS 1/2 PUBLISHes the broker accepts unacknowledged (its CONNACK's Receive Maximum)."""
        self.bytes_received = 0
        """Every byte read from the broker on this connection (what a device pays for on the wire)."""

    # -- life cycle -------------------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        client_id: str,
        *,
        on_message: MessageHandler | None = None,
        clean_start: bool = True,
        keep_alive: int = 60,
        username: str | None = None,
        password: bytes | None = None,
        session_expiry_s: int = 0,
        log_offsets: bool = False,
        timeout_s: float = 10.0,
        source_address: str | None = None,
        will: Will | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> MqttClient:
        """Open a TCP connection, send CONNECT and wait for a successful CONNACK.

        ``log_offsets`` asks a Timestone broker for the ``offset`` user property on deliveries of persisted
        messages (``Message.offset``; see docs/device-protocol.md). ``source_address`` binds the local end
        (e.g. one of several 127.0.0.x addresses, so that a fleet of more connections than one address has
        ephemeral ports can reach one broker port). ``will`` is published by the broker when the connection
        ends without a DISCONNECT (a Sparkplug B edge node's NDEATH). ``ssl_context``: MQTT over TLS (a
        broker's ``type: tls`` listener), its certificate checked for ``host``.
        """
        loop = asyncio.get_running_loop()
        local_addr = (source_address, 0) if source_address else None
        _, client = await asyncio.wait_for(
            loop.create_connection(
                lambda: cls(client_id, on_message, keep_alive),
                host,
                port,
                local_addr=local_addr,
                ssl=ssl_context,
                server_hostname=host if ssl_context is not None else None,
            ),
            timeout_s,
        )
        properties = None
        if session_expiry_s or log_offsets:
            properties = Properties(
                session_expiry_interval=session_expiry_s or None,
                user_properties=[OFFSETS_OPT_IN] if log_offsets else [],
            )
        connect = Connect(
            protocol_version=MQTT_5,
            clean_start=clean_start,
            keep_alive=keep_alive,
            client_id=client_id,
            username=username,
            password=password,
            properties=properties,
            will=will,
        )
        assert client._connack is not None  # made with the connection
        try:
            if client.connected:  # else closed since its handshake (a TLS alert): connection_lost says why
                client._send(connect)
            connack = await asyncio.wait_for(client._connack, timeout_s)
        except BaseException:  # a CONNECT the broker took in later would open a session nobody holds
            client.abort()
            raise
        if connack.reason_code >= 0x80:
            client.abort()
            properties = connack.properties
            raise ConnectionRefused(connack.reason_code, properties.server_reference if properties else None)
        if connack.properties and connack.properties.receive_maximum:
            client.receive_maximum = connack.properties.receive_maximum
        client._schedule_ping()
        return client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # create_connection made a stream transport
        loop = asyncio.get_running_loop()
        self._closed = loop.create_future()
        self._connack = loop.create_future()  # failed by connection_lost with why, even before CONNECT

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._ping_handle:
            self._ping_handle.cancel()
        error = exc or ConnectionResetError("connection closed")
        for future in [self._connack, *self._waiters.values()]:
            if future is not None and not future.done():
                future.set_exception(error)
        self._waiters.clear()
        if self._closed and not self._closed.done():
            self._closed.set_result(None)
        if self.on_disconnect:
            self.on_disconnect(exc)

    @property
    def connected(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    async def disconnect(self) -> None:
        """Send a normal DISCONNECT (no will) and wait for the socket to close."""
        transport = self._transport
        if transport is not None and not transport.is_closing():
            self._send(Disconnect())
            transport.close()
        if self._closed:
            await self._closed

    def abort(self) -> None:
        """Drop the connection without DISCONNECT, as a device losing power would."""
        if self._transport:
            self._transport.abort()

    # -- requests ---------------------------------------------------------------------------------------

    async def subscribe(
        self, topic_filter: str, qos: int = 1, user_properties: list[tuple[str, str]] | None = None
    ) -> list[int]:
        """Subscribe to one filter and return the SUBACK reason codes."""
        return (await self.subscribe_answer(topic_filter, qos, user_properties)).reason_codes

    async def subscribe_answer(
        self, topic_filter: str, qos: int = 1, user_properties: list[tuple[str, str]] | None = None
    ) -> SubAck:
        """Subscribe to one filter and return the SUBACK (its properties say where a replay started)."""
        packet_id = next(self._packet_ids)
        properties = Properties(user_properties=user_properties) if user_properties else None
        future = self._expect("suback", packet_id)
        self._send(Subscribe(packet_id, [Subscription(topic_filter, qos)], properties))
        suback: SubAck = await future
        return suback

    async def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        user_properties: list[tuple[str, str]] | None = None,
    ) -> int:
        """Publish; for QoS 1 wait for the PUBACK and return its reason code (0 for QoS 0)."""
        properties = Properties(user_properties=user_properties) if user_properties else None
        if qos == 0:
            self._send(Publish(topic, payload, 0, retain, properties=properties))
            return 0
        packet_id = next(self._packet_ids)
        future = self._expect("puback" if qos == 1 else "pubcomp", packet_id)
        self._send(Publish(topic, payload, qos, retain, packet_id=packet_id, properties=properties))
        ack = await future
        return ack.reason_code

    async def publish_many(self, messages: Sequence[Publication]) -> list[int]:
        """Publish at QoS 1, pipelined within the broker's Receive Maximum; returns the PUBACK codes.

        Whatever fits in the window goes out in one write; each batch of acknowledgements refills it.
        Raises when the connection drops before every PUBACK arrived.
        """
        acks: list[asyncio.Future] = []
        await self._send_windowed(messages, acks)
        return [ack.reason_code for ack in await asyncio.gather(*acks)]

    async def publish_many_settled(
        self, messages: Sequence[Publication], timeout_s: float
    ) -> list[int | None]:
        """As :meth:`publish_many`, but never raises: each message's PUBACK code, or None when it was not
        acknowledged (the connection dropped, or no PUBACK within ``timeout_s``): a caller that must not
        lose a message resends exactly the ``None`` ones, elsewhere if need be."""
        acks: list[asyncio.Future] = []
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(self._send_windowed(messages, acks), timeout_s)
        if acks:
            await asyncio.wait(acks, timeout=timeout_s)
        codes: list[int | None] = [None] * len(messages)
        for index, ack in enumerate(acks):
            if ack.done() and not ack.cancelled() and ack.exception() is None:
                codes[index] = ack.result().reason_code
            elif not ack.done():
                ack.cancel()
        return codes

    async def _send_windowed(self, messages: Sequence[Publication], acks: list[asyncio.Future]) -> None:
        """Send QoS 1 PUBLISHes within the Receive Maximum, appending each PUBACK future to ``acks`` (in
        message order) as its PUBLISH is written: an interrupted caller still knows which went out."""
        window_open = asyncio.Event()
        in_flight = 0

        def acknowledged(_: asyncio.Future) -> None:
            nonlocal in_flight
            in_flight -= 1
            window_open.set()

        index = 0
        while index < len(messages):
            if in_flight >= self.receive_maximum:
                window_open.clear()
                await window_open.wait()
                continue
            frames = []
            batch = messages[index : index + self.receive_maximum - in_flight]
            futures = []
            for topic, payload, expiry_s in batch:
                packet_id = next(self._packet_ids)
                ack = self._expect("puback", packet_id)
                ack.add_done_callback(acknowledged)
                futures.append(ack)
                frames.append(qos1_publish_frame(topic, payload, packet_id, expiry_s))
            index += len(frames)
            in_flight += len(frames)
            acks.extend(futures)
            try:
                self._write(frames)
            except ConnectionError:
                for ack in futures:
                    ack.cancel()
                raise

    def publish_tracked(self, topic: str, payload: bytes) -> asyncio.Future | None:
        """Send a QoS 1 PUBLISH; the future of its PUBACK (fails if the connection drops first), or None
        when not connected."""
        if not self.connected:
            return None
        packet_id = next(self._packet_ids)
        ack = self._expect("puback", packet_id)
        self._send(Publish(topic, payload, 1, packet_id=packet_id))
        return ack

    def publish_nowait(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> bool:
        """Send a PUBLISH without waiting for its acknowledgement; False when not connected."""
        if not self.connected:
            return False
        packet_id = next(self._packet_ids) if qos else None
        self._send(Publish(topic, payload, qos, retain, packet_id=packet_id))
        return True

    # -- protocol ---------------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.bytes_received += len(data)
        try:
            packets = self._decoder.feed(data)
        except MQTTError:
            self.abort()
            return
        for packet in packets:
            self._handle(packet)

    def _handle(self, packet) -> None:
        if isinstance(packet, Publish):
            self._deliver(packet)
        elif isinstance(packet, ConnAck):
            if self._connack and not self._connack.done():
                self._connack.set_result(packet)
        elif isinstance(packet, PubAck):
            self._resolve("puback", packet.packet_id, packet)
        elif isinstance(packet, PubRec):
            self._send(PubRel(packet.packet_id))
        elif isinstance(packet, PubComp):
            self._resolve("pubcomp", packet.packet_id, packet)
        elif isinstance(packet, PubRel):
            self._send(PubComp(packet.packet_id))
        elif isinstance(packet, SubAck):
            self._resolve("suback", packet.packet_id, packet)
        elif isinstance(packet, UnsubAck):
            self._resolve("unsuback", packet.packet_id, packet)
        elif isinstance(packet, Disconnect):
            self.closed_with = packet.reason_code
            self.server_reference = packet.properties.server_reference if packet.properties else None
            self.abort()
        elif isinstance(packet, PingResp):
            pass

    def _deliver(self, packet: Publish) -> None:
        user_properties = packet.properties.user_properties if packet.properties else []
        offset = None
        for key, value in reversed(user_properties):  # the broker's own comes after the publisher's
            if key == "offset":
                offset = int(value) if value.isdigit() else None
                break
        if self.on_message:
            self.on_message(
                Message(packet.topic, packet.payload, packet.qos, packet.retain, offset, user_properties)
            )
        if packet.packet_id is None:  # QoS 0
            return
        if packet.qos == 1:
            self._send(PubAck(packet.packet_id))
        elif packet.qos == 2:
            self._send(PubRec(packet.packet_id))

    def _expect(self, kind: str, packet_id: int) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._waiters[kind, packet_id] = future
        return future

    def _resolve(self, kind: str, packet_id: int, packet) -> None:
        future = self._waiters.pop((kind, packet_id), None)
        if future is not None and not future.done():
            future.set_result(packet)

    def _send(self, packet) -> None:
        self._write([encode(packet, MQTT_5)])

    def _write(self, frames: list[bytes]) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError(f"{self.client_id}: not connected")
        self._transport.writelines(frames)

    def _schedule_ping(self) -> None:
        if self.keep_alive:
            loop = asyncio.get_running_loop()
            self._ping_handle = loop.call_later(self.keep_alive * 0.75, self._ping)

    def _ping(self) -> None:
        if self.connected:
            self._send(PingReq())
            self._schedule_ping()
