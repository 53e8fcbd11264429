"""PUBLISH from a client: topic alias, limits, ACL, QoS 2 de-duplication, commitlog, routing, ack (MQTT 3.3).

The order matters. A QoS 2 id already held (PUBREC sent or pending, PUBREL not yet received) is answered with
PUBREC again and never routed twice. A valid, allowed publish is handed to the PUBLISH path
(``broker_edge.engine.publish``): publishes the commitlog keeps are appended first and routed and acknowledged
only once durable, so an acknowledged message is never lost and every delivery already carries its offset;
everything else is routed at once and acknowledged in the same turn.

ACL-denied publishes follow Mosquitto for v3 (acknowledged normally and dropped) and MQTT 5 for v5 (PUBACK /
PUBREC with 0x87). Topic names starting with ``$`` are the broker's (``$SYS``): treated the same. A client
that would create more topic logs than ``limits.max_topics_per_client``, or than its identity's share
(``limits.max_topics_per_identity``, see ``broker_edge.security.topic_quota``), is refused the same way (0x97
Quota exceeded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_edge.engine.message import Message, forwarded_properties
from broker_edge.engine.publish_run import PublishRun
from broker_edge.protocol.errors import ProtocolError
from broker_edge.protocol.packets import Publish, PublishesAlike
from broker_edge.protocol.properties import payload_format_holds
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.security.limits import topic_over_limits
from broker_edge.security.topic_quota import identity_of
from broker_edge.storage.persistence import CREATES_LOG, LOGGED, NOT_LOGGED

if TYPE_CHECKING:
    from broker_edge.engine.handlers.context import BrokerContext, Client
    from broker_edge.engine.sessions.session import Session
    from broker_edge.security.limits import TokenBucket

__all__ = ["handle_publish", "handle_publish_run"]

_NOT_AUTHORIZED = ReasonCode.NOT_AUTHORIZED
_QUOTA_EXCEEDED = ReasonCode.QUOTA_EXCEEDED
_PAYLOAD_FORMAT_INVALID = ReasonCode.PAYLOAD_FORMAT_INVALID


def handle_publish(ctx: BrokerContext, conn: Client, session: Session, packet: Publish) -> None:
    qos = packet.qos
    conn.terms.stats.received[qos] += 1
    topic = packet.topic
    props = packet.properties
    if props is not None and props.topic_alias is not None:
        aliased = _resolve_alias(ctx, conn, props.topic_alias, topic)
        if aliased is None:
            return
        topic = aliased
    limits = ctx.config.limits
    max_length, max_levels = limits.max_topic_length, limits.max_topic_levels
    if (  # a topic of n characters has at most 4n UTF-8 bytes: most need only their levels counted here
        len(topic) << 2 > max_length or topic.count("/") >= max_levels
    ) and topic_over_limits(topic, max_length, max_levels):
        _disconnect(
            ctx, conn, ReasonCode.TOPIC_NAME_INVALID, "topic name longer or deeper than the broker allows"
        )
        return
    packet_id = packet.packet_id
    path = ctx.publish_path
    again = False  # a QoS 2 PUBLISH whose id is held: sent again, answered with PUBREC, never routed twice
    if qos == 2:
        assert packet_id is not None, "the decoder gives every QoS 1/2 PUBLISH a packet id"
        held = session.incoming_qos2
        again = held is not None and packet_id in held and not session.reused(packet_id, packet.dup)
        if again and (not conn.terms.v5 or conn.started_inbound.counts_qos2(packet_id)):
            path.acknowledge_in_turn(conn, packet_id, 2, 0)
            return
    if qos and conn.terms.v5 and (conn.inbound or conn.started_inbound).pending >= limits.receive_maximum:
        _disconnect(
            ctx,
            conn,
            ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
            "more unacknowledged QoS 1/2 PUBLISHes than Receive Maximum",
        )
        return
    if again:  # one a former connection of the session sent: a place of this one's Receive Maximum too
        assert packet_id is not None
        conn.started_inbound.count_qos2(packet_id)
        path.acknowledge_in_turn(conn, packet_id, 2, 0)
        return
    retain = packet.retain
    if retain and not ctx.config.retain.enabled:
        if conn.terms.v5:
            _disconnect(ctx, conn, ReasonCode.RETAIN_NOT_SUPPORTED, "retained messages are disabled")
            return
        retain = False
    acl = ctx.acl
    reserved = ctx.reserved_topics
    if (
        topic[0] == "$"
        or (acl is not None and not acl.can_publish(session.client_id, session.username, topic))
        or (reserved is not None and reserved(topic))  # another writer's here (a site's hub): only it writes
    ):
        _refuse(ctx, conn, session, packet, _NOT_AUTHORIZED, "acl_denied")
        return
    if props is not None and not payload_format_holds(props, packet.payload):
        _refuse(ctx, conn, session, packet, _PAYLOAD_FORMAT_INVALID, "payload_format_invalid")
        return
    persisted = path.persist_as(topic, qos)
    if persisted == CREATES_LOG and not _may_create_log(ctx, conn, session, topic):
        _refuse(ctx, conn, session, packet, _QUOTA_EXCEEDED, "topic_quota")
        return
    logged = persisted != NOT_LOGGED

    expires_at = None
    forwarded = props
    if props is not None:
        forwarded, expiry = forwarded_properties(props)
        if expiry is not None:
            expires_at = ctx.now() + expiry
    message = Message(
        topic,
        packet.payload,
        qos,
        retain,
        forwarded,
        session.client_id,
        None,
        expires_at,
        packet.frame,
        conn.terms.v5,
    )
    if qos == 2 and packet_id is not None:
        _hold_qos2(conn, session, packet_id)
    path.accept(conn, message, packet_id, logged)


def handle_publish_run(
    ctx: BrokerContext,
    conn: Client,
    session: Session,
    parts: list[Publish | PublishesAlike],
    count: int,
    bucket: TokenBucket | None,
) -> bool:
    """A run of ``count`` plain PUBLISHes on one topic at QoS 0 or 1, read as ``parts``
    (``engine.publish_run``, ``plain_run_end``): checked once and taken together when ``handle_publish`` would
    accept each of them alike and the client's rate limit (``bucket``) takes them all; False, having done
    nothing, when not (each then goes through ``handle_publish``).

    At QoS 0 the topic must not be logged (the run is routed at once), at QoS 1 it must be, its log made
    already (the run is queued for the log); an MQTT 5 client must stay within Receive Maximum all along."""
    topic = parts[0].topic
    qos = parts[0].qos
    limits = ctx.config.limits
    max_length, max_levels = limits.max_topic_length, limits.max_topic_levels
    acl = ctx.acl
    reserved = ctx.reserved_topics
    path = ctx.publish_path
    if (
        (
            (len(topic) << 2 > max_length or topic.count("/") >= max_levels)
            and topic_over_limits(topic, max_length, max_levels)
        )
        or topic[0] == "$"
        or (acl is not None and not acl.can_publish(session.client_id, session.username, topic))
        or (reserved is not None and reserved(topic))
        or path.persist_as(topic, qos) != (LOGGED if qos else NOT_LOGGED)
        or (qos and conn.terms.v5 and conn.started_inbound.pending + count > limits.receive_maximum)
        or (bucket is not None and not bucket.try_acquire(ctx.now(), count))
    ):
        return False
    conn.terms.stats.received[qos] += count
    run = PublishRun(parts, session.client_id, conn.terms.v5)
    if qos:
        path.accept_logged_run(conn, run)
    else:
        path.accept_run(conn, run)
    return True


def _may_create_log(ctx: BrokerContext, conn: Client, session: Session, topic: str) -> bool:
    """Whether the client may create ``topic``'s log: its client id's quota, then its identity's share."""
    limits = ctx.config.limits
    if limits.is_exempt(session.username):
        return True
    path, client_id = ctx.publish_path, session.client_id
    if path.creates_log(client_id, topic):
        return True  # another publish of this turn creates it: counted once
    quota = limits.max_topics_per_client
    if quota and path.logs_created_by(client_id) >= quota:
        return False
    if not ctx.topic_shares.take(identity_of(session.username, conn.peer_host()), topic):
        return False
    path.will_create_log(client_id, topic)
    return True


