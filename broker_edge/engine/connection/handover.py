"""A client's connection moved to another member of the cluster on the same host, and taken in there.

What moves is the socket and what the client's CONNECT settled, never a session's state: only a connection
whose session holds nothing may move (``may_move``: no Session Expiry Interval, no subscription, nothing in
flight towards it, no QoS 2 id held, no topic alias set, a small will without properties, no publish of
it appended here on a topic this member still leads). One moved here moves on when its topic's leader
moves. Its reading is held first (``HELD_FOR_HANDOVER``); it moves
once every QoS 1/2 publish it sent is answered (``record_of``), with the bytes read and not yet handled
(``"unread"``) and the session registry's record the member it leaves wrote for it (``"claim"``: swapped there
for the new member's own without a read, ``claim_of``); the member taking it in starts it as its own CONNECT
would, without a CONNACK, then handles those bytes: the client sees nothing. ``connect_of`` turns a record
back into that CONNECT (``handlers.connect.accept_handed_in``). The socket itself is the transport's
(``runtime.transports.tcp``) and travels between the members as a file descriptor (``cluster.links.handoff``).
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

from broker_edge.engine.connection.states import (
    CONNECTED,
    HELD_FOR_ACKS,
    HELD_FOR_HANDOVER,
    HELD_FOR_TURN,
    NO_LIMIT,
)
from broker_edge.engine.message import OFFSETS_OPT_IN
from broker_edge.engine.ports import MovedClaim
from broker_edge.protocol.packets import MQTT_3_1, MQTT_3_1_1, MQTT_5, Connect, Will
from broker_edge.protocol.properties import Properties

if TYPE_CHECKING:
    from broker_edge.engine.connection.connection import Connection

__all__ = ["MAX_WILL_PAYLOAD", "BadRecord", "claim_of", "connect_of", "may_move", "record_of", "unread_of"]

MAX_WILL_PAYLOAD = 16 * 1024
"""The largest will payload that moves with a connection (a connection with a larger will stays)."""

_VERSIONS = (MQTT_3_1, MQTT_3_1_1, MQTT_5)

_MOVES_HELD = HELD_FOR_HANDOVER | HELD_FOR_TURN
"""Holds of reading a connection moves with: its own, and bytes kept for a later turn (they go along)."""
_MAY_HOLD = _MOVES_HELD | HELD_FOR_ACKS
"""Holds of reading a connection that may move has: those it moves with, and an MQTT 3.1.1 client's
publishes waiting for the answers to those before them (``limits.receive_maximum``), handled once they
come."""


class BadRecord(ValueError):
    """A record that is not one ``record_of`` makes: the connection it came with is closed."""


def may_move(conn: Connection) -> bool:
    """Whether ``conn`` may move once its publishes read are answered (see the module docstring): what its
    session holds and what it is, not what is on its way."""
    terms = conn.terms
    session = conn.session
    if terms.state != CONNECTED or session is None or conn.decoder.failed:
        return False
    if conn.held & ~_MAY_HOLD or conn.held_error is not None or conn.aliases_in or conn.aliases_out:
        return False
    inbound = conn.inbound
    if inbound is not None and inbound.appended_here:
        return False
    if (
        session.expiry_interval
        or session.subscriptions
        or session.inflight
        or session.queue
        or session.retained_due
        or session.cursors
        or session.incoming_qos2
        or session.connection is not conn
    ):
        return False
    will = conn.will
    return will is None or (will.properties is None and len(will.payload) <= MAX_WILL_PAYLOAD)


def record_of(conn: Connection) -> dict[str, Any] | None:
    """What moves with ``conn`` to another member, or None while it cannot move now: it may move
    (``may_move``), every QoS 1/2 publish it sent is answered and nothing waits to be handled. The
    transport's part (everything written sent; the bytes read and not yet handled go along) is the
    transport's to check (``TcpConnection.handover_socket``)."""
    inbound = conn.inbound
    if (
        (inbound is not None and inbound.pending)
        or conn.held & ~_MOVES_HELD
        or conn.backlog is not None
        or not may_move(conn)
    ):
        return None
    session = conn.session
    assert session is not None, "a connection that may move has a session"
    terms = conn.terms
    will = conn.will
    return {
        "listener": terms.listener.name,
        "client_id": session.client_id,
        "username": session.username,
        "version": conn.version,
        "keepalive": terms.keepalive,
        "send_quota": terms.send_quota,
        "max_packet_out": terms.max_packet_out,
        "alias_max_out": terms.alias_max_out,
        "problem_information": terms.problem_information,
        "log_offsets": bool(session.log_offsets),
        "will": None
        if will is None
        else {
            "topic": will.topic,
            "payload": base64.b64encode(will.payload).decode(),
            "qos": will.qos,
            "retain": will.retain,
        },
    }


