"""What an operator does to the ``actions`` table: create an action, cancel one, read the summaries.

Creating or canceling writes one row and nothing else: the fanout job picks it up from the table's change
feed. Both writes are idempotent per action id, so running the same command twice changes nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.actions.validation import check_action_row
from sinks.store import TableStore

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
            "rollout": {"max_per_minute": self.max_per_minute, "broadcast": self.max_per_minute is None},
            "abort_criteria": {"failure_pct": self.failure_pct, "min_executed": self.min_executed},
            "in_progress_timeout_s": self.in_progress_timeout_s,
            "created_by": self.created_by,
            "created_at": now,
            "cancel": False,
            "updated_at": now,
        }


def create_action(store: TableStore, action: NewAction) -> str:
    """Write the action's row (once per action id) and return its id."""
    action.validate()
    table = pa.Table.from_pylist([action.row(datetime.now(UTC))], schema=store.spec("actions").arrow_schema)
    store.merge("actions", table, f"{OPERATOR_APP_ID}/create/{action.action_id}", 0, update=False)
    return action.action_id


def cancel_action(store: TableStore, action_id: str) -> bool:
    """Set the action's cancel flag; False when there is no such action."""
    if not store.exists("actions"):
        return False
    actions = store.read_arrow("actions")
    rows = actions.filter(pc.equal(actions["id"], action_id)).to_pylist()
    if not rows:
        return False
    row = dict(rows[-1], cancel=True, updated_at=datetime.now(UTC))
    table = pa.Table.from_pylist([row], schema=store.spec("actions").arrow_schema)
    store.merge(
        "actions",
        table,
        f"{OPERATOR_APP_ID}/cancel/{action_id}",
        0,
        insert=False,
        update_set={"cancel": "s.cancel", "updated_at": "s.updated_at"},
    )
    return True


def summaries(store: TableStore, action_id: str | None = None) -> list[dict]:
    """Rows of ``action_summary`` (all, or one action's)."""
    if not store.exists("action_summary"):
        return []
    table = store.read_arrow("action_summary")
    if action_id is not None:
        table = table.filter(pc.equal(table["action_id"], action_id))
    return table.to_pylist()
