"""CONNECT: client id, authentication, session takeover or resume, keepalive, will, CONNACK (MQTT 3.1, 3.2).

A client certificate's CN is the login: a user name sent with it must be the CN or a password login. A
session belongs to the identity that created it (its user name, the client certificate's CN, or none for
an anonymous client): a CONNECT of another identity with the same client id is refused with "not
authorized" (v5 0x87, v3 0x05) and the session and its connection are left alone. A resumed session keeps
only the subscriptions the ACL still allows (see docs/security.md). With
``auth.client_id_must_match_login`` a client id other than the login is refused (v5 0x85, v3 2), and an
empty one is the login.

Password checks hash on purpose, so they run off the loop (``BrokerContext.verify_password``) while the
connection reads nothing further (packets that already arrived wait in its ``backlog``). Everything else
is synchronous. CONNACK is written before the session's in-flight messages are resent, as the spec orders.
Every refusal goes through ``Connection.refuse`` with its codes from ``_REFUSALS``.

On a cluster node (the ``sessions`` port of ``BrokerContext.cluster``), the client id is first claimed
cluster-wide, which moves its session here from the broker that holds it
(``broker_edge.cluster.features.sessions``); the CONNECT waits for that as for a password check, then goes on
exactly as on a broker alone.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING

from broker_edge.engine.connection.states import (
    AUTHENTICATING,
    CLOSED,
    CONNECTED,
    HELD_FOR_CONNECT,
    NEW,
    NO_LIMIT,
    keepalive_deadline,
)
from broker_edge.engine.message import wants_log_offsets
from broker_edge.engine.ports import SessionClaim
from broker_edge.protocol.codec import encode, shared_like
from broker_edge.protocol.packets import MQTT_5, ConnAck, Connect, Will
from broker_edge.protocol.properties import Properties, payload_format_holds
from broker_edge.protocol.reason_codes import ConnectReturnCode, ReasonCode

if TYPE_CHECKING:
    from collections.abc import Iterator

    from broker_edge.engine.handlers.context import BrokerContext, Client
    from broker_edge.engine.ports import SessionClaims
    from broker_edge.engine.sessions.session import Session
    from broker_edge.security.acl import AccessControl
    from broker_edge.security.auth import AuthConfig
    from broker_edge.settings.broker import ListenerConfig

__all__ = ["accept_handed_in", "handle_connect", "refuse_elsewhere"]

_log = logging.getLogger("broker_edge.connection")

_RC = ReasonCode
_V3 = ConnectReturnCode


def handle_connect(ctx: BrokerContext, conn: Client, packet: Connect) -> None:
    limits = ctx.config.limits
    v5 = packet.protocol_version == MQTT_5
    props = packet.properties
    # the client's Maximum Packet Size bounds the CONNACK too (3.1.2.11.4)
    max_packet_out = props.maximum_packet_size if props is not None else None
    conn.terms = conn.terms.settle(v5=v5, max_packet_out=max_packet_out)
    client_id = packet.client_id
    assigned = False
    if len(client_id) > limits.max_client_id_length or len(client_id.encode()) > limits.max_client_id_length:
        _refuse(ctx, conn, "client_id_invalid", client_id[: limits.max_client_id_length])
        return
    if not client_id:
        if not v5 and not packet.clean_start:
            # MQTT 3.1.1 3.1.3-8: a zero-byte client id needs clean session 1.
            _refuse(ctx, conn, "client_id_invalid", client_id)
            return
        client_id = "auto-" + secrets.token_hex(8)
        assigned = True
    if props is not None and props.authentication_method is not None:
        _refuse(ctx, conn, "bad_auth_method", client_id)
        return

    username = packet.username
    if conn.peer_uri:  # a cluster member's or a site's certificate, of a CA the listener trusts
        _refuse(ctx, conn, "certificate_not_device", client_id, conn.peer_uri)
        return
    if conn.peer_cn is not None and username in (None, conn.peer_cn):
        username = conn.peer_cn  # authenticated by its client certificate
        _accept(ctx, conn, packet, client_id, assigned, username)
        return
    if username is None:
        if not conn.terms.listener.allow_anonymous:
            _refuse(ctx, conn, "anonymous", client_id)
            return
        _accept(ctx, conn, packet, client_id, assigned, None)
        return
    passwords = ctx.passwords
    if passwords is None:
        # no password file: a username is only a label, and never one that would hide a certificate's CN
        if conn.terms.listener.allow_anonymous and conn.peer_cn is None:
            _accept(ctx, conn, packet, client_id, assigned, username)
        else:
            _refuse(ctx, conn, "bad_credentials", client_id, username)
        return
    charged = not passwords.remembered(username, packet.password)  # a password verified before costs nothing
    if charged and not ctx.login_backoff.admit(
        conn.peer_host(), username if username in passwords else None, ctx.now()
    ):
        _refuse(ctx, conn, "login_backoff", client_id, username)  # no hash spent on a guesser
        return
    conn.named = client_id  # for the log lines while the password is checked
    conn.state = AUTHENTICATING
    conn.hold(HELD_FOR_CONNECT)

    def checked(ok: bool) -> None:
        _after_password(ctx, conn, packet, client_id, assigned, username, charged, ok)

    ctx.verify_password(username, packet.password, checked)


def accept_handed_in(
    ctx: BrokerContext, conn: Client, packet: Connect, username: str | None, origin: str
) -> None:
    """Take in a connection member ``origin`` on this host moved here (``connection.handover``): its
    ``packet`` (``handover.connect_of``) is handled as a CONNECT here is, for the identity ``username``
    ``origin`` authenticated (members of one cluster share their configuration), with no CONNACK written
    (the client has had it); a refusal closes it without one, and the client connects again."""
    conn.handed_in = origin
    props = packet.properties
    max_packet_out = props.maximum_packet_size if props is not None else None
    conn.terms = conn.terms.settle(v5=packet.protocol_version == MQTT_5, max_packet_out=max_packet_out)
    conn.decoder = shared_like(conn.decoder, packet.protocol_version)
    _accept(ctx, conn, packet, packet.client_id, False, username)


def _after_password(
    ctx: BrokerContext,
    conn: Client,
    packet: Connect,
    client_id: str,
    assigned: bool,
    username: str,
    charged: bool,
    ok: bool,
) -> None:
    if conn.state == CLOSED:
        return
    conn.state = NEW
    if not ok:
        _refuse(ctx, conn, "bad_credentials", username=username)
        return
    if charged:
        ctx.login_backoff.succeeded(conn.peer_host(), username)
    _accept(ctx, conn, packet, client_id, assigned, username)
    if conn.state not in (CLOSED, AUTHENTICATING):  # AUTHENTICATING: a cluster claim is under way
        conn.release(HELD_FOR_CONNECT)  # what arrived meanwhile, then reading resumes


_REFUSALS: dict[str, tuple[int, int, str]] = {
    "certificate_not_device": (
        _RC.NOT_AUTHORIZED,
        _V3.NOT_AUTHORIZED,
        "a cluster member's or a site's certificate is not a device's login",
    ),
    "client_id_invalid": (
        _RC.CLIENT_IDENTIFIER_NOT_VALID,
        _V3.IDENTIFIER_REJECTED,
        "client identifier too long, or empty without a clean session",
    ),
    "client_id_not_login": (  # auth.client_id_must_match_login
        _RC.CLIENT_IDENTIFIER_NOT_VALID,
        _V3.IDENTIFIER_REJECTED,
        "the client identifier must be the login (user name or CN)",
    ),
    "bad_auth_method": (
        _RC.BAD_AUTHENTICATION_METHOD,
        _V3.NOT_AUTHORIZED,
        "enhanced authentication not offered",
    ),
    "anonymous": (_RC.NOT_AUTHORIZED, _V3.NOT_AUTHORIZED, "this listener requires a user name"),
    "bad_credentials": (
        _RC.BAD_USER_NAME_OR_PASSWORD,
        _V3.BAD_USERNAME_OR_PASSWORD,
        "bad user name or password",
    ),
    "not_authorized": (_RC.NOT_AUTHORIZED, _V3.NOT_AUTHORIZED, "will topic not allowed"),
    "payload_format_invalid": (  # (a v3 will has no Payload Format Indicator)
        _RC.PAYLOAD_FORMAT_INVALID,
        _V3.NOT_AUTHORIZED,
        "the will's payload is not UTF-8, as its Payload Format Indicator says",
    ),
    "login_backoff": (
        _RC.CONNECTION_RATE_EXCEEDED,
        _V3.SERVER_UNAVAILABLE,
        "too many failed logins; retry later",
    ),
    "session_owner": (
        _RC.NOT_AUTHORIZED,
        _V3.NOT_AUTHORIZED,
        "this client identifier's session belongs to another user",
    ),
    "session_unavailable": (
        _RC.SERVER_UNAVAILABLE,
        _V3.SERVER_UNAVAILABLE,
        "this client identifier's session could not be moved here; retry",
    ),
    "use_another_server": (
        _RC.USE_ANOTHER_SERVER,
        _V3.SERVER_UNAVAILABLE,
        "this broker is not a cluster member now; connect to the server referenced",
    ),
    "session_quota": (
        _RC.QUOTA_EXCEEDED,
        _V3.SERVER_UNAVAILABLE,
        "too many persistent sessions on this broker",
    ),
    "retain_not_supported": (_RC.RETAIN_NOT_SUPPORTED, _V3.NOT_AUTHORIZED, "retained messages are disabled"),
    "connack_too_large": (
        _RC.PACKET_TOO_LARGE,
        _V3.NOT_AUTHORIZED,
        "the CONNACK does not fit the client's Maximum Packet Size",
    ),
}
"""Refusal (``reason`` label of ``connections_refused_total``) → v5 code, v3 return code, reason string."""


_LEFT_OUT_WHEN_TOO_LARGE = ("topic_alias_maximum", "maximum_packet_size", "receive_maximum")
"""CONNACK properties left out, in this order, while the CONNACK is larger than the client's Maximum Packet
Size [MQTT-3.1.2-24]. Without them the client assumes no topic aliases, no size limit and 65,535 in flight;
the broker enforces its limits all the same (DISCONNECT 0x95, 0x93)."""


def _fit_connack(ack: Properties, max_packet_out: int) -> bool:
    """Leave properties out of a successful CONNACK until it fits ``max_packet_out``; False if it cannot
    (what is left is needed: an assigned client id, a changed keep alive or expiry, retain unavailable)."""
    for name in _LEFT_OUT_WHEN_TOO_LARGE:
        if len(encode(ConnAck(True, 0, ack), MQTT_5)) <= max_packet_out:
            return True
        setattr(ack, name, None)
    return len(encode(ConnAck(True, 0, ack), MQTT_5)) <= max_packet_out


def _drop_denied_subscriptions(ctx: BrokerContext, acl: AccessControl, session: Session) -> None:
    """A resumed session keeps only the subscriptions the ACL allows its identity now (rules change)."""
    for key, entry in list((session.subscriptions or {}).items()):
        if not acl.can_subscribe(session.client_id, session.username, entry.topic_filter):
            ctx.router.unsubscribe(session, key)
            ctx.counters.drop("subscribe_denied")


def _refuse(
    ctx: BrokerContext,
    conn: Client,
    reason: str,
    client_id: str | None = None,
    username: str | None = None,
    topic: str | None = None,
    server_reference: str | None = None,
) -> None:
    """CONNACK with the refusal's code (v5: and its reason string, if the client accepts that size), close.

    ``client_id`` names the connection in the log lines from here on, until it has a session; the line
    (WARNING, rate-limited per reason) names the ``username`` tried, and the will's ``topic`` it was
    refused for. ``server_reference``: the broker a v5 client is sent to (``use_another_server``)."""
    if client_id is not None and conn.session is None:
        conn.named = client_id
    v5_code, v3_code, text = _REFUSALS[reason]
    fields = {"action": "connect", "username": username if username is not None else ""}
    if topic is not None:
        fields["topic"] = topic
    if server_reference is not None and conn.terms.v5:
        fields["server_reference"] = server_reference
    ctx.counters.refusal_log.write(conn.log(), ctx.now(), reason, f"connection refused: {reason}", **fields)
    if conn.handed_in:  # moved here connected: closed without a CONNACK, and the client connects again
        conn.refuse(reason, None)
        return
    conn.refuse(reason, v5_code if conn.terms.v5 else v3_code, text, server_reference=server_reference)


def refuse_elsewhere(ctx: BrokerContext, conn: Client, server_references: Iterator[str] | None) -> None:
    """Refuse a CONNECT still under way because this broker left the cluster: a v5 client gets CONNACK 0x9C
    "use another server" naming the next of ``server_references`` (0x88 when there are none), a 3.1.1
    client return code 3 "server unavailable"; either retries elsewhere at once instead of waiting for an
    answer that does not come."""
    if server_references is None:
        _refuse(ctx, conn, "session_unavailable")
    else:
        reference = next(server_references) if conn.terms.v5 else None
        _refuse(ctx, conn, "use_another_server", server_reference=reference)


def _will_delay(will: Will | None) -> int:
    """The v5 Will Delay Interval of a CONNECT's will (0: none, or no will)."""
    if will is None or will.properties is None:
        return 0
    return will.properties.will_delay_interval or 0


