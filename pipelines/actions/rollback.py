"""The action an abort writes to roll its devices back: the previous firmware, to the devices that installed.

An ``ota`` action with a ``rollback`` (version, URL, checksum of the firmware to go back to) and abort
rules gets, when it is aborted, a second row in ``actions``: the same kind of action, targeting the devices
whose execution had SUCCEEDED and those that had the action without a final report (the cancel may reach
them after they installed it; one that did not is already at that version), sent to them at once. It is
an action like any other: checked by ``validation.py``, fanned out by the job from the table's change
feed, followed with ``timestone ota status``. Its id is the aborted action's with ``-rollback``
(shortened with a hash when that is too long). More devices than one action may list (a group's or every
device's) are rolled back by as many actions,
each listing the next devices by id: ``-rollback``, then ``-rollback-2``, ... Writing them again (a
replayed batch, a restarted job) finds them there and writes nothing. An id another action holds (an
operator's own ``<id>-rollback``) is never taken for a rollback: the abort's reason says that none was
written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.actions.checks import MAX_DEVICE_IDS, MAX_ID_LENGTH

__all__ = ["id_taken", "rollback_id", "rollback_row", "rollback_rows"]

SUFFIX = "-rollback"
CREATED_BY = "actions job: rollback of "
"""How a rollback row's ``created_by`` begins (the aborted action's id follows)."""


def rollback_id(action_id: str, part: int = 1) -> str:
    """The id of the rollback of ``action_id`` (its ``part``-th action, when it needs several)."""
    suffix = SUFFIX if part == 1 else f"{SUFFIX}-{part}"
    plain = action_id + suffix
    if len(plain) <= MAX_ID_LENGTH:
        return plain
    digest = hashlib.sha256(action_id.encode()).hexdigest()[:12]
    return f"{action_id[: MAX_ID_LENGTH - len(suffix) - 13]}-{digest}{suffix}"


def rollback_rows(
    action_id: str,
    firmware: Mapping[str, Any],
    installed: Sequence[str],
    in_progress_timeout_s: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """The ``actions`` rows sending ``firmware`` back to every device that ``installed`` the aborted action:
    one, or one per :data:`MAX_DEVICE_IDS` devices (by id) when more."""
    ids = sorted(installed)
    return [
        rollback_row(
            action_id, firmware, ids[start : start + MAX_DEVICE_IDS], in_progress_timeout_s, now, part
        )
        for part, start in enumerate(range(0, len(ids), MAX_DEVICE_IDS), start=1)
    ]


def rollback_row(
    action_id: str,
    firmware: Mapping[str, Any],
    installed: Sequence[str],
    in_progress_timeout_s: int | None,
    now: datetime,
    part: int = 1,
) -> dict[str, Any]:
    """The ``actions`` row sending ``firmware`` back to ``installed`` devices (at most as many as one action
    may list: :func:`rollback_rows` splits more), the ``part``-th of the rollback of ``action_id``."""
    return {
        "id": rollback_id(action_id, part),
        "kind": "ota",
        "target": {"device_ids": sorted(installed), "group": None, "all": False},
        "payload": {
            "version": firmware.get("version"),
            "url": firmware.get("url"),
            "sha256": firmware.get("sha256"),
            "size": firmware.get("size"),
            "command": None,
            "args": None,
        },
        "rollout": {"max_per_minute": None, "broadcast": True},
        "abort_criteria": None,
        "in_progress_timeout_s": in_progress_timeout_s,
        "created_by": f"{CREATED_BY}{action_id}",
        "created_at": now,
        "cancel": False,
        "updated_at": now,
    }


def id_taken(actions: pa.Table, row: Mapping[str, Any]) -> list[str]:
    """Why ``row`` (a rollback) cannot be written under its id: another writer's action holds it (empty when
    the id is free, or holds this job's rollback, written before a replay or restart)."""
    held = actions.filter(pc.equal(actions["id"], row["id"]))
    others = [by for by in held["created_by"].to_pylist() if by != row["created_by"]]
    if not others:
        return []
    return [
        f"id: {row['id']} is the id of another action (created by {others[0]}): write the rollback under "
        "another id"
    ]
