"""Persistent sessions as plain data: what a restart reads back (the format is in docs/broker.md).

Sans-IO: ``capture`` turns the router's persistent sessions into a JSON-ready document, ``parse`` checks a
decoded document and ``restore`` puts its sessions back into a router as offline sessions. Times come in as
numbers: ``now`` on the loop's clock (deadlines), ``wall`` in epoch seconds (the downtime between a write
and a read). ``broker_edge.runtime.session_store`` owns the file.

For logged topics a session is saved as log cursors, never as messages: the cursor of a topic is the first
offset the client has not acknowledged (the session's own cursor, lowered to the oldest logged message in
flight or queued), so a restored session reads everything after its last acknowledgement from the log.
Messages of topics that are not logged (QoS 0, topics outside the persistence rules) and shared-subscription
deliveries only ever lived in memory and are not saved.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker_edge.engine.routing.subscriptions import SubscriptionOptions
from broker_edge.engine.sessions.session import NEVER_EXPIRES, RELEASED, Inflight, Released, Session
from broker_edge.protocol.errors import MQTTError
from broker_edge.protocol.topics import parse_shared, topic_matches

if TYPE_CHECKING:
    from broker_edge.engine.routing.router import Router

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "NewerSnapshotVersion",
    "SavedSession",
    "Snapshot",
    "SnapshotError",
    "add_checks",
    "capture",
    "parse",
    "restore",
    "session_document",
]

FORMAT = "timestone-sessions"
FORMAT_VERSION = 1
"""Bumped when the document changes shape; a broker refuses a snapshot with a higher version."""


class SnapshotError(ValueError):
    """The document is not a sessions snapshot this broker can read."""


class NewerSnapshotVersion(SnapshotError):
    """The snapshot was written by a broker with a newer format (a downgrade): refused, never guessed at."""


@dataclass(slots=True)
class SavedSubscription:
    key: str
    """The filter as subscribed (``$share/<group>/<filter>`` included): the session's key for it."""
    group: str | None
    topic_filter: str
    options: SubscriptionOptions


@dataclass(slots=True)
class SavedSession:
    client_id: str
    username: str | None
    expiry_interval: int
    expires_in_s: float | None
    """Seconds left at ``Snapshot.written_at`` (None: never expires)."""
    subscriptions: list[SavedSubscription]
    cursors: dict[str, int]
    """Logged topic → first offset the client has not acknowledged."""
    log_offsets: bool = False
    """The client asked for the ``offset`` user property on deliveries (``Session.log_offsets``)."""
    releases: tuple[int, ...] = ()
    """Outgoing QoS 2 packet ids past PUBREC (PUBREL sent, PUBCOMP awaited): resent when it reconnects."""
    sent: tuple[tuple[int, str, int], ...] = ()
    """(packet id, topic, offset) of the logged QoS 2 deliveries in flight before PUBREC: sent again from the
    log with that id and DUP."""
    received: tuple[int, ...] = ()
    """Incoming QoS 2 packet ids held until PUBREL: a PUBLISH resent with one is answered, not routed."""


@dataclass(slots=True)
class Snapshot:
    written_at: float
    log_ends: dict[str, int]
    """Every log's end offset when written: records past it were appended later (before a crash), so the
    sessions that were caught up on that topic read them from there."""
    sessions: list[SavedSession]
    store_id: str | None = None
    """The store whose logs ``log_ends`` and the cursors are offsets of (None: not recorded)."""
    damaged: int = 0
    """Sessions left out because their entry failed its check (a damaged file that is still JSON)."""
    journal_from: int | None = None
    """The first generation of the incoming QoS 2 ids' journal written after it (``runtime.qos2_journal``;
    None: not recorded)."""
    log_positions: list[int] | None = None
    """Each storage partition's end position, taken just before ``log_ends``: the records since those ends
    are past them (``runtime.qos2_log_ids`` reads the partitions from there; None: not recorded)."""


# -- capture ----------------------------------------------------------------------------------------------


def capture(
    router: Router,
    log_ends: dict[str, int],
    now: float,
    wall: float,
    store_id: str | None = None,
    log_positions: list[int] | None = None,
) -> dict[str, Any]:
    """The document of every persistent session (Session Expiry Interval > 0), online or not; ``store_id``
    names the logs whose offsets its cursors and ``log_ends`` are, ``log_positions`` their partitions' end
    positions before ``log_ends`` was taken."""
    document: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "written_at": wall,
        "log_ends": log_ends,
        "sessions": [session_document(s, now) for s in router.sessions.values() if s.expiry_interval > 0],
    }
    if store_id is not None:
        document["store_id"] = store_id
    if log_positions is not None:
        document["log_positions"] = log_positions
    return document