def _claim_then_accept(
    ctx: BrokerContext,
    claims: SessionClaims,
    conn: Client,
    packet: Connect,
    client_id: str,
    assigned: bool,
    username: str | None,
    expiry: int,
) -> None:
    """A cluster node first makes the client id's session its own (taking it over from the broker that
    holds it, refused as here if it is another user's); the packets that arrive meanwhile wait."""
    conn.named = client_id  # for the log lines while the claim is under way
    conn.state = AUTHENTICATING
    conn.hold(HELD_FOR_CONNECT)
    will = packet.will
    claim = SessionClaim(
        client_id,
        username,
        packet.clean_start,
        expiry,
        will,
        _will_delay(will),
        conn.terms.v5,
        conn.moved_claim if conn.handed_in else None,
    )

    def claimed(refusal: str | None, server_reference: str | None) -> None:
        if conn.state == CLOSED:
            return
        conn.state = NEW
        if refusal is not None:
            _refuse(ctx, conn, refusal, username=username, server_reference=server_reference)
            return
        _accept(ctx, conn, packet, client_id, assigned, username, claimed=True)
        if conn.state != CLOSED:
            conn.release(HELD_FOR_CONNECT)

    claims.claim(claim, claimed)


def _bound_to_login(auth: AuthConfig, listener: ListenerConfig, username: str) -> bool:
    """Whether ``username`` must connect with its login as client id on ``listener``: its
    ``client_id_must_match_login``, else ``auth.client_id_must_match_login``; never a free login."""
    bound = listener.client_id_must_match_login
    if bound is None:
        bound = auth.client_id_must_match_login
    return bound and username not in auth.client_id_free_logins


