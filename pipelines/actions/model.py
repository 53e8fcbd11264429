"""An action as the fanout reads it from the ``actions`` table, and the messages it becomes on the wire."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pipelines.actions.states import DEVICE_REPORTED_STATES, StatusReport
from pipelines.actions.summary import AbortCriteria

ALL_TOPIC = "actions/all"
DEFAULT_EXPIRY_S = 24 * 3600


def group_topic(group: str) -> str:
    return f"actions/groups/{group}"


def device_topic(device_id: str) -> str:
    return f"actions/devices/{device_id}"


def to_ms(value: datetime | int | None) -> int | None:
    """Epoch milliseconds of a table timestamp (timezone-aware datetimes from Arrow)."""
    if value is None or isinstance(value, int):
        return value
    return int(value.timestamp() * 1000)


@dataclass(frozen=True)
class Action:
    """One valid row of ``actions`` (docs/tables.md; ``validation.py`` says which rows are), with the
    defaults the fanout applies."""

    id: str
    kind: str
    device_ids: tuple[str, ...] = ()
    group: str | None = None
    all_devices: bool = False
    payload: dict[str, Any] = field(default_factory=dict)
    max_per_minute: int | None = None
    abort: AbortCriteria = field(default_factory=AbortCriteria)
    in_progress_timeout_s: int | None = None
    created_at_ms: int = 0
    cancel: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Action:
        target = row.get("target") or {}
        rollout = row.get("rollout") or {}
        abort = row.get("abort_criteria") or {}
        payload = {k: v for k, v in (row.get("payload") or {}).items() if v is not None}
        if isinstance(payload.get("args"), list):  # Arrow returns map<string,string> as key/value pairs
            payload["args"] = dict(payload["args"])
        broadcast = rollout.get("broadcast")
        max_per_minute = rollout.get("max_per_minute")
        return cls(
            id=row["id"],
            kind=row["kind"],
            device_ids=tuple(target.get("device_ids") or ()),
            group=target.get("group"),
            all_devices=bool(target.get("all")),
            payload=payload,
            max_per_minute=None if broadcast or not max_per_minute else int(max_per_minute),
            abort=AbortCriteria(abort.get("failure_pct"), int(abort.get("min_executed") or 1)),
            in_progress_timeout_s=row.get("in_progress_timeout_s"),
            created_at_ms=to_ms(row.get("created_at")) or 0,
            cancel=bool(row.get("cancel")),
        )

    @property
    def broadcast(self) -> bool:
        """Sent to every target at once rather than as a paced per-device rollout."""
        return self.max_per_minute is None

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

    def message(self, issued_at_ms: int, listed: Sequence[str] | None = None) -> bytes:
        """The action message devices receive (docs/device-protocol.md); with ``listed``, only the devices
        named in its ``device_ids`` act on it (a bucket topic's message)."""
        body: dict[str, Any] = {"action_id": self.id, "kind": self.kind, "issued_at": issued_at_ms}
        body["expires_at"] = (self.created_at_ms or issued_at_ms) + DEFAULT_EXPIRY_S * 1000
        body.update(self.payload)
        return _encoded(body, listed)

    def cancel_message(self, issued_at_ms: int, listed: Sequence[str] | None = None) -> bytes:
        """The cancel message; with ``listed``, for the devices named in its ``device_ids`` only."""
        return _encoded({"action_id": self.id, "kind": "cancel", "issued_at": issued_at_ms}, listed)


def _encoded(body: dict[str, Any], listed: Sequence[str] | None) -> bytes:
    if listed is not None:
        body["device_ids"] = list(listed)
    return json.dumps(body, separators=(",", ":")).encode()


def parse_report(payload: bytes) -> StatusReport | None:
    """A device status report, or None when the payload is not one (it is then counted and skipped)."""
    try:
        data = json.loads(payload)
        report = StatusReport(
            action_id=str(data["action_id"]),
            device_id=str(data["device_id"]),
            state=str(data["state"]),
            seq=int(data["seq"]),
            ts=int(data["ts"]),
            details=str(data.get("details", ""))[:1000],
        )
    except (ValueError, KeyError, TypeError):
        return None
    return report if report.state in DEVICE_REPORTED_STATES else None
