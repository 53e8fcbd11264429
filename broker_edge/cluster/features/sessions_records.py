"""Who holds each client id's session in a cluster, as plain data: the records kept in etcd.

``<prefix>/sessions/<client_id>`` holds one ``SessionRecord`` (JSON): the node holding the session, a
generation counted up by every CONNECT of the client id anywhere, the owner identity (the user name, or the
certificate's CN, that the standalone broker's session-owner rule compares), the Session Expiry Interval,
the will of its current connection (until it is published or cancelled) and, for a persistent session, its
saved state: the subscriptions and the log position of every topic it reads, so that another broker can
restore it after the holder died. Records are written by compare-and-swap only, and are not bound to a
lease: a persistent session outlives the broker that held it.

Sans-IO: nothing here talks to etcd or reads a clock; times come in as numbers (``wall``: epoch seconds).
``broker_edge.cluster.features.sessions`` does the I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from broker_edge.cluster.coordination.etcd_values import load_json
from broker_edge.cluster.links.link_wire import decode_parts
from broker_edge.cluster.links.peer_link import decode_unlogged, encode_unlogged
from broker_edge.engine.message import Message, forwarded_properties
from broker_edge.engine.sessions.session import NEVER_EXPIRES
from broker_edge.engine.sessions.snapshot import FORMAT, FORMAT_VERSION, parse, restore, session_document
from broker_edge.settings.cluster import NODE_ID

if TYPE_CHECKING:
    from broker_edge.engine.routing.router import Router
    from broker_edge.engine.sessions.session import Session
    from broker_edge.log_info import LogInfo
    from broker_edge.protocol.packets import Will

__all__ = [
    "SavedWill",
    "SessionRecord",
    "restore_saved_session",
    "saved_session",
    "will_message",
    "will_to_save",
]


@dataclass(frozen=True, slots=True)
class SavedWill:
    """A connection's will as the registry keeps it, so that any broker can publish it."""

    publish: bytes
    """The will publish as the peer link's ``UNLOGGED`` part (topic, payload, QoS, retain, properties,
    Message Expiry Interval): the format brokers already exchange publishes in."""
    delay: int
    """Seconds between the connection's end and the will's publication (0 when the session ends with the
    connection: a will is never delayed past its session's end)."""
    due_at: float | None = None
    """When it is to be published (epoch seconds), set once the connection has ended; None while the
    connection is open (a survivor counts ``delay`` from when it learns that the holder died)."""

    def due(self, noticed_at: float) -> float:
        """When to publish it if the connection ended no later than ``noticed_at``."""
        return self.due_at if self.due_at is not None else noticed_at + self.delay

    def to_document(self) -> dict[str, Any]:
        publish = base64.b64encode(self.publish).decode()
        return {"publish": publish, "delay": self.delay, "due_at": self.due_at}

    @classmethod
    def from_document(cls, document: Any) -> SavedWill:
        fields = _mapping(document, "will")
        due_at = fields.get("due_at")
        if due_at is not None and not isinstance(due_at, (int, float)):
            raise ValueError("will.due_at: expected a number or null")
        delay = _typed(fields, "delay", int)
        if not 0 <= delay <= NEVER_EXPIRES:
            raise ValueError(f"will.delay: out of range, got {delay}")
        try:
            publish = base64.b64decode(_typed(fields, "publish", str), validate=True)
        except binascii.Error:
            raise ValueError("will.publish: not base64") from None
        return cls(publish, delay, due_at)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """One client id's entry of the registry (see the module docstring)."""

    node: str
    generation: int
    owner: str | None
    expiry_interval: int
    will: SavedWill | None = None
    state: dict[str, Any] | None = None
    """The session as ``saved_session`` made it (persistent sessions only; None until first saved)."""
    saved_at: float | None = None
    """When ``state`` was taken (epoch seconds)."""

    @property
    def persistent(self) -> bool:
        return self.expiry_interval > 0

    def held_by(self, node: str, generation: int) -> bool:
        """Whether the record is still the one ``node`` wrote for the CONNECT numbered ``generation``."""
        return self.node == node and self.generation == generation

    def without_will(self) -> SessionRecord:
        return replace(self, will=None)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "node": self.node,
                "generation": self.generation,
                "owner": self.owner,
                "expiry_interval": self.expiry_interval,
                "persistent": self.persistent,
                "will": None if self.will is None else self.will.to_document(),
                "state": self.state,
                "saved_at": self.saved_at,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> SessionRecord:
        """Parse a record; ``ValueError`` naming the field when it is not one."""
        fields = load_json(data, "record")
        owner = fields.get("owner")
        if owner is not None and not isinstance(owner, str):
            raise ValueError("owner: expected a string or null")
        will = fields.get("will")
        state = fields.get("state")
        if state is not None:
            _mapping(state, "state")
        saved_at = fields.get("saved_at")
        if saved_at is not None and not isinstance(saved_at, (int, float)):
            raise ValueError("saved_at: expected a number or null")
        node = _typed(fields, "node", str)
        if not NODE_ID.match(node):
            raise ValueError(f"node: expected a node id, got {node[:64]!r}")
        generation = _typed(fields, "generation", int)
        expiry_interval = _typed(fields, "expiry_interval", int)
        if not 0 <= generation < 2**63 or not 0 <= expiry_interval <= NEVER_EXPIRES:
            raise ValueError("generation or expiry_interval: out of range")
        return cls(
            node,
            generation,
            owner,
            expiry_interval,
            None if will is None else SavedWill.from_document(will),
            state,
            saved_at,
        )


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _typed(fields: dict[str, Any], name: str, kind: type) -> Any:
    value = fields.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ValueError(f"{name}: expected {kind.__name__}, got {value!r}")
    return value


