"""The state and lookups every part of the actions engine shares: the valid actions of the ``actions``
snapshot, the summaries' states, an action's targets and the messages that reach exactly some devices.

The engine is split by job (``engine.py`` its inputs, ``engine_sending.py`` what goes out,
``engine_summary.py`` summaries and aborts, ``engine_compliance.py`` the compliance table); they share one
instance and its lock.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

import pyarrow as pa

from pipelines.actions.arrow_rows import python_rows
from pipelines.actions.buckets import DEFAULT_BUCKETS, bucket_topic, by_bucket
from pipelines.actions.engine_tables import (
    ACTIONS,
    EngineTables,
)
from pipelines.actions.model import DEFAULT_EXPIRY_S, Action, device_topic
from pipelines.actions.operator import action_content
from pipelines.actions.publisher import Outgoing, Publisher
from pipelines.actions.states import (
    IN_PROGRESS,
    QUEUED,
    Execution,
)
from pipelines.actions.summary import FINAL_ACTION_STATES
from pipelines.actions.validation import problems

log = logging.getLogger("pipelines.actions.engine")

COMPLIANCE_INTERVAL_S = 10.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _utc(ms: int | None) -> str:
    return "-" if ms is None else f"{_ts(ms):%Y-%m-%d %H:%M:%S} UTC"


def _devices(count: int) -> str:
    return f"{count} device{'' if count == 1 else 's'}"


def _retry_message(
    action: Action, now: int, attempt: int, expiry_s: int
) -> Callable[[list[str] | None], bytes]:
    return lambda listed: action.message(now, listed, attempt, expiry_s)


def _reached_and_open(row: Execution) -> bool:
    """The device has (or may have) the action message and has not reported a final state."""
    sent = row.state == QUEUED and row.published_at is not None and row.retry_at is None
    return row.state == IN_PROGRESS or sent


class EngineBase:
    """What the parts of :class:`~pipelines.actions.engine.ActionsEngine` share: its tables, publisher, clock
    and what it remembers between batches."""

    def __init__(
        self,
        store,
        publisher: Publisher,
        clock: Callable[[], int] = _now_ms,
        app_id: str = "actions",
        device_buckets: int = DEFAULT_BUCKETS,
        compliance_interval_s: float = COMPLIANCE_INTERVAL_S,
        message_expiry_s: int = DEFAULT_EXPIRY_S,
    ) -> None:
        if device_buckets < 0:
            raise ValueError("device_buckets must be 0 (per-device topics) or more")
        if message_expiry_s < 1:
            raise ValueError("message_expiry_s must be at least 1")
        self.store = store
        self.tables = EngineTables(store)
        self.publisher = publisher
        self.device_buckets = device_buckets
        self.clock = clock
        self.app_id = app_id
        self.compliance_interval_s = compliance_interval_s
        self.message_expiry_s = message_expiry_s
        """How long an action message stays valid for a device that has not taken it (``expires_at``)."""
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
        self._no_target: dict[str, str] = {}
        """Actions fanned out to no device that none will ever join, with why: completed by their summary."""
        self._payload_changes: dict[str, str] = {}
        """Actions whose row's kind or payload changed after they were taken in, with what was said."""
        self._failing: dict[str, str] = {}
        """Actions whose last tick failed, with the error said about it."""
        self._reports_waited_since: int | None = None
        """Since when (ms) the ticks have sent nothing, waiting for the reports stream to catch up."""
        self._reports_wait_warned = False
        """Whether that wait was said at WARNING."""
        self._unsent: set[str] | None = None
        """Actions whose fan-out was refused, sent by the ticker (None until the first tick: every action)."""
        self._compliance_inputs: tuple[int, ...] | None = None
        self._compliance_at = 0.0

    def _held_back(self, action_id: str, error: Exception) -> None:
        """Say (once per different error) that an action's send failed (at its fan-out or a tick): what it
        sent is not recorded and goes again at the next tick, as after a restart; the others go on."""
        said = f"{type(error).__name__}: {error}"
        if self._failing.get(action_id) != said:
            self._failing[action_id] = said
            log.warning("action %s held back, tried again at the next tick: %s", action_id, said)

    def _listed_messages(
        self,
        device_ids: list[str],
        message: Callable[[list[str] | None], bytes],
        expires_in_ms: int | None = None,
    ) -> list[Outgoing]:
        """Messages reaching exactly ``device_ids``: one per bucket holding any of them, listing them, or
        one unlisted message per device on its own topic when buckets are off."""
        if not device_ids:
            return []
        if not self.device_buckets:
            payload = message(None)
            return [Outgoing(device_topic(device_id), payload, expires_in_ms) for device_id in device_ids]
        groups = by_bucket(device_ids, self.device_buckets)
        return [
            Outgoing(bucket_topic(bucket), message(groups[bucket]), expires_in_ms)
            for bucket in sorted(groups)
        ]

    def _expires_in(self, action: Action, issued_at: int) -> int:
        """Milliseconds from now until a message of ``action`` issued at ``issued_at`` expires (its
        ``expires_at``): what its publish carries as its Message Expiry Interval."""
        return action.expires_at(issued_at, self.message_expiry_s) - self.clock()

    def _targets(self, action: Action) -> list[str]:
        """The devices an action is for: listed, every device, or a group's (never every device unless
        ``all_devices`` says so)."""
        if action.device_ids:
            return sorted(set(action.device_ids))
        if not (action.all_devices or action.group):
            return []
        return self.tables.targets(None if action.all_devices else action.group)

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
            return [self._as_accepted(action) for action in valid.values()]
        return [self._as_accepted(valid[key]) for key in dict.fromkeys(ids) if key in valid]

    def _as_accepted(self, action: Action) -> Action:
        """``action`` doing what it was taken in with (``action_summary.accepted_payload``): a kind or
        payload changed in place since is refused, with a WARNING once per change and the summary's
        ``payload_change`` saying so; the devices not sent it yet get the build the phase gates and abort
        rules judged."""
        accepted = self.tables.accepted_payloads().get(action.id)
        if accepted is None or accepted == action.build:
            return action
        kept = action.with_build(accepted)
        was, now = json.loads(accepted), json.loads(action.build)
        fields = [
            k if k == "kind" else f"payload.{k}" for k in sorted({*was, *now}) if was.get(k) != now.get(k)
        ]
        change = (
            f"payload changed in place after the action started ({', '.join(fields)}): refused, it goes on "
            "with the payload it started with (write a new action to send another)"
        )
        if self._payload_changes.get(action.id) != change:
            self._payload_changes[action.id] = change
            log.warning("action %s: %s", action.id, change)
        return kept
