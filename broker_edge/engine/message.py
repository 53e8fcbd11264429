"""The routed message and its outgoing encodings, computed once and shared by every subscriber.

A PUBLISH fanned out to N subscribers is encoded once per distinct variant — protocol family (v3 / v5),
QoS, RETAIN flag, v5 subscription identifiers, remaining message expiry and the v5 topic alias the connection
uses for the topic (with the topic name when it sets the alias, without when it uses it) — and the resulting
bytes are handed to every subscriber of that variant: QoS 0 subscribers all write the same ``bytes`` object,
QoS 1/2 subscribers write ``head + packet id + tail``.

User properties are forwarded exactly as published [MQTT-3.3.2-17, -18]. The one exception is asked for:
a v5 session that wants log delivery (it subscribed from an offset, or opted in on CONNECT with the user
property ``offsets: on``, see ``wants_log_offsets``) gets logged messages with one more user property,
``offset``, their log offset. That is one more shared variant, not a per-subscriber cost.
"""

from __future__ import annotations

import copy
import math
import time

from broker_edge.protocol.codec import (
    PublishTemplate,
    around_packet_id,
    encode_publish_template,
    qos0_frame_of,
)
from broker_edge.protocol.packets import MQTT_3_1_1, MQTT_5
from broker_edge.protocol.properties import Properties

__all__ = ["OFFSETS_OPT_IN", "Message", "forwarded_properties", "wants_log_offsets"]

OFFSETS_OPT_IN = ("offsets", "on")
"""The CONNECT user property by which a v5 client asks for the ``offset`` user property on deliveries."""


class Message:
    """One application message inside the broker, from the PUBLISH that brought it to every delivery.

    ``properties`` are the v5 properties to forward (never a topic alias or subscription identifier);
    ``origin`` is the publishing client id (for No Local); ``offset`` is its log offset once appended;
    ``expires_at`` is a ``time.monotonic()`` deadline from the v5 Message Expiry Interval.
    """

    __slots__ = (
        "expires_at",
        "frame",
        "frame_head",
        "frame_v5",
        "offset",
        "origin",
        "payload",
        "properties",
        "qos",
        "retain",
        "templates",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
        origin: str = "",
        offset: int | None = None,
        expires_at: float | None = None,
        frame: bytes | None = None,
        frame_v5: bool = False,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties
        self.origin = origin
        self.offset = offset
        self.expires_at = expires_at
        self.templates: dict[object, PublishTemplate] | None = None
        """The encoded deliveries made so far (``template``), by variant. A plain variant (no alias, no
        ``offset`` property, no subscription identifier, no expiry to send) has the key
        ``(v5 << 3) | (qos << 1) | retain``: ``Connection.send_message`` looks those up itself. Empty: one
        delivery was cut out of ``frame`` without a template (``send_message``), the next one makes it."""
        self.frame = frame
        """The PUBLISH frame that brought it (``Publish.frame``; ``frame_v5``: in the MQTT 5 family), when a
        delivery of the publisher's own protocol family and QoS, without RETAIN, is that frame again: that
        variant is made of it instead of being encoded (at QoS 0 the frame itself is written), and so is the
        family's QoS 0 variant of a QoS 1/2 message (the frame less its packet id)."""
        self.frame_v5 = frame_v5
        self.frame_head: bytes | None = None
        """An MQTT 3.1.1 QoS 1/2 ``frame``'s bytes before its packet id, once cut (``Outgoing.send_message``,
        ``encode_while_framed``) or given by its read (``PublishRun.messages``: one for PUBLISHes alike,
        ``PublishesAlike.head``): a delivery of that family and QoS without RETAIN is they, the subscriber's
        packet id and the payload, kept when the frame is let go of. (An MQTT 5 frame has a byte of
        properties after its packet id: its variant is a template.)"""

    def __repr__(self) -> str:
        return f"Message({self.topic!r}, {len(self.payload)} bytes, qos={self.qos}, offset={self.offset})"

    def expired(self, now: float | None = None) -> bool:
        if self.expires_at is None:
            return False
        return (time.monotonic() if now is None else now) >= self.expires_at

    def expiry_left(self) -> int | None:
        """Whole seconds left of the v5 Message Expiry Interval, rounded up (None: never expires)."""
        if self.expires_at is None:
            return None
        return max(0, math.ceil(self.expires_at - time.monotonic()))

    def template(
        self,
        v5: bool,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...] = (),
        alias: int = 0,
        alias_only: bool = False,
        offsets: bool = False,
    ) -> PublishTemplate:
        """The encoded PUBLISH of one delivery variant, the same object for every subscriber of it.

        ``alias`` (v5) adds the Topic Alias property: with the topic name to set it, or with an empty topic
        name when ``alias_only`` (the connection has set it before). ``offsets`` (v5) adds the user property
        ``offset`` to a logged message, for sessions that asked for it.
        """
        expires_at = self.expires_at  # runs once per delivery: no method call for the common case
        expiry = None if expires_at is None or not v5 else max(0, math.ceil(expires_at - time.monotonic()))
        if offsets and (not v5 or self.offset is None):
            offsets = False
        if subscription_ids or expiry is not None:
            key: object = (v5, qos, retain, subscription_ids, expiry, alias, alias_only, offsets)
        else:  # the common variants: one small int (hashing a tuple per delivery would cost more)
            key = (v5 << 3) | (qos << 1) | retain
            if alias or offsets:
                key |= (alias << 6) | (offsets << 5) | (alias_only << 4)
        frame = self.frame
        if frame is not None and key == (self.frame_v5 << 3) | (self.qos << 1):  # the frame as received
            return self.frame_template()
        cache = self.templates
        if cache is not None and (found := cache.get(key)) is not None:
            return found
        if frame is not None and key == self.frame_v5 << 3:  # a QoS 1/2 frame sent at QoS 0: less its id
            found = PublishTemplate(0, qos0_frame_of(frame, self.payload, v5))
        else:
            properties = self._delivery_properties(subscription_ids, expiry, alias, offsets) if v5 else None
            found = encode_publish_template(
                "" if alias_only else self.topic,
                self.payload,
                MQTT_5 if v5 else MQTT_3_1_1,
                qos=qos,
                retain=retain,
                properties=properties,
            )
        if expiry is not None and cache is not None:
            _forget_earlier_intervals(cache, expiry)
        return self._keep(key, found)

    def frame_template(self) -> PublishTemplate:
        """``template`` of the variant that is the frame received (``frame``, which the message must still
        hold): the publisher's protocol family and QoS, no RETAIN, nothing added; split around the packet id
        at QoS 1/2. What a delivery queued behind a full in-flight window is made of while the message holds
        its frame (``Connection.encode_while_framed``), without ``template``'s look at every variant."""
        qos = self.qos
        key = (self.frame_v5 << 3) | (qos << 1)
        cache = self.templates
        if cache is not None and (found := cache.get(key)) is not None:
            return found
        frame = self.frame
        assert frame is not None, "only a message holding its frame has this variant made of it"
        if qos:  # split around its packet id
            found = PublishTemplate(qos, *around_packet_id(frame, self.payload, self.frame_v5))
        else:
            found = PublishTemplate(0, frame)
        return self._keep(key, found)

    def _keep(self, key: object, found: PublishTemplate) -> PublishTemplate:
        """``found``, kept as the variant ``key`` (the first variant, with one subscriber the only one: the
        dict made with it)."""
        cache = self.templates
        if cache is None:
            self.templates = {key: found}
        else:
            cache[key] = found
        return found

    def _delivery_properties(
        self, subscription_ids: tuple[int, ...], expiry: int | None, alias: int, offsets: bool
    ) -> Properties | None:
        base = self.properties
        if not offsets and not subscription_ids and expiry is None and not alias:
            return base
        props = copy.copy(base) if base is not None else Properties()
        if offsets:
            props.user_properties = [*props.user_properties, ("offset", str(self.offset))]
        props.subscription_identifiers = list(subscription_ids)
        props.message_expiry_interval = expiry
        props.topic_alias = alias or None
        return props


