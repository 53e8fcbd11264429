"""What an operator does to the ``actions`` table: create an action, cancel one, read the summaries.

Creating or canceling writes one row and nothing else: the fanout job picks it up from the table's change
feed. Both writes are idempotent per action id, so running the same command twice changes nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from pipelines.actions.arrow_rows import out_of_range, python_rows
from pipelines.actions.summary import FINAL_ACTION_STATES
from pipelines.actions.validation import check_action_row
from sinks.arrow_conform import SchemaMismatch
from sinks.spark_arrow import to_spark
from sinks.store import TableStore, command_write_id

OPERATOR_APP_ID = "operator"


@dataclass
class NewAction:
    """An action as an operator describes it; exactly one target (device ids, a group, or all)."""

    kind: str = "ota"
    device_ids: list[str] = field(default_factory=list)
    group: str | None = None
    all_devices: bool = False
    version: str | None = None
    url: str | None = None
    sha256: str | None = None
    size: int | None = None
    command: str | None = None
    args: dict[str, str] = field(default_factory=dict)
    max_per_minute: int | None = None
    failure_pct: float | None = None
    min_executed: int = 1
    in_progress_timeout_s: int | None = None
    created_by: str = "operator"
    action_id: str = field(default_factory=lambda: f"act-{uuid.uuid4().hex[:12]}")
    exponential_rate: dict[str, Any] | None = None
    """``base_per_minute``, ``increment_factor``, and ``notified_devices`` or ``succeeded_devices``."""
    phases: list[dict[str, Any]] = field(default_factory=list)
    """Each: ``percent`` or ``devices`` (none on the last), ``wait_s``, ``success_pct``."""
    abort_rules: list[dict[str, Any]] = field(default_factory=list)
    """Each: ``failure_kind``, ``threshold_pct``, ``min_executed``."""
    rollback: dict[str, Any] | None = None
    """``version``, ``url``, ``sha256``, ``size`` of the firmware to send back on abort."""
    retries: list[dict[str, Any]] = field(default_factory=list)
    """Each: ``failure_kind``, ``max_retries``, ``backoff_s``, ``backoff_factor``."""
    start_at: datetime | None = None
    end_at: datetime | None = None
    end_behavior: str | None = None
    maintenance_windows: list[dict[str, Any]] = field(default_factory=list)
    """Each: ``days`` (None: daily), ``start`` (HH:MM), ``duration_min``, ``time_zone``."""
    continuous: bool = False

    def validate(self) -> None:
        """Raise :class:`InvalidAction` naming the field, by the rules the actions job applies."""
        check_action_row(self.row(datetime.now(UTC)))

    def row(self, now: datetime) -> dict:
        return {
            "id": self.action_id,
            "kind": self.kind,
            "target": {"device_ids": self.device_ids or None, "group": self.group, "all": self.all_devices},
            "payload": {
                "version": self.version,
                "url": self.url,
                "sha256": self.sha256,
                "size": self.size,
                "command": self.command,
                "args": self.args or None,
            },
            "rollout": {
                "max_per_minute": self.max_per_minute,
                "broadcast": self.max_per_minute is None and self.exponential_rate is None,
            },
            "abort_criteria": {"failure_pct": self.failure_pct, "min_executed": self.min_executed},
            "in_progress_timeout_s": self.in_progress_timeout_s,
            "created_by": self.created_by,
            "created_at": now,
            "cancel": False,
            "updated_at": now,
            "exponential_rate": _struct(self.exponential_rate, EXPONENTIAL_FIELDS),
            "phases": [_struct(p, PHASE_FIELDS) for p in self.phases] or None,
            "abort_rules": [_struct(r, ABORT_RULE_FIELDS) for r in self.abort_rules] or None,
            "rollback": _struct(self.rollback, ROLLBACK_FIELDS),
            "retries": [_struct(r, RETRY_FIELDS) for r in self.retries] or None,
            "schedule": (
                {"start_at": self.start_at, "end_at": self.end_at, "end_behavior": self.end_behavior}
                if self.start_at or self.end_at or self.end_behavior
                else None
            ),
            "maintenance_windows": [_struct(w, WINDOW_FIELDS) for w in self.maintenance_windows] or None,
            "continuous": self.continuous or None,
        }


EXPONENTIAL_FIELDS = ("base_per_minute", "increment_factor", "notified_devices", "succeeded_devices")
PHASE_FIELDS = ("percent", "devices", "wait_s", "success_pct")
ABORT_RULE_FIELDS = ("failure_kind", "threshold_pct", "min_executed")
ROLLBACK_FIELDS = ("version", "url", "sha256", "size")
RETRY_FIELDS = ("failure_kind", "max_retries", "backoff_s", "backoff_factor")
WINDOW_FIELDS = ("days", "start", "duration_min", "time_zone")


def _struct(values: dict[str, Any] | None, names: tuple[str, ...]) -> dict[str, Any] | None:
    """A struct column's value with every field named, as the table holds it."""
    if values is None:
        return None
    return {**{name: None for name in names}, **values}


