"""Peer links: one persistent WebSocket between every pair of brokers, carrying publishes and answers.

A link is the WebSocket ``/v1/peer`` of the members' endpoint (``member_api``): the dialing node is the
one its certificate names (``member_clients`` checks the other end's before it sends anything), and both
ends are current members. Of each pair the node with the smaller ``node_id`` dials and redials while the
other is a member; both then send on the one socket. A link coming up proves the peer's node id
(``MemberProofs``). Everything sent to a peer during one loop iteration
leaves as one binary WebSocket message, written in the next iteration (the first part sent starts the
writing task, whose first step joins whatever was sent meanwhile): a part waits one loop iteration, never a
timer. Senders that want to build their part as late as possible, to take in everything new of the
iteration (a leader's push, a follower's acknowledgement), register with ``PeerLink.soon`` and are called
by that task just before it joins the message.

Wire format: a WebSocket message is a sequence of parts ``u8 kind | u32 length | body`` (little endian;
``link_wire`` holds what every format of the link shares):

- ``FORWARD``: ``u32 batch | u32 CRC-32C of the rest | u16 topic length | topic | u16 publishers |
  (u16 length | client id)* | u32 count | count x (u8 flags | u16 publisher | u32 length) | each one's
  data, in order``. Logged publishes for the peer to append as their partition's leader, described by a
  table and their data one after the other, so that a batch costs one checksum and each publish a few
  slices: a publish without MQTT 5 properties or expiry has its payload as data (flags: QoS in bits 0-1,
  retain in bit 2); any other is the commitlog's record frame (``storage/record.py``: payload, QoS, retain,
  publisher, MQTT 5 properties, what remains of the expiry; flag bit 7).
- ``UNLOGGED``: ``u16 topic length | topic | one record frame``: route it locally, log nothing.
- ``ANSWER``: ``u32 batch | u32 count | runs``: the leader's answer to a ``FORWARD``, sent once the batch is
  acknowledged by its PUBLISH path, as runs of publishes answered alike, ``u32 length | u8 reason code |
  i64 offset of the first or -1 | u16 length | reason``: a run's offsets follow each other (a batch
  appended in one go is one run).
- ``REQUEST``: ``u32 id | u8 service | body`` and ``REPLY``: ``u32 id | u8 status (0 ok, 1 error) | body``:
  a call to a service a feature registered with ``PeerLinks.serve_requests`` (``PeerLink.request``).
- Kinds from ``FIRST_EXTENSION_KIND`` up: one-way messages of features that registered a handler with
  ``PeerLinks.on`` (``PeerLink.send``). Each feature keeps its kinds, and their body formats, in its own
  module.

``FORWARD`` and ``ANSWER`` are the link's format 2. Members of earlier versions read only format 1
(``link_format_1``: a record frame per publish, an answer entry per publish), so a link forwards and answers
in format 1 until its peer, asked once the link is up (service ``FORMAT_SERVICE``), says it speaks format 2:
a rolling upgrade keeps forwarding between old and new members. Every member reads both.

A link that drops fails the forwards it was waiting for (they may or may not have been appended: the
device is told the publish failed and resends).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from crc32c import crc32c

from broker_edge.cluster.links.link_format_1 import (
    ANSWER_1,
    FORWARD_1,
    decode_answer_1,
    decode_forward_1,
    encode_answer_1,
    encode_forward_1,
)
from broker_edge.cluster.links.link_wire import (
    MAX_RECORD_BODY,
    decode_parts,
    decode_publish,
    decode_text,
    encode_part,
    encode_text,
    frame_end,
)
from broker_edge.cluster.links.member_clients import FailureStreak
from broker_edge.engine.message import Message
from broker_edge.engine.ports import ForwardAck
from broker_edge.engine.records import record_fields
from broker_edge.http.client_errors import failure_text
from broker_edge.storage.record import encode_frame

if TYPE_CHECKING:
    from aiohttp import web

    from broker_edge.cluster.links.member_clients import MemberClients
    from broker_edge.cluster.links.member_proofs import MemberProofs

__all__ = [
    "ANSWER",
    "FIRST_EXTENSION_KIND",
    "FORMAT_SERVICE",
    "FORWARD",
    "LINK_FORMAT",
    "REPLY",
    "REQUEST",
    "UNLOGGED",
    "PeerHandler",
    "PeerLink",
    "PeerLinkDown",
    "PeerLinks",
    "PeerReceiver",
    "PeerRequestFailed",
    "PeerService",
    "decode_answer",
    "decode_forward",
    "decode_unlogged",
    "encode_answer",
    "encode_forward",
    "encode_unlogged",
]

log = logging.getLogger("broker_edge.cluster.peer_link")

UNLOGGED, REQUEST, REPLY, FORWARD, ANSWER = 2, 4, 5, 6, 7
"""Part kinds (1 and 3 are format 1's forward and answer, ``link_format_1``)."""
LINK_FORMAT = 2
"""The link format this version speaks and answers with when asked."""
FORMAT_SERVICE = 0
"""The request a link asks its peer's link format with (a member of an earlier version has no such
service: its error reply means format 1)."""
FORMAT_TIMEOUT_S = 10.0
FIRST_EXTENSION_KIND = 16
"""Part kinds from here up belong to features registered with ``PeerLinks.on``."""
PEER_PATH = "/v1/peer"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
HEARTBEAT_S = 1.0
REDIAL_S = 0.2

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_FORWARD_HEAD = struct.Struct("<II")
_PUBLISH = struct.Struct("<BHI")
_RUN = struct.Struct("<IBqH")
_FRAME = 0x80
_RETAIN = 0x04
_CALL = struct.Struct("<IB")
_LOST = ForwardAck(0x83, None, "connection to the partition leader was lost")
_OK, _ERROR = 0, 1

PeerHandler = Callable[["PeerLink", memoryview], None]
"""Handles one extension part from a peer: ``(link it came on, body)``."""

PeerService = Callable[["PeerLink", memoryview], Awaitable[bytes]]
"""Answers one ``REQUEST`` from a peer with the reply's body (an exception becomes an error reply)."""


class PeerLinkDown(ConnectionError):
    """The link to the peer is down, or went down before the peer replied."""


class PeerRequestFailed(RuntimeError):
    """The peer's service raised (its message is the peer's error text)."""


# -- wire format ------------------------------------------------------------------------------------------


def encode_forward(batch: int, topic: str, messages: Sequence[Message]) -> bytes:
    """The ``FORWARD`` part of ``messages`` (all on ``topic``) as batch ``batch``."""
    publishers: dict[str, int] = {}
    table: list[bytes] = []
    data: list[bytes] = []
    pack = _PUBLISH.pack
    for index, message in enumerate(messages):
        publisher = publishers.get(message.origin)
        if publisher is None and len(publishers) <= 0xFFFF:
            publisher = publishers[message.origin] = len(publishers)
        if message.properties is None and message.expires_at is None and publisher is not None:
            payload = message.payload
            table.append(pack(message.qos | (_RETAIN if message.retain else 0), publisher, len(payload)))
            data.append(payload)
        else:
            frame = encode_frame(index, 0, *record_fields(message))
            table.append(pack(_FRAME, 0, len(frame)))
            data.append(frame)
    names = [encode_text(origin) for origin in publishers]
    rest = b"".join(
        [encode_text(topic), _U16.pack(len(names)), *names, _U32.pack(len(messages)), *table, *data]
    )
    return encode_part(FORWARD, _FORWARD_HEAD.pack(batch, crc32c(rest)) + rest)


def encode_unlogged(message: Message) -> bytes:
    """The ``UNLOGGED`` part of ``message``."""
    return encode_part(UNLOGGED, encode_text(message.topic) + encode_frame(0, 0, *record_fields(message)))


def encode_answer(batch: int, acks: Sequence[ForwardAck]) -> bytes:
    """The ``ANSWER`` part for batch ``batch``."""
    runs: list[bytes] = []
    first: ForwardAck | None = None
    length = 0
    for ack in acks:
        if (
            first is not None
            and ack.reason_code == first.reason_code
            and ack.reason_string == first.reason_string
            and (
                ack.offset == first.offset + length
                if ack.offset is not None and first.offset is not None
                else ack.offset is first.offset  # both None
            )
        ):
            length += 1
            continue
        if first is not None:
            runs.append(_run(first, length))
        first, length = ack, 1
    if first is not None:
        runs.append(_run(first, length))
    return encode_part(ANSWER, _FORWARD_HEAD.pack(batch, len(acks)) + b"".join(runs))


def _run(first: ForwardAck, length: int) -> bytes:
    reason = (first.reason_string or "").encode()[:0xFFFF]
    offset = -1 if first.offset is None else first.offset
    return _RUN.pack(length, first.reason_code, offset, len(reason)) + reason


def decode_forward(body: memoryview, now: float) -> tuple[int, list[Message]]:
    """``(batch, messages)`` of a ``FORWARD`` body; expiry deadlines count from ``now`` (the loop's clock).
    Raises ``ValueError`` on a malformed body, a checksum that does not match or a bad record frame."""
    batch, checksum = _FORWARD_HEAD.unpack_from(body, 0)
    if crc32c(body[_FORWARD_HEAD.size :]) != checksum:
        raise ValueError("forward checksum mismatch")
    topic, pos = decode_text(body, _FORWARD_HEAD.size)
    (count,) = _U16.unpack_from(body, pos)
    pos += _U16.size
    publishers: list[str] = []
    for _ in range(count):
        publisher, pos = decode_text(body, pos)
        publishers.append(publisher)
    (count,) = _U32.unpack_from(body, pos)
    at = pos + _U32.size + count * _PUBLISH.size
    if at > len(body):
        raise ValueError("truncated forward table")
    messages: list[Message] = []
    for flags, publisher, length in _PUBLISH.iter_unpack(body[pos + _U32.size : at]):
        end = at + length
        if end > len(body):
            raise ValueError("truncated forward data")
        if flags & _FRAME:
            messages.append(decode_publish(topic, body[at:end], len(messages), now))
        elif publisher >= len(publishers):
            raise ValueError(f"forwarded publish names publisher {publisher} of {len(publishers)}")
        else:
            retain, origin = bool(flags & _RETAIN), publishers[publisher]
            messages.append(Message(topic, bytes(body[at:end]), flags & 3, retain, None, origin))
        at = end
    if at != len(body):
        raise ValueError("trailing bytes after the forwarded publishes")
    return batch, messages


def decode_unlogged(body: memoryview, now: float) -> Message:
    """The message of an ``UNLOGGED`` body; its expiry deadline counts from ``now`` (the loop's clock).
    Raises ``ValueError`` on a malformed body or a bad record frame."""
    topic, pos = decode_text(body, 0)
    if frame_end(body, pos) != len(body):
        raise ValueError("an unlogged publish is one record frame")
    return decode_publish(topic, body[pos:], 0, now)


def decode_answer(body: memoryview) -> tuple[int, list[ForwardAck]]:
    """``(batch, answers)`` of an ``ANSWER`` body (``ValueError`` if the runs do not add up)."""
    batch, count = _FORWARD_HEAD.unpack_from(body, 0)
    pos = _FORWARD_HEAD.size
    acks: list[ForwardAck] = []
    while pos < len(body):
        length, code, offset, size = _RUN.unpack_from(body, pos)
        pos += _RUN.size
        reason = str(body[pos : pos + size], "utf-8") if size else None
        pos += size
        if offset < 0:
            acks.extend([ForwardAck(code, None, reason)] * length)
        else:
            acks.extend([ForwardAck(code, at, reason) for at in range(offset, offset + length)])
    if len(acks) != count or pos != len(body):
        raise ValueError(f"an answer of {count} publishes carries {len(acks)}")
    return batch, acks


# -- links --------------------------------------------------------------------------------------------


class _Socket(Protocol):
    """What a link uses of an aiohttp WebSocket (client or server side)."""

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self) -> Any: ...