def unread_of(record: dict[str, Any]) -> bytes:
    """The bytes the client sent that the member it leaves read and did not handle (``"unread"``, base64;
    none when absent): the member taking it in handles them first."""
    value = record.get("unread")
    if value is None:
        return b""
    if not isinstance(value, str):
        raise BadRecord("unread: expected base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise BadRecord(f"unread: not base64 ({exc})") from None


def connect_of(record: dict[str, Any]) -> tuple[Connect, str | None]:
    """The CONNECT a moved connection is taken in with, and its identity (user name, certificate CN, or
    None); ``BadRecord`` naming the field that is not as ``record_of`` makes it."""
    client_id = _field(record, "client_id", str)
    username = record.get("username")
    if username is not None and not isinstance(username, str):
        raise BadRecord("username: expected a string or null")
    version = _field(record, "version", int)
    if version not in _VERSIONS:
        raise BadRecord(f"version: {version} is not an MQTT protocol level")
    keepalive = _field(record, "keepalive", int)
    if not 0 <= keepalive <= 0xFFFF:
        raise BadRecord("keepalive: out of range")
    properties = None
    if version == MQTT_5:
        max_packet_out = _field(record, "max_packet_out", int)
        properties = Properties(
            receive_maximum=_field(record, "send_quota", int),
            topic_alias_maximum=_field(record, "alias_max_out", int),
            request_problem_information=1 if _field(record, "problem_information", bool) else 0,
            maximum_packet_size=None if max_packet_out >= NO_LIMIT else max_packet_out,
        )
        if _field(record, "log_offsets", bool):
            properties.user_properties.append(OFFSETS_OPT_IN)
    return Connect(
        protocol_version=version,
        clean_start=True,
        keep_alive=keepalive,
        client_id=client_id,
        will=_will_of(record.get("will")),
        username=username,
        properties=properties,
    ), username


def claim_of(record: dict[str, Any], origin: str) -> MovedClaim | None:
    """The registry record of the session that member ``origin`` wrote and hands on (``"claim"``:
    ``{"generation", "revision"}``; None when it sent none: the claim here reads the record), or
    ``BadRecord``."""
    value = record.get("claim")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRecord("claim: expected an object or null")
    generation, revision = _field(value, "generation", int), _field(value, "revision", int)
    if generation < 1 or revision < 1:
        raise BadRecord("claim: generation and revision start at 1")
    return MovedClaim(origin, generation, revision)


def _will_of(value: object) -> Will | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRecord("will: expected an object or null")
    try:
        payload = base64.b64decode(_field(value, "payload", str), validate=True)
    except binascii.Error as exc:
        raise BadRecord(f"will.payload: not base64 ({exc})") from None
    qos = _field(value, "qos", int)
    if qos not in (0, 1, 2):
        raise BadRecord("will.qos: expected 0, 1 or 2")
    return Will(_field(value, "topic", str), payload, qos, _field(value, "retain", bool))


def _field(record: dict[str, Any], name: str, kind: type) -> Any:
    value = record.get(name)
    if type(value) is not kind:
        raise BadRecord(f"{name}: expected {kind.__name__}, got {type(value).__name__}")
    return value