class ActionRefused(Exception):
    """What the operator asked contradicts the tables (the id is taken, the action ended, is unknown)."""


class UnknownAction(ActionRefused):
    pass


def read_actions(store: TableStore) -> pa.Table | None:
    """The ``actions`` table, or None while there is none. A table written by hand or by another tool may
    lack columns (but ``id``) and struct fields (they read as null); one holding a value of another kind
    than declared (an ``id`` of numbers, a ``target`` of text) is refused (``SchemaMismatch`` naming the
    column) before a row of it is read, as the actions job refuses it."""
    if not store.exists("actions"):
        return None
    table = store.read_arrow("actions")
    held = {f.name: f.dataType for f in to_spark(table.schema).fields}
    for declared in store.spec("actions").schema.fields:
        found = held.get(declared.name)
        if found is None and declared.name == "id":
            raise SchemaMismatch("actions.id: column missing (type string): no row can be named")
        if found is not None and not _readable_as(found, declared.dataType):
            raise SchemaMismatch(
                f"actions.{declared.name}: table has {found.simpleString()}, "
                f"spec says {declared.dataType.simpleString()}"
            )
    return table


def _readable_as(found: DataType, declared: DataType) -> bool:
    """Whether values of ``found`` read as ``declared`` ones: the same type, or a struct holding some of the
    declared fields (each readable as its own), an array or map of readable items."""
    if isinstance(declared, StructType):
        fields = {f.name: f.dataType for f in declared.fields}
        return isinstance(found, StructType) and all(
            _readable_as(f.dataType, fields[f.name]) for f in found.fields if f.name in fields
        )
    if isinstance(declared, ArrayType):
        return isinstance(found, ArrayType) and _readable_as(found.elementType, declared.elementType)
    if isinstance(declared, MapType):
        return (
            isinstance(found, MapType)
            and _readable_as(found.keyType, declared.keyType)
            and _readable_as(found.valueType, declared.valueType)
        )
    return found.simpleString() == declared.simpleString()


def action_row(store: TableStore, action_id: str) -> dict | None:
    """The latest ``actions`` row of ``action_id``, or None."""
    actions = read_actions(store)
    if actions is None:
        return None
    rows = python_rows(actions.filter(pc.equal(actions["id"], action_id)))
    return rows[-1] if rows else None


CONTENT_FIELDS = (
    "kind",
    "target",
    "payload",
    "rollout",
    "abort_criteria",
    "in_progress_timeout_s",
    "exponential_rate",
    "phases",
    "abort_rules",
    "rollback",
    "retries",
    "schedule",
    "maintenance_windows",
    "continuous",
)
"""The columns that say what an action does (not who wrote it or when): equal content, the same action."""


def action_content(row: dict) -> dict:
    content = {name: row.get(name) for name in CONTENT_FIELDS}
    payload = dict(content["payload"] or {})
    if isinstance(payload.get("args"), list):  # Arrow reads a map as key/value pairs
        payload["args"] = dict(payload["args"])
    content["payload"] = payload
    return content


def differences(stored: Any, given: Any, path: str = "") -> list[str]:
    """The dotted fields where two rows' values differ, each with both values."""
    if isinstance(stored, dict) and isinstance(given, dict):
        found = []
        for key in dict.fromkeys([*stored, *given]):
            found += differences(stored.get(key), given.get(key), f"{path}.{key}" if path else key)
        return found
    return [] if stored == given else [f"{path}: {stored!r} in the table, {given!r} here"]


