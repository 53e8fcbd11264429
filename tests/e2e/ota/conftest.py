"""Fixtures for the actions tests: a delta-rs table store in tmp_path and an action row builder."""

from __future__ import annotations

import itertools
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from broker_edge.runtime.launcher import BrokerProcess
from pipelines.actions.config import ActionsConfig, BrokerEndpoint
from pipelines.actions.job import ActionsJob, start_actions_job
from sinks import TableStore, open_table_store
from tests.fleet_harness import FleetHarness, FleetSpec

SHA256 = "0" * 64
FIRMWARE: dict[str, Any] = {"version": "2.0.0", "url": "https://example.invalid/fw.bin", "sha256": SHA256}
"""The firmware fields of a ``NewAction``."""
"""The firmware checksum of the test actions (devices refuse an OTA without one)."""


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
    **columns,
) -> dict:
    """One ``actions`` row as an operator would write it; ``columns``: the rollout columns (``phases``,
    ``abort_rules``, ``retries``, ``schedule``, ...) as the table holds them."""
    now = datetime.now(UTC)
    return {
        "id": action_id,
        "kind": kind,
        "target": {"device_ids": device_ids, "group": group, "all": all_devices},
        "payload": {
            "version": version,
            "url": f"https://example.invalid/fw-{version}.bin",
            "sha256": SHA256,
            "size": 1024,
            "command": None,
            "args": None,
        },
        "rollout": {
            "max_per_minute": max_per_minute,
            "broadcast": max_per_minute is None and not columns.get("exponential_rate"),
        },
        "abort_criteria": {"failure_pct": failure_pct, "min_executed": min_executed},
        "in_progress_timeout_s": timeout_s,
        "created_by": "tests",
        "created_at": now,
        "cancel": cancel,
        "updated_at": now,
        **columns,
    }


def write_actions(store, rows: list[dict], batch_id: int) -> None:
    table = pa.Table.from_pylist(rows, schema=store.spec("actions").arrow_schema)
    store.merge("actions", table, "tests/actions", batch_id)


def device_report(action_id: str, device_id: str, state: str, seq: int = 1) -> bytes:
    """A status report as a device sends it (docs/device-protocol.md)."""
    body = {"action_id": action_id, "device_id": device_id, "state": state, "seq": seq, "ts": 1}
    return json.dumps({**body, "details": ""}).encode()


_REGISTRATIONS = itertools.count()
"""The version of each ``register_devices`` write: a write of a version the table has seen is skipped."""


def register_devices(store, devices: dict[str, str]) -> None:
    """Rows of the ``devices`` table: device id -> group (each call a write of its own)."""
    now = datetime.now(UTC)
    rows = [
        {"device_id": d, "group": g, "last_seen": now, "firmware_version": "1.0.0"}
        for d, g in devices.items()
    ]
    store.append(
        "devices",
        pa.Table.from_pylist(rows, schema=store.spec("devices").arrow_schema),
        "tests",
        next(_REGISTRATIONS),
    )


@dataclass
class ActionsStack:
    """A broker process, a simulated fleet on it, and the actions job on the shared Spark session."""

    store: TableStore
    broker: BrokerProcess
    harness: FleetHarness
    job: ActionsJob
    spark: SparkSession
    config: ActionsConfig

    @property
    def fleet(self):
        return self.harness.fleet

    def restart_job(self) -> None:
        """Stop the job and start it again from its checkpoints, as after a crash or a redeploy."""
        self.job.stop()
        self.job = start_actions_job(self.spark, self.config, self.store)


@contextmanager
def actions_stack(spark, tmp_path, spec_kwargs: dict, behaviour, register: bool = True, job=None, **settings):
    """Start everything the actions job needs for real, and stop it all afterwards.

    ``settings`` are further ``ActionsConfig`` fields; ``job`` (``start_actions_job``'s signature) starts
    the job instead, e.g. after wrapping what it calls.
    """
    store = open_table_store(spark, str(tmp_path / "tables"), backend="delta-rs")
    with BrokerProcess(tmp_path / "broker") as broker:
        spec = FleetSpec(brokers=[broker.address], **spec_kwargs)
        with FleetHarness(broker.address, spec, behaviour) as harness:
            if register:
                register_devices(store, {d.device_id: d.group for d in harness.fleet.devices})
            config = ActionsConfig(
                tables_root=str(tmp_path / "tables"),
                checkpoint_root=str(tmp_path / "checkpoints"),
                brokers=[BrokerEndpoint(mqtt_port=broker.port, offsets_api=broker.offsets_url)],
                trigger_interval_s=0.5,
                tick_interval_s=0.5,
                device_buckets=spec.buckets,
                **settings,
            )
            stack = ActionsStack(
                store, broker, harness, (job or start_actions_job)(spark, config, store), spark, config
            )
            try:
                yield stack
            finally:
                stack.job.stop()


def wait_for(predicate, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def summary(store, action_id: str) -> dict | None:
    """The action's ``action_summary`` row, or None before the job wrote one."""
    if not store.exists("action_summary"):
        return None
    table = store.read_arrow("action_summary")
    rows = table.filter(pc.equal(table["action_id"], action_id)).to_pylist()
    return rows[0] if rows else None


def epoch_ms(value: datetime) -> int:
    """A table's timestamp (read back as a datetime) as the epoch milliseconds it was written as."""
    return round(value.timestamp() * 1000)