def _accept(
    ctx: BrokerContext,
    conn: Client,
    packet: Connect,
    client_id: str,
    assigned: bool,
    username: str | None,
    claimed: bool = False,
) -> None:
    config = ctx.config
    listener = conn.terms.listener.config
    if username is not None and client_id != username and _bound_to_login(config.auth, listener, username):
        if not assigned:
            _refuse(ctx, conn, "client_id_not_login", client_id, username)
            return
        client_id = username  # a server-assigned id is the login (v5: Assigned Client Identifier)
    limits = config.limits
    v5 = conn.terms.v5
    props = packet.properties
    will = packet.will
    if will is not None:
        if will.topic.startswith("$") or (
            ctx.acl is not None and not ctx.acl.can_publish(client_id, username, will.topic)
        ):
            _refuse(
                ctx, conn, "not_authorized", client_id, username, topic=will.topic
            )  # clients never publish to $ topics, not even by will
            return
        if will.retain and not config.retain.enabled:
            _refuse(ctx, conn, "retain_not_supported", client_id)
            return
        if not payload_format_holds(will.properties, will.payload):
            _refuse(ctx, conn, "payload_format_invalid", client_id, username, topic=will.topic)
            return

    max_expiry = config.sessions.max_session_expiry_s
    if v5:
        requested = (
            props.session_expiry_interval if props and props.session_expiry_interval is not None else 0
        )
        expiry = min(requested, max_expiry)
    else:
        requested = expiry = 0 if packet.clean_start else max_expiry

    claims = ctx.cluster.sessions
    if claims is not None and not claimed:
        _claim_then_accept(ctx, claims, conn, packet, client_id, assigned, username, expiry)
        return

    router = ctx.router
    now = ctx.now()
    existing = router.sessions.get(client_id)
    if existing is not None and existing.username != username:
        _refuse(
            ctx, conn, "session_owner", client_id, username
        )  # neither taken over nor discarded: it is someone else's
        return
    max_persistent = config.sessions.max_persistent
    adds_persistent = expiry > 0 and (existing is None or existing.expiry_interval == 0)
    if adds_persistent and max_persistent and router.persistent_count >= max_persistent:
        _refuse(ctx, conn, "session_quota", client_id, username)
        return

    keepalive = packet.keep_alive
    ack: Properties | None = None
    terms = conn.terms
    if v5:
        ack = Properties()
        if keepalive == 0 or keepalive > limits.max_keepalive_s:
            keepalive = limits.max_keepalive_s
            ack.server_keep_alive = keepalive
        if expiry != requested:
            ack.session_expiry_interval = expiry
        if props is not None:
            terms = terms.settle(
                problem_information=props.request_problem_information != 0,
                send_quota=(
                    None
                    if props.receive_maximum is None
                    else min(props.receive_maximum, limits.max_inflight_out)
                ),
                alias_max_out=min(props.topic_alias_maximum or 0, config.mqtt.outgoing_topic_aliases),
            )
        ack.receive_maximum = limits.receive_maximum
        ack.maximum_packet_size = limits.max_packet_size
        if config.mqtt.topic_alias_maximum:
            ack.topic_alias_maximum = config.mqtt.topic_alias_maximum
        if not config.retain.enabled:
            ack.retain_available = 0
        if assigned:
            ack.assigned_client_identifier = client_id
        if not _fit_connack(ack, terms.max_packet_out):
            _refuse(ctx, conn, "connack_too_large", client_id)
            return
    else:
        terms = terms.settle(max_packet_out=NO_LIMIT)

    if existing is not None and existing.connection is not None:
        existing.connection.taken_over()
    session, present = router.open_session(client_id, packet.clean_start, expiry, now)
    session.username = username
    conn.session = session
    if v5 and wants_log_offsets(props):
        session.log_offsets = True
    if present and ctx.acl is not None:
        _drop_denied_subscriptions(ctx, ctx.acl, session)
    conn.terms = terms.settle(keepalive=keepalive, state=CONNECTED)
    conn.deadline = keepalive_deadline(now, keepalive)
    conn.will = will
    conn.will_delay = _will_delay(will)
    conn.expiry_lowered = requested > 0 and expiry == 0 and v5
    handed_in = conn.handed_in
    if not handed_in:  # a connection moved here has had its CONNACK
        conn.write(encode(ConnAck(present, 0, ack), conn.version))
    conn.terms.listener.metrics.connected()
    if _log.isEnabledFor(logging.INFO):
        fields = {
            "version": conn.version,
            "clean_start": packet.clean_start,
            "keepalive": keepalive,
            "session_present": present,
            "username": username if username is not None else "",
        }  # fields, not words of the message: JSON logs carry them as keys (docs/observability.md)
        if handed_in:
            fields["handed_over_by"] = handed_in
        conn.log().info("connected", extra=fields)
    session.attach(conn)
    conn.attached()
