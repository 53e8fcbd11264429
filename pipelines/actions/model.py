"""An action as the fanout reads it from the ``actions`` table, and the messages it becomes on the wire."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from pipelines.actions.abort import AbortRule, abort_rules
from pipelines.actions.engine_tables import epoch_ms
from pipelines.actions.phases import Phase
from pipelines.actions.retries import RetryRule
from pipelines.actions.rollout import Pace
from pipelines.actions.schedule import Schedule, to_ms
from pipelines.actions.states import DEVICE_REPORTED_STATES, StatusReport

ALL_TOPIC = "actions/all"
DEFAULT_EXPIRY_S = 24 * 3600


def group_topic(group: str) -> str:
    return f"actions/groups/{group}"


def device_topic(device_id: str) -> str:
    return f"actions/devices/{device_id}"


@dataclass(frozen=True)
class Action:
    """One valid row of ``actions`` (docs/tables.md; ``validation.py`` says which rows are), with the
    defaults the fanout applies (a null column is the behaviour from before it existed)."""

    id: str
    kind: str
    device_ids: tuple[str, ...] = ()
    group: str | None = None
    all_devices: bool = False
    payload: dict[str, Any] = field(default_factory=dict)
    pace: Pace = field(default_factory=Pace)
    phases: tuple[Phase, ...] = ()
    abort_rules: tuple[AbortRule, ...] = ()
    retries: tuple[RetryRule, ...] = ()
    schedule: Schedule = field(default_factory=Schedule)
    continuous: bool = False
    rollback: dict[str, Any] | None = None
    """The firmware an abort sends back to the devices that installed this one (``rollback.py``)."""
    in_progress_timeout_s: int | None = None
    created_at_ms: int = 0
    cancel: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Action:
        target = row.get("target") or {}
        payload = {k: v for k, v in (row.get("payload") or {}).items() if v is not None}
        if isinstance(payload.get("args"), list):  # Arrow returns map<string,string> as key/value pairs
            payload["args"] = dict(payload["args"])
        rollback = {k: v for k, v in (row.get("rollback") or {}).items() if v is not None}
        return cls(
            id=row["id"],
            kind=row["kind"],
            device_ids=tuple(target.get("device_ids") or ()),
            group=target.get("group"),
            all_devices=bool(target.get("all")),
            payload=payload,
            pace=Pace.from_row(row),
            phases=tuple(Phase.from_row(item) for item in row.get("phases") or ()),
            abort_rules=abort_rules(row),
            retries=tuple(RetryRule.from_row(item) for item in row.get("retries") or ()),
            schedule=Schedule.from_row(row),
            continuous=bool(row.get("continuous")),
            rollback=rollback or None,
            in_progress_timeout_s=row.get("in_progress_timeout_s"),
            created_at_ms=to_ms(row.get("created_at")) or 0,
            cancel=bool(row.get("cancel")),
        )

    @property
    def build(self) -> str:
        """What the action does, as JSON (its kind and payload): what ``action_summary.accepted_payload``
        keeps of the row the job took the action in with."""
        return json.dumps({"kind": self.kind, **self.payload}, sort_keys=True, separators=(",", ":"))

    def with_build(self, build: str) -> Action:
        """This action doing what ``build`` (a :attr:`build`) says instead of what its row says."""
        payload = json.loads(build)
        return replace(self, kind=payload.pop("kind"), payload=payload)

    @property
    def max_per_minute(self) -> int | None:
        return self.pace.max_per_minute

    @property
    def staged(self) -> bool:
        """Sent over time rather than to every target at once: a rate, or phases."""
        return self.pace.paced or len(self.phases) > 1

    @property
    def clocked(self) -> bool:
        """Whether the ticker has anything to do for it: send over time or later, time devices out, retry
        them, take in devices that join."""
        return (
            self.staged
            or self.schedule.timed
            or bool(self.in_progress_timeout_s)
            or bool(self.retries)
            or self.continuous
        )

    @property
    def broadcast(self) -> bool:
        """Sent to every target at once (when its schedule lets it) rather than staged."""
        return not self.staged

    @property
    def shared_topic(self) -> str | None:
        """The one topic a group or ``all`` broadcast goes out on; None when sent per device.

        An explicit device list is never sent on a shared topic: every listed device gets the same small
        message on its own topic, so what a device receives does not grow with the size of the list. Only
        ``all_devices`` is every device: a row without a target is rejected before it gets here
        (``validation.py``), and would reach no device.
        """
        if self.device_ids or not self.broadcast:
            return None
        if self.all_devices:
            return ALL_TOPIC
        return group_topic(self.group) if self.group else None

    def expires_at(self, issued_at_ms: int, expiry_s: int = DEFAULT_EXPIRY_S) -> int:
        """When a message of this action issued at ``issued_at_ms`` expires: ``expiry_s`` after it was
        issued, or after the action was created if that is later (epoch ms)."""
        return max(self.created_at_ms, issued_at_ms) + expiry_s * 1000

    def message(
        self,
        issued_at_ms: int,
        listed: Sequence[str] | None = None,
        attempt: int = 1,
        expiry_s: int = DEFAULT_EXPIRY_S,
    ) -> bytes:
        """The action message devices receive (docs/device-protocol.md); with ``listed``, only the devices
        named in its ``device_ids`` act on it (a bucket topic's message); a retry says its ``attempt``.

        It expires ``expiry_s`` (a day by default, ``message_expiry_s``) after it was issued, or the action
        created if later (:meth:`expires_at`): a device that comes back after that does not act on it from
        the log, and the job ends the execution of a device that had not taken it ``EXPIRED``.
        """
        body: dict[str, Any] = {"action_id": self.id, "kind": self.kind, "issued_at": issued_at_ms}
        body["expires_at"] = self.expires_at(issued_at_ms, expiry_s)
        if attempt > 1:
            body["attempt"] = attempt
        body.update(self.payload)
        return _encoded(body, listed)

    def cancel_message(self, issued_at_ms: int, listed: Sequence[str] | None = None) -> bytes:
        """The cancel message; with ``listed``, for the devices named in its ``device_ids`` only."""
        return cancel_message(self.id, issued_at_ms, listed)


def cancel_message(action_id: str, issued_at_ms: int, listed: Sequence[str] | None = None) -> bytes:
    """The cancel message of action ``action_id`` (which needs nothing else of it); with ``listed``, for
    the devices named in its ``device_ids`` only."""
    return _encoded({"action_id": action_id, "kind": "cancel", "issued_at": issued_at_ms}, listed)


def _encoded(body: dict[str, Any], listed: Sequence[str] | None) -> bytes:
    if listed is not None:
        body["device_ids"] = list(listed)
    return json.dumps(body, separators=(",", ":")).encode()


INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1


def _text(value: object) -> str:
    """A report's id or state: a non-empty string (a number or a null is no id) that UTF-8 holds (JSON may
    escape half of a UTF-16 pair, ``\ud800``, which no column, device or action id holds)."""
    if not isinstance(value, str) or not value:
        raise ValueError("expected a non-empty string")
    value.encode()  # UnicodeEncodeError, a ValueError, for a lone surrogate
    return value


def _details(value: object) -> str:
    """A report's details as a column holds them: text of at most 1000 characters (other JSON as the JSON
    it is, null as none), a lone surrogate kept escaped (``\ud800``) rather than failing the write of every
    report of its batch."""
    text = value if isinstance(value, str) else "" if value is None else json.dumps(value, ensure_ascii=False)
    return text[:1000].encode("utf-8", "backslashreplace").decode()


def _whole(value: object, high: int, low: int = 0) -> int:
    """A report's whole number from ``low`` to ``high`` (a column's range): not a fraction, a boolean,
    NaN or an infinity, which no row can hold."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError("expected a whole number")
    if not isinstance(value, int | float | str):
        raise TypeError("expected a number")
    number = int(value)
    if not low <= number <= high:
        raise ValueError(f"{number} is out of range")
    return number


