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
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from pipelines.actions.engine_compliance import Compliance
from pipelines.actions.engine_sending import ROW_DELETED, Turn, unrecorded
from pipelines.actions.engine_summary import Summaries
from pipelines.actions.engine_tables import ACTIONS, DEVICES, EXECUTIONS, SUMMARY, counts_after
from pipelines.actions.feed_rows import latest_rows
from pipelines.actions.model import Action
from pipelines.actions.release import fired_rule, lost_gate
from pipelines.actions.report_scope import in_scope, late_joiners
from pipelines.actions.states import CANCELED, QUEUED, Execution, StatusReport, apply_reports, queued
from pipelines.actions.summary import ACTION_SCHEDULED, FINAL_ACTION_STATES
from pipelines.actions.validation import problems

if TYPE_CHECKING:
    from pipelines.actions.reports import FoldedReports

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(action id, device id)."""
_Reports = TypeVar("_Reports")
Fold = Callable[[Mapping[Key, _Reports], Mapping[str, Mapping[str, Execution]]], dict[Key, Execution | None]]
"""Each pair's row after its reports (None: unchanged), given the rows read (by action and device)."""

__all__ = ["ACTIONS", "DEVICES", "EXECUTIONS", "REPORTS_WAIT_WARNING_S", "SUMMARY", "ActionsEngine"]

REPORTS_WAIT_WARNING_S = 120.0
"""How long the ticker sends nothing, waiting for the reports stream to catch up, before it says so at
WARNING."""


