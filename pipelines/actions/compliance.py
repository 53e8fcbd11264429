"""The fleet's compliance: per group, devices by installed firmware version against the desired one.

As Azure Device Update shows it: a group's desired version is the version of the latest OTA action for the
group (or for all devices) that was not aborted, canceled or rejected; each device's installed version is
the newer of what the ``devices`` registry says (the telemetry pipeline keeps its ``firmware_version``) and
the version of the latest OTA action the device SUCCEEDED, by when the device said each: the registry row's
``last_seen`` (the device's own time of its last reading, not when the pipeline wrote the row: telemetry sent
before a rollback and ingested after it must not undo the rollback) against the execution's ``finished_at``.
The actions job keeps the result in ``fleet_compliance``, one row per (group, installed version).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pipelines.actions.model import Action
from pipelines.actions.schedule import to_ms
from pipelines.actions.summary import ACTION_ABORTED, ACTION_CANCELED, ACTION_REJECTED

__all__ = ["NO_GROUP", "UNKNOWN_VERSION", "Desired", "compliance_rows", "desired_versions"]

NO_GROUP = ""
"""The group of devices that have none."""
UNKNOWN_VERSION = "unknown"
ALL_GROUPS = None
NOT_DESIRED = frozenset({ACTION_ABORTED, ACTION_CANCELED, ACTION_REJECTED})


@dataclass(frozen=True)
class Desired:
    version: str
    action_id: str
    created_at_ms: int


def desired_versions(actions: Iterable[Action], states: Mapping[str, str]) -> dict[str | None, Desired]:
    """The latest wanted OTA per group (key None: an action for all devices), by ``created_at``."""
    out: dict[str | None, Desired] = {}
    for action in actions:
        if action.kind != "ota" or action.device_ids or states.get(action.id) in NOT_DESIRED or action.cancel:
            continue
        key = ALL_GROUPS if action.all_devices else action.group
        wanted = Desired(str(action.payload.get("version")), action.id, action.created_at_ms)
        held = out.get(key)
        if held is None or (wanted.created_at_ms, wanted.action_id) > (held.created_at_ms, held.action_id):
            out[key] = wanted
    return out


def compliance_rows(
    devices: Iterable[Mapping[str, Any]],
    desired: Mapping[str | None, Desired],
    installed: Mapping[str, tuple[int, str]],
    now: datetime,
) -> list[dict[str, Any]]:
    """Rows of ``fleet_compliance``.

    ``devices``: rows of the registry (``device_id``, ``group``, ``firmware_version``, ``last_seen``, and
    ``updated_at``, used only for rows without ``last_seen``);
    ``installed``: per device, (when, version) of the latest OTA it succeeded.
    """
    counts: Counter[tuple[str, str]] = Counter()
    for device in devices:
        version = device.get("firmware_version")
        seen_ms = to_ms(device.get("last_seen") or device.get("updated_at")) or 0
        succeeded = installed.get(device["device_id"])
        if succeeded is not None and (version is None or succeeded[0] >= seen_ms):
            version = succeeded[1]
        counts[(device.get("group") or NO_GROUP, version or UNKNOWN_VERSION)] += 1
    rows = []
    for (group, version), number in sorted(counts.items()):
        wanted = _desired_for(group, desired)
        rows.append(
            {
                "group": group,
                "installed_version": version,
                "devices": number,
                "desired_version": wanted.version if wanted else None,
                "desired_action_id": wanted.action_id if wanted else None,
                "on_desired": wanted is not None and wanted.version == version,
                "updated_at": now,
            }
        )
    return rows


def _desired_for(group: str, desired: Mapping[str | None, Desired]) -> Desired | None:
    own = desired.get(group) if group else None
    candidates = [d for d in (own, desired.get(ALL_GROUPS)) if d is not None]
    return max(candidates, key=lambda d: (d.created_at_ms, d.action_id), default=None)
