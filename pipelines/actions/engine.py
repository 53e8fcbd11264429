"""The fanout engine: actions in, executions and summaries out, messages to the brokers.

Three inputs drive it, each from its own thread of the job: new or changed ``actions`` rows (a stream over
the table's change feed), device status reports (a stream over the brokers' logs), and a clock tick (rollout
pacing, timeouts). All three read and write ``action_executions`` and ``action_summary``; one lock
serialises them in the job's driver process, and every row carries a version that only grows, so a write
computed from an old read can never move a row backwards.

The engine works on Arrow tables on the driver: an action's executions are one row per targeted device, which
is small next to telemetry (tens of thousands of rows for a 10,000-device rollout). It keeps
``action_executions`` in memory between its own commits, so a batch costs one merge of the rows it changes
and a lookup of each table's version, not a read of the tables.
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
import pyarrow.compute as pc

from pipelines.actions.buckets import DEFAULT_BUCKETS, bucket_topic, by_bucket
from pipelines.actions.model import Action, device_topic
from pipelines.actions.publisher import Publisher
from pipelines.actions.rollout import rollout_allowance
from pipelines.actions.states import (
    CANCELED,
    IN_PROGRESS,
    QUEUED,
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
    ACTION_IN_PROGRESS,
    ACTION_REJECTED,
    FINAL_ACTION_STATES,
    action_state,
    state_counts,
)
from pipelines.actions.validation import problems
from sinks.store import TableStore

log = logging.getLogger(__name__)

EXECUTIONS = "action_executions"
SUMMARY = "action_summary"
ACTIONS = "actions"
DEVICES = "devices"
_INT64 = pa.int64()
TIME_COLUMNS = ("queued_at", "published_at", "updated_at", "started_at", "finished_at")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _ts(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def _reached_and_open(row: Execution) -> bool:
    """The device has (or may have) the action message and has not reported a final state."""
    return row.state == IN_PROGRESS or (row.state == QUEUED and row.published_at is not None)


class ActionsEngine:
    """Fans actions out and keeps ``action_executions`` and ``action_summary`` up to date.

    An explicit-id action goes out as one message per device bucket listing that bucket's targets
    (``pipelines/actions/buckets.py``), or with ``device_buckets`` 0 as one message per device on its own
    topic (for devices that subscribe to that topic only).
    """

    def __init__(
        self,
        store: TableStore,
        publisher: Publisher,
        clock: Callable[[], int] = _now_ms,
        app_id: str = "actions",
        device_buckets: int = DEFAULT_BUCKETS,
    ) -> None:
        if device_buckets < 0:
            raise ValueError("device_buckets must be 0 (per-device topics) or more")
        self.store = store
        self.publisher = publisher
        self.device_buckets = device_buckets
        self.clock = clock
        self.app_id = app_id
        self.lock = threading.Lock()
        self._tick_batch = 0
        self._cached: pa.Table | None = None
        """``action_executions`` as of Delta version ``_cached_version`` (timestamps as epoch ms), or None."""
        self._cached_version = -1
        self._snapshots: dict[str, tuple[int, pa.Table]] = {}
        """The other tables as last read, by name: (Delta version, rows)."""
        self._valid: tuple[pa.Table, dict[str, Action]] | None = None
        """The valid actions of the ``actions`` snapshot they were parsed from (each tick asks for them)."""
        self._last_valid: dict[str, Action] = {}
        """Each action as its last valid row had it: what a running action whose row turned invalid keeps."""
        for name in (ACTIONS, EXECUTIONS, SUMMARY, DEVICES):
            store.ensure(name)

    # -- inputs ---------------------------------------------------------------------------------------------

    def on_action_rows(self, rows: Iterable[dict], app_id: str, batch_id: int) -> None:
        """New and updated ``actions`` rows (change feed inserts and update post-images, in commit order).

        Only an action's latest row counts: created and canceled in one batch means never fanned out. Every
        row is checked first (``validation.py``, whoever wrote it): an invalid one is never published and
        its action ends ``REJECTED``, the summary's reason naming the field. An action that has ended is
        not fanned out again, whatever its row says now.
        """
        latest = {row["id"]: row for row in rows}
        if not latest:
            return
        with self.lock:
            now = self.clock()
            known, counts = self._executions_and_counts(list(latest))
            previous = self._summary_states(list(latest))
            changed: list[Execution] = []
            rejected: dict[str, str] = {}
            for action_id, row in latest.items():
                rows_of_action = known.get(action_id, {})
                ended = previous.get(action_id, (None, None))[0] in FINAL_ACTION_STATES
                invalid = problems(row)
                kept = self._last_valid.get(action_id) if rows_of_action else None
                if invalid and not (kept is not None and row.get("cancel")):
                    self._refuse(action_id, str(invalid[0]), bool(rows_of_action), ended, rejected)
                    continue
                action = replace(kept, cancel=True) if invalid and kept is not None else Action.from_row(row)
                if not invalid:
                    self._last_valid[action_id] = action
                if action.cancel:
                    changed += self._stop(action, rows_of_action, CANCELED, "canceled by operator", now)
                elif ended:
                    log.warning(
                        "action %s changed after it ended (%s): not fanned out again; write a new action",
                        action_id,
                        previous[action_id][0],
                    )
                elif not rows_of_action:
                    changed += self._fan_out(action, now)
            self._write(changed, f"{app_id}/executions", batch_id)
            counted = _counts_after(counts, known, changed)
            self._summarise(list(latest), f"{app_id}/summary", batch_id, counted, rejected)
            log.info(
                "actions batch %d: %d actions (%d rejected), %d executions written in %.2f s",
                batch_id,
                len(latest),
                len(rejected),
                len(changed),
                (self.clock() - now) / 1000,
            )

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
        """Device status reports from the brokers' logs, folded into the executions."""
        by_key: dict[tuple[str, str], list[StatusReport]] = {}
        for report in reports:
            by_key.setdefault((report.action_id, report.device_id), []).append(report)
        if not by_key:
            return
        with self.lock:
            started = self.clock()
            action_ids = sorted({action_id for action_id, _ in by_key})
            known, counts = self._executions_and_counts(action_ids, {device_id for _, device_id in by_key})
            changed = []
            for (action_id, device_id), device_reports in by_key.items():
                updated = apply_reports(known.get(action_id, {}).get(device_id), device_reports)
                if updated is not None:
                    changed.append(updated)
            self._write(changed, f"{app_id}/executions", batch_id)
            self._summarise(action_ids, f"{app_id}/summary", batch_id, _counts_after(counts, known, changed))
            log.info(
                "reports batch %d: %d reports, %d executions changed in %.2f s",
                batch_id,
                len(by_key),
                len(changed),
                (self.clock() - started) / 1000,
            )

    def tick(self) -> None:
        """Pace rollouts, time out executions; summarise (and maybe abort) the actions that changed.

        Only actions with something to do on a clock (a paced rollout or an in-progress timeout) are read:
        a broadcast without a timeout changes only on reports, which summarise it themselves.
        """
        with self.lock:
            now = self.clock()
            actions = {a.id: a for a in self._actions() if not a.cancel}
            clocked = {
                a for a, action in actions.items() if not action.broadcast or action.in_progress_timeout_s
            }
            open_ids = [a for a in self._open_action_ids(actions) if a in clocked]
            if not open_ids:
                return
            known, counts = self._executions_and_counts(open_ids)
            changed: list[Execution] = []
            for action_id in open_ids:
                action, rows = actions[action_id], known.get(action_id, {})
                changed += self._time_out(action, rows, now)
                if not action.broadcast:
                    changed += self._pace(action, rows, now)
            if not changed:
                return
            self._tick_batch = max(self._tick_batch + 1, now)
            self._write(changed, f"{self.app_id}/tick/executions", self._tick_batch)
            self._summarise(
                sorted({row.action_id for row in changed}),
                f"{self.app_id}/tick/summary",
                self._tick_batch,
                _counts_after(counts, known, changed),
            )

    # -- fanout ---------------------------------------------------------------------------------------------

    def _fan_out(self, action: Action, now: int) -> list[Execution]:
        targets = self._targets(action)
        topic = action.shared_topic
        if topic is not None:
            self.publisher.publish(topic, action.message(now))
            rows = [queued(action.id, device_id, now, published_at=now) for device_id in targets]
            log.info("action %s broadcast on %s to %d devices", action.id, topic, len(rows))
        elif action.broadcast:
            messages = self._listed_messages(targets, lambda listed: action.message(now, listed))
            self.publisher.publish_many(messages)
            rows = [queued(action.id, device_id, now, published_at=now) for device_id in targets]
            log.info(
                "action %s sent to %d listed devices in %d messages", action.id, len(rows), len(messages)
            )
        else:
            rows = [queued(action.id, device_id, now) for device_id in targets]
            log.info(
                "action %s rolls out to %d devices at %d/min", action.id, len(rows), action.max_per_minute
            )
            rows = self._pace(action, {row.device_id: row for row in rows}, now)
            published = {row.device_id for row in rows}
            rows += [queued(action.id, d, now) for d in targets if d not in published]
        return rows

    def _pace(self, action: Action, rows: dict[str, Execution], now: int) -> list[Execution]:
        """Publish to the next devices a paced rollout may reach by now (paced from its first queued row)."""
        if action.max_per_minute is None or not rows:
            return []
        published = sum(1 for row in rows.values() if row.published_at is not None)
        start = min(row.queued_at for row in rows.values())
        allowance = rollout_allowance(action.max_per_minute, start, now, published)
        waiting = sorted(d for d, row in rows.items() if row.published_at is None and row.state == QUEUED)
        turn = waiting[:allowance]
        message = action.message(now)
        self.publisher.publish_many([(device_topic(device_id), message) for device_id in turn])
        return [replace(rows[d], published_at=now, version=rows[d].version + 1, updated_at=now) for d in turn]

    def _listed_messages(
        self, device_ids: list[str], message: Callable[[list[str] | None], bytes]
    ) -> list[tuple[str, bytes]]:
        """(topic, payload) reaching exactly ``device_ids``: one per bucket holding any of them, listing
        them, or one unlisted message per device on its own topic when buckets are off."""
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
        devices = self._read(DEVICES)
        if not action.all_devices:
            devices = devices.filter(pc.equal(devices["group"], action.group))
        return sorted(set(devices["device_id"].to_pylist()))

    # -- stopping -------------------------------------------------------------------------------------------

    def _stop(
        self, action: Action, rows: dict[str, Execution], state: str, details: str, now: int
    ) -> list[Execution]:
        """Cancel what has not started; ask devices that have started to stop (they report CANCELED)."""
        if any(row.state == IN_PROGRESS or row.published_at is not None for row in rows.values()):
            topic = action.shared_topic
            if topic:
                self.publisher.publish(topic, action.cancel_message(now))
            else:  # devices that have the action and have not finished it
                reached = [r.device_id for r in rows.values() if _reached_and_open(r)]
                listed = self._listed_messages(reached, lambda ids: action.cancel_message(now, ids))
                self.publisher.publish_many(listed)
        changed = []
        for row in rows.values():
            if row.state == QUEUED:
                updated = platform_transition(row, CANCELED, details, now)
                if updated is not None:
                    changed.append(updated)
        log.info("action %s stopped (%s): %d queued executions canceled", action.id, state, len(changed))
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
    ) -> None:
        """Recompute the summary of ``action_ids``; an action crossing its abort threshold is stopped.

        ``counted``: the executions per state of each action as just written (from the batch's own read of
        the table and its changes), so that the table is not read again; counted from the table when None.
        ``rejected``: actions whose rows were refused, with the reason. A final state and its reason, once
        written, stay.
        """
        rejected = rejected or {}
        actions = {a.id: a for a in self._actions(action_ids)}
        previous = self._summary_states(action_ids)
        if counted is None:
            counted = self._state_counts(action_ids)
        now = self.clock()
        summaries: list[tuple[str, Counter, str, str | None]] = []
        aborted = []
        for action_id in action_ids:
            action = actions.get(action_id)
            counts = counted.get(action_id) or state_counts([])
            before, reason = previous.get(action_id, (None, None))
            if before in FINAL_ACTION_STATES:
                state = before
            elif action_id in rejected:
                state, reason = ACTION_REJECTED, rejected[action_id]
            elif action is None:  # reports for an action this job has no valid row of
                state = ACTION_IN_PROGRESS
            else:
                state = action_state(before, counts, action.cancel, action.abort)
                if state == ACTION_CANCELED:
                    reason = "canceled by operator"
                elif state == ACTION_ABORTED:
                    reason = action.abort.reason(counts)
                    aborted.append(action)
            summaries.append((action_id, counts, state, reason))
        for action in aborted:
            rows = self._executions([action.id]).get(action.id, {})
            details = "action aborted: failure threshold reached"
            stopped = self._stop(action, rows, ACTION_ABORTED, details, now)
            self._write(stopped, f"{app_id}/abort", batch_id)
            for row in stopped:
                rows[row.device_id] = row
            index = next(i for i, s in enumerate(summaries) if s[0] == action.id)
            counts = state_counts([r.state for r in rows.values()])
            summaries[index] = (action.id, counts, ACTION_ABORTED, summaries[index][3])
            log.warning("action %s aborted: %s", action.id, summaries[index][3])
        table = pa.Table.from_pylist(
            [
                {
                    "action_id": action_id,
                    **{f"{state.lower()}_count": counts[state] for state in counts},
                    "total_count": sum(counts.values()),
                    "action_state": state,
                    "updated_at": _ts(now),
                    "reason": reason,
                }
                for action_id, counts, state, reason in summaries
            ],
            schema=self.store.spec(SUMMARY).arrow_schema,
        )
        if self.store.merge(SUMMARY, table, app_id, batch_id):
            self._replace_rows(SUMMARY, table, "action_id")

    def _open_action_ids(self, actions: dict[str, Action]) -> list[str]:
        states = self._summary_states(list(actions))
        return sorted(a for a in actions if states.get(a, (None,))[0] not in FINAL_ACTION_STATES)

    # -- table access ---------------------------------------------------------------------------------------

    def _actions(self, ids: list[str] | None = None) -> list[Action]:
        """The actions whose latest rows are valid (an invalid row is never acted on, ``on_action_rows``),
        parsed and checked once per snapshot of the table."""
        table = self._read(ACTIONS)
        if self._valid is None or self._valid[0] is not table:
            valid = {}
            for key, row in {row["id"]: row for row in table.to_pylist()}.items():
                if not problems(row):
                    valid[key] = self._last_valid[key] = Action.from_row(row)
                elif key in self._last_valid:  # it goes on as it was sent; its cancel flag still counts
                    valid[key] = replace(self._last_valid[key], cancel=bool(row.get("cancel")))
            self._valid = (table, valid)
        valid = self._valid[1]
        if ids is None:
            return list(valid.values())
        return [valid[key] for key in dict.fromkeys(ids) if key in valid]

    def _summary_states(self, action_ids: list[str]) -> dict[str, tuple[str, str | None]]:
        """Each summarised action's state and reason."""
        table = self._read(SUMMARY)
        table = table.filter(pc.is_in(table["action_id"], pa.array(action_ids, pa.string())))
        reasons = table["reason"].to_pylist() if "reason" in table.column_names else [None] * len(table)
        states = table["action_state"].to_pylist()
        return {
            action_id: (state, reason)
            for action_id, state, reason in zip(table["action_id"].to_pylist(), states, reasons, strict=True)
        }

    def _state_counts(self, action_ids: list[str]) -> dict[str, Counter]:
        """Executions per state of each action, counted in Arrow (no Python object per row)."""
        table = self._execution_table()
        return _group_counts(table.filter(pc.is_in(table["action_id"], pa.array(action_ids, pa.string()))))

    def _executions(
        self, action_ids: list[str], device_ids: Iterable[str] | None = None
    ) -> dict[str, dict[str, Execution]]:
        """Execution rows of ``action_ids`` (only those of ``device_ids`` when given), by action, device."""
        return self._executions_and_counts(action_ids, device_ids)[0]

    def _executions_and_counts(
        self, action_ids: list[str], device_ids: Iterable[str] | None = None
    ) -> tuple[dict[str, dict[str, Execution]], dict[str, Counter]]:
        """Execution rows of ``action_ids`` (only those of ``device_ids`` when given), by action and device,
        and every execution of those actions counted per state: from one read of the table.

        Filtered and converted in Arrow before any Python object is made: a report batch touches a few
        thousand rows of an action that may have a hundred thousand.
        """
        table = self._execution_table()
        table = table.filter(pc.is_in(table["action_id"], pa.array(action_ids, pa.string())))
        counts = _group_counts(table)
        if device_ids is not None:
            table = table.filter(pc.is_in(table["device_id"], pa.array(list(device_ids), pa.string())))
        out: dict[str, dict[str, Execution]] = {}
        for row in table.to_pylist():
            out.setdefault(row["action_id"], {})[row["device_id"]] = Execution(**row)
        return out, counts

    def _read(self, name: str) -> pa.Table:
        """The table ``name`` as of now, read again only when its version moved (the ticker looks every
        second at ``actions`` and ``action_summary``, which change far less often)."""
        version = self.store.version(name)  # before the read: a commit after it is read next time
        snapshot = self._snapshots.get(name)
        if snapshot is None or snapshot[0] != version:
            snapshot = self._snapshots[name] = (version, self.store.read_arrow(name))
        return snapshot[1]

    def _replace_rows(self, name: str, rows: pa.Table, key: str) -> None:
        """After a merge of ``rows`` (keyed by ``key``) that committed: the snapshot of ``name`` with them in
        place, as of the version after the snapshot's (see :meth:`_write` for why that guess is safe)."""
        snapshot = self._snapshots.get(name)
        if snapshot is None:
            return
        version, table = snapshot
        kept = table.filter(pc.invert(pc.is_in(table[key], value_set=rows[key])))
        self._snapshots[name] = (version + 1, pa.concat_tables([kept, rows.cast(table.schema)]))

    def _execution_table(self) -> pa.Table:
        """``action_executions`` with its timestamps as epoch ms: read once, then kept up to date by
        :meth:`_write` as long as the engine's commits are the only ones (read again after any other: only
        the table's version is looked up per batch, not its data)."""
        version = self.store.version(EXECUTIONS)  # before a read: a commit after it is seen as foreign
        if self._cached is None or version != self._cached_version:
            table = self.store.read_arrow(EXECUTIONS)
            for column in TIME_COLUMNS:  # the table's timestamps → epoch ms, without a datetime per value
                epoch_ms = table[column].cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64())
                table = table.set_column(table.schema.get_field_index(column), column, epoch_ms)
            self._cached, self._cached_version = table, version
        return self._cached

    def _write(self, rows: list[Execution], app_id: str, batch_id: int) -> None:
        """One merge of ``rows`` keyed by (action, device), each replacing an older version of its row."""
        if not rows:
            return
        cached, self._cached = self._cached, None  # forgotten unless the merge is known to be the next commit
        schema = self.store.spec(EXECUTIONS).arrow_schema
        epoch_ms = pa.table(
            {
                name: pa.array([getattr(row, name) for row in rows], _INT64 if name in TIME_COLUMNS else None)
                for name in schema.names
            }
        )
        table = epoch_ms
        for column in TIME_COLUMNS:  # epoch ms → the table's timestamp type, without a datetime per value
            stamps = epoch_ms[column].cast(pa.timestamp("ms", tz="UTC"))
            table = table.set_column(table.schema.get_field_index(column), column, stamps)
        table = table.cast(schema)
        written = self.store.merge(EXECUTIONS, table, app_id, batch_id, update_when="s.version > t.version")
        if cached is None or not written:
            return
        # The cache becomes "version + 1" without asking the table: if another writer committed in between,
        # this merge is a later version, no version ever equals the guess again, and the next batch, seeing
        # the table's version differ, reads it. Only when this merge was the next commit does the guess hold.
        keys = pc.binary_join_element_wise(cached["action_id"], cached["device_id"], "\x00")
        replaced = pc.binary_join_element_wise(epoch_ms["action_id"], epoch_ms["device_id"], "\x00")
        kept = cached.filter(pc.invert(pc.is_in(keys, value_set=replaced)))
        self._cached = pa.concat_tables([kept, epoch_ms.cast(cached.schema)])
        self._cached_version += 1


def _group_counts(table: pa.Table) -> dict[str, Counter]:
    """Executions per state of each action in ``table``, counted in Arrow (no Python object per row)."""
    grouped = table.group_by(["action_id", "state"]).aggregate([("device_id", "count")])
    out: dict[str, Counter] = {}
    for action_id, state, count in zip(
        grouped["action_id"].to_pylist(),
        grouped["state"].to_pylist(),
        grouped["device_id_count"].to_pylist(),
        strict=True,
    ):
        out.setdefault(action_id, state_counts([]))[state] = count
    return out


def _counts_after(
    counts: dict[str, Counter], known: dict[str, dict[str, Execution]], changed: Iterable[Execution]
) -> dict[str, Counter]:
    """``counts`` (read with ``known``) once ``changed`` replaced the rows they update (or were added)."""
    out = {action_id: Counter(counted) for action_id, counted in counts.items()}
    for row in changed:
        counted = out.setdefault(row.action_id, state_counts([]))
        before = known.get(row.action_id, {}).get(row.device_id)
        if before is not None:
            counted[before.state] -= 1
        counted[row.state] += 1
    return out