def create_action(store: TableStore, action: NewAction) -> str:
    """Write the action's row and return its id.

    Checked first against the rules the actions job applies (``InvalidAction`` naming the field). An id
    already in the table with the same content is a retry and writes nothing; with other content it is
    refused (``ActionRefused`` naming the fields that differ), so a second action never hides behind the
    first's id.
    """
    action.validate()
    schema = store.spec("actions").arrow_schema
    table = pa.Table.from_pylist([action.row(datetime.now(UTC))], schema=schema)
    existing = action_row(store, action.action_id)
    if existing is not None:
        changed = differences(action_content(existing), action_content(table.to_pylist()[0]))
        if changed:
            raise ActionRefused(
                f"action {action.action_id} exists with other content ({'; '.join(changed)}): "
                "give the new action another --id"
            )
        return action.action_id
    store.merge("actions", table, command_write_id(f"{OPERATOR_APP_ID}/create"), 0, update=False)
    return action.action_id


def _refuse_unreadable(row: dict, action_id: str, verb: str) -> None:
    """A row holding a timestamp out of range is rejected by the job and never sent: nothing to change."""
    unreadable = out_of_range(row)
    if unreadable:
        raise ActionRefused(f"action {action_id}'s row cannot be read ({unreadable[0]}): nothing to {verb}")


def cancel_action(store: TableStore, action_id: str) -> bool:
    """Set the action's cancel flag: True when requested now, False when it already was.

    Raises ``UnknownAction``, or ``ActionRefused`` when the action has ended (completed, aborted, canceled,
    rejected): there is nothing left to cancel.
    """
    row = action_row(store, action_id)
    if row is None:
        raise UnknownAction(f"no action {action_id!r}")
    summary = next(iter(summaries(store, action_id)), None)
    if summary is not None and summary["action_state"] in FINAL_ACTION_STATES:
        raise ActionRefused(f"action {action_id} has ended ({summary['action_state']}): nothing to cancel")
    _refuse_unreadable(row, action_id, "cancel")
    store.ensure("actions")  # a table in another layout is refused (SchemaMismatch) before anything is read
    if row["cancel"]:
        return False
    row = dict(row, cancel=True, updated_at=datetime.now(UTC))
    table = pa.Table.from_pylist([row], schema=store.spec("actions").arrow_schema)
    store.merge(
        "actions",
        table,
        command_write_id(f"{OPERATOR_APP_ID}/cancel"),
        0,
        insert=False,
        update_set={"cancel": "s.cancel", "updated_at": "s.updated_at"},
    )
    return True


def end_action(store: TableStore, action_id: str, at: datetime | None = None) -> datetime:
    """Set the action's ``schedule.end_at`` (now, by default): from then on nothing new is sent, devices
    not sent it are canceled, and a continuous action takes in no more devices. Returns the end.

    Raises ``UnknownAction``, or ``ActionRefused`` when the action has ended already or ends earlier.
    """
    row = action_row(store, action_id)
    if row is None:
        raise UnknownAction(f"no action {action_id!r}")
    summary = next(iter(summaries(store, action_id)), None)
    if summary is not None and summary["action_state"] in FINAL_ACTION_STATES:
        raise ActionRefused(f"action {action_id} has ended ({summary['action_state']}): nothing to end")
    _refuse_unreadable(row, action_id, "end")
    store.ensure("actions")  # a table in another layout is refused (SchemaMismatch) before anything is read
    end = at or datetime.now(UTC)
    schedule = dict(row.get("schedule") or {"start_at": None, "end_behavior": None})
    if schedule.get("end_at") is not None and schedule["end_at"] <= end:
        raise ActionRefused(f"action {action_id} already ends at {schedule['end_at'].isoformat()}")
    schedule["end_at"] = end
    updated = dict(row, schedule=schedule, updated_at=datetime.now(UTC))
    check_action_row(updated)
    table = pa.Table.from_pylist([updated], schema=store.spec("actions").arrow_schema)
    store.merge(
        "actions",
        table,
        command_write_id(f"{OPERATOR_APP_ID}/end"),
        0,
        insert=False,
        update_set={"schedule": "s.schedule", "updated_at": "s.updated_at"},
    )
    return end


def device_groups(store: TableStore) -> set[str]:
    """The groups of the devices registered in ``devices`` (what a group target can reach now)."""
    if not store.exists("devices"):
        return set()
    groups: set[str | None] = set()
    for batch in store.scan_arrow("devices", columns=["group"]):  # the registry's groups, not its rows
        groups.update(batch.column("group").unique().to_pylist())
    return {group for group in groups if group is not None}


def summaries(store: TableStore, action_id: str | None = None) -> list[dict]:
    """Rows of ``action_summary`` (all, or one action's)."""
    if not store.exists("action_summary"):
        return []
    table = store.read_arrow("action_summary")
    if action_id is not None:
        table = table.filter(pc.equal(table["action_id"], action_id))
    return table.to_pylist()