def session_document(session: Session, now: float) -> dict[str, Any]:
    """One session's entry of the document (also what a cluster hands to the broker its client moves to)."""
    expiry = session.expiry_interval
    if expiry == NEVER_EXPIRES:
        expires_in = None
    elif session.expires_at is None:
        expires_in = float(expiry)  # online: the countdown starts when its connection ends
    else:
        expires_in = max(0.0, session.expires_at - now)
    document: dict[str, Any] = {
        "client_id": session.client_id,
        "username": session.username,
        "expiry_interval": expiry,
        "expires_in_s": expires_in,
        "subscriptions": [
            _subscription_document(key, entry.options) for key, entry in (session.subscriptions or {}).items()
        ],
        "cursors": _unacknowledged_offsets(session),
    }
    if session.log_offsets:
        document["log_offsets"] = True
    releases = sorted(key for key, entry in (session.inflight or {}).items() if isinstance(entry, Released))
    if releases:
        document["releases"] = releases
    sent = _sent_before_pubrec(session)
    if sent:
        document["sent"] = sent
    if session.answered_qos2:  # those whose PUBREC was sent: a publish still waiting for the log is not one
        document["received"] = sorted(session.answered_qos2)
    return document


_OPTION_DEFAULTS = SubscriptionOptions()
_OPTIONS = ("no_local", "retain_as_published", "retain_handling", "subscription_id")


def _subscription_document(key: str, options: SubscriptionOptions) -> dict[str, Any]:
    document: dict[str, Any] = {"filter": key, "qos": options.qos}
    for name in _OPTIONS:  # options at their default are left out: most subscriptions are two fields
        value = getattr(options, name)
        if value != getattr(_OPTION_DEFAULTS, name):
            document[name] = value
    return document


def _sent_before_pubrec(session: Session) -> list[list[Any]]:
    """[packet id, topic, offset] of each logged QoS 2 delivery in flight and not past PUBREC (or still to
    be sent again so), that the session's log cursor delivers again."""
    inflight = session.inflight
    if not inflight:
        return []
    sent = [
        [packet_id, entry[0].topic, entry[0].offset]
        for packet_id, entry in inflight.items()
        if not isinstance(entry, Released)
        and entry[1] == 2
        and entry[0].offset is not None
        and _reads_log(session, entry[0].topic)
    ]
    sent.extend(
        [packet_id, topic, offset]
        for (topic, offset), packet_id in (getattr(inflight, "resend_as", None) or {}).items()
    )
    return sorted(sent)


def _unacknowledged_offsets(session: Session) -> dict[str, int]:
    """Logged topic → first offset not acknowledged: the log cursor, lowered to the oldest logged message
    in flight (sent, no PUBACK/PUBREC yet) or queued, so those are delivered again from the log."""
    offsets = dict(session.cursors or {})
    held = [entry for entry in (session.inflight or {}).values() if not isinstance(entry, Released)]
    held.extend(session.queue or ())
    for message, *_ in held:
        offset = message.offset
        if offset is None or not _reads_log(session, message.topic):
            continue
        current = offsets.get(message.topic)
        if current is None or offset < current:
            offsets[message.topic] = offset
    return offsets


def _reads_log(session: Session, topic: str, min_qos: int = 0) -> bool:
    """Whether a log cursor on ``topic`` would deliver anything: a non-shared subscription of at least
    ``min_qos`` matches it (shared deliveries never come from a cursor)."""
    return any(
        entry.group is None and entry.options.qos >= min_qos and topic_matches(entry.topic_filter, topic)
        for entry in (session.subscriptions or {}).values()
    )


def _check_of(fields: dict[str, Any]) -> int:
    """The check of a part of the document: CRC-32 of its fields but ``check`` as canonical JSON."""
    canonical = json.dumps(
        {key: value for key, value in fields.items() if key != "check"}, separators=(",", ":"), sort_keys=True
    )
    return zlib.crc32(canonical.encode())


