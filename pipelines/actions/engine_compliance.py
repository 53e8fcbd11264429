"""The actions engine's ``fleet_compliance``: recomputed on a tick when a table it is made from
moved, at most every ``compliance_interval_s``."""

from __future__ import annotations

import logging

import pyarrow as pa

from pipelines.actions.compliance import (
    DEVICE_COLUMNS,
    SUCCESS_COLUMNS,
    compliance_rows,
    desired_versions,
    installed_counts,
    latest_installed,
)
from pipelines.actions.engine_base import EngineBase, _ts
from pipelines.actions.engine_tables import (
    ACTIONS,
    COMPLIANCE,
    DEVICES,
    EXECUTIONS,
    SUMMARY,
)
from pipelines.actions.model import Action
from pipelines.actions.states import (
    SUCCEEDED,
)
from sinks.store import Matching

log = logging.getLogger("pipelines.actions.engine")


class Compliance(EngineBase):
    """``fleet_compliance`` of :class:`~pipelines.actions.engine.ActionsEngine`."""

    def refresh_compliance(self) -> None:
        """Bring ``fleet_compliance`` up to date now, whenever it was last recomputed (the job does when it
        stops, so that the table does not keep the state of up to ``compliance_interval_s`` before)."""
        with self.lock:
            self._keep_compliance(self.clock(), every=0.0)

    def _keep_compliance(self, now: int, every: float | None = None) -> None:
        """Recompute ``fleet_compliance`` when a table it is made from moved, at most every
        ``compliance_interval_s``; groups and versions no device has any more are deleted."""
        interval = self.compliance_interval_s if every is None else every
        if now - self._compliance_at < interval * 1000:
            return
        inputs = tuple(self.tables.version(name) for name in (DEVICES, EXECUTIONS, SUMMARY, ACTIONS))
        if inputs == self._compliance_inputs:
            return
        actions = self._actions()
        states = {a: s for a, (s, _) in self._summary_states([a.id for a in actions]).items()}
        desired = desired_versions(actions, states)
        devices = self.store.scan_arrow(DEVICES, columns=DEVICE_COLUMNS)
        rows = compliance_rows(installed_counts(devices, self._installed(actions)), desired, _ts(now))
        fresh = {(row["group"], row["installed_version"]) for row in rows}
        held = self.tables.read(COMPLIANCE)
        gone = zip(held["group"].to_pylist(), held["installed_version"].to_pylist(), strict=True)
        rows += [
            {"group": g, "installed_version": v, "devices": 0, "on_desired": False, "updated_at": _ts(now)}
            for g, v in gone
            if (g, v) not in fresh
        ]
        if rows:
            self._tick_batch = max(self._tick_batch + 1, now)
            table = pa.Table.from_pylist(rows, schema=self.store.spec(COMPLIANCE).arrow_schema)
            self.store.merge(
                COMPLIANCE,
                table,
                f"{self.app_id}/compliance",
                self._tick_batch,
                delete_when="s.devices = 0",
                insert_when="s.devices > 0",
            )
        self._compliance_inputs, self._compliance_at = inputs, now

    def _installed(self, actions: list[Action]) -> pa.Table:
        """Per device, when and which version of the latest OTA action it succeeded, folded from the
        table's SUCCEEDED rows of OTA actions as they are read (``compliance.latest_installed``)."""
        versions = {a.id: str(a.payload.get("version")) for a in actions if a.kind == "ota"}
        where = (Matching("state", (SUCCEEDED,)), Matching("action_id", tuple(sorted(versions))))
        return latest_installed(
            self.store.scan_arrow(EXECUTIONS, where=where, columns=SUCCESS_COLUMNS), versions
        )
