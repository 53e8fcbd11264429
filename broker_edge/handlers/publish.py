"""PUBLISH from a client: topic alias, limits, ACL, QoS 2 de-duplication, commitlog, routing, ack (MQTT 3.3).

The order matters. A QoS 2 id already held (PUBREC sent or pending, PUBREL not yet received) is answered with
PUBREC again and never routed twice. Publishes the commitlog keeps are appended first and routed and
acknowledged only once durable (``Broker.log_publish``), so an acknowledged message is never lost and every
delivery already carries its offset. Everything else is routed at once and acknowledged in the same turn.

ACL-denied publishes follow Mosquitto for v3 (acknowledged normally and dropped) and MQTT 5 for v5
(PUBACK / PUBREC with 0x87). Topic names starting with ``$`` are the broker's (``$SYS``): treated the same.
A client that would create more topic logs than ``limits.max_topics_per_client``, or than its identity's share
(``limits.max_topics_per_identity``, see ``broker_edge.topic_quota``), is refused the same way (0x97 Quota
exceeded).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from broker_edge.delivery import Message, forwarded_properties
from broker_edge.limits import topic_over_limits
from broker_edge.protocol.errors import ProtocolError
from broker_edge.protocol.packets import Publish
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.topic_quota import identity_of

if TYPE_CHECKING:
    from broker_edge.connection import Connection

__all__ = ["handle_publish"]

_NO_MATCHING = ReasonCode.NO_MATCHING_SUBSCRIBERS
_NOT_AUTHORIZED = ReasonCode.NOT_AUTHORIZED
_QUOTA_EXCEEDED = ReasonCode.QUOTA_EXCEEDED


def handle_publish(conn: Connection, packet: Publish) -> None:
    qos = packet.qos
    conn.listener.stats.received[qos] += 1
    broker = conn.broker
    topic = packet.topic
    props = packet.properties
    if props is not None and props.topic_alias is not None:
        topic = _resolve_alias(conn, props.topic_alias, topic)
        if topic is None:
            return
    limits = broker.config.limits
    if topic_over_limits(topic, limits.max_topic_length, limits.max_topic_levels):
        conn.close(ReasonCode.TOPIC_NAME_INVALID, "topic name longer or deeper than the broker allows")
        return
    session = conn.session
    packet_id = packet.packet_id
    if qos == 2:
        held = session.incoming_qos2  # type: ignore[union-attr]
        if held is not None and packet_id in held:
            broker.ack_after_log(
                conn, packet_id, 2, 0
            )  # duplicate: PUBREC again, in order, never routed twice
            return
    if qos and conn.v5 and conn.incoming_pending >= limits.receive_maximum:
        conn.close(
            ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "more unacknowledged QoS 1/2 PUBLISHes than Receive Maximum"
        )
        return
    retain = packet.retain
    if retain and not broker.config.retain.enabled:
        if conn.v5:
            conn.close(ReasonCode.RETAIN_NOT_SUPPORTED, "retained messages are disabled")
            return
        retain = False
    acl = broker.acl
    if topic[0] == "$" or (acl is not None and not acl.can_publish(conn.client_id, session.username, topic)):  # type: ignore[union-attr]
        _refuse(conn, qos, packet_id, _NOT_AUTHORIZED, "acl_denied")
        return
    store = broker.store
    logged = store is not None and store.should_persist(topic, qos)
    if logged and topic not in store and not _may_create_log(conn, topic):  # type: ignore[operator]
        _refuse(conn, qos, packet_id, _QUOTA_EXCEEDED, "topic_quota")
        return

    expires_at = None
    forwarded = props
    if props is not None:
        forwarded, expiry = forwarded_properties(props)
        if expiry is not None:
            expires_at = time.monotonic() + expiry
    message = Message(topic, packet.payload, qos, retain, forwarded, conn.client_id, None, expires_at)
    if qos == 2:
        _hold_qos2(conn, packet_id)  # type: ignore[arg-type]
    if logged:
        if qos == 1:
            conn.incoming_pending += 1
        broker.log_publish(conn, message, packet_id)
        return
    matched = broker.router.publish(message)
    if not matched:
        broker.count_drop("no_subscribers")
    if qos == 1:
        conn.send_puback(packet_id, 0 if matched else _NO_MATCHING)  # type: ignore[arg-type]
    elif qos == 2:
        conn.send_pubrec(packet_id, 0 if matched else _NO_MATCHING)  # type: ignore[arg-type]


def _may_create_log(conn: Connection, topic: str) -> bool:
    """Whether the client may create ``topic``'s log: its client id's quota, then its identity's share."""
    broker = conn.broker
    username = conn.session.username  # type: ignore[union-attr]
    shares = broker.topic_shares
    if shares.exempt_user(username):
        return True
    quota = broker.config.limits.max_topics_per_client
    if quota and broker.store.logs_created_by(conn.client_id) >= quota:
        return False
    return shares.take(identity_of(username, conn.peer_host()), topic)


def _refuse(conn: Connection, qos: int, packet_id: int | None, reason_code: int, drop_reason: str) -> None:
    """Drop a PUBLISH the client may not make: v5 learns why from PUBACK / PUBREC; v3 sees a normal ack."""
    conn.broker.count_drop(drop_reason)
    if qos == 1:
        conn.send_puback(packet_id, reason_code)  # type: ignore[arg-type]
    elif qos == 2:
        if not conn.v5:  # v3: the flow completes normally (PUBREL → PUBCOMP)
            _hold_qos2(conn, packet_id)  # type: ignore[arg-type]
        conn.send_pubrec(packet_id, reason_code)  # type: ignore[arg-type]


def _hold_qos2(conn: Connection, packet_id: int) -> None:
    """Remember an incoming QoS 2 id until PUBREL (exactly once, MQTT 4.3.3)."""
    session = conn.session
    held = session.incoming_qos2  # type: ignore[union-attr]
    if held is None:
        held = session.incoming_qos2 = set()  # type: ignore[union-attr]
    held.add(packet_id)
    conn.incoming_pending += 1


def _resolve_alias(conn: Connection, alias: int, topic: str) -> str | None:
    """Map a v5 topic alias (MQTT 3.3.2.3.4); an alias out of range or unknown closes the connection."""
    maximum = conn.broker.config.mqtt.topic_alias_maximum
    if alias > maximum:
        conn.protocol_error(
            ProtocolError(f"topic alias {alias} above the maximum {maximum}", ReasonCode.TOPIC_ALIAS_INVALID)
        )
        return None
    aliases = conn.aliases_in
    if topic:
        if aliases is None:
            aliases = conn.aliases_in = {}
        aliases[alias] = topic
        return topic
    known = aliases.get(alias) if aliases else None
    if known is None:
        conn.protocol_error(ProtocolError(f"topic alias {alias} was never set", ReasonCode.PROTOCOL_ERROR))
        return None
    return known