def wants_log_offsets(connect_properties: Properties | None) -> bool:
    """Whether a v5 CONNECT asks for the ``offset`` user property on deliveries (``OFFSETS_OPT_IN``)."""
    return connect_properties is not None and OFFSETS_OPT_IN in connect_properties.user_properties


def forwarded_properties(props: Properties | None) -> tuple[Properties | None, int | None]:
    """The v5 properties of an incoming PUBLISH (or will) to forward, and its Message Expiry Interval.

    Only the application properties travel (payload format, content type, response topic, correlation
    data, user properties): topic alias and subscription identifiers are per hop and will-only properties
    (Will Delay Interval) are not PUBLISH properties. The expiry is kept apart because each delivery sends
    what remains of it (MQTT 3.3.2.3.3).
    """
    if props is None:
        return None, None
    expiry = props.message_expiry_interval
    if (
        props.topic_alias is None
        and expiry is None
        and not props.subscription_identifiers
        and props.will_delay_interval is None
    ):
        return props, None
    forwarded = Properties(
        payload_format_indicator=props.payload_format_indicator,
        content_type=props.content_type,
        response_topic=props.response_topic,
        correlation_data=props.correlation_data,
        user_properties=props.user_properties,
    )
    if forwarded.is_empty():
        return None, expiry
    return forwarded, expiry


def _forget_earlier_intervals(cache: dict[object, PublishTemplate], expiry: int) -> None:
    """Drop the variants of ``cache`` that carry a Message Expiry Interval left other than ``expiry``: made at
    an earlier second, they are never sent again (a message held for a day would otherwise keep an encoding,
    its payload copied, for every second it was delivered in). They were made before those of ``expiry``, so
    the walk stops at the first of these; the few plain variants (int keys) are passed over."""
    earlier = []
    for key in cache:
        if type(key) is tuple and key[4] is not None:
            if key[4] == expiry:
                break
            earlier.append(key)
    for key in earlier:
        del cache[key]
