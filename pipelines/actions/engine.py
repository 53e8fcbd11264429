"""The fanout engine: actions in, executions and summaries out, messages to the brokers.

Three inputs drive it, each from its own thread of the job: new or changed ``actions`` rows (a stream over
the table's change feed), device status reports (a stream over the brokers' logs), and a clock tick
(rollouts sent over time or later, timeouts, retries, devices joining a continuous action, the compliance
table). All three read and write ``action_executions`` and ``action_summary``; one lock serialises them in
the job's driver process, and every row carries a version that only grows, so a write computed from an old
read can never move a row backwards.

What is sent when is decided by ``release.py`` from the rows alone; the engine sends it and records it.
The engine works on Arrow tables on the driver (``engine_tables.py``): it holds the executions of the
actions in flight (one row per targeted device), reads a group's devices with the group pushed down to the
table, and folds the fleet's compliance from the tables batch by batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime

import pyarrow as pa

from pipelines.actions.abort import first_fired
from pipelines.actions.arrow_rows import python_rows
from pipelines.actions.buckets import DEFAULT_BUCKETS, bucket_topic, by_bucket
from pipelines.actions.compliance import (
    DEVICE_COLUMNS,
    SUCCESS_COLUMNS,
    compliance_rows,
    desired_versions,
    installed_counts,
    latest_installed,
)
from pipelines.actions.engine_tables import (
    ACTIONS,
    COMPLIANCE,
    DEVICES,
    EXECUTIONS,
    SUMMARY,
    EngineTables,
    counts_after,
)
from pipelines.actions.feed_rows import latest_rows
from pipelines.actions.model import Action, device_topic
from pipelines.actions.operator import action_content
from pipelines.actions.phases import phase_of_devices
from pipelines.actions.publisher import Publisher
from pipelines.actions.release import Release, due, lost_gate
from pipelines.actions.report_scope import in_scope
from pipelines.actions.retries import retry
from pipelines.actions.rollback import id_taken, rollback_rows
from pipelines.actions.schedule import END_CANCEL
from pipelines.actions.states import (
    CANCELED,
    FAILED,
    IN_PROGRESS,
    QUEUED,
    SUCCEEDED,
    TIMED_OUT,
    Execution,
    StatusReport,
    apply_reports,
    platform_transition,
    queued,
)
from pipelines.actions.summary import (
    ACTION_ABORTED,
    ACTION_CANCELED,
    ACTION_COMPLETED,
    ACTION_IN_PROGRESS,
    ACTION_REJECTED,
    ACTION_SCHEDULED,
    FINAL_ACTION_STATES,
    action_state,
    state_counts,
)
from pipelines.actions.validation import problems
from sinks.store import Matching

log = logging.getLogger(__name__)

__all__ = ["ACTIONS", "DEVICES", "EXECUTIONS", "SUMMARY", "ActionsEngine"]

COMPLIANCE_INTERVAL_S = 10.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _utc(ms: int | None) -> str:
    return "-" if ms is None else f"{_ts(ms):%Y-%m-%d %H:%M:%S} UTC"


def _devices(count: int) -> str:
    return f"{count} device{'' if count == 1 else 's'}"


def _retry_message(action: Action, now: int, attempt: int) -> Callable[[list[str] | None], bytes]:
    return lambda listed: action.message(now, listed, attempt)


def _reached_and_open(row: Execution) -> bool:
    """The device has (or may have) the action message and has not reported a final state."""
    sent = row.state == QUEUED and row.published_at is not None and row.retry_at is None
    return row.state == IN_PROGRESS or sent


class ActionsEngine:
    """Fans actions out and keeps ``action_executions``, ``action_summary`` and ``fleet_compliance`` up to
    date.

    An action to a group or all devices sent to everyone at once is one message on the group's topic.
    Otherwise devices are sent the action as one message per device bucket listing the bucket's devices
    of the turn (``pipelines/actions/buckets.py``), or with ``device_buckets`` 0 as one message per device
    on its own topic (for devices that subscribe to that topic only).
    """

    def __init__(
        self,
        store,
        publisher: Publisher,
        clock: Callable[[], int] = _now_ms,
        app_id: str = "actions",
        device_buckets: int = DEFAULT_BUCKETS,
        compliance_interval_s: float = COMPLIANCE_INTERVAL_S,
    ) -> None:
        if device_buckets < 0:
            raise ValueError("device_buckets must be 0 (per-device topics) or more")
        self.store = store
        self.tables = EngineTables(store)
        self.publisher = publisher
        self.device_buckets = device_buckets
        self.clock = clock
        self.app_id = app_id
        self.compliance_interval_s = compliance_interval_s
        self.lock = threading.Lock()
        self._tick_batch = 0
        self._valid: tuple[pa.Table, dict[str, Action]] | None = None
        """The valid actions of the ``actions`` snapshot they were parsed from (each tick asks for them)."""
        self._last_valid: dict[str, Action] = {}
        """Each action as its last valid row had it: what a running action whose row turned invalid keeps."""
        self._phases: dict[str, int | None] = {}
        """The phase each phased action was last seen sending (for its summary)."""
        self._ended: set[str] = set()
        """Actions whose ``schedule.end_at`` this engine has acted on (the cancel messages went out)."""
        self._other_rows: set[str] = set()
        """Actions with rows of other content under their id, warned about once."""
        self._failing: dict[str, str] = {}
        """Actions whose last tick failed, with the error said about it."""
        self._unsent: set[str] | None = None
        """Actions whose fan-out was refused, sent by the ticker (None until the first tick: every action)."""
        self._compliance_inputs: tuple[int, ...] | None = None
        self._compliance_at = 0.0

    # -- inputs ---------------------------------------------------------------------------------------------

    def on_action_rows(self, rows: Iterable[dict], app_id: str, batch_id: int) -> None:
        """New and updated ``actions`` rows (change feed inserts and update post-images, in commit order).

        Only an action's latest row counts: created and canceled in one batch means never fanned out. Every
        row is checked first (``validation.py``, whoever wrote it): an invalid one is never published and
        its action ends ``REJECTED``, the summary's reason naming the field. An action that has ended is
        not fanned out again, whatever its row says now. Rows of one action with different content in one
        commit (``_commit_version``, when the rows carry it) cannot say which is meant: a new action is
        rejected, and for one already sent they are ignored, each with a WARNING.
        """
        latest, conflicts, inserted = latest_rows(rows)
        if not latest:
            return
        with self.lock:
            now = self.clock()
            known, counts = self.tables.executions_and_counts(list(latest))
            previous = self._summary_states(list(latest))
            changed: list[Execution] = []
            rejected: dict[str, str] = {}
            for action_id, row in latest.items():
                rows_of_action = known.get(action_id, {})
                ended = previous.get(action_id, (None, None))[0] in FINAL_ACTION_STATES
                if action_id in conflicts:
                    self._refuse(action_id, conflicts[action_id], bool(rows_of_action), ended, rejected)
                    continue
                invalid = problems(row)
                kept = self._last_valid.get(action_id) if rows_of_action else None
                if invalid and not (kept is not None and row.get("cancel")):
                    self._refuse(action_id, str(invalid[0]), bool(rows_of_action), ended, rejected)
                    continue
                action = replace(kept, cancel=True) if invalid and kept is not None else Action.from_row(row)
                if not invalid and kept is not None and action_id in inserted:
                    action = self._another_row(kept, action)
                elif not invalid:
                    self._last_valid[action_id] = action
                if action.cancel:
                    changed += self._stop(action, rows_of_action, CANCELED, "canceled by operator", now)
                elif ended:
                    self._ended_row(action_id, previous[action_id][0], action_id in inserted)
                elif not rows_of_action:
                    changed += self._fan_out(action, now)
            self.tables.write_executions(changed, f"{app_id}/executions", batch_id)
            counted = counts_after(counts, known, changed)
            self._summarise(list(latest), f"{app_id}/summary", batch_id, counted, rejected)
            log.info(
                "actions batch %d: %d actions (%d rejected), %d executions written in %.2f s",
                batch_id,
                len(latest),
                len(rejected),
                len(changed),
                (self.clock() - now) / 1000,
            )

    def _another_row(self, kept: Action, action: Action) -> Action:
        """A row appended under the id of an action already sent (a second row, not an update in place):
        ignored unless it only repeats the action, with a WARNING once per action; its cancel still
        counts. The action goes on as it was sent."""
        same = replace(action, cancel=kept.cancel, created_at_ms=kept.created_at_ms) == kept
        if not same and kept.id not in self._other_rows:
            self._other_rows.add(kept.id)
            log.warning(
                "action %s: another row with other content was appended under its id and is ignored, the "
                "action goes on as it was sent (write a new action, or update its row in place)",
                kept.id,
            )
        return replace(kept, cancel=kept.cancel or action.cancel)

    def _refuse(
        self, action_id: str, reason: str, fanned_out: bool, ended: bool, rejected: dict[str, str]
    ) -> None:
        """An invalid row: a new action is rejected; one already sent keeps going as it was sent (a cancel
        flag on its row still cancels it)."""
        if fanned_out or ended:
            log.warning(
                "action %s: its row changed to an invalid one, it goes on as it was sent: %s",
                action_id,
                reason,
            )
            return
        log.warning("action %s rejected, nothing published: %s", action_id, reason)
        rejected[action_id] = reason

    def on_reports(self, reports: Iterable[StatusReport], app_id: str, batch_id: int) -> None:
        """Device status reports from the brokers' logs, folded into the executions; a failure that a retry
        rule covers is queued again in the same write."""
        by_key: dict[tuple[str, str], list[StatusReport]] = {}
        for report in reports:
            by_key.setdefault((report.action_id, report.device_id), []).append(report)
        if not by_key:
            return
        with self.lock:
            started = self.clock()
            action_ids = sorted({action_id for action_id, _ in by_key})
            known, counts = self.tables.executions_and_counts(
                action_ids, {device_id for _, device_id in by_key}
            )
            by_key = in_scope(by_key, known, self._actions(action_ids), batch_id)
            action_ids = sorted({action_id for action_id, _ in by_key})
            if not by_key:
                return
            retrying = self._retrying(action_ids)
            changed = []
            for (action_id, device_id), device_reports in by_key.items():
                updated = apply_reports(known.get(action_id, {}).get(device_id), device_reports)
                if updated is not None:
                    action = retrying.get(action_id)
                    changed.append(self._after_failure(action, updated, started) if action else updated)
            self.tables.write_executions(changed, f"{app_id}/executions", batch_id)
            self._summarise(action_ids, f"{app_id}/summary", batch_id, counts_after(counts, known, changed))
            log.info(
                "reports batch %d: %d reports, %d executions changed in %.2f s",
                batch_id,
                len(by_key),
                len(changed),
                (self.clock() - started) / 1000,
            )

    def tick(self) -> None:
        """Send what is due, time executions out, retry, take in devices that joined; summarise (and maybe
        abort) the actions that changed; keep the compliance table.

        Only actions with something to do on a clock are read (``Action.clocked``): a broadcast without a
        timeout, retries or schedule changes only on reports, which summarise it themselves.
        """
        with self.lock:
            now = self.clock()
            self._tick(now)
            self._keep_compliance(now)

    def _tick(self, now: int) -> None:
        actions = {a.id: a for a in self._actions() if not a.cancel}
        if self._unsent is None:  # a job's first tick: any action may hold rows its fan-out did not send
            self._unsent = set(actions)
        clocked = {a for a, action in actions.items() if action.clocked or a in self._unsent}
        previous = self._summary_states(sorted(clocked))
        open_ids = [a for a in sorted(clocked) if previous.get(a, (None,))[0] not in FINAL_ACTION_STATES]
        if not open_ids:
            return
        known, counts = self.tables.executions_and_counts(open_ids)
        changed: list[Execution] = []
        summarised = set()
        lost: dict[str, tuple[int, str]] = {}
        for action_id in open_ids:
            action = actions[action_id]
            rows = dict(known.get(action_id, {}))
            try:
                moved = self._advance(action, rows, now)
            except Exception as error:  # one action a broker refuses holds no other back
                self._held_back(action_id, error)
                continue
            self._failing.pop(action_id, None)
            if not any(row.state == QUEUED and row.published_at is None for row in rows.values()):
                self._unsent.discard(action_id)
            changed += moved
            gate = lost_gate(action, rows, now)
            if gate is not None:
                lost[action_id] = gate
            before = previous.get(action_id, (None,))[0]
            starts = before == ACTION_SCHEDULED and action.schedule.started(now)
            if moved or before is None or starts or action.schedule.ended(now) or gate is not None:
                summarised.add(action_id)
        if not summarised:
            return
        self._tick_batch = max(self._tick_batch + 1, now)
        self.tables.write_executions(changed, f"{self.app_id}/tick/executions", self._tick_batch)
        self._summarise(
            sorted(summarised),
            f"{self.app_id}/tick/summary",
            self._tick_batch,
            counts_after(counts, known, changed),
            lost=lost,
        )

    def _held_back(self, action_id: str, error: Exception) -> None:
        """Say (once per different error) that an action's send failed (at its fan-out or a tick): what it
        sent is not recorded and goes again at the next tick, as after a restart; the others go on."""
        said = f"{type(error).__name__}: {error}"
        if self._failing.get(action_id) != said:
            self._failing[action_id] = said
            log.warning("action %s held back, tried again at the next tick: %s", action_id, said)

    def _advance(self, action: Action, rows: dict[str, Execution], now: int) -> list[Execution]:
        """One tick of one action: joiners queued, timeouts (and their retries), the schedule's end, what is
        due sent. Returns the rows it changed, each once."""
        changed: dict[str, Execution] = {}

        def put(row: Execution) -> None:
            changed[row.device_id] = rows[row.device_id] = row

        if action.continuous and not action.schedule.ended(now):
            last_phase = len(action.phases) if len(action.phases) > 1 else None
            for device_id in self._targets(action):
                if device_id not in rows:
                    put(queued(action.id, device_id, now, phase=last_phase))
        for row in self._time_out(action, rows, now):
            put(self._after_failure(action, row, now))
        if action.schedule.ended(now):
            for row in self._end(action, rows, now):
                put(row)
        else:
            for row in self._send(action, rows, now):
                put(row)
        return list(changed.values())

    # -- fanout ---------------------------------------------------------------------------------------------

    @staticmethod
    def _ended_row(action_id: str, state: str | None, replayed: bool) -> None:
        """An ended action's row read again: never fanned out again. A row appended (a change feed
        ``insert``) is the feed replayed by a job started again (a restart, a new checkpoint), or a second
        row that ``_another_row`` speaks of: said only at DEBUG; a row updated in place is said."""
        if replayed:
            log.debug("action %s ended (%s): its row read again, not fanned out again", action_id, state)
            return
        log.warning(
            "action %s changed after it ended (%s): not fanned out again; write a new action",
            action_id,
            state,
        )

    def _fan_out(self, action: Action, now: int) -> list[Execution]:
        """Queue a new action's targets (with their phases) and send what is due now."""
        targets = self._targets(action)
        phases = phase_of_devices(action.id, action.phases, targets) if len(action.phases) > 1 else {}
        rows = {d: queued(action.id, d, now, phase=phases.get(d)) for d in targets}
        topic = action.shared_topic
        if not rows and topic is not None and action.schedule.may_send(now):
            self.publisher.publish(topic, action.message(now))  # for devices that join the group later
            log.info("action %s broadcast on %s, which has no registered device yet", action.id, topic)
            return []
        try:
            sent = {row.device_id: row for row in self._send(action, rows, now)}
        except Exception as error:  # refused (a topic quota): queued, unsent, for the ticker to send
            self._held_back(action.id, error)
            if self._unsent is not None:  # else the first tick looks at every action
                self._unsent.add(action.id)
            return list(rows.values())
        log.info(
            "action %s queued for %d devices, %d sent now%s",
            action.id,
            len(rows),
            len(sent),
            f" ({action.max_per_minute}/min)" if action.max_per_minute else "",
        )
        return [sent.get(device_id, row) for device_id, row in rows.items()]

    def _send(self, action: Action, rows: Mapping[str, Execution], now: int) -> list[Execution]:
        """Send what ``release.due`` says is due and record it: first messages, then retries."""
        release = due(action, rows, now)
        if release.phase is not None:
            self._phases[action.id] = release.phase
        if not release:
            return []
        self._publish_first(action, rows, release, now)
        for attempt in sorted({row.attempt for row in release.retries}):
            ids = [row.device_id for row in release.retries if row.attempt == attempt]
            self.publisher.publish_many(self._listed_messages(ids, _retry_message(action, now, attempt)))
        sent = [
            replace(rows[d], published_at=now, version=rows[d].version + 1, updated_at=now)
            for d in release.first
        ]
        sent += [
            replace(row, retry_at=None, version=row.version + 1, updated_at=now) for row in release.retries
        ]
        return sent

    def _publish_first(
        self, action: Action, rows: Mapping[str, Execution], release: Release, now: int
    ) -> None:
        if not release.first:
            return
        topic = action.shared_topic
        untouched = all(row.published_at is None for row in rows.values())
        if topic is not None and untouched and len(release.first) == len(rows):
            self.publisher.publish(topic, action.message(now))
            log.info("action %s broadcast on %s to %d devices", action.id, topic, len(rows))
            return
        self.publisher.publish_many(
            self._listed_messages(release.first, lambda ids: action.message(now, ids))
        )

    def _listed_messages(
        self, device_ids: list[str], message: Callable[[list[str] | None], bytes]
    ) -> list[tuple[str, bytes]]:
        """(topic, payload) reaching exactly ``device_ids``: one per bucket holding any of them, listing
        them, or one unlisted message per device on its own topic when buckets are off."""
        if not device_ids:
            return []
        if not self.device_buckets:
            payload = message(None)
            return [(device_topic(device_id), payload) for device_id in device_ids]
        groups = by_bucket(device_ids, self.device_buckets)
        return [(bucket_topic(bucket), message(groups[bucket])) for bucket in sorted(groups)]

    def _targets(self, action: Action) -> list[str]:
        """The devices an action is for: listed, every device, or a group's (never every device unless
        ``all_devices`` says so)."""
        if action.device_ids:
            return sorted(set(action.device_ids))
        if not (action.all_devices or action.group):
            return []
        return self.tables.targets(None if action.all_devices else action.group)

    # -- failures and stopping ------------------------------------------------------------------------------

    def _retrying(self, action_ids: list[str]) -> dict[str, Action]:
        """The actions of ``action_ids`` with retry rules that may still send something."""
        actions = {a.id: a for a in self._actions(action_ids) if a.retries and not a.cancel}
        states = self._summary_states(list(actions))
        return {
            a: action
            for a, action in actions.items()
            if states.get(a, (None,))[0] not in FINAL_ACTION_STATES
            and not action.schedule.ended(self.clock())
        }

    @staticmethod
    def _after_failure(action: Action | None, row: Execution, now: int) -> Execution:
        """A failed or timed-out row, queued again when a retry rule of ``action`` covers it."""
        if action is None or row.state not in (FAILED, TIMED_OUT):
            return row
        return retry(row, action.retries, now) or row

    def _stop(
        self, action: Action, rows: dict[str, Execution], state: str, details: str, now: int
    ) -> list[Execution]:
        """Cancel what has not started; ask devices that have started to stop (they report CANCELED)."""
        self._cancel_started(action, rows, now)
        changed = self._cancel_queued(rows, details, now)
        log.info("action %s stopped (%s): %d queued executions canceled", action.id, state, len(changed))
        return changed

    def _cancel_started(self, action: Action, rows: Mapping[str, Execution], now: int) -> None:
        """The cancel message to devices that have the action and have not finished it."""
        topic = action.shared_topic
        if topic and any(row.published_at is not None for row in rows.values()):
            self.publisher.publish(topic, action.cancel_message(now))  # late joiners took it from there too
            return
        reached = [r.device_id for r in rows.values() if _reached_and_open(r)]
        listed = self._listed_messages(reached, lambda ids: action.cancel_message(now, ids))
        self.publisher.publish_many(listed)

    @staticmethod
    def _cancel_queued(
        rows: Mapping[str, Execution], details: str, now: int, unsent_only: bool = False
    ) -> list[Execution]:
        """QUEUED rows canceled: all of them, or only those not sent the action (or waiting for a retry)."""
        changed = []
        for row in rows.values():
            if row.state != QUEUED or (unsent_only and row.published_at is not None and row.retry_at is None):
                continue
            updated = platform_transition(row, CANCELED, details, now)
            if updated is not None:
                changed.append(updated)
        return changed

    def _end(self, action: Action, rows: dict[str, Execution], now: int) -> list[Execution]:
        """``schedule.end_at`` passed: nothing new goes out. ``end_behavior`` stop: devices not sent the
        action are canceled, the others may still do it; cancel: every device not done is told to stop."""
        details = f"schedule.end_at {_utc(action.schedule.end_at_ms)} passed"
        stop_all = action.schedule.end_behavior == END_CANCEL
        changed = self._cancel_queued(rows, details, now, unsent_only=not stop_all)
        if action.id not in self._ended:
            self._ended.add(action.id)
            if stop_all:
                self._cancel_started(action, rows, now)
            log.info("action %s reached its schedule's end: %d devices canceled", action.id, len(changed))
        return changed

    def _time_out(self, action: Action, rows: dict[str, Execution], now: int) -> list[Execution]:
        if not action.in_progress_timeout_s:
            return []
        limit = action.in_progress_timeout_s * 1000
        changed = []
        for row in rows.values():
            if row.state == IN_PROGRESS and row.started_at is not None and now - row.started_at > limit:
                details = f"no final report within {action.in_progress_timeout_s} s"
                updated = platform_transition(row, TIMED_OUT, details, now)
                if updated is not None:
                    changed.append(updated)
        return changed

    # -- summaries ------------------------------------------------------------------------------------------

    def _summarise(
        self,
        action_ids: list[str],
        app_id: str,
        batch_id: int,
        counted: dict[str, Counter] | None = None,
        rejected: Mapping[str, str] | None = None,
        lost: Mapping[str, tuple[int, str]] | None = None,
    ) -> None:
        """Recompute the summary of ``action_ids``; an action crossing an abort threshold, or whose phase
        gate can no longer open (``lost``: the phase and why), is stopped (and rolled back when it says so).

        ``counted``: the executions per state of each action as just written (from the batch's own read of
        the table and its changes), so that the table is not read again; counted from the table when None.
        ``rejected``: actions whose rows were refused, with the reason. A final state and its reason, once
        written, stay.
        """
        rejected = rejected or {}
        lost = lost or {}
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
            }
            if summary["action_state"] in FINAL_ACTION_STATES:
                pass
            elif action_id in rejected:
                summary.update(action_state=ACTION_REJECTED, reason=rejected[action_id])
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
        if state == ACTION_COMPLETED and schedule.ended(now) and counts[CANCELED]:
            reason = (
                f"schedule.end_at {_utc(schedule.end_at_ms)} passed: {_devices(counts[CANCELED])} canceled"
            )
            return {"action_state": state, "reason": reason}
        return {"action_state": state}

    def _abort(self, action: Action, summary: dict, app_id: str, batch_id: int, now: int) -> dict:
        """Stop an aborted action and write its rollback; the summary's fields that change."""
        rows = self.tables.executions([action.id]).get(action.id, {})
        stopped = self._stop(
            action, rows, ACTION_ABORTED, f"action aborted: {summary['aborted_by']} reached", now
        )
        self.tables.write_executions(stopped, f"{app_id}/abort", batch_id)
        for row in stopped:
            rows[row.device_id] = row
        changes: dict = {"counts": state_counts([r.state for r in rows.values()])}
        if action.rollback is not None:
            installed = [d for d, r in rows.items() if r.state == SUCCEEDED]
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

    def _runs(self, action_id: str) -> bool:
        state = self._summary_states([action_id]).get(action_id, (None, None))[0]
        return state is not None and state not in FINAL_ACTION_STATES

    def _summary_states(self, action_ids: list[str]) -> dict[str, tuple[str, str | None]]:
        """Each summarised action's state and reason."""
        return {
            action_id: (row["action_state"], row.get("reason"))
            for action_id, row in self.tables.summary_rows(action_ids).items()
        }

    def _first_created(self, action_id: str, rows: list[dict]) -> dict:
        """Of the rows under one id of an action this engine has not sent, the one created first (a job
        restarted after a row was appended), with a WARNING once per action when their content differs
        and the action runs (the fanout decides about one it has not seen, and one that ended is done)."""
        contents = [action_content(row) for row in rows]
        differ = any(content != contents[0] for content in contents)
        if differ and action_id not in self._other_rows and self._runs(action_id):
            self._other_rows.add(action_id)
            log.warning(
                "action %s: %d rows with other content under its id; the one created first is taken, the "
                "others are ignored",
                action_id,
                len(rows),
            )
        never = datetime.max.replace(tzinfo=UTC)  # a created_at out of range (arrow_rows.OutOfRange)
        return min(rows, key=lambda r: c if isinstance(c := r.get("created_at"), datetime) else never)

    # -- compliance -----------------------------------------------------------------------------------------

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

    # -- actions --------------------------------------------------------------------------------------------

    def _actions(self, ids: list[str] | None = None) -> list[Action]:
        """The actions whose latest rows are valid (an invalid row is never acted on, ``on_action_rows``),
        parsed and checked once per snapshot of the table."""
        table = self.tables.read(ACTIONS)
        if self._valid is None or self._valid[0] is not table:
            valid = {}
            by_id: dict[str, list[dict]] = {}
            for read in python_rows(table):
                by_id.setdefault(read["id"], []).append(read)
            for key, rows in by_id.items():
                row = rows[-1]
                if len(rows) > 1:  # rows appended under one id: the action as it was sent, or the first
                    kept = self._last_valid.get(key)
                    if kept is not None:
                        valid[key] = replace(kept, cancel=any(bool(r.get("cancel")) for r in rows))
                        continue
                    row = self._first_created(key, rows)
                if not problems(row):
                    valid[key] = self._last_valid[key] = Action.from_row(row)
                elif key in self._last_valid:  # it goes on as it was sent; its cancel flag still counts
                    valid[key] = replace(self._last_valid[key], cancel=bool(row.get("cancel")))
            self._valid = (table, valid)
        valid = self._valid[1]
        if ids is None:
            return list(valid.values())
        return [valid[key] for key in dict.fromkeys(ids) if key in valid]
