"""What ``timestone ota status`` tells an operator: each action as written, where it stands, what is left.

An action is a row in ``actions`` before it is anything else: until the actions job has seen it there is no
summary, and the status says so, with whether a job is running against these tables (its heartbeat,
``heartbeat.py``). Once summarised, the status adds the counts per state, the reason an action ended
otherwise than completed (the rejected field, the abort threshold crossed), and the devices that have not
finished (the first few, and how many).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.actions.arrow_rows import OutOfRange, out_of_range, python_rows
from pipelines.actions.engine import REPORTS_WAIT_WARNING_S
from pipelines.actions.heartbeat import STALE_AFTER_S, Heartbeat
from pipelines.actions.operator import action_content, differences, read_actions
from pipelines.actions.schedule import Schedule
from pipelines.actions.states import ALL_STATES, IN_PROGRESS, QUEUED
from pipelines.actions.summary import FINAL_ACTION_STATES
from pipelines.actions.validation import problems
from sinks.store import Matching, TableStore

__all__ = ["WAITING", "ActionStatus", "describe", "describe_job", "describe_list", "read_statuses"]

WAITING = "WAITING"
"""Shown for an action the actions job has not summarised yet (not a value of ``action_state``)."""
OPEN_STATES = (QUEUED, IN_PROGRESS)


@dataclass
class ActionStatus:
    """One action: its latest row, its summary, and its devices that have not finished."""

    action_id: str
    row: dict[str, Any] | None
    summary: dict[str, Any] | None
    open_devices: list[dict[str, Any]] = field(default_factory=list)
    """The first few executions still QUEUED or IN_PROGRESS, by device id."""
    open_count: int = 0
    rejects: list[str] = field(default_factory=list)
    """Why the actions job will reject its row, while it has not summarised it (a row written by hand)."""
    other_rows: str | None = None
    """Rows of other content appended under its id, which the job ignores: how many, and what differs."""

    @property
    def state(self) -> str:
        return WAITING if self.summary is None else str(self.summary["action_state"])

    @property
    def ended(self) -> bool:
        return self.state in FINAL_ACTION_STATES


def _latest_rows(table: pa.Table, key: str) -> dict[str, dict]:
    """The last row per key (a timestamp no ``datetime`` holds is an ``OutOfRange``)."""
    return {row[key]: row for row in python_rows(table)}


def _action_rows(table: pa.Table) -> tuple[dict[str, dict], dict[str, str]]:
    """The row per action id that the job takes, and for the ids with rows of other content appended
    under them (which the job ignores) how many there are and the fields that differ. Of several rows the
    job takes the one it sent, the one created first (``EngineBase._first_created``); a ``cancel`` on any
    of them counts."""
    by_id: dict[str, list[dict]] = {}
    for row in python_rows(table):
        by_id.setdefault(row["id"], []).append(row)
    taken: dict[str, dict] = {}
    others: dict[str, str] = {}
    for key, rows in by_id.items():
        never = datetime.max.replace(tzinfo=UTC)
        first = min(rows, key=lambda r: c if isinstance(c := r.get("created_at"), datetime) else never)
        taken[key] = {**first, "cancel": any(bool(r.get("cancel")) for r in rows)}
        content = action_content(first)
        fields = {line.split(":")[0] for r in rows for line in differences(content, action_content(r))}
        if fields:
            others[key] = f"{len(rows)} rows with other content under this id ({', '.join(sorted(fields))})"
    return taken, others


def _shown(row: dict | None) -> dict | None:
    """``row`` with a timestamp no ``datetime`` holds shown as none (the job rejects such a row, and the
    summary's reason names it)."""
    if row is None or not out_of_range(row):
        return row
    return {name: None if isinstance(value, OutOfRange) else value for name, value in row.items()}


def read_statuses(
    store: TableStore, action_id: str | None = None, open_limit: int = 10
) -> list[ActionStatus]:
    """The status of ``action_id`` (empty when no table knows it), or of every action, newest first; the
    not-finished devices are listed only for one action."""
    rows, others = _read_actions(store, action_id)
    summaries = _read(store, "action_summary", "action_id", action_id)
    keys = dict.fromkeys([*rows, *summaries])
    statuses = [
        ActionStatus(key, _shown(rows.get(key)), summaries.get(key), other_rows=others.get(key))
        for key in keys
    ]
    for status in statuses:
        if status.summary is None and status.action_id in rows:  # read as the job will read it
            status.rejects = [str(problem) for problem in problems(rows[status.action_id])]
    if action_id is not None:
        for status in statuses:
            status.open_devices, status.open_count = _open_executions(store, action_id, open_limit)
    epoch = datetime.min.replace(tzinfo=UTC)
    return sorted(  # a row written without an id (the job rejects it) is listed too, under "-"
        statuses, key=lambda s: ((s.row or {}).get("created_at") or epoch, s.action_id or ""), reverse=True
    )


def _read(store: TableStore, name: str, key: str, value: str | None) -> dict[str, dict]:
    if not store.exists(name):
        return {}
    table = store.read_arrow(name)
    if value is not None:
        table = table.filter(pc.equal(table[key], value))
    return _latest_rows(table, key)


def _read_actions(store: TableStore, action_id: str | None) -> tuple[dict[str, dict], dict[str, str]]:
    """``_action_rows`` of the ``actions`` table (of ``action_id`` only, when given)."""
    table = read_actions(store)
    if table is None:
        return {}, {}
    if action_id is not None:
        table = table.filter(pc.equal(table["id"], action_id))
    return _action_rows(table)


def _open_executions(store: TableStore, action_id: str, limit: int) -> tuple[list[dict], int]:
    if not store.exists("action_executions"):
        return [], 0
    where = (Matching("action_id", (action_id,)), Matching("state", tuple(OPEN_STATES)))
    table = store.read_arrow("action_executions", where=where).sort_by("device_id")
    return table.slice(0, limit).to_pylist(), table.num_rows


# -- text -----------------------------------------------------------------------------------------------


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(ms: int, now_ms: int) -> str:
    seconds = max(0, (now_ms - ms) // 1000)
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def describe_job(
    beat: Heartbeat | None, now_ms: int, tables_root: str, start: str = "timestone pipeline actions"
) -> str:
    """Whether an actions job is running against these tables, from its heartbeat (``start``: the command
    that starts one on them), and whether it holds every action, waiting for its reports stream."""
    if beat is None:
        return f"actions job: no actions job has run against {tables_root} (start one: {start})"
    where = f"on {beat.host} (pid {beat.pid})"
    if beat.running(now_ms):
        running = f"actions job: running {where}, last heartbeat {_ago(beat.beat_at_ms, now_ms)}"
        return running + _held(beat)
    how = "stopped" if beat.stopped else f"not running (no heartbeat for over {STALE_AFTER_S:.0f} s)"
    return f"actions job: {how} {where}, last heartbeat {_ago(beat.beat_at_ms, now_ms)} (start one: {start})"


def _held(beat: Heartbeat) -> str:
    """The line saying that the job holds every action until its reports stream has caught up (how long it
    had waited at its last heartbeat); empty while it sends."""
    if beat.reports_wait_since_ms is None:
        return ""
    waited_s = max(0, beat.beat_at_ms - beat.reports_wait_since_ms) // 1000
    down = " (is one of them down?)" if waited_s >= REPORTS_WAIT_WARNING_S else ""
    return (
        f"\nheld      every action: the actions job has sent nothing for {waited_s} s, waiting for its "
        f"reports stream to catch up with the brokers{down}; nothing goes out until it has"
    )


def _target(row: dict) -> str:
    target = row.get("target") or {}
    if target.get("device_ids"):
        ids = target["device_ids"]
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        return f"{len(ids)} device{'s' if len(ids) != 1 else ''}: {shown}"
    if target.get("group") is not None:
        return f"group {target['group']}"
    return "all devices" if target.get("all") else "none"


def _as_sent(row: dict, summary: dict | None) -> dict:
    """``row`` with the kind and payload the actions job took the action in with and sends
    (``accepted_payload``), whatever the row says now."""
    accepted = (summary or {}).get("accepted_payload")
    if not accepted:
        return row
    payload = json.loads(accepted)
    return {**row, "kind": payload.pop("kind", None), "payload": payload}


def _what(row: dict) -> str:
    payload = row.get("payload") or {}
    if row.get("kind") == "ota":
        return f"firmware {payload.get('version')} from {payload.get('url')}"
    if row.get("kind") == "command":
        args = payload.get("args") or []
        pairs = args.items() if isinstance(args, dict) else args
        shown = " ".join(f"{k}={v}" for k, v in pairs)
        return f"command {payload.get('command')}" + (f" {shown}" if shown else "")
    return f"kind {row.get('kind')!r}"


def _rollout(row: dict) -> str:
    """How the action goes out: rate, growth, phases, aborts, retries, timeout."""
    rollout = row.get("rollout") or {}
    growth = row.get("exponential_rate") or {}
    parts = [f"{rollout['max_per_minute']} devices/min" if rollout.get("max_per_minute") else "broadcast"]
    if growth.get("base_per_minute"):
        every = growth.get("notified_devices") or growth.get("succeeded_devices")
        trigger = "notified" if growth.get("notified_devices") else "succeeded"
        ceiling = f" up to {rollout['max_per_minute']}" if rollout.get("max_per_minute") else ""
        parts[0] = (
            f"from {growth['base_per_minute']} devices/min, x{growth.get('increment_factor'):g} every "
            f"{every} {trigger}{ceiling}"
        )
    if row.get("phases"):
        parts.append("phases " + ", ".join(_phase(p) for p in row["phases"]))
    parts += [_abort(rule) for rule in _abort_rules(row)]
    for retry in row.get("retries") or ():
        backoff = f" after {retry['backoff_s']} s" if retry.get("backoff_s") else ""
        factor = f" (x{retry['backoff_factor']:g})" if retry.get("backoff_factor") not in (None, 1.0) else ""
        parts.append(f"retry {retry['failure_kind']} up to {retry['max_retries']}x{backoff}{factor}")
    if row.get("in_progress_timeout_s"):
        parts.append(f"timeout {row['in_progress_timeout_s']} s per device")
    if (row.get("rollback") or {}).get("version"):
        parts.append(f"rollback to {row['rollback']['version']} on abort")
    return "; ".join(parts)


def _phase(phase: dict) -> str:
    if phase.get("percent") is not None:
        share = f"{phase['percent']:g} %"
    elif phase.get("devices") is not None:
        share = str(phase["devices"])
    else:
        share = "rest"
    holds = []
    if phase.get("wait_s"):
        holds.append(f"wait {phase['wait_s']} s")
    if phase.get("success_pct"):
        holds.append(f"{phase['success_pct']:g} % succeeded")
    return share + (f" ({', '.join(holds)})" if holds else "")


def _abort_rules(row: dict) -> list[dict]:
    legacy = row.get("abort_criteria") or {}
    rules = [dict(rule) for rule in row.get("abort_rules") or ()]
    if legacy.get("failure_pct") is not None:
        rules.insert(
            0,
            {
                "failure_kind": "failed or timed out",
                "threshold_pct": legacy["failure_pct"],
                "min_executed": legacy.get("min_executed"),
            },
        )
    return rules


def _abort(rule: dict) -> str:
    minimum = rule.get("min_executed") or 1
    return f"abort at {rule['threshold_pct']:g} % {rule['failure_kind']} after {minimum} finished"


def _when(row: dict) -> str | None:
    """The schedule and windows, when there are any."""
    schedule = row.get("schedule") or {}
    parts = []
    if schedule.get("start_at"):
        parts.append(f"from {_time(schedule['start_at'])}")
    if schedule.get("end_at"):
        behavior = " (then cancel)" if schedule.get("end_behavior") == "cancel" else ""
        parts.append(f"until {_time(schedule['end_at'])}{behavior}")
    for window in row.get("maintenance_windows") or ():
        days = ",".join(window["days"]) if window.get("days") else "daily"
        zone = window.get("time_zone") or "UTC"
        parts.append(f"window {days} {window['start']} for {window['duration_min']} min {zone}")
    if row.get("continuous"):
        parts.append("continuous (devices joining the group get it too)")
    return "; ".join(parts) or None


def _counts(summary: dict) -> str:
    counts = " ".join(f"{state.lower()}={summary.get(f'{state.lower()}_count') or 0}" for state in ALL_STATES)
    return f"{counts} total={summary['total_count']}"


def _waiting_for(row: dict, now_ms: int) -> str | None:
    """Why nothing new goes out to devices now, and until when: the scheduled start has not come, or every
    maintenance window is closed (the next one opens then); None when the action may send."""
    schedule = Schedule.from_row(row)
    if not schedule.started(now_ms):
        return f"its start: nothing goes out before {_time(_datetime(schedule.start_at_ms))}"
    if schedule.ended(now_ms) or schedule.in_window(now_ms):
        return None
    opens = schedule.next_opening(now_ms)
    if opens is None:
        return "its maintenance windows: none opens in the next 8 days"
    return (
        f"its maintenance window: nothing new goes out until {_time(_datetime(opens))}, when the next opens"
    )


def _datetime(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def describe(status: ActionStatus, job: str, now_ms: int | None = None) -> str:
    """One action in full (``job``: :func:`describe_job`'s line, shown while the action has not ended; with
    ``now_ms``, what it waits for before it sends anything new: its start, its next maintenance window)."""
    lines = [f"action    {status.action_id}"]
    row = status.row
    if row is not None:
        lines += [
            f"created   {_time(row.get('created_at'))} by {row.get('created_by') or '-'}",
            f"target    {_target(row)}",
            f"what      {_what(_as_sent(row, status.summary))}",
            f"rollout   {_rollout(row)}",
        ]
        when = _when(row)
        if when:
            lines.append(f"when      {when}")
        if status.other_rows:
            lines.append(
                f"rows      {status.other_rows}: the actions job takes the one created first and ignores "
                "the others (write a new action)"
            )
    else:
        lines.append("row       not in the actions table (only its summary is)")
    summary = status.summary
    if summary is None:
        canceled = " (cancel requested)" if row is not None and row.get("cancel") else ""
        lines.append(f"state     {WAITING}: the actions job has not picked it up yet{canceled}")
        if status.rejects:  # a row written by hand, read as the job will read it
            shown = "; ".join(status.rejects[:3])
            more = f" (and {len(status.rejects) - 3} more)" if len(status.rejects) > 3 else ""
            lines.append(f"rejects   the actions job will reject it, sending nothing: {shown}{more}")
    else:
        state = status.state
        if row is not None and row.get("cancel") and not status.ended:
            state += " (cancel requested)"
        lines.append(f"state     {state}, updated {_time(summary.get('updated_at'))}")
        lines.append(f"devices   {_counts(summary)}")
        progress = _progress(summary, row or {})
        if progress:
            lines.append(f"progress  {progress}")
        if summary.get("reason"):
            lines.append(f"reason    {summary['reason']}")
        if summary.get("payload_change"):
            lines.append(f"refused   {summary['payload_change']}")
    waiting = (
        _waiting_for(row, now_ms) if row is not None and now_ms is not None and not status.ended else None
    )
    if waiting is not None:
        lines.append(f"waiting   for {waiting}")
    if status.open_count:
        lines.append(f"not done  {status.open_count} device{'s' if status.open_count != 1 else ''}:")
        for execution in status.open_devices:
            details = (
                f" ({_printable(execution['status_details'])})" if execution.get("status_details") else ""
            )
            since = execution.get("started_at") or execution.get("published_at") or execution.get("queued_at")
            device = _printable(execution["device_id"])
            lines.append(f"          {device} {execution['state']}{details} since {_time(since)}")
        if status.open_count > len(status.open_devices):
            lines.append(f"          ... and {status.open_count - len(status.open_devices)} more")
    printed = [_printable(line) for line in lines]  # what rows written by hand hold, as a terminal shows it
    if not status.ended:
        printed.append(job)
    return "\n".join(printed)


def _printable(text: str) -> str:
    """What a device sent (its id, its report's details) or a row written by hand holds, as one line a
    terminal shows as it is: a character that is not printable (a newline, an ANSI escape) is written as
    Python escapes it (``\\n``, ``\\x1b``)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _progress(summary: dict, row: dict) -> str | None:
    parts = []
    if summary.get("phase") is not None:
        parts.append(f"phase {summary['phase']} of {len(row.get('phases') or ()) or '?'}")
    if summary.get("retries_count"):
        parts.append(f"{summary['retries_count']} retries")
    if summary.get("aborted_by"):
        parts.append(f"aborted by {summary['aborted_by']}")
    if summary.get("rollback_action_id"):
        parts.append(f"rollback {summary['rollback_action_id']}")
    return ", ".join(parts) or None


def describe_list(statuses: Iterable[ActionStatus], job: str) -> str:
    """Every action, one line each (newest first), then whether the job runs; the action column as wide as
    its longest id (a rollback's is its action's and ``-rollback``)."""
    statuses = list(statuses)
    width = max([22, *(len(_printable(status.action_id or "-")) for status in statuses)])
    header = f"{'action':<{width}} {'kind':<8} {'state':<12} {'done':>11}  {'created':<23} target"
    lines = [header]
    for status in statuses:
        row = status.row or {}
        summary = status.summary
        done = (
            "-" if summary is None else f"{summary['total_count'] - _open(summary)}/{summary['total_count']}"
        )
        kind = str(row.get("kind", "-"))[:8]
        target = _target(row) if row else "-"
        created = _time(row.get("created_at"))
        action = _printable(status.action_id or "-")
        line = f"{action:<{width}} {kind:<8} {status.state:<12} {done:>11}  {created:<23} {target}"
        lines.append(_printable(line))  # an id or a group written by hand forges no line, moves no cursor
    lines.append(job)
    return "\n".join(lines)


def _open(summary: dict) -> int:
    return sum(int(summary[f"{state.lower()}_count"]) for state in OPEN_STATES)