class ActionsEngine(Summaries, Compliance):
    """Fans actions out and keeps ``action_executions``, ``action_summary`` and ``fleet_compliance`` up to
    date.

    An action to a group or all devices sent to everyone at once is one message on the group's topic.
    Otherwise devices are sent the action as one message per device bucket listing the bucket's devices
    of the turn (``pipelines/actions/buckets.py``), or with ``device_buckets`` 0 as one message per device
    on its own topic (for devices that subscribe to that topic only).
    """

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
            new: list[Execution] = []
            turns: dict[str, Turn] = {}
            rejected: dict[str, str] = {}
            for action_id, row in latest.items():
                rows_of_action = known.get(action_id, {})
                ended = previous.get(action_id, (None, None))[0] in FINAL_ACTION_STATES
                if action_id in conflicts:
                    self._refuse(action_id, conflicts[action_id], bool(rows_of_action), ended, rejected)
                    continue
                invalid = problems(row)
                kept = self._kept(action_id) if rows_of_action else None
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
                    queued_rows, turn = self._fan_out(action, now)
                    new += queued_rows
                    if turn.sends:
                        turns[action_id] = turn
            sent = [row for turn in turns.values() for row in turn.sent]
            sent = self._publish_turns(turns, sent, now, f"{app_id}/sending", batch_id, new)
            self.tables.write_executions(changed + sent, f"{app_id}/executions", batch_id)
            counted = counts_after(counts, known, changed + new)
            empty = {a: self._no_target.pop(a) for a in list(self._no_target) if a in latest}
            self._summarise(list(latest), f"{app_id}/summary", batch_id, counted, rejected, completed=empty)
            log.info(
                "actions batch %d: %d actions (%d rejected), %d executions written in %.2f s",
                batch_id,
                len(latest),
                len(rejected),
                len(changed),
                (self.clock() - now) / 1000,
            )

    def _kept(self, action_id: str) -> Action | None:
        """The action as sent, of an action with executions: as this engine last took it, or else (a job
        started since) when rows were appended under its id, the row created first (``_actions``)."""
        kept = self._last_valid.get(action_id)
        if kept is None and self.tables.rows_under(action_id) > 1:
            found = self._actions([action_id])
            kept = found[0] if found else None
        return kept

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

    def on_reports(
        self, reports: Iterable[StatusReport] | FoldedReports, app_id: str, batch_id: int
    ) -> Counter:
        """Device status reports from the brokers' logs, folded into the executions; a failure that a retry
        rule covers is queued again in the same write. Returns the reports left out, by reason
        (``report_scope.py``: ``not_sent``, ``not_a_target``). ``reports``: the reports, or a batch of them
        folded per (action, device) on the executors (``reports.fold_batch``), which writes the same rows."""
        if not isinstance(reports, Iterable):
            return self._take_reports(reports.by_key, reports.fold, app_id, batch_id)
        by_key: dict[tuple[str, str], list[StatusReport]] = {}
        for report in reports:
            by_key.setdefault((report.action_id, report.device_id), []).append(report)
        return self._take_reports(by_key, _fold_lists, app_id, batch_id)

    def _take_reports(
        self, by_key: dict[Key, _Reports], fold: Fold[_Reports], app_id: str, batch_id: int
    ) -> Counter:
        if not by_key:
            return Counter()
        with self.lock:
            started = self.clock()
            action_ids = sorted({action_id for action_id, _ in by_key})
            known, counts = self.tables.executions_and_counts(
                action_ids, {device_id for _, device_id in by_key}
            )
            actions = self._actions(action_ids)
            registered = self.tables.groups_of(late_joiners(by_key, known, actions))
            by_key, left_out = in_scope(by_key, known, actions, batch_id, registered)
            action_ids = sorted({action_id for action_id, _ in by_key})
            if not by_key:
                return left_out
            retrying = self._retrying(action_ids)
            changed = []
            for (action_id, _), updated in fold(by_key, known).items():
                if updated is not None:
                    updated = replace(updated, sending_at=None)  # the device has it: it was sent
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
            return left_out

    def tick(self, reports_read_until: int | None = None) -> None:
        """Send what is due, time executions out, retry, end those whose message expired, take in devices
        that joined; summarise (and maybe abort) the actions that changed; keep the compliance table.

        Only actions with something to do on a clock are read (``Action.clocked``), and others once their
        first message may have expired: a broadcast without a timeout, retries or schedule changes only on
        reports until then, which summarise it themselves.

        ``reports_read_until``: every report the brokers took in before this time (epoch ms) has been
        handed to :meth:`on_reports` (the job's reports stream has caught up to it, 0 before it has; None:
        reports are handed over as they come). A device's message is taken as expired before it took it, and
        an execution as timed out, only up to there, so a report of a device that answered in time, still
        unread (a job restarted after the expiry or the timeout), is not overtaken. Nothing is sent before
        the stream has caught up (0): the rate's next turn, the abort rules and the phase gates are judged
        on the reports of the devices sent before the job started, and a message sent again reaches only
        the devices that did not answer it.
        """
        with self.lock:
            now = self.clock()
            expired_by = now if reports_read_until is None else min(now, reports_read_until)
            sends = reports_read_until is None or reports_read_until > 0
            self._note_reports_wait(now, sends)
            self._tick(now, expired_by, sends)
            self._keep_compliance(now)

    @property
    def reports_wait_since(self) -> int | None:
        """Since when (epoch ms) the ticks have sent nothing, waiting for the reports stream to catch up;
        None while they send."""
        return self._reports_waited_since

    def _note_reports_wait(self, now: int, sends: bool) -> None:
        """Say that the ticker waits for the reports stream: at INFO when it starts, at WARNING once it has
        waited ``REPORTS_WAIT_WARNING_S`` (a broker the stream reads may be down: no action advances), and
        at INFO when sends start again after that."""
        if sends:
            if self._reports_wait_warned:
                log.info("the reports stream has caught up: sending again")
            self._reports_waited_since = None
            self._reports_wait_warned = False
            return
        if self._reports_waited_since is None:
            self._reports_waited_since = now
            log.info("nothing is sent until the reports stream has read what the brokers took in")
        waited_s = (now - self._reports_waited_since) / 1000
        if waited_s >= REPORTS_WAIT_WARNING_S and not self._reports_wait_warned:
            self._reports_wait_warned = True
            log.warning(
                "nothing sent for %.0f s: the reports stream has not caught up with the brokers (is one of "
                "them down?); no action advances until it has",
                waited_s,
            )

    def _tick(self, now: int, expired_by: int, sends: bool = True) -> None:
        self._end_deleted(now)
        actions = {a.id: a for a in self._actions() if not a.cancel}
        if self._unsent is None:  # a job's first tick: any action may hold rows its fan-out did not send
            self._unsent = set(actions)
        clocked = {
            a
            for a, action in actions.items()
            if action.clocked or a in self._unsent or self._may_have_expired(action, expired_by)
        }
        previous = self._summary_states(sorted(clocked))
        open_ids = [a for a in sorted(clocked) if previous.get(a, (None,))[0] not in FINAL_ACTION_STATES]
        if not open_ids:
            return
        known, counts = self.tables.executions_and_counts(open_ids)
        changed: list[Execution] = []
        turns: dict[str, Turn] = {}
        summarised = set()
        lost: dict[str, tuple[int, str]] = {}
        for action_id in open_ids:
            action = actions[action_id]
            rows = dict(known.get(action_id, {}))
            try:
                moved, turn = self._advance(action, rows, now, expired_by, sends)
            except Exception as error:  # one action a broker refuses holds no other back
                self._held_back(action_id, error)
                continue
            if turn.sends:
                turns[action_id] = turn
            else:
                self._failing.pop(action_id, None)
            waiting = any(row.state == QUEUED and row.published_at is None for row in rows.values())
            if sends and not waiting and not unrecorded(rows.values()):
                self._unsent.discard(action_id)
            changed += moved
            gate = lost_gate(action, rows, expired_by)  # silent: judged on the reports read
            if gate is not None:
                lost[action_id] = gate
            before = previous.get(action_id, (None,))[0]
            starts = before == ACTION_SCHEDULED and action.schedule.started(now)
            aborting = gate is not None or fired_rule(action, rows) is not None
            if moved or before is None or starts or action.schedule.ended(now) or aborting:
                summarised.add(action_id)
        if not summarised:
            return
        self._tick_batch = max(self._tick_batch + 1, now)
        changed = self._publish_turns(turns, changed, now, f"{self.app_id}/tick/sending", self._tick_batch)
        self.tables.write_executions(changed, f"{self.app_id}/tick/executions", self._tick_batch)
        self._summarise(
            sorted(summarised),
            f"{self.app_id}/tick/summary",
            self._tick_batch,
            counts_after(counts, known, changed),
            lost=lost,
        )

    def _publish_turns(
        self,
        turns: dict[str, Turn],
        changed: list[Execution],
        now: int,
        app_id: str,
        batch_id: int,
        new: Iterable[Execution] = (),
    ) -> list[Execution]:
        """Publish what a batch or tick sends, each action's turn marked as being sent first, all in one
        merge with ``new`` (the rows of actions fanned out now, as queued: a job that stops before it records
        the sends knows that they may have gone out, ``docs/ota.md``, "Sends a job did not record"). Returns
        ``changed`` with the rows sent recorded as sent, and without those of an action whose publish failed:
        they stay marked, and are sent again at the next tick."""
        marked = {
            (row.action_id, row.device_id): replace(row, sending_at=now)
            for turn in turns.values()
            for row in turn.sent
        }
        rows = [marked.pop((row.action_id, row.device_id), row) for row in new]
        self.tables.write_executions(rows + list(marked.values()), app_id, batch_id)
        failed: set[tuple[str, str]] = set()
        recorded: dict[tuple[str, str], Execution] = {}
        for action_id, turn in turns.items():
            keys = {(row.action_id, row.device_id) for row in turn.sent}
            try:
                turn.publish()
            except Exception as error:  # refused (a topic quota): the others go on
                self._held_back(action_id, error)
                failed |= keys
                if self._unsent is not None:  # an action not clocked is looked at again, for its marked rows
                    self._unsent.add(action_id)
                continue
            self._failing.pop(action_id, None)
            recorded.update(
                {(r.action_id, r.device_id): replace(r, version=r.version + 1) for r in turn.sent}
            )
        return [
            recorded.get(key, row) for row in changed if (key := (row.action_id, row.device_id)) not in failed
        ]

    def _end_deleted(self, now: int) -> None:
        """Cancel the actions not ended whose row was deleted from ``actions`` (``_deleted``), decided from
        the tables alone: after a restart too."""
        gone = self.tables.unended_without_row()
        if not gone:
            return
        known = self.tables.executions(gone)
        changed: list[Execution] = []
        ended = {}
        for action_id in gone:
            try:
                changed += self._deleted(action_id, known.get(action_id, {}), now)
            except Exception as error:  # a broker refusing the cancel messages: again at the next tick
                self._held_back(action_id, error)
                continue
            ended[action_id] = ROW_DELETED
        if not ended:
            return
        self._tick_batch = max(self._tick_batch + 1, now)
        self.tables.write_executions(changed, f"{self.app_id}/deleted/executions", self._tick_batch)
        self._summarise(sorted(ended), f"{self.app_id}/deleted/summary", self._tick_batch, canceled=ended)

    def _advance(
        self, action: Action, rows: dict[str, Execution], now: int, expired_by: int, sends: bool = True
    ) -> tuple[list[Execution], Turn]:
        """One tick of one action: joiners queued, timeouts (and their retries), expired messages, the
        schedule's end, what is due to be sent (its turn, not published yet; none unless ``sends``). Returns
        the rows it changed, each once (those of the turn as sent), and the turn."""
        changed: dict[str, Execution] = {}

        def put(row: Execution) -> None:
            changed[row.device_id] = rows[row.device_id] = row

        if action.continuous and not action.schedule.ended(now):
            last_phase = len(action.phases) if len(action.phases) > 1 else None
            for device_id in self._targets(action):
                if device_id not in rows:
                    put(queued(action.id, device_id, now, phase=last_phase))
        for row in self._time_out(action, rows, now, expired_by):
            put(self._after_failure(action, row, now))
        for row in self._expire(action, rows, now, expired_by):
            put(row)
        turn = Turn([], [])
        if action.schedule.ended(now):
            for row in self._end(action, rows, now):
                put(row)
        elif sends:
            turn = self._turn(action, rows, now)
            for row in turn.sent:
                put(row)
        return list(changed.values()), turn

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


def _fold_lists(
    by_key: Mapping[Key, list[StatusReport]], rows: Mapping[str, Mapping[str, Execution]]
) -> dict[Key, Execution | None]:
    """Each pair's reports folded onto its row, in sequence order."""
    return {(a, d): apply_reports(rows.get(a, {}).get(d), reports) for (a, d), reports in by_key.items()}
