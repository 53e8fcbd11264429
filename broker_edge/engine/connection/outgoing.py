"""What a connection writes: its packets batched per loop turn, deliveries, acknowledgements, and its close.

The bytes out of the MQTT state machine (``Connection`` builds on this): nothing here writes to a socket.
Packets are collected in a batch (``_out``); the first one of a loop turn tells the broker
(``schedule_flush``), which has the transport take the batch at the end of the turn (``take_output``), so
a subscriber receiving from a hundred publishers in one turn costs one system call, not a hundred.

Closing is output too: ``close`` and ``abort`` seal the batch into a ``Closing``, the packets written so
far (none after an abort) and then the end of the connection. Whatever the connection would write after
that is dropped (MQTT: nothing follows a DISCONNECT).

Outgoing topic aliases (MQTT 5, 3.3.2.3.4): when the client's CONNECT allows them (Topic Alias Maximum > 0)
and the broker's ``mqtt.outgoing_topic_aliases`` is not 0, every topic sent gets an alias, the least recently
used one being reassigned when all are taken. The first PUBLISH of a topic carries the name and the alias,
the following ones only the alias; both forms are shared encodings (``Message.template``), so fanout still
encodes once per variant. A delivery that the alias would make larger than the client's Maximum Packet Size
goes with its topic name alone.

The ``offset`` user property the broker adds for a session that asked for it (``Message.template``) is left
out of a delivery it alone would make larger than the client's Maximum Packet Size: the message goes without
it (counted, ``timestone_broker_offset_properties_left_out_total``) rather than being dropped. The publisher's
own properties are never left out: a message too large with them alone is dropped for the client.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar, Final

from broker_edge.engine.connection.states import CLOSED, NO_LIMIT
from broker_edge.engine.rare_fields import RareField, RareSlots
from broker_edge.protocol.codec import (
    around_packet_id,
    encode,
    encode_puback_coded,
    encode_puback_success,
    encode_pubacks,
)
from broker_edge.protocol.packets import MQTT_5, PubAck, PubComp, PubRec, PubRel
from broker_edge.protocol.properties import Properties

if TYPE_CHECKING:
    from collections.abc import Iterable

    from broker_edge.engine.connection.terms import Terms
    from broker_edge.engine.message import Message
    from broker_edge.engine.publish_run import LoggedRun, PublishRun
    from broker_edge.engine.sessions.session import Session
    from broker_edge.protocol.codec import PacketDecoder, PublishTemplate
    from broker_edge.protocol.packets import Packet

__all__ = ["ABORT", "CLOSE", "Closing", "ConnectionRare", "Outgoing"]

CLOSE: Final = 1
"""The connection ends once the packets before its close are written (``Closing.how``)."""
ABORT: Final = 2
"""The connection ends at once, nothing more written."""


class Closing(list[bytes]):
    """The sealed batch of a connection that is to end: the packets to write first (none when aborted), and
    how it ends. Appending to it drops the packet: nothing is written after the close."""

    __slots__ = ("done", "how")

    def __init__(self, packets: list[bytes], how: int) -> None:
        super().__init__(packets)
        self.how = how
        """``CLOSE`` or ``ABORT``."""
        self.done = 0
        """How far the transport has carried it out (0: not yet, else the ``how`` it carried out)."""

    def append(self, packet: bytes) -> None:
        """Dropped: the connection is closing."""


class ConnectionRare(RareSlots):
    """The ``RareField`` attributes of a connection that has set one (``Outgoing``, ``Connection``)."""

    __slots__ = (
        "aliases_in",
        "aliases_out",
        "backlog",
        "expiry_lowered",
        "handed_in",
        "held",
        "held_error",
        "moved_claim",
        "named",
        "peer",
        "peer_cas",
        "peer_certificate",
        "peer_cn",
        "peer_trust",
        "peer_uri",
        "refused",
        "will",
        "will_delay",
    )
    defaults: ClassVar[dict[str, Any]] = {}


class Outgoing:
    """The output half of a client connection (see the module docstring)."""

    __slots__ = ("_out", "_rare")

    _out: list[bytes] | None
    """This turn's packets (None: none yet), or a ``Closing``."""
    terms: Terms[Any]
    decoder: PacketDecoder
    session: Session | None

    aliases_out: RareField[dict[str, int] | None] = RareField(ConnectionRare, None)
    """Topic → alias sent to this client, least recently used first (None: none sent yet, or no outgoing
    aliases: ``terms.alias_max_out`` says whether it takes them)."""

    @property
    def version(self) -> int:
        """The protocol level of the client's CONNECT (0 until it is decoded)."""
        return self.decoder.protocol_version or 0

    @property
    def v5(self) -> bool:
        return self.terms.v5

    # -- the batch ----------------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Add ``data`` to this turn's batch."""
        out = self._out
        if out is None:
            if self.terms.state == CLOSED:
                return
            self._out = [data]
            self.terms.host.schedule_flush(self)
        else:
            out.append(data)

    def take_output(self) -> list[bytes] | None:
        """The packets to write now, in order (None: none); a closing connection's once."""
        out = self._out
        if out is None:
            return None
        if type(out) is Closing:
            if not out:
                return None
            packets = list(out)
            out.clear()
            return packets
        self._out = None
        return out

    @property
    def closing(self) -> int:
        """0, or how the connection is to end (``CLOSE``, ``ABORT``) once its transport carries it out."""
        out = self._out
        return out.how if type(out) is Closing else 0

    def flush(self) -> None:
        """Hand the batch to the transport: the transport adapter's part (``runtime.transports.stream``).
        A connection with no transport keeps its output for ``take_output``."""

    def _seal(self, how: int) -> None:
        """Nothing more is written: the batch so far (none for ``ABORT``) goes out, then the connection
        ends ``how``."""
        out = self._out
        if type(out) is Closing:
            if how > out.how:
                out.how = how
                out.clear()
                self.terms.host.schedule_flush(self)
            return
        self._out = Closing(out if out is not None and how == CLOSE else [], how)
        if out is None:
            self.terms.host.schedule_flush(self)

    # -- packets ------------------------------------------------------------------------------------------

    def send_packet(self, packet: Packet) -> None:
        self.write(encode(packet, self.version))

    def send_message(
        self,
        message: Message,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...],
        packet_id: int | None,
        dup: bool = False,
    ) -> bool:
        """Write one delivery; False when it was dropped (slow subscriber, larger than the client accepts)."""
        terms = self.terms
        if qos == 0 and terms.paused and not terms.host.slow_subscribers.deliver(self, message):
            return False
        head: bytes
        tail: bytes  # QoS 1/2: the delivery is ``head``, the packet id, ``tail``
        if (
            (frame_head := message.frame_head) is not None
            and qos == message.qos
            and not terms.v5
            and not retain
            and not subscription_ids
            and not terms.alias_max_out
        ):
            # The MQTT 3.1.1 frame received, around this subscriber's packet id: no template, no look-up
            # (``offsets`` adds nothing in that family).
            head = frame_head
            tail = message.payload
            offsets = False
        else:
            session = self.session  # once per delivery: look at the session only for a logged message
            offsets = (
                message.offset is not None
                and session is not None
                and (rare := session._rare) is not None
                and rare.log_offsets
            )
            if not terms.alias_max_out:
                # A plain variant already encoded for another subscriber is looked up here, without the call
                # to ``template`` (its key as ``Message.templates`` says); the first delivery of the
                # publisher's family at its QoS is the frame received (``Message.frame``), no template made.
                templates = message.templates
                if templates is not None:
                    if (
                        offsets
                        or subscription_ids
                        or message.expires_at is not None
                        or (found := templates.get((terms.v5 << 3) | (qos << 1) | retain)) is None
                    ):
                        found = message.template(terms.v5, qos, retain, subscription_ids, 0, False, offsets)
                    head = found.head
                    if qos:
                        tail = found.tail
                elif (
                    (frame := message.frame) is not None
                    and qos == message.qos
                    and terms.v5 == message.frame_v5
                    and not retain
                    and not subscription_ids
                    and not offsets
                ):
                    # The frame received: as it is at QoS 0 (every such subscriber writes that one object),
                    # around this subscriber's packet id at QoS 1/2. The first delivery makes no template (a
                    # message with one subscriber, the ingest shape, needs none): in MQTT 3.1.1 the part
                    # before the packet id is kept for the next ones (``Message.frame_head``); in MQTT 5 the
                    # empty cache it leaves has the next subscriber make the shared template.
                    if qos:
                        head, tail = around_packet_id(frame, message.payload, terms.v5)
                        if terms.v5:
                            message.templates = {}
                        else:
                            message.frame_head = head
                    else:
                        head = frame
                else:
                    template = message.template(terms.v5, qos, retain, subscription_ids, 0, False, offsets)
                    head = template.head
                    if qos:
                        tail = template.tail
            else:
                aliased = self._aliased_template(message, qos, retain, subscription_ids, offsets)
                head = aliased.head
                if qos:
                    tail = aliased.tail
        if qos == 0:
            if len(head) > terms.max_packet_out:
                smaller = self._fitted(message, 0, retain, subscription_ids, offsets)
                if smaller is None:
                    return False
                head = smaller.head
            out = self._out
            if out is None:
                if self.terms.state == CLOSED:
                    return False
                self._out = [head]
                terms.host.schedule_flush(self)
            else:
                out.append(head)
        else:
            if len(head) + 2 + len(tail) > terms.max_packet_out:
                smaller = self._fitted(message, qos, retain, subscription_ids, offsets)
                if smaller is None:
                    return False
                head, tail = smaller.head, smaller.tail
            if dup:
                head = bytes((head[0] | 0x08,)) + head[1:]
            out = self._out
            if out is None:
                if self.terms.state == CLOSED:
                    return False
                out = self._out = []
                terms.host.schedule_flush(self)
            out.append(head)
            assert packet_id is not None, "QoS 1/2 deliveries carry a packet id"
            out.append(packet_id.to_bytes(2, "big"))
            out.append(tail)
        terms.stats.sent[qos] += 1
        return True

    def fits(self, message: Message, qos: int, retain: bool, subscription_ids: tuple[int, ...]) -> bool:
        """Whether this delivery is within the client's Maximum Packet Size, encoded without a topic alias
        (an alias only makes it smaller) and, if need be, without the ``offset`` user property (``_fitted``):
        a shared group gives one that is not to another member."""
        limit = self.terms.max_packet_out
        if limit >= NO_LIMIT:
            return True  # the client stated none
        if len(message.payload) + len(message.topic) > limit:
            return False
        session = self.session
        offsets = (
            message.offset is not None
            and session is not None
            and (rare := session._rare) is not None
            and rare.log_offsets
        )
        template = message.template(self.terms.v5, qos, retain, subscription_ids, 0, False, offsets)
        if _size(template, qos) <= limit:
            return True
        return offsets and _size(message.template(self.terms.v5, qos, retain, subscription_ids), qos) <= limit

    def encode_while_framed(
        self, messages: Iterable[Message], qos: int, retain: bool, subscription_ids: tuple[int, ...]
    ) -> None:
        """Deliveries about to wait in the session's queue (the in-flight window is full): for each that will
        be the MQTT 3.1.1 frame received around this client's packet id, the frame's part before the packet
        id is cut now (``Message.frame_head``; its payload is shared), as the message lets go of the frame
        once routed; sent without it, the delivery would be encoded from its parts. A QoS 0 one is the frame
        itself, kept as its template. (An MQTT 5 one would hold a second copy of the payload while queued: it
        is made when sent.)"""
        if retain or subscription_ids or self.terms.v5:
            return
        for message in messages:
            if (
                qos == message.qos
                and not message.frame_v5
                and (frame := message.frame) is not None
                and message.frame_head is None
            ):
                if qos:
                    message.frame_head = around_packet_id(frame, message.payload, False)[0]
                else:
                    message.frame_template()

    def send_run(self, run: PublishRun | LoggedRun, subscription_ids: tuple[int, ...]) -> None:
        """Write a run of plain messages (``engine.publish_run``) delivered at QoS 0: their QoS 0 frames in
        one piece when this client takes them as they are, else each one by ``send_message``."""
        terms = self.terms
        if (
            terms.v5 == run.v5
            and not subscription_ids
            and not terms.alias_max_out
            and not terms.paused
            and run.fits(terms.max_packet_out)
        ):
            if self._out is None and terms.state == CLOSED:
                return  # gone: nothing written, nothing counted (as ``send_message``)
            self.write(run.frames)
            terms.stats.sent[0] += len(run)
            return
        for message in run.messages():
            self.send_message(message, 0, False, subscription_ids, None)

    def _aliased_template(
        self, message: Message, qos: int, retain: bool, subscription_ids: tuple[int, ...], offsets: bool
    ) -> PublishTemplate:
        """The v5 PUBLISH with this connection's alias for the topic (LRU).

        A topic without an alias gets the next free one, or the least recently used topic's; the alias is
        recorded only once the PUBLISH that sets it is certain to be written. One that the alias would make
        larger than the client's Maximum Packet Size goes with its topic name alone, no alias given (the
        caller drops it if even that is too large).
        """
        aliases = self.aliases_out
        if aliases is None:
            aliases = self.aliases_out = {}
        topic = message.topic
        alias = aliases.get(topic)
        if alias is not None:
            del aliases[topic]  # most recently used last
            aliases[topic] = alias
            return message.template(True, qos, retain, subscription_ids, alias, True, offsets)
        full = len(aliases) >= self.terms.alias_max_out
        alias = next(iter(aliases.values())) if full else len(aliases) + 1
        template = message.template(True, qos, retain, subscription_ids, alias, False, offsets)
        if _size(template, qos) > self.terms.max_packet_out:
            return message.template(True, qos, retain, subscription_ids, 0, False, offsets)
        if full:
            del aliases[next(iter(aliases))]
        aliases[topic] = alias
        return template

    def _fitted(
        self, message: Message, qos: int, retain: bool, subscription_ids: tuple[int, ...], offsets: bool
    ) -> PublishTemplate | None:
        """A delivery over the client's Maximum Packet Size [MQTT-3.1.2-24]: when the broker's own ``offset``
        user property is what makes it too large, the delivery without it (counted in
        ``counters.offsets_left_out``; the publisher's properties are never left out [MQTT-3.3.2-17]); else
        None, the message dropped for this client ([MQTT-3.1.2-25], counted ``too_large``)."""
        if offsets:
            terms = self.terms
            if terms.alias_max_out:
                template = self._aliased_template(message, qos, retain, subscription_ids, False)
            else:
                template = message.template(terms.v5, qos, retain, subscription_ids)
            if _size(template, qos) <= terms.max_packet_out:
                terms.host.counters.offsets_left_out += 1
                return template
        self._too_large(message)
        return None

    def _too_large(self, message: Message) -> None:
        """A delivery larger than the client's Maximum Packet Size: dropped ([MQTT-3.1.2-25]), counted and
        said naming the client."""
        host = self.terms.host
        host.counters.drop_for(
            "too_large",
            host.now(),
            self.log,
            "message dropped: larger than the subscriber's Maximum Packet Size",
            topic=message.topic,
            limit=self.terms.max_packet_out,
        )

    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """The connection's logger, naming its client (``Connection``'s)."""
        raise NotImplementedError

    # -- acknowledgements ---------------------------------------------------------------------------------

    def send_pubrel(self, packet_id: int, reason_code: int = 0) -> None:
        self.write(encode(PubRel(packet_id, reason_code), self.version))

    def send_puback(self, packet_id: int, reason_code: int = 0, reason_string: str | None = None) -> None:
        if reason_string is None:  # made without a ``PubAck``: every publish of a device nobody subscribes to
            if reason_code and self.v5:
                self.write(encode_puback_coded(packet_id, reason_code))
            else:  # MQTT 3.1.1 has no reason code: its PUBACK is the same four bytes whatever the code
                self.write(encode_puback_success(packet_id))
            return
        if self.v5:
            self.write(self._with_reason(PubAck(packet_id, reason_code), reason_string))
            return
        self.write(encode_puback_success(packet_id))

    def send_pubacks(self, packet_ids: list[int], reason_code: int = 0) -> None:
        """The PUBACKs of a run of accepted QoS 1 publishes (`reason_code` 0 or 0x10), in one write."""
        self.write(encode_pubacks(packet_ids, reason_code, self.terms.v5))

    def send_pubrec(self, packet_id: int, reason_code: int = 0, reason_string: str | None = None) -> None:
        session = self.session
        if session is not None and reason_code < 0x80 and session._rare is not None:  # held ids are rare
            session.answering_incoming(packet_id)
        if reason_string is not None and self.v5:
            self.write(self._with_reason(PubRec(packet_id, reason_code), reason_string))
            return
        self.write(encode(PubRec(packet_id, reason_code if self.v5 else 0), self.version))

    def _with_reason(self, packet: PubAck | PubRec, reason_string: str) -> bytes:
        """A v5 acknowledgement with a reason string, unless the client refused them (Request Problem
        Information 0) or the packet would exceed its Maximum Packet Size."""
        plain = encode(packet, MQTT_5)
        if not self.terms.problem_information:
            return plain
        packet.properties = Properties(reason_string=reason_string)
        framed = encode(packet, MQTT_5)
        return framed if len(framed) <= self.terms.max_packet_out else plain

    def send_pubcomp(self, packet_id: int, reason_code: int = 0) -> None:
        self.write(encode(PubComp(packet_id, reason_code if self.v5 else 0), self.version))


def _size(template: PublishTemplate, qos: int) -> int:
    """The bytes of a delivery of ``template`` (at QoS 1/2 with its packet id)."""
    return len(template.head) + (len(template.tail) + 2 if qos else 0)
