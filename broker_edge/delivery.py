"""The routed message and its outgoing encodings, computed once and shared by every subscriber.

A PUBLISH fanned out to N subscribers is encoded once per distinct variant — protocol family (v3 / v5),
QoS, RETAIN flag, v5 subscription identifiers, remaining message expiry and the v5 topic alias the connection
uses for the topic (with the topic name when it sets the alias, without when it uses it) — and the resulting
bytes are handed to every subscriber of that variant: QoS 0 subscribers all write the same ``bytes`` object,
QoS 1/2 subscribers write ``head + packet id + tail``. Logged messages carry their log offset to v5
subscribers as the user property ``offset``; that is part of the shared encoding, not a per-subscriber cost.
"""

from __future__ import annotations

import copy
import math
import time

from broker_edge.protocol.codec import PublishTemplate, encode_publish_template
from broker_edge.protocol.packets import MQTT_3_1_1, MQTT_5
from broker_edge.protocol.properties import Properties

__all__ = ["Message", "forwarded_properties"]


class Message:
    """One application message inside the broker, from the PUBLISH that brought it to every delivery.

    ``properties`` are the v5 properties to forward (never a topic alias or subscription identifier);
    ``origin`` is the publishing client id (for No Local); ``offset`` is its log offset once appended;
    ``expires_at`` is a ``time.monotonic()`` deadline from the v5 Message Expiry Interval.
    """

    __slots__ = (
        "_cache",
        "expires_at",
        "offset",
        "origin",
        "payload",
        "properties",
        "qos",
        "retain",
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
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties
        self.origin = origin
        self.offset = offset
        self.expires_at = expires_at
        self._cache: dict | None = None

    def __repr__(self) -> str:
        return f"Message({self.topic!r}, {len(self.payload)} bytes, qos={self.qos}, offset={self.offset})"

    def expired(self, now: float | None = None) -> bool:
        if self.expires_at is None:
            return False
        return (time.monotonic() if now is None else now) >= self.expires_at

    def template(
        self,
        v5: bool,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...] = (),
        alias: int = 0,
        alias_only: bool = False,
    ) -> PublishTemplate:
        """The encoded PUBLISH of one delivery variant, the same object for every subscriber of it.

        ``alias`` (v5) adds the Topic Alias property: with the topic name to set it, or with an empty topic
        name when ``alias_only`` (the connection has set it before).
        """
        expiry = None
        if self.expires_at is not None and v5:
            expiry = max(1, math.ceil(self.expires_at - time.monotonic()))
        if subscription_ids or expiry is not None:
            key: object = (v5, qos, retain, subscription_ids, expiry, alias, alias_only)
        else:  # the common variants: one small int (hashing a tuple per delivery would cost more)
            key = (alias << 5) | (alias_only << 4) | (v5 << 3) | (qos << 1) | retain
        cache = self._cache
        if cache is None:
            cache = self._cache = {}
        else:
            found = cache.get(key)
            if found is not None:
                return found
        properties = self._delivery_properties(subscription_ids, expiry, alias) if v5 else None
        found = cache[key] = encode_publish_template(
            "" if alias_only else self.topic,
            self.payload,
            MQTT_5 if v5 else MQTT_3_1_1,
            qos=qos,
            retain=retain,
            properties=properties,
        )
        return found

    def _delivery_properties(
        self, subscription_ids: tuple[int, ...], expiry: int | None, alias: int
    ) -> Properties | None:
        base = self.properties
        if self.offset is None and not subscription_ids and expiry is None and not alias:
            return base
        props = copy.copy(base) if base is not None else Properties()
        props.user_properties = list(props.user_properties)
        if self.offset is not None:
            props.user_properties.append(("offset", str(self.offset)))
        props.subscription_identifiers = list(subscription_ids)
        props.message_expiry_interval = expiry
        props.topic_alias = alias or None
        return props


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
