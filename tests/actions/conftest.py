"""Fixtures for the actions tests: a delta-rs table store in tmp_path and an action row builder."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from sinks import open_table_store


@pytest.fixture
def table_store(tmp_path):
    """A delta-rs store (no Spark needed for the engine: it works on Arrow)."""
    return open_table_store(None, str(tmp_path / "tables"), backend="delta-rs")


def action_row(
    action_id: str,
    *,
    kind: str = "ota",
    version: str = "2.0.0",
    group: str | None = None,
    device_ids: list[str] | None = None,
    all_devices: bool = False,
    max_per_minute: int | None = None,
    failure_pct: float | None = None,
    min_executed: int = 1,
    timeout_s: int | None = None,
    cancel: bool = False,
) -> dict:
    """One ``actions`` row as an operator would write it."""
    now = datetime.now(UTC)
    return {
        "id": action_id,
        "kind": kind,
        "target": {"device_ids": device_ids, "group": group, "all": all_devices},
        "payload": {
            "version": version,
            "url": f"https://example.invalid/fw-{version}.bin",
            "sha256": "0" * 64,
            "size": 1024,
            "command": None,
            "args": None,
        },
        "rollout": {"max_per_minute": max_per_minute, "broadcast": max_per_minute is None},
        "abort_criteria": {"failure_pct": failure_pct, "min_executed": min_executed},
        "in_progress_timeout_s": timeout_s,
        "created_by": "tests",
        "created_at": now,
        "cancel": cancel,
        "updated_at": now,
    }


def write_actions(store, rows: list[dict], batch_id: int) -> None:
    table = pa.Table.from_pylist(rows, schema=store.spec("actions").arrow_schema)
    store.merge("actions", table, "tests/actions", batch_id)


def register_devices(store, devices: dict[str, str]) -> None:
    """Rows of the ``devices`` table: device id -> group."""
    now = datetime.now(UTC)
    rows = [
        {"device_id": d, "group": g, "last_seen": now, "firmware_version": "1.0.0"}
        for d, g in devices.items()
    ]
    store.append("devices", pa.Table.from_pylist(rows, schema=store.spec("devices").arrow_schema), "tests", 0)