class PeerReceiver(Protocol):
    """What a node does with what its peers send."""

    def forwarded(self, link: PeerLink, batch: int, messages: list[Message]) -> None:
        """Append ``messages`` (forwarded by ``link``'s peer) and answer with ``link.answer(batch, ...)``."""

    def unlogged(self, message: Message) -> None:
        """Route an unlogged publish a peer received."""


class PeerLink:
    """This node's end of the link to one peer: batches what is sent, matches answers to forwards."""

    def __init__(self, peer: str, loop: asyncio.AbstractEventLoop) -> None:
        self.peer = peer
        self._loop = loop
        self._socket: _Socket | None = None
        self._out: list[bytes] = []
        self._producers: list[Callable[[], None]] = []
        self._next_batch = 0
        self._waiting: dict[int, tuple[int, Callable[[Sequence[ForwardAck]], None]]] = {}
        self._sending: asyncio.Task[None] | None = None
        self._next_request = 0
        self._requests: dict[int, asyncio.Future[bytes]] = {}
        self._serving: set[asyncio.Task[None]] = set()
        self.format = 1
        """The link format the peer reads: 1 until it says it speaks a later one (``learn_format``)."""

    @property
    def up(self) -> bool:
        """Whether the socket to the peer is open."""
        return self._socket is not None

    def forward(
        self, topic: str, messages: Sequence[Message], done: Callable[[Sequence[ForwardAck]], None]
    ) -> None:
        """Send logged publishes for the peer to append; ``done`` gets its answer (or a refusal per message
        when the link drops first)."""
        if self._socket is None:
            self._loop.call_soon(done, [_LOST] * len(messages))
            return
        self._next_batch = batch = (self._next_batch + 1) & 0xFFFFFFFF
        self._waiting[batch] = (len(messages), done)
        encode = encode_forward if self.format >= 2 else encode_forward_1
        self._send(encode(batch, topic, messages))

    def unlogged(self, message: Message) -> None:
        """Send an unlogged publish for the peer to route (dropped while the link is down: at most once)."""
        if self._socket is not None:
            self._send(encode_unlogged(message))

    def answer(self, batch: int, acks: Sequence[ForwardAck]) -> None:
        """Answer a ``FORWARD`` of the peer, in the format the peer reads."""
        if self._socket is None:
            return
        if self.format >= 2:
            self._send(encode_answer(batch, acks))
            return
        try:
            self._send(encode_answer_1(batch, acks))
        except ValueError as exc:  # too many for format 1: the peer's forwards fail, its devices resend
            log.error("cannot answer %s in link format 1, closing the link: %s", self.peer, exc)
            self._loop.create_task(self.close())

    def send(self, kind: int, body: bytes) -> None:
        """Send one extension part (a kind registered with ``PeerLinks.on`` on the peer); dropped while the
        link is down, as unlogged publishes are."""
        if self._socket is not None:
            self._send(encode_part(kind, body))

    async def request(self, service: int, body: bytes, timeout: float) -> bytes:
        """Call ``service`` (registered with ``PeerLinks.serve_requests`` on the peer) and return its reply.

        Raises ``PeerLinkDown`` when the link is down or drops first, ``PeerRequestFailed`` when the peer's
        service raised, ``TimeoutError`` after ``timeout`` seconds."""
        if self._socket is None:
            raise PeerLinkDown(f"no link to {self.peer}")
        self._next_request = request_id = (self._next_request + 1) & 0xFFFFFFFF
        future: asyncio.Future[bytes] = self._loop.create_future()
        self._requests[request_id] = future
        self._send(encode_part(REQUEST, _CALL.pack(request_id, service) + body))
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._requests.pop(request_id, None)

    def soon(self, produce: Callable[[], None]) -> None:
        """Call ``produce`` just before the next message to the peer leaves (in the next loop iteration at
        the latest), so that the parts it sends go with it; while the link is down, in the next loop
        iteration (what it sends then is dropped)."""
        if self._socket is None:
            self._loop.call_soon(produce)
            return
        self._producers.append(produce)
        self._start_writing()

    def _send(self, part: bytes) -> None:
        self._out.append(part)
        self._start_writing()

    def _start_writing(self) -> None:
        sending = self._sending
        if sending is None or sending.done():
            self._sending = self._loop.create_task(self._write())

    async def _write(self) -> None:
        """Send what is queued as one message, and again while more was queued during a send that waited
        (for the socket's buffer to drain)."""
        while True:
            producers, self._producers = self._producers, []
            for produce in producers:
                try:
                    produce()
                except Exception:
                    log.exception("building a part for %s failed", self.peer)
            socket = self._socket
            if not self._out or socket is None:
                self._out = []
                return
            data = b"".join(self._out)
            self._out = []
            try:
                await socket.send_bytes(data)
            except Exception as exc:  # the reader sees the socket close and detaches it
                log.debug("sending to %s failed: %s", self.peer, exc)
                # go on: the builders registered meanwhile are still called

    def attach(self, socket: _Socket) -> None:
        """Use ``socket`` from now on (a newer socket replaces an older one, whose forwards fail)."""
        if self._socket is not None:
            self.detach(self._socket)
        self._socket = socket
        self.format = 1  # a new socket may reach another version of the peer
        log.info("peer link to %s up", self.peer)

    def learn_format(self) -> None:
        """Ask the peer which link format it speaks and use it from its answer on (format 1 meanwhile,
        which every member reads, and for good if the peer is of a version without the question)."""
        task = self._loop.create_task(self._ask_format())
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def _ask_format(self) -> None:
        socket = self._socket
        try:
            reply = await self.request(FORMAT_SERVICE, b"", FORMAT_TIMEOUT_S)
        except PeerRequestFailed:
            log.warning(
                "peer %s runs an earlier version (peer link format 1): forwarding to it in that format",
                self.peer,
            )
            return
        except (PeerLinkDown, TimeoutError):
            return  # asked again when the link comes up again
        if self._socket is socket and reply:
            self.format = min(reply[0], LINK_FORMAT)

    def uses(self, socket: _Socket) -> bool:
        """Whether ``socket`` is the link's current one (not replaced by a newer socket, nor closed)."""
        return self._socket is socket

    def detach(self, socket: _Socket) -> None:
        """``socket`` closed: fail the forwards waiting on it."""
        if self._socket is not socket:
            return
        self._socket = None
        self._out = []
        waiting, self._waiting = self._waiting, {}
        for count, done in waiting.values():
            done([_LOST] * count)
        requests, self._requests = self._requests, {}
        for future in requests.values():
            if not future.done():
                future.set_exception(PeerLinkDown(f"link to {self.peer} dropped"))
        log.info("peer link to %s down", self.peer)

    async def close(self) -> None:
        """Close the socket (its forwards fail)."""
        socket = self._socket
        if socket is not None:
            self.detach(socket)
            await socket.close()

    def received(
        self,
        data: bytes,
        receiver: PeerReceiver,
        handlers: dict[int, PeerHandler] | None = None,
        services: dict[int, PeerService] | None = None,
    ) -> None:
        """Handle one WebSocket message from the peer: publishes and answers go to ``receiver``, extension
        parts to ``handlers`` by kind, requests to ``services`` by service number."""
        now = self._loop.time()
        for kind, body in decode_parts(data):
            if kind in (ANSWER, ANSWER_1):
                batch, acks = decode_answer(body) if kind == ANSWER else decode_answer_1(body)
                waiting = self._waiting.pop(batch, None)
                if waiting is not None:
                    waiting[1](acks)
            elif kind in (FORWARD, FORWARD_1):
                if kind == FORWARD:
                    batch, messages = decode_forward(body, now)
                else:
                    batch, messages = decode_forward_1(body, now, MAX_RECORD_BODY)
                receiver.forwarded(self, batch, messages)
            elif kind == UNLOGGED:
                receiver.unlogged(decode_unlogged(body, now))
            elif kind == REQUEST:
                request_id, service = _CALL.unpack_from(body, 0)
                self._serve(request_id, (services or {}).get(service), service, body[_CALL.size :])
            elif kind == REPLY:
                request_id, status = _CALL.unpack_from(body, 0)
                future = self._requests.pop(request_id, None)
                if future is not None and not future.done():
                    reply = bytes(body[_CALL.size :])
                    if status == _OK:
                        future.set_result(reply)
                    else:
                        future.set_exception(PeerRequestFailed(reply.decode("utf-8", "replace")))
            else:
                handler = (handlers or {}).get(kind)
                if handler is None:
                    raise ValueError(f"unknown part kind {kind}")
                handler(self, body)

    def _serve(self, request_id: int, service: PeerService | None, number: int, body: memoryview) -> None:
        """Run one request's service and send its reply (an error reply if it raises or is unknown)."""

        async def run() -> None:
            try:
                if service is None:
                    raise LookupError(f"no peer service {number}")
                reply, status = await service(self, body), _OK
            except Exception as exc:
                reply, status = f"{type(exc).__name__}: {exc}".encode(), _ERROR
            if self._socket is not None:
                self._send(encode_part(REPLY, _CALL.pack(request_id, status) + reply))

        task = self._loop.create_task(run())
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)


