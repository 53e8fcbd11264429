"""What the actions engine sends and records: an action fanned out, what a rollout releases at a
tick, retries, timeouts, the schedule's end, and the cancel messages of a stop."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from pipelines.actions.engine_base import EngineBase, _devices, _reached_and_open, _retry_message, _utc
from pipelines.actions.model import Action, cancel_message
from pipelines.actions.phases import phase_of_devices
from pipelines.actions.publisher import Outgoing
from pipelines.actions.release import Release, due, fired_rule
from pipelines.actions.retries import retry
from pipelines.actions.schedule import END_CANCEL
from pipelines.actions.states import (
    CANCELED,
    EXPIRED,
    FAILED,
    IN_PROGRESS,
    QUEUED,
    TIMED_OUT,
    Execution,
    platform_transition,
    queued,
)
from pipelines.actions.summary import FINAL_ACTION_STATES

log = logging.getLogger("pipelines.actions.engine")

ROW_DELETED = "its row was deleted from actions"
"""The reason of an action that had not ended when its row was deleted from the ``actions`` table."""


@dataclass(frozen=True)
class Turn:
    """What one action sends at once: its publishes, not made yet, and its rows as they are once sent."""

    sends: list[Callable[[], None]]
    sent: list[Execution]

    def publish(self) -> None:
        for send in self.sends:
            send()


def _shortened(messages: list[Outgoing], elapsed_ms: int) -> list[Outgoing]:
    """``messages`` with ``elapsed_ms`` less of their expiry intervals (those without one as they are)."""
    if elapsed_ms <= 0:
        return messages
    return [
        message
        if message.expires_in_ms is None
        else message._replace(expires_in_ms=message.expires_in_ms - elapsed_ms)
        for message in messages
    ]


def unrecorded(rows: Iterable[Execution]) -> list[Execution]:
    """Rows a tick or a fan-out marked as being sent and never recorded as sent, the device not heard from
    since."""
    return sorted(
        (r for r in rows if r.sending_at is not None and r.awaiting_device), key=lambda r: r.device_id
    )


class Sending(EngineBase):
    """Fan-out, release, failures and stopping of :class:`~pipelines.actions.engine.ActionsEngine`."""

    def _fan_out(self, action: Action, now: int) -> tuple[list[Execution], Turn]:
        """Queue a new action's targets (with their phases): their rows as queued, and what is due now, not
        published yet (``_publish_turns`` marks it as being sent with the rows, publishes it, records it)."""
        targets = self._targets(action)
        phases = phase_of_devices(action.id, action.phases, targets) if len(action.phases) > 1 else {}
        rows = {d: queued(action.id, d, now, phase=phases.get(d)) for d in targets}
        topic = action.shared_topic
        if not rows and topic is not None and action.schedule.may_send(now):
            message = action.message(now, expiry_s=self.message_expiry_s)
            self.publisher.publish(topic, message, self._expires_in(action, now))  # for later joiners
            log.info("action %s broadcast on %s, which has no registered device yet", action.id, topic)
            return [], Turn([], [])
        if not rows and not action.continuous:  # targets the group as it was: nothing will ever go out
            where = "no device" if action.all_devices else f"no device in group {action.group!r}"
            self._no_target[action.id] = (
                f"no device to send it to: the devices table had {where} when the job read the action, and "
                "a device registered later is not queued (write a new action, or a continuous one)"
            )
            log.warning(
                "action %s completed without sending anything: %s", action.id, self._no_target[action.id]
            )
            return [], Turn([], [])
        turn = self._turn(action, rows, now)
        log.info(
            "action %s queued for %d devices, %d sent now%s",
            action.id,
            len(rows),
            len(turn.sent),
            f" ({action.max_per_minute}/min)" if action.max_per_minute else "",
        )
        return list(rows.values()), turn

    def _turn(self, action: Action, rows: Mapping[str, Execution], now: int) -> Turn:
        """What ``action`` sends now, not sent yet: first messages and retries that are due, and the
        messages of rows a tick or a fan-out marked as being sent and never recorded
        (``Execution.sending_at``: the device may have it or not; it acts once per action id, so it is sent
        again), unless an abort rule fired."""
        release = due(action, rows, now)
        if release.phase is not None:
            self._phases[action.id] = release.phase
        again = [] if fired_rule(action, rows) is not None else unrecorded(rows.values())
        if not release and not again:
            return Turn([], [])
        sends = self._first_sends(action, rows, release, now)
        for attempt in sorted({row.attempt for row in release.retries}):
            ids = [row.device_id for row in release.retries if row.attempt == attempt]
            message = _retry_message(action, now, attempt, self.message_expiry_s)
            sends.append(self._publishing(self._listed_messages(ids, message, self._expires_in(action, now))))
        sends += self._sends_again(action, again)
        expires_at = action.expires_at(now, self.message_expiry_s)
        sent = [
            replace(
                rows[d], published_at=now, version=rows[d].version + 1, updated_at=now, expires_at=expires_at
            )
            for d in release.first
        ]
        sent += [
            replace(row, retry_at=None, version=row.version + 1, updated_at=now, expires_at=expires_at)
            for row in release.retries
        ]
        sent += [replace(row, version=row.version + 1, sending_at=None) for row in again]
        return Turn(sends, sent)

    def _publishing(self, messages: list[Outgoing]) -> Callable[[], None]:
        """The publish of ``messages``, made later (after the rows marking them as being sent are written):
        their expiry intervals count from now, so the time until then is taken off them, and none outlives
        its row's ``expires_at`` at a broker however long the write took."""
        made = self.clock()

        def publish() -> None:
            self.publisher.publish_many(_shortened(messages, self.clock() - made))

        return publish

    def _first_sends(
        self, action: Action, rows: Mapping[str, Execution], release: Release, now: int
    ) -> list[Callable[[], None]]:
        if not release.first:
            return []
        topic = action.shared_topic
        untouched = all(row.published_at is None for row in rows.values())
        if topic is not None and untouched and len(release.first) == len(rows):
            message = action.message(now, expiry_s=self.message_expiry_s)
            publish = self._publishing([Outgoing(topic, message, self._expires_in(action, now))])

            def broadcast() -> None:
                publish()
                log.info("action %s broadcast on %s to %d devices", action.id, topic, len(rows))

            return [broadcast]
        messages = self._listed_messages(
            release.first,
            lambda ids: action.message(now, ids, expiry_s=self.message_expiry_s),
            self._expires_in(action, now),
        )
        return [self._publishing(messages)]

    def _sends_again(self, action: Action, rows: list[Execution]) -> list[Callable[[], None]]:
        """The messages of rows marked as being sent by a tick or a fan-out that did not record them, as
        they were issued then (same time, attempt and expiry)."""
        sends = []
        for issued_at, attempt, expires_at in sorted({(r.updated_at, r.attempt, r.expires_at) for r in rows}):
            ids = [
                r.device_id
                for r in rows
                if (r.updated_at, r.attempt, r.expires_at) == (issued_at, attempt, expires_at)
            ]
            expiry_s = self.message_expiry_s
            if expires_at is not None:
                expiry_s = max(1, (expires_at - max(action.created_at_ms, issued_at)) // 1000)
            message = _retry_message(action, issued_at, attempt, expiry_s)
            expires_in = (
                expires_at if expires_at is not None else action.expires_at(issued_at, expiry_s)
            ) - self.clock()
            sends.append(self._publishing(self._listed_messages(ids, message, expires_in)))
        if rows:
            log.warning(
                "action %s: sent again to %s that the job marked as being sent and did not record (it "
                "stopped or the publish failed in between)",
                action.id,
                _devices(len(rows)),
            )
        return sends

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

    def _deleted(self, action_id: str, rows: Mapping[str, Execution], now: int) -> list[Execution]:
        """An action whose row was deleted from ``actions`` before it ended, which nothing can pace, time
        out or cancel any more: the devices that have it are told to stop, the others canceled."""
        reached = [row.device_id for row in rows.values() if _reached_and_open(row)]
        listed = self._listed_messages(reached, lambda ids: cancel_message(action_id, now, ids))
        self.publisher.publish_many(listed)
        changed = self._cancel_queued(rows, ROW_DELETED, now)
        log.warning(
            "action %s canceled: %s before it ended (%s told to stop, %d queued executions canceled)",
            action_id,
            ROW_DELETED,
            _devices(len(reached)),
            len(changed),
        )
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

    def _may_have_expired(self, action: Action, expired_by: int) -> bool:
        """Whether a message of ``action`` may have expired by ``expired_by`` (none is older than the
        action)."""
        return action.expires_at(action.created_at_ms, self.message_expiry_s) <= expired_by

    def _expire(
        self, action: Action, rows: Mapping[str, Execution], now: int, expired_by: int
    ) -> list[Execution]:
        """Rows sent a message (the first, or a retry notice) that expired by ``expired_by`` with nothing
        reported about it: EXPIRED, the device will not act on it (docs/ota.md, "Devices that never take
        an action"). Each row expires when the message it was sent did; a row sent by a job before rows
        said so, ``message_expiry_s`` after it was sent."""
        changed = []
        for row in rows.values():
            if not row.awaiting_device:
                continue
            expires_at = row.expires_at
            if expires_at is None:
                expires_at = action.expires_at(row.updated_at, self.message_expiry_s)
            if expires_at > expired_by:
                continue
            details = f"message expired at {_utc(expires_at)} before the device took it"
            updated = platform_transition(row, EXPIRED, details, now)
            if updated is not None:
                changed.append(updated)
        if changed:
            log.info(
                "action %s: %d devices had not taken it when its message expired", action.id, len(changed)
            )
        return changed

    def _time_out(
        self, action: Action, rows: dict[str, Execution], now: int, read_until: int
    ) -> list[Execution]:
        """``IN_PROGRESS`` rows whose timeout passed by ``read_until`` (the reports read until then: a final
        report that came in time, still unread after a restart, is not overtaken), TIMED_OUT at ``now``."""
        if not action.in_progress_timeout_s:
            return []
        limit = action.in_progress_timeout_s * 1000
        changed = []
        for row in rows.values():
            if (
                row.state == IN_PROGRESS
                and row.started_at is not None
                and read_until - row.started_at >= limit
            ):
                details = f"no final report within {action.in_progress_timeout_s} s"
                updated = platform_transition(row, TIMED_OUT, details, now)
                if updated is not None:
                    changed.append(updated)
        return changed
