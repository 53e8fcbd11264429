"""SUBSCRIBE: validate each filter, check ACL and quotas, add to the trie, SUBACK, then retained and replays.

Each filter is answered on its own (MQTT 3.8.4): v5 reason codes say why one failed (0x8F invalid filter,
0x87 ACL, 0x97 too many subscriptions), v3 gets 0x80. Retained messages and log replays are sent after the
SUBACK so a client always sees the acknowledgement first.

A subscription replays a topic's commitlog when it names a start: the v5 user property ``offset`` on the
SUBSCRIBE (``<offset>``, ``earliest``, ``latest`` or ``time:<epoch-ms>``) or the v3 filter form
``$offset/<start>/<filter>``. Replays need the commitlog; without one such a filter is refused (0x80/0x83).
A v5 SUBACK refusing a filter (invalid, a malformed ``offset``, a replay not possible) says why in its
reason string.
A v5 SUBACK says when an asked offset is outside a log (``offset_out_of_range``, see
``broker_edge.engine.cursors``), unless the client set Request Problem Information to 0 [MQTT-3.1.2-29] or the
properties would make the SUBACK larger than its Maximum Packet Size [MQTT-3.9.2-1, -2]. The SUBACK waits
until the replays are positioned (``ReplayManager.when_started``): in this broker's logs a slice per loop
turn, when a filter matches more logs than a turn's budget positions, and on a cluster node in the logs other
brokers hold; then, on a cluster node, until the partitions the new subscriptions need are observed (the
``subscribe_gate`` port). Reading from the client pauses meanwhile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_edge.engine.connection.states import CLOSED, HELD_FOR_SUBACK
from broker_edge.engine.routing.subscriptions import SubscriptionOptions
from broker_edge.protocol.codec import encode
from broker_edge.protocol.errors import InvalidTopic
from broker_edge.protocol.packets import SubAck, Subscribe
from broker_edge.protocol.properties import Properties
from broker_edge.protocol.reason_codes import SUBACK_FAILURE_V3, ReasonCode
from broker_edge.protocol.topics import (
    parse_offset_filter,
    parse_offset_start,
    parse_shared,
    validate_topic_filter,
)
from broker_edge.security.limits import topic_over_limits

if TYPE_CHECKING:
    from broker_edge.engine.handlers.context import BrokerContext, Client
    from broker_edge.engine.sessions.session import Session
    from broker_edge.storage.errors import OffsetOutOfRange

__all__ = ["handle_subscribe"]


def _refused(
    ctx: BrokerContext, conn: Client, session: Session, topic_filter: str, reason: str, why: str
) -> None:
    """Count a filter refused for ``reason`` and say so (``why``), limited per reason like every refusal."""
    ctx.counters.drop(reason)
    ctx.counters.refusal_log.write(
        conn.log(),
        ctx.now(),
        reason,
        f"subscribe refused: {why}",
        action="subscribe",
        topic=topic_filter,
        username=session.username or "",
    )


_NO_REPLAY_LOG = "replay refused: this broker keeps no commitlog (storage.enabled is false)"
_NO_REPLAY_SHARED = "replay refused: a shared subscription is not replayed from an offset"


def _reasons(ctx: BrokerContext, outside: list[OffsetOutOfRange], whys: list[str]) -> Properties | None:
    """The v5 SUBACK properties saying why: refused filters first, then replays started elsewhere."""
    replays = ctx.replays
    properties = replays.out_of_range_properties(outside) if outside and replays is not None else None
    if not whys:
        return properties
    more = f" (and {len(whys) - 1} more filters refused)" if len(whys) > 1 else ""
    reason = whys[0] + more
    if properties is None:
        return Properties(reason_string=reason)
    properties.reason_string = f"{reason}; {properties.reason_string}"
    return properties


def _filter_bytes(session: Session) -> int:
    """UTF-8 bytes of the filters ``session`` holds (``limits.max_subscription_bytes_per_client``)."""
    return sum(len(key.encode()) for key in session.subscriptions or ())


def handle_subscribe(ctx: BrokerContext, conn: Client, session: Session, packet: Subscribe) -> None:
    router = ctx.router
    limits = ctx.config.limits
    acl = ctx.acl
    replays = ctx.replays
    v5 = conn.terms.v5
    props = packet.properties
    subscription_id = None
    offset_text = None
    if props is not None:
        if props.subscription_identifiers:
            subscription_id = props.subscription_identifiers[0]
        for key, value in props.user_properties:
            if key == "offset":
                offset_text = value
    codes: list[int] = []
    retained: list[tuple[str, SubscriptionOptions]] = []
    outside: list[OffsetOutOfRange] = []
    whys: list[str] = []  # why filters were refused, for the v5 SUBACK's reason string
    replaying = False
    for sub in packet.subscriptions:

        def fail(v5_code: int) -> None:
            codes.append(v5_code if v5 else SUBACK_FAILURE_V3)

        try:
            start, key = parse_offset_filter(sub.topic_filter)
            if start is None and offset_text is not None:
                try:
                    start = parse_offset_start(offset_text)
                except ValueError as exc:
                    raise InvalidTopic(str(exc), ReasonCode.TOPIC_FILTER_INVALID) from None
            group, topic_filter = parse_shared(key)
            validate_topic_filter(topic_filter)
        except InvalidTopic as exc:
            whys.append(str(exc))
            fail(ReasonCode.TOPIC_FILTER_INVALID)
            continue
        if topic_over_limits(topic_filter, limits.max_topic_length, limits.max_topic_levels):
            fail(ReasonCode.TOPIC_FILTER_INVALID)
            continue
        if acl is not None and not acl.can_subscribe(session.client_id, session.username, topic_filter):
            _refused(ctx, conn, session, topic_filter, "subscribe_denied", "subscribe_denied")
            fail(ReasonCode.NOT_AUTHORIZED)
            continue
        if start is not None and (replays is None or group is not None):
            whys.append(_NO_REPLAY_SHARED if group is not None else _NO_REPLAY_LOG)
            fail(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
            continue
        existing = session.subscriptions.get(key) if session.subscriptions else None
        if existing is None and (
            router.subscription_count(session) >= limits.max_subscriptions_per_client
            or _filter_bytes(session) + len(key.encode()) > limits.max_subscription_bytes_per_client
        ):
            fail(ReasonCode.QUOTA_EXCEEDED)
            continue
        if existing is None and not router.match_cost_allows(topic_filter):
            why = "with this filter a publish could visit more than limits.max_match_nodes"
            _refused(ctx, conn, session, topic_filter, "subscribe_match_cost", why)
            fail(ReasonCode.QUOTA_EXCEEDED)
            continue
        options = SubscriptionOptions(
            sub.qos, sub.no_local, sub.retain_as_published, sub.retain_handling, subscription_id
        )
        is_new = router.subscribe(session, key, topic_filter, group, options)
        codes.append(sub.qos)
        if start is not None and replays is not None:
            session.log_offsets = True  # asked for log delivery: deliveries carry their offset
            outside += replays.start(session, topic_filter, start)  # read after the SUBACK
            replaying = True
        elif group is None and (sub.retain_handling == 0 or (sub.retain_handling == 1 and is_new)):
            retained.append((topic_filter, options))

    def acknowledge() -> None:
        properties = None
        if v5 and conn.terms.problem_information:
            properties = _reasons(ctx, outside, whys)
        suback = SubAck(packet.packet_id, codes, properties)
        if properties is not None and len(encode(suback, conn.version)) > conn.terms.max_packet_out:
            suback = SubAck(packet.packet_id, codes, None)  # the properties may go, the reason codes not
        most = conn.terms.max_packet_out  # a SUBACK without properties is at most 8 bytes and its codes
        size = len(encode(suback, conn.version)) if suback.properties is None and 8 + len(codes) > most else 0
        if size > most:  # not sent, the rest done as if it was [MQTT-3.1.2-24] [MQTT-3.1.2-25]
            why = f"its SUBACK of {size} bytes exceeds the client's Maximum Packet Size"
            _refused(ctx, conn, session, f"{len(codes)} filters", "suback_too_large", why)
        else:
            conn.send_packet(suback)
        for topic_filter, options in retained:
            router.send_retained(session, topic_filter, options)
        if replaying and replays is not None:
            replays.pump(session)

    def released() -> None:
        if conn.state != CLOSED:
            acknowledge()
            conn.release(HELD_FOR_SUBACK)

    def gated() -> bool:
        """Whether the SUBACK waits for observation (a cluster node routes the new subscriptions' records
        here from the SUBACK on)."""
        gate = ctx.cluster.subscribe_gate
        return gate is not None and gate.subscribe_gate(released)

    def started() -> None:
        if not gated():
            released()

    if replaying and replays is not None and replays.when_started(session, outside, started):
        conn.hold(HELD_FOR_SUBACK)  # positioned in later turns, or by asking the brokers holding the logs
        return
    if not gated():
        acknowledge()
        return
    conn.hold(HELD_FOR_SUBACK)  # a cluster node routes the new subscriptions' records here from the SUBACK on