# -- wills ------------------------------------------------------------------------------------------------


def will_to_save(will: Will, client_id: str, will_delay: int, expiry_interval: int, now: float) -> SavedWill:
    """The registry's copy of a CONNECT's will. Its delay follows the standalone rule: none when the
    session ends with the connection, and never past the session's end. ``now`` is the monotonic clock
    (``time.monotonic`` or the loop's), which ``Message.expiry_left`` counts the Message Expiry Interval
    against."""
    properties, expiry = forwarded_properties(will.properties)
    expires_at = None if expiry is None else now + expiry
    message = Message(
        will.topic, will.payload, will.qos, will.retain, properties, client_id, None, expires_at
    )
    if expiry_interval == 0:
        delay = 0
    elif expiry_interval == NEVER_EXPIRES:
        delay = will_delay
    else:
        delay = min(will_delay, expiry_interval)
    return SavedWill(encode_unlogged(message), max(0, delay))


def will_message(will: SavedWill, now: float) -> Message:
    """The will as a publish to send now; ``now`` is the loop's clock (its expiry counts from it)."""
    parts = decode_parts(will.publish)
    if len(parts) != 1:
        raise ValueError("will.publish: expected one publish")
    return decode_unlogged(parts[0][1], now)


# -- saved state ------------------------------------------------------------------------------------------


def saved_session(session: Session, logs: Callable[[str], list[LogInfo]], now: float) -> dict[str, Any]:
    """What another broker needs to go on with ``session``: its snapshot entry (subscriptions, options,
    first unacknowledged offset of the topics it is behind on), plus the log end of every other topic its
    non-shared QoS 1/2 subscriptions read. A broker restoring it then redelivers everything after those
    positions, and reads from their start the topics that did not exist yet.

    ``logs(filter)`` lists the logs a filter matches with their committed ends (``LogStore.logs``)."""
    document = session_document(session, now)
    # the countdown of an offline session is not kept: the CONNECT that resumes it sets its expiry anew,
    # and a document that changed only by it would be written again at every save
    document["expires_in_s"] = None
    cursors: dict[str, int] = document["cursors"]
    for entry in (session.subscriptions or {}).values():
        if entry.group is not None or entry.options.qos == 0:
            continue  # shared deliveries and QoS 0 are never read back from the log
        for info in logs(entry.topic_filter):
            cursors.setdefault(info.topic, info.end_offset)
    return document


def restore_saved_session(
    router: Router,
    state: dict[str, Any],
    logs: Callable[[str], list[LogInfo]],
    now: float,
    max_expiry_s: int,
    can_subscribe: Callable[[str, str | None, str], bool] | None = None,
) -> bool:
    """Put a session ``saved_session`` made into ``router`` as an offline session (the CONNECT that asked
    for it resumes it at once); topics its subscriptions read that have a log here and no saved position
    (created since) are read from their start. ``logs`` as for ``saved_session``. False when it has
    expired; ``ValueError`` when the document is not a saved session."""
    snapshot = parse(
        {"format": FORMAT, "version": FORMAT_VERSION, "written_at": 0.0, "log_ends": {}, "sessions": [state]}
    )
    log_ends: dict[str, int] = {}
    for subscription in snapshot.sessions[0].subscriptions:
        if subscription.group is None:
            log_ends.update((info.topic, info.end_offset) for info in logs(subscription.topic_filter))
    restored, _, _, _ = restore(router, snapshot, log_ends, now, 0.0, max_expiry_s, can_subscribe)
    return restored == 1
