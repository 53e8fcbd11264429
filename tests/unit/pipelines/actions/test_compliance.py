"""The compliance view: desired version per group, installed per device, counted per group and version."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from pipelines.actions.compliance import (
    DEVICE_COLUMNS,
    SUCCESS_COLUMNS,
    compliance_rows,
    desired_versions,
    installed_counts,
    latest_installed,
)
from pipelines.actions.model import Action
from sinks.tables import DEFAULT_CATALOG

NOW = datetime(2026, 11, 25, tzinfo=UTC)
DEVICES = pa.schema([DEFAULT_CATALOG["devices"].arrow_schema.field(c) for c in DEVICE_COLUMNS])


def ota(action_id: str, version: str, created: int, group: str | None = None, **fields) -> Action:
    return Action(
        action_id,
        "ota",
        group=group,
        all_devices=group is None and not fields.get("device_ids"),
        payload={"version": version},
        created_at_ms=created,
        **fields,
    )


def test_the_latest_wanted_version_per_group_counts_and_all_applies_to_every_group():
    actions = [
        ota("a1", "2.0.0", 100, group="canary"),
        ota("a2", "2.1.0", 200, group="canary"),
        ota("a3", "3.0.0", 300, group="canary"),
        ota("a4", "1.5.0", 150),
        ota("a5", "9.9.9", 400, device_ids=("d1",)),
    ]
    desired = desired_versions(actions, {"a3": "ABORTED"})
    assert (desired["canary"].version, desired[None].version) == ("2.1.0", "1.5.0")
    assert "a5" not in {d.action_id for d in desired.values()}  # a device list sets no group's version


def test_devices_are_counted_by_the_newer_of_the_registry_reading_and_their_last_success():
    desired = desired_versions([ota("a1", "2.0.0", 100, group="canary")], {})
    devices = pa.Table.from_pylist(
        [
            {
                "device_id": "d1",
                "group": "canary",
                "firmware_version": "1.0.0",
                "updated_at": datetime(2026, 11, 1, tzinfo=UTC),
            },
            {
                "device_id": "d2",
                "group": "canary",
                "firmware_version": "1.0.0",
                "updated_at": datetime(2026, 11, 30, tzinfo=UTC),
            },
            {
                "device_id": "d5",  # its last reading was sent before the success, written after it
                "group": "canary",
                "firmware_version": "1.0.0",
                "last_seen": datetime(2026, 11, 5, tzinfo=UTC),
                "updated_at": datetime(2026, 11, 30, tzinfo=UTC),
            },
            {"device_id": "d3", "group": "canary", "firmware_version": None, "updated_at": None},
            {"device_id": "d4", "group": None, "firmware_version": "1.0.0", "updated_at": None},
        ],
        schema=DEVICES,
    )
    later_than_d1_seen = datetime(2026, 11, 10, tzinfo=UTC)
    successes = [
        success_batch([("a0", "d1", datetime(2026, 10, 1, tzinfo=UTC)), ("a1", "d2", later_than_d1_seen)]),
        success_batch([("a1", "d1", later_than_d1_seen), ("a1", "d5", later_than_d1_seen)]),
    ]
    installed = latest_installed(successes, {"a0": "1.5.0", "a1": "2.0.0"})
    assert sorted(installed.to_pylist(), key=lambda r: r["device_id"]) == [
        {"device_id": d, "finished_ms": int(later_than_d1_seen.timestamp() * 1000), "version": "2.0.0"}
        for d in ("d1", "d2", "d5")
    ]  # one row per device, its latest success, across batches

    counts = installed_counts(devices.to_batches(max_chunksize=2), installed)
    rows = compliance_rows(counts, desired, NOW)
    found = {
        (r["group"], r["installed_version"]): (r["devices"], r["desired_version"], r["on_desired"])
        for r in rows
    }
    assert found == {
        ("canary", "2.0.0"): (2, "2.0.0", True),  # d1, d5: the success is newer than the registry's reading
        ("canary", "1.0.0"): (1, "2.0.0", False),  # d2: the registry saw it on 1.0.0 since (rolled back)
        ("canary", "unknown"): (1, "2.0.0", False),
        ("", "1.0.0"): (1, None, False),  # no group, nothing desired
    }


def success_batch(rows: list[tuple[str, str, datetime]]) -> pa.RecordBatch:
    """SUCCEEDED executions as the table is read: (action, device, finished_at)."""
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(columns[0]), pa.array(columns[1]), pa.array(columns[2], pa.timestamp("us", "UTC"))],
        names=list(SUCCESS_COLUMNS),
    )