def add_checks(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (of ``capture``) with a ``check`` in each session's entry and one of the rest at the top,
    so that a flipped bit that leaves valid JSON (a client id, an offset) is found when it is read."""
    for entry in document["sessions"]:
        entry["check"] = _check_of(entry)
    document["check"] = _check_of({key: value for key, value in document.items() if key != "sessions"})
    return document


# -- parse ------------------------------------------------------------------------------------------------


def parse(document: Any) -> Snapshot:
    """Check a decoded document field by field; raises ``SnapshotError`` (``NewerSnapshotVersion``)."""
    top = _mapping(document, "document")
    if top.get("format") != FORMAT:
        raise SnapshotError(f"not a sessions snapshot (format {top.get('format')!r})")
    version = _typed(top, "version", int, "document")
    if version > FORMAT_VERSION:
        raise NewerSnapshotVersion(
            f"format version {version} is newer than this broker reads (up to {FORMAT_VERSION})"
        )
    if version < 1:
        raise SnapshotError(f"unknown format version {version}")
    check = _typed(top, "check", (int, type(None)), "document", None)
    if check is not None and check != _check_of(
        {key: value for key, value in top.items() if key != "sessions"}
    ):
        raise SnapshotError("its check fails: the document is damaged")
    log_ends = _offsets(top.get("log_ends"), "log_ends")
    sessions = top.get("sessions")
    if not isinstance(sessions, list):
        raise SnapshotError("sessions: expected a list")
    intact = [entry for entry in sessions if not isinstance(entry, dict) or _intact(entry)]
    return Snapshot(
        float(_typed(top, "written_at", (int, float), "document")),
        log_ends,
        [_parse_session(entry, index) for index, entry in enumerate(intact)],
        _typed(top, "store_id", (str, type(None)), "document", None),
        len(sessions) - len(intact),
        _typed(top, "journal_from", (int, type(None)), "document", None),
        _positions(top.get("log_positions")),
    )


def _intact(entry: dict[str, Any]) -> bool:
    """Whether a session's entry passes its check (an entry without one, of an earlier broker, does)."""
    check = entry.get("check")
    return check is None or check == _check_of(entry)


def _parse_session(entry: Any, index: int) -> SavedSession:
    where = f"sessions[{index}]"
    fields = _mapping(entry, where)
    cursors = _offsets(fields.get("cursors", {}), f"{where}.cursors")
    subscriptions = fields.get("subscriptions", [])
    if not isinstance(subscriptions, list):
        raise SnapshotError(f"{where}.subscriptions: expected a list")
    expires_in = _typed(fields, "expires_in_s", (int, float, type(None)), where)
    return SavedSession(
        _typed(fields, "client_id", str, where),
        _typed(fields, "username", (str, type(None)), where),
        _typed(fields, "expiry_interval", int, where),
        None if expires_in is None else float(expires_in),
        [_parse_subscription(sub, f"{where}.subscriptions[{i}]") for i, sub in enumerate(subscriptions)],
        cursors,
        _typed(fields, "log_offsets", bool, where, False),
        _packet_ids(fields.get("releases", []), f"{where}.releases"),
        _sent(fields.get("sent", []), f"{where}.sent"),
        _packet_ids(fields.get("received", []), f"{where}.received"),
    )


def _packet_ids(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(item, int) and not isinstance(item, bool) and 0 < item < 65536 for item in value
    ):
        raise SnapshotError(f"{where}: expected a list of packet ids, got {value!r}")
    return tuple(value)


def _sent(value: Any, where: str) -> tuple[tuple[int, str, int], ...]:
    if not isinstance(value, list):
        raise SnapshotError(f"{where}: expected a list, got {value!r}")
    sent = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[1], str)):
            raise SnapshotError(f"{where}: expected [packet id, topic, offset], got {item!r}")
        _packet_ids([item[0]], where)
        if not isinstance(item[2], int) or isinstance(item[2], bool) or item[2] < 0:
            raise SnapshotError(f"{where}: expected an offset, got {item[2]!r}")
        sent.append((item[0], item[1], item[2]))
    return tuple(sent)


def _parse_subscription(entry: Any, where: str) -> SavedSubscription:
    fields = _mapping(entry, where)
    key = _typed(fields, "filter", str, where)
    try:
        group, topic_filter = parse_shared(key)
    except MQTTError as exc:
        raise SnapshotError(f"{where}.filter: {exc}") from None
    options = SubscriptionOptions(
        _typed(fields, "qos", int, where),
        _typed(fields, "no_local", bool, where, False),
        _typed(fields, "retain_as_published", bool, where, False),
        _typed(fields, "retain_handling", int, where, 0),
        _typed(fields, "subscription_id", (int, type(None)), where, None),
    )
    if not 0 <= options.qos <= 2:
        raise SnapshotError(f"{where}.qos: expected 0, 1 or 2, got {options.qos}")
    return SavedSubscription(key, group, topic_filter, options)


_REQUIRED = object()


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SnapshotError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _offsets(value: Any, where: str) -> dict[str, int]:
    """A mapping of topic → offset."""
    offsets = _mapping(value, where)
    for topic in offsets:
        _typed(offsets, topic, int, where)
    return offsets


