"""The fleet's compliance: per group, devices by installed firmware version against the desired one.

As Azure Device Update shows it: a group's desired version is the version of the latest OTA action for the
group (or for all devices) that was not aborted, canceled or rejected; each device's installed version is
the newer of what the ``devices`` registry says (the telemetry pipeline keeps its ``firmware_version``) and
the version of the latest OTA action the device SUCCEEDED, by when each was said, both on the brokers' clock:
the registry row's ``last_seen`` (when a broker took in the device's last reading, not when the pipeline wrote
the row: telemetry sent before a rollback and ingested after it must not undo the rollback) against the
execution's ``finished_at`` (when one took in its final report).
The actions job keeps the result in ``fleet_compliance``, one row per (group, installed version).

The inputs are the fleet and its history, so they are folded record batch by record batch as the tables
are read: what is held is one row per device that succeeded an OTA (:func:`latest_installed`) and a count
per (group, version) (:func:`installed_counts`), never the executions or the registry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.actions.engine_tables import epoch_ms
from pipelines.actions.model import Action
from pipelines.actions.summary import ACTION_ABORTED, ACTION_CANCELED, ACTION_REJECTED

__all__ = [
    "DEVICE_COLUMNS",
    "NO_GROUP",
    "SUCCESS_COLUMNS",
    "UNKNOWN_VERSION",
    "Desired",
    "compliance_rows",
    "desired_versions",
    "installed_counts",
    "latest_installed",
]

NO_GROUP = ""
"""The group of devices that have none."""
UNKNOWN_VERSION = "unknown"
ALL_GROUPS = None
NOT_DESIRED = frozenset({ACTION_ABORTED, ACTION_CANCELED, ACTION_REJECTED})
SUCCESS_COLUMNS = ("action_id", "device_id", "finished_at")
"""The columns of ``action_executions`` :func:`latest_installed` reads."""
DEVICE_COLUMNS = ("device_id", "group", "firmware_version", "last_seen", "updated_at")
"""The columns of ``devices`` :func:`installed_counts` reads."""
_INSTALLED = pa.schema([("device_id", pa.string()), ("finished_ms", pa.int64()), ("version", pa.string())])


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


def latest_installed(successes: Iterable[pa.RecordBatch], versions: Mapping[str, str]) -> pa.Table:
    """Per device, when (``finished_ms``, epoch ms; 0 when unknown) and which ``version`` it last
    succeeded an OTA: ``successes`` are the SUCCEEDED executions (:data:`SUCCESS_COLUMNS`) of the OTA
    actions ``versions`` maps to their version. One row per device is kept across batches."""
    held = _INSTALLED.empty_table()
    keys = pa.array(list(versions), pa.string())
    values = pa.array(list(versions.values()), pa.string())
    for batch in successes:
        version = pc.take(values, pc.index_in(batch.column("action_id"), value_set=keys))
        finished = pc.fill_null(epoch_ms(batch.column("finished_at")), 0)
        rows = pa.table([batch.column("device_id"), finished, version], schema=_INSTALLED)
        held = _latest_per_device(pa.concat_tables([held, rows.filter(pc.is_valid(version))]))
    return held


def _latest_per_device(table: pa.Table) -> pa.Table:
    """The row of each device with the latest ``finished_ms`` (of equal ones, the last)."""
    ordered = table.sort_by([("device_id", "ascending"), ("finished_ms", "ascending")])
    grouped = ordered.group_by("device_id", use_threads=False).aggregate(
        [("finished_ms", "last"), ("version", "last")]
    )
    columns = [grouped["device_id"], grouped["finished_ms_last"], grouped["version_last"]]
    return pa.table(columns, schema=_INSTALLED)


def installed_counts(devices: Iterable[pa.RecordBatch], installed: pa.Table) -> Counter[tuple[str, str]]:
    """Devices per (group, installed version): ``devices`` are rows of the registry
    (:data:`DEVICE_COLUMNS`; ``updated_at`` counts only for rows without ``last_seen``), ``installed`` is
    :func:`latest_installed`. A device's version is its last success when that is newer than the registry's
    reading (or the registry has none), else the registry's; neither: ``unknown``."""
    counts: Counter[tuple[str, str]] = Counter()
    for batch in devices:
        table = pa.Table.from_batches([batch]).join(installed, "device_id", join_type="left outer")
        seen = pc.coalesce(epoch_ms(table["last_seen"]), epoch_ms(table["updated_at"]), 0)
        registry = table["firmware_version"]
        newer = pc.and_kleene(
            pc.is_valid(table["version"]),
            pc.or_kleene(pc.is_null(registry), pc.greater_equal(table["finished_ms"], seen)),
        )
        version = pc.if_else(newer, table["version"], registry)
        version = pc.if_else(pc.equal(pc.fill_null(version, ""), ""), UNKNOWN_VERSION, version)
        group = pc.fill_null(table["group"], NO_GROUP)
        per_version = pa.table({"group": group, "version": version}).group_by(["group", "version"])
        counted = per_version.aggregate([("version", "count")])
        for key, number in zip(
            zip(counted["group"].to_pylist(), counted["version"].to_pylist(), strict=True),
            counted["version_count"].to_pylist(),
            strict=True,
        ):
            counts[key] += number
    return counts


def compliance_rows(
    counts: Mapping[tuple[str, str], int], desired: Mapping[str | None, Desired], now: datetime
) -> list[dict[str, Any]]:
    """Rows of ``fleet_compliance`` from the devices per (group, installed version)."""
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