def _refuse(
    ctx: BrokerContext, conn: Client, session: Session, packet: Publish, reason_code: int, drop_reason: str
) -> None:
    """Drop a PUBLISH the client may not make: v5 learns why from PUBACK / PUBREC; v3 sees a normal ack, so
    the log line (rate-limited, naming client, user and topic) is where its owner learns of it. The answer
    keeps its turn behind the client's publishes still waiting for the log [MQTT-4.6.0-2]."""
    ctx.counters.drop(drop_reason)
    qos, packet_id = packet.qos, packet.packet_id
    ctx.counters.refusal_log.write(
        conn.log(),
        ctx.now(),
        drop_reason,
        f"publish refused: {drop_reason}",
        action="publish",
        topic=packet.topic,
        username=session.username or "",
        qos=qos,
    )
    if packet_id is None:
        return
    v5 = conn.terms.v5
    if qos == 2 and not v5:  # v3: the flow completes normally (PUBREL → PUBCOMP)
        _hold_qos2(conn, session, packet_id)
    ctx.publish_path.acknowledge_in_turn(conn, packet_id, qos, reason_code if v5 else 0)


def _disconnect(ctx: BrokerContext, conn: Client, code: ReasonCode, detail: str) -> None:
    """Close ``conn`` for a PUBLISH no broker may take (v5: DISCONNECT with ``code``), said in the broker's
    rate-limited refusal lines naming the client and why: a client that breaks the rule again at every
    connection would otherwise be disconnected over and over with nothing in the log."""
    reason = code.name.lower()
    message = f"disconnected: {reason} ({detail})"
    ctx.counters.refusal_log.write(conn.log, ctx.now(), reason, message, action="publish")
    conn.close(code, detail)


def _hold_qos2(conn: Client, session: Session, packet_id: int) -> None:
    """Remember an incoming QoS 2 id until PUBREL (exactly once, MQTT 4.3.3); an MQTT 5 client's publish
    counts towards its Receive Maximum until then (an older client's only until its PUBREC: the PUBLISH
    path counts those)."""
    session.hold_incoming(packet_id)
    if conn.terms.v5:
        conn.started_inbound.count_qos2(packet_id)


def _resolve_alias(ctx: BrokerContext, conn: Client, alias: int, topic: str) -> str | None:
    """Map a v5 topic alias (MQTT 3.3.2.3.4); an alias out of range or unknown closes the connection."""
    maximum = ctx.config.mqtt.topic_alias_maximum
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