def _positions(value: Any) -> list[int] | None:
    """A list of partition positions, or None (not recorded)."""
    if value is None:
        return None
    if not isinstance(value, list) or any(type(p) is not int or p < 0 for p in value):
        raise SnapshotError(f"log_positions: expected a list of positions, got {value!r}")
    return value


def _typed(fields: dict[str, Any], name: str, kinds: Any, where: str, default: Any = _REQUIRED) -> Any:
    """``fields[name]`` if it has one of ``kinds`` (a bool is not an int here), else ``SnapshotError``."""
    value = fields.get(name, default)
    if value is _REQUIRED:
        raise SnapshotError(f"{where}.{name}: missing")
    allowed = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise SnapshotError(f"{where}.{name}: unexpected {type(value).__name__} {value!r}")
    return value


# -- restore ----------------------------------------------------------------------------------------------


def _restore_window(session: Session, saved: SavedSession) -> None:
    """The in-flight window of a restored session: its released ids (PUBREL sent again) and the ids its
    QoS 2 deliveries not past PUBREC are sent again with, when the log gives them again."""
    inflight = session.inflight = Inflight(dict.fromkeys(saved.releases, RELEASED))
    resend_as = {(topic, offset): packet_id for packet_id, topic, offset in saved.sent}
    inflight.resend_as = {key: packet_id for key, packet_id in resend_as.items() if packet_id not in inflight}
    inflight.resend_as = inflight.resend_as or None
    ids = [*saved.releases, *(packet_id for packet_id, _, _ in saved.sent)]
    inflight.next_id = max(ids) % 0xFFFF + 1  # a window is never without it


def restore(
    router: Router,
    snapshot: Snapshot,
    log_ends: dict[str, int],
    now: float,
    wall: float,
    max_expiry_s: int,
    can_subscribe: Callable[[str, str | None, str], bool] | None = None,
    max_persistent: int = 0,
    store_id: str | None = None,
) -> tuple[int, int, int, int]:
    """Put the snapshot's sessions into ``router`` as offline sessions; returns (restored, expired, over
    the bound, cursors moved back): at most ``max_persistent`` persistent sessions in all (0: no bound), the
    first ones kept.

    Deadlines continue from the snapshot (the downtime counts), capped by the current ``max_expiry_s``.
    ``log_ends`` are the logs' end offsets now; a log that grew past its end in the snapshot (appends between
    the last write and a crash) is read from there by every session subscribed to it without a cursor.
    A cursor past its log's end now, of a log that ends below its end in the snapshot or of another store
    than ``store_id`` (the logs wiped or replaced since), is moved back to that end: the offsets from there
    name records the session never saw. ``can_subscribe`` (the current ACL) drops subscriptions it no
    longer allows.
    """
    elapsed = max(0.0, wall - snapshot.written_at)
    grown = {
        topic: snapshot.log_ends.get(topic, 0)
        for topic, end in log_ends.items()
        if end > snapshot.log_ends.get(topic, 0)
    }
    replaced = snapshot.store_id is not None and store_id is not None and snapshot.store_id != store_id
    restored = expired = over = moved = 0
    for saved in snapshot.sessions:
        if saved.client_id in router.sessions:
            continue
        if max_persistent and router.persistent_count >= max_persistent:
            over += 1
            continue
        expiry = min(saved.expiry_interval, max_expiry_s)
        expires_at: float | None = None
        if expiry != NEVER_EXPIRES:
            left = expiry if saved.expires_in_s is None else min(saved.expires_in_s, expiry)
            if left - elapsed <= 0:
                expired += 1
                continue
            expires_at = now + left - elapsed
        session = router.restore_session(saved.client_id, expiry, expires_at, saved.username)
        session.log_offsets = saved.log_offsets
        if saved.releases or saved.sent:  # resent with their ids when it reconnects [MQTT-4.4.0-1]
            _restore_window(session, saved)
        session.restore_incoming(saved.received)  # a resent PUBLISH: PUBREC, never routed twice
        for sub in saved.subscriptions:
            if can_subscribe is None or can_subscribe(saved.client_id, saved.username, sub.topic_filter):
                router.subscribe(session, sub.key, sub.topic_filter, sub.group, sub.options)
        cursors = dict(saved.cursors)
        for topic, since in saved.cursors.items():
            end = log_ends.get(topic, 0)
            if since > end and (replaced or (topic in log_ends and end < snapshot.log_ends.get(topic, end))):
                cursors[topic] = end
                moved += 1
        for topic, since in grown.items():
            if topic not in cursors and _reads_log(session, topic, min_qos=1):  # QoS 0 is not kept offline
                cursors[topic] = since
        session.cursors = cursors or None
        restored += 1
    return restored, expired, over, moved
