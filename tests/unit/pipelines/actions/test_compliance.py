"""The compliance view: desired version per group, installed per device, counted per group and version."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pipelines.actions.compliance import compliance_rows, desired_versions
from pipelines.actions.model import Action

NOW = datetime(2026, 11, 25, tzinfo=UTC)


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
    devices: list[dict[str, Any]] = [
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
    ]
    later_than_d1_seen = int(datetime(2026, 11, 10, tzinfo=UTC).timestamp() * 1000)
    installed = {d: (later_than_d1_seen, "2.0.0") for d in ("d1", "d2", "d5")}
    rows = compliance_rows(devices, desired, installed, NOW)
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
