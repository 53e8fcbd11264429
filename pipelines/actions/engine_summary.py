"""The actions engine's summaries: ``action_summary`` recomputed from the executions, an action
stopped when an abort rule fires or its phase gate is lost, and its rollback written."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping

import pyarrow as pa

from pipelines.actions.abort import first_fired
from pipelines.actions.engine_base import _devices, _reached_and_open, _ts, _utc
from pipelines.actions.engine_sending import Sending
from pipelines.actions.engine_tables import (
    ACTIONS,
    SUMMARY,
)
from pipelines.actions.model import Action
from pipelines.actions.rollback import id_taken, rollback_rows
from pipelines.actions.states import CANCELED, EXPIRED, SUCCEEDED
from pipelines.actions.summary import (
    ACTION_ABORTED,
    ACTION_CANCELED,
    ACTION_COMPLETED,
    ACTION_IN_PROGRESS,
    ACTION_REJECTED,
    FINAL_ACTION_STATES,
    action_state,
    state_counts,
)
from pipelines.actions.validation import problems

log = logging.getLogger("pipelines.actions.engine")


class Summaries(Sending):
    """Summaries, aborts and rollbacks of :class:`~pipelines.actions.engine.ActionsEngine`."""

    def _summarise(
        self,
        action_ids: list[str],
        app_id: str,
        batch_id: int,
        counted: dict[str, Counter] | None = None,
        rejected: Mapping[str, str] | None = None,
        lost: Mapping[str, tuple[int, str]] | None = None,
        canceled: Mapping[str, str] | None = None,
        completed: Mapping[str, str] | None = None,
    ) -> None:
        """Recompute the summary of ``action_ids``; an action crossing an abort threshold, or whose phase
        gate can no longer open (``lost``: the phase and why), is stopped (and rolled back when it says so).

        ``counted``: the executions per state of each action as just written (from the batch's own read of
        the table and its changes), so that the table is not read again; counted from the table when None.
        ``rejected``: actions whose rows were refused, with the reason; ``canceled``: actions canceled
        otherwise than by their row, with the reason; ``completed``: actions that ended without a device to
        send them to, with the reason. A final state and its reason, once written, stay.
        """
        rejected = rejected or {}
        completed = completed or {}
        lost = lost or {}
        canceled = canceled or {}
        actions = {a.id: a for a in self._actions(action_ids)}
        previous = self.tables.summary_rows(action_ids)
        if counted is None:
            counted = self.tables.state_counts(action_ids)
        now = self.clock()
        summaries: dict[str, dict] = {}
        aborted = []
        for action_id in action_ids:
            action = actions.get(action_id)
            counts = counted.get(action_id) or state_counts([])
            before = previous.get(action_id, {})
            summary = {
                "action_state": before.get("action_state"),
                "reason": before.get("reason"),
                "aborted_by": before.get("aborted_by"),
                "rollback_action_id": before.get("rollback_action_id"),
                "phase": self._phases.get(action_id, before.get("phase")),
                "accepted_payload": before.get("accepted_payload") or (action.build if action else None),
                "payload_change": self._payload_changes.get(action_id, before.get("payload_change")),
            }
            if summary["action_state"] in FINAL_ACTION_STATES:
                pass
            elif action_id in rejected:
                summary.update(action_state=ACTION_REJECTED, reason=rejected[action_id])
            elif action_id in canceled:
                summary.update(action_state=ACTION_CANCELED, reason=canceled[action_id])
            elif action_id in completed:
                summary.update(action_state=ACTION_COMPLETED, reason=completed[action_id])
            elif action is None:  # reports for an action this job has no valid row of
                summary["action_state"] = ACTION_IN_PROGRESS
            else:
                summary.update(
                    self._state_of(action, before.get("action_state"), counts, now, lost.get(action_id))
                )
                if summary["action_state"] == ACTION_ABORTED:
                    aborted.append(action)
            summaries[action_id] = {"counts": counts, **summary}
        for action in aborted:
            summaries[action.id].update(self._abort(action, summaries[action.id], app_id, batch_id, now))
        retries = self.tables.retries(action_ids)
        table = pa.Table.from_pylist(
            [
                {
                    "action_id": action_id,
                    **{f"{state.lower()}_count": s["counts"][state] for state in s["counts"]},
                    "total_count": sum(s["counts"].values()),
                    "action_state": s["action_state"],
                    "updated_at": _ts(now),
                    "reason": s["reason"],
                    "aborted_by": s["aborted_by"],
                    "rollback_action_id": s["rollback_action_id"],
                    "phase": s["phase"],
                    "retries_count": retries.get(action_id, 0),
                    "accepted_payload": s["accepted_payload"],
                    "payload_change": s["payload_change"],
                }
                for action_id, s in summaries.items()
            ],
            schema=self.store.spec(SUMMARY).arrow_schema,
        )
        self.tables.merge_summary(table, app_id, batch_id)
        self.tables.forget(a for a, s in summaries.items() if s["action_state"] in FINAL_ACTION_STATES)

    @staticmethod
    def _state_of(
        action: Action, before: str | None, counts: Counter, now: int, lost: tuple[int, str] | None = None
    ) -> dict:
        """The summary's state, reason and abort rule of a valid action that had not ended (``lost``: its
        phase gate that can no longer open, and why: aborted by that phase's ``success_pct``)."""
        schedule = action.schedule
        state = action_state(
            before,
            counts,
            action.cancel,
            action.abort_rules,
            before_start=not schedule.started(now),
            open_ended=action.continuous and not schedule.ended(now),
        )
        if state == ACTION_CANCELED:
            return {"action_state": state, "reason": "canceled by operator"}
        if state == ACTION_ABORTED:
            rule = first_fired(action.abort_rules, counts)
            assert rule is not None  # action_state aborts only when a rule fired
            return {"action_state": state, "reason": rule.reason(counts), "aborted_by": rule.field}
        if lost is not None and state == ACTION_IN_PROGRESS:
            phase, reason = lost
            return {"action_state": ACTION_ABORTED, "reason": reason, "aborted_by": f"phases[{phase - 1}]"}
        reasons = []
        if state == ACTION_COMPLETED and schedule.ended(now) and counts[CANCELED]:
            reasons.append(
                f"schedule.end_at {_utc(schedule.end_at_ms)} passed: {_devices(counts[CANCELED])} canceled"
            )
        if state == ACTION_COMPLETED and counts[EXPIRED]:
            reasons.append(f"{_devices(counts[EXPIRED])} had not taken it when its message expired")
        return {"action_state": state, "reason": "; ".join(reasons)} if reasons else {"action_state": state}

    def _abort(self, action: Action, summary: dict, app_id: str, batch_id: int, now: int) -> dict:
        """Stop an aborted action and write its rollback; the summary's fields that change."""
        rows = self.tables.executions([action.id]).get(action.id, {})
        # devices with the build and no final report (working on it, or sent it and not heard from, also by
        # a tick or a fan-out that did not record it): the cancel may reach them after they installed it
        may_have_it = [row.device_id for row in rows.values() if _reached_and_open(row)]
        stopped = self._stop(
            action, rows, ACTION_ABORTED, f"action aborted: {summary['aborted_by']} reached", now
        )
        self.tables.write_executions(stopped, f"{app_id}/abort", batch_id)
        for row in stopped:
            rows[row.device_id] = row
        changes: dict = {"counts": state_counts([r.state for r in rows.values()])}
        if action.rollback is not None:
            installed = sorted({d for d, r in rows.items() if r.state == SUCCEEDED}.union(may_have_it))
            changes.update(self._roll_back(action, installed, summary["reason"], now))
        log.warning("action %s aborted: %s", action.id, changes.get("reason", summary["reason"]))
        return changes

    def _roll_back(self, action: Action, installed: list[str], reason: str, now: int) -> dict:
        """Write the rollback action for the devices that installed ``action`` (``rollback.py``)."""
        if not installed:
            return {"reason": f"{reason}; no device had installed it: nothing to roll back"}
        assert action.rollback is not None
        rows = rollback_rows(action.id, action.rollback, installed, action.in_progress_timeout_s, _ts(now))
        actions = self.tables.read(ACTIONS)
        invalid = [problem for row in rows for problem in (*problems(row), *id_taken(actions, row))]
        if invalid:
            log.error("action %s: its rollback is not a valid action, not written: %s", action.id, invalid[0])
            return {"reason": f"{reason}; rollback not written: {invalid[0]}"}
        table = pa.Table.from_pylist(rows, schema=self.store.spec(ACTIONS).arrow_schema)
        self.store.merge(ACTIONS, table, f"{self.app_id}/rollback/{action.id}", 0, update=False)
        ids = [row["id"] for row in rows]
        written = (
            f"rollback {ids[0]} to {action.rollback.get('version')} written for {_devices(len(installed))}"
        )
        written += f" in {len(ids)} actions: {', '.join(ids)}" if len(ids) > 1 else ""
        return {"rollback_action_id": ids[0], "reason": f"{reason}; {written}"}