def parse_report(payload: bytes, received_at: int | None = None) -> StatusReport | None:
    """A device status report received at ``received_at`` (epoch ms), or None when the payload is not one (it
    is then counted and skipped): ids and state strings, ``seq`` (from 1) and ``ts`` 64-bit, ``attempt``
    from 1 and 32-bit, as the executions hold them."""
    try:
        data = json.loads(payload)
        attempt = data.get("attempt")
        report = StatusReport(
            action_id=_text(data["action_id"]),
            device_id=_text(data["device_id"]),
            state=_text(data["state"]),
            seq=_whole(data["seq"], INT64_MAX, 1),  # 0 is an execution's "no report yet"
            ts=_whole(data["ts"], INT64_MAX, -INT64_MAX),
            details=_details(data.get("details", "")),
            attempt=_whole(attempt, INT32_MAX, 1) if attempt is not None else None,
            received_at=received_at,
        )
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None  # ValueError: also not JSON, not UTF-8; RecursionError: nested past what json reads
    return report if report.state in DEVICE_REPORTED_STATES else None


def own_topic_device(topic: str | None) -> str | None:
    """The device whose own report topic ``devices/<id>/actions`` is ``topic`` (the earlier protocol's, which
    an ACL can give to that device alone), or None for any other topic (a bucket's, shared)."""
    parts = (topic or "").split("/")
    return parts[1] if len(parts) == 3 and parts[0] == "devices" and parts[2] == "actions" else None


REPORT_IDENTITIES = ("client_id", "payload")
"""How the job tells who sent a report (``report_identity`` in conf/actions.yaml)."""


def parse_reports(
    records: pa.Table, identity: str = "client_id", impostors: list[str] | None = None
) -> list[StatusReport]:
    """The reports among the ``timestone`` source's records (its ``payload`` and ``timestamp`` columns), each
    received when the broker appended its record; records that are not reports are left out, and so is a
    report on a device's own topic (``topic`` column, when read) that names another device: the topic's
    ACL (``%c``) is what says who sent it.

    On any other topic (a bucket's, shared) with ``identity`` ``client_id`` (and the ``client_id`` column
    read), a report is taken only from its device: one whose publisher's client id, as the broker recorded
    it, is not the ``device_id`` it names is left out, and described in ``impostors`` (``"<client id> for
    <device id>"``). With ``payload``, the ``device_id`` a report names is believed."""
    payloads = records.column("payload").to_pylist()
    received = epoch_ms(records.column("timestamp")).to_pylist()
    topics = _column(records, "topic")
    checked = identity == "client_id" and "client_id" in records.column_names
    senders = _column(records, "client_id")
    reports = []
    for payload, at, topic, sender in zip(payloads, received, topics, senders, strict=True):
        report = parse_report(payload, at)
        owner = own_topic_device(topic)
        if report is None or (owner is not None and owner != report.device_id):
            continue
        if checked and owner is None and sender != report.device_id:
            if impostors is not None:
                impostors.append(f"{sender} for {report.device_id}")
            continue
        reports.append(report)
    return reports


def _column(records: pa.Table, name: str) -> list[Any]:
    """The values of column ``name``, or None for each record when it was not read."""
    if name in records.column_names:
        return records.column(name).to_pylist()
    return [None] * records.num_rows