async def _speaks(link: PeerLink, body: memoryview) -> bytes:
    """``FORMAT_SERVICE``: the link format this version speaks."""
    return bytes([LINK_FORMAT])


class PeerLinks:
    """Every peer link of this node: dials the members it should, accepts the others, routes what arrives.

    ``update(members)`` (called on every view change) starts dialing new members whose ``node_id`` is
    larger than ours and drops the links of members gone. ``clients`` are this node's sessions to the
    members (without them, plain ones: development on loopback); ``proofs`` learns of every link that
    comes up. A link this node dialed is closed once the certificate its peer served is no longer accepted
    (expired, or its CA out of this node's reloaded ``cluster.tls.cafile``), told to ``refused(reason)``.
    """

    def __init__(
        self,
        node_id: str,
        clients: MemberClients | None,
        receiver: PeerReceiver,
        proofs: MemberProofs | None = None,
        refused: Callable[[str], None] | None = None,
    ) -> None:
        from broker_edge.cluster.links.member_clients import MemberClients

        self.node_id = node_id
        self._own_clients = clients is None
        self.clients = clients if clients is not None else MemberClients(node_id, None)
        self.receiver = receiver
        self.proofs = proofs
        self.refused = refused
        if proofs is not None:
            proofs.linked = self.up
        self.links: dict[str, PeerLink] = {}
        self._dialers: dict[str, asyncio.Task[None]] = {}
        self._urls: dict[str, str] = {}
        self._closed = False
        self._handlers: dict[int, PeerHandler] = {}
        self._services: dict[int, PeerService] = {FORMAT_SERVICE: _speaks}

    def on(self, kind: int, handler: PeerHandler) -> None:
        """Hand parts of ``kind`` (``>= FIRST_EXTENSION_KIND``) that peers send to ``handler``."""
        if kind < FIRST_EXTENSION_KIND:
            raise ValueError(f"part kind {kind} is reserved (extensions start at {FIRST_EXTENSION_KIND})")
        if kind in self._handlers:
            raise ValueError(f"part kind {kind} already has a handler")
        self._handlers[kind] = handler

    def serve_requests(self, service: int, handler: PeerService) -> None:
        """Answer peers' ``PeerLink.request(service, ...)`` calls with ``handler``."""
        if not 0 <= service <= 0xFF:
            raise ValueError(f"service numbers are 0-255, got {service}")
        if service in self._services:
            raise ValueError(f"peer service {service} already has a handler")
        self._services[service] = handler

    def link(self, peer: str) -> PeerLink:
        """The link to ``peer`` (created down if new)."""
        link = self.links.get(peer)
        if link is None:
            link = self.links[peer] = PeerLink(peer, asyncio.get_running_loop())
        return link

    def up(self, peer: str) -> bool:
        link = self.links.get(peer)
        return link is not None and link.up

    def update(self, members: dict[str, str]) -> None:
        """``members``: node_id → offsets API base URL of every live member (this node included)."""
        if self._closed:
            return
        for peer, url in members.items():
            if peer == self.node_id:
                continue
            self._urls[peer] = url
            self.link(peer)
            if peer > self.node_id and peer not in self._dialers:
                self._dialers[peer] = asyncio.get_running_loop().create_task(self._dial(peer))
        for peer in [peer for peer in self._dialers if peer not in members]:
            self._dialers.pop(peer).cancel()
            self._urls.pop(peer, None)

    def broadcast(self, message: Message) -> None:
        """Send an unlogged publish to every peer whose link is up."""
        for link in self.links.values():
            link.unlogged(message)

    async def _dial(self, peer: str) -> None:
        """Keep a link to ``peer`` open while it is a member: connect, read until it closes, redial."""
        import aiohttp

        link = self.link(peer)
        failures = FailureStreak(every=1000)
        loop = asyncio.get_running_loop()
        while not self._closed:
            url = self._urls.get(peer)
            if url is None:
                return
            try:
                socket = await self.clients.session(peer).ws_connect(
                    url.rstrip("/") + PEER_PATH,
                    heartbeat=HEARTBEAT_S,
                    max_msg_size=MAX_MESSAGE_BYTES,
                    timeout=aiohttp.ClientWSTimeout(ws_close=1.0),
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                refused = isinstance(exc, aiohttp.WSServerHandshakeError) and exc.status == 403
                if failures.failed(loop.time(), refused):  # a member that cannot prove who it is
                    log.warning("peer link to %s at %s: %s", peer, url, failure_text(exc))
                else:
                    log.debug("dialing peer %s at %s failed: %s", peer, url, failure_text(exc))
                await asyncio.sleep(REDIAL_S)
                continue
            failures.succeeded()
            ending = self._watch_served(peer, socket)
            try:
                await self._read(link, socket)
            except ConnectionError as exc:
                log.info("peer link to %s closed: %s", peer, exc)
            finally:
                if ending is not None:
                    ending.cancel()
                self._detach(link, socket)
                with contextlib.suppress(ConnectionError):
                    await socket.close()
            await asyncio.sleep(REDIAL_S)

    def _watch_served(self, peer: str, socket: Any) -> asyncio.Task[None] | None:
        """Close ``socket``, dialed to ``peer``, once the certificate ``peer`` served is no longer accepted
        (as ``_close_when_ended`` does on the serving side): a link lasts for weeks."""
        from broker_edge.http.peer_certificates import watch_dialed

        trust = self.clients.tls.server.trust if self.clients.tls is not None else None
        return watch_dialed(f"peer link to {peer}", trust, self.refused, socket)

    def _detach(self, link: PeerLink, socket: Any) -> None:
        """``socket`` closed: the link is down unless a newer socket replaced it."""
        current = link.uses(socket)
        link.detach(socket)
        if current and self.proofs is not None:
            self.proofs.link_down(link.peer)

    async def _read(self, link: PeerLink, socket: Any) -> None:
        import aiohttp

        link.attach(socket)
        link.learn_format()
        if self.proofs is not None:
            self.proofs.link_up(link.peer)
        async for frame in socket:
            if not link.uses(socket):
                # A newer socket replaced this one: the peer failed what it sent here (its forwards
                # refused), so none of it is appended now, after what the peer sends on the new socket.
                break
            if frame.type != aiohttp.WSMsgType.BINARY:
                if frame.type == aiohttp.WSMsgType.ERROR:
                    break
                continue
            try:
                link.received(frame.data, self.receiver, self._handlers, self._services)
            except (ValueError, struct.error) as exc:
                log.error("malformed message from peer %s, closing the link: %s", link.peer, exc)
                break

    async def serve(self, request: web.Request) -> web.StreamResponse:
        """The ``/v1/peer`` endpoint: a member with a smaller node_id dialing in, as the node it proved."""
        from aiohttp import web

        from broker_edge.offsets_api.server import access_of

        peer = access_of(request).member
        if peer is None:
            raise web.HTTPForbidden()  # only on the members' endpoint, whose every request is a member's
        if peer == self.node_id or self._closed:
            raise web.HTTPBadRequest()
        socket = web.WebSocketResponse(heartbeat=HEARTBEAT_S, max_msg_size=MAX_MESSAGE_BYTES)
        await socket.prepare(request)
        link = self.link(peer)
        ending = asyncio.get_running_loop().create_task(_close_when_ended(request, socket))
        try:
            await self._read(link, socket)
        except ConnectionError as exc:  # the transport closed under it (a peer paused, cut off, gone)
            log.info("peer link to %s closed: %s", peer, exc)
        finally:
            ending.cancel()
            self._detach(link, socket)
            with contextlib.suppress(ConnectionError):  # "Cannot write to closing transport"
                await socket.close()
        return socket

    def add_routes(self, app: web.Application) -> None:
        """Serve ``/v1/peer`` on ``app`` (the offsets API)."""
        app.router.add_get(PEER_PATH, self.serve)

    async def close(self) -> None:
        """Stop dialing and close every link."""
        self._closed = True
        for task in self._dialers.values():
            task.cancel()
        for task in self._dialers.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._dialers.clear()
        for link in self.links.values():
            await link.close()
        if self._own_clients:
            await self.clients.close()


async def _close_when_ended(request: web.Request, socket: web.WebSocketResponse) -> None:
    """Close a peer's link once the member certificate it connected with has ended (expired, or its CA
    taken out of ``cluster.tls.cafile`` by a reload): a link lasts for weeks, no request of it is checked."""
    from broker_edge.http.peer_certificates import certificate_ended

    await certificate_ended(request)
    with contextlib.suppress(ConnectionError):
        await socket.close()
