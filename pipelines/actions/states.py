"""Execution states of one (action, device) and the only transitions allowed between them.

Modelled on AWS IoT Jobs executions. A row only ever moves forward: QUEUED → IN_PROGRESS → a terminal state,
or straight from QUEUED to a terminal state. A report for a row that is already terminal, or one older than
what the row has seen (by the device's report sequence, or from an earlier attempt), changes nothing.

A row's times are the platform's, as AWS IoT Jobs keeps them: when the broker took the report in, not the
``ts`` the device wrote into it. A device's clock may be anywhere (one without a real-time clock starts at
1970 until it syncs), and a time-out counted from it would fire at once or never.

One move goes back, and only the platform makes it: a retry (``retries.py``) takes a FAILED or TIMED_OUT
row to QUEUED as its next ``attempt``, in the same write as the failure, so no reader sees a failure that is
about to be retried as final.

The platform ends a row itself in three ways: TIMED_OUT (no final report within the in-progress timeout),
CANCELED (a cancel, an abort, the schedule's end) and EXPIRED: the action message the row was last sent
expired before the device took it, so the device will never act on it (it ignores an expired message). An
EXPIRED device never tried the action: it is final for the action's completion but no execution the abort
rules or a phase's sample count (``EXECUTED_STATES``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

QUEUED = "QUEUED"
IN_PROGRESS = "IN_PROGRESS"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
TIMED_OUT = "TIMED_OUT"
REJECTED = "REJECTED"
CANCELED = "CANCELED"
EXPIRED = "EXPIRED"

ALL_STATES = (QUEUED, IN_PROGRESS, SUCCEEDED, FAILED, TIMED_OUT, REJECTED, CANCELED, EXPIRED)
TERMINAL_STATES = frozenset({SUCCEEDED, FAILED, TIMED_OUT, REJECTED, CANCELED, EXPIRED})
EXECUTED_STATES = TERMINAL_STATES - {EXPIRED}
"""The final states of a device that had the action: what abort rules and phase samples count as executed."""
PLATFORM_STATES = frozenset({TIMED_OUT, CANCELED, EXPIRED})
"""The final states the platform sets, not a device's report."""
DEVICE_REPORTED_STATES = frozenset({IN_PROGRESS, SUCCEEDED, FAILED, REJECTED, CANCELED})

_RANK = {QUEUED: 0, IN_PROGRESS: 1, **{state: 2 for state in TERMINAL_STATES}}


def is_legal_transition(current: str, new: str) -> bool:
    """True when a row in ``current`` may move to ``new`` (IN_PROGRESS → IN_PROGRESS updates details)."""
    if current in TERMINAL_STATES:
        return False
    if new == IN_PROGRESS and current == IN_PROGRESS:
        return True
    return _RANK[new] > _RANK[current]


@dataclass(frozen=True, slots=True)
class Execution:
    """One row of ``action_executions``.

    ``version`` grows by one with every change; ``report_seq`` is the highest device report sequence applied;
    ``published_at`` is when the action message first went out for this device (one broadcast, or its turn
    in a paced rollout); ``attempt`` counts from 1 and grows with every retry; ``retry_at`` is when a retry
    is due (None once it went out); ``phase`` is the device's phase of a phased rollout (from 1);
    ``expires_at`` is when the message last sent expires (None: sent by a job before the column);
    ``sending_at`` is when a tick or a fan-out marked the row as being sent, before it published the
    message, and is None once it recorded that the message went out: a row still marked was sent by a job
    that stopped in between (the device may have the action, or not), ``docs/ota.md``, "Sends a job did not
    record".
    """

    action_id: str
    device_id: str
    state: str
    version: int
    report_seq: int
    status_details: str
    queued_at: int
    updated_at: int
    published_at: int | None = None
    started_at: int | None = None
    finished_at: int | None = None
    attempt: int = 1
    phase: int | None = None
    retry_at: int | None = None
    expires_at: int | None = None
    sending_at: int | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def executed(self) -> bool:
        """Final, and not EXPIRED: the device had the action and ended it (or the platform did for it)."""
        return self.state in EXECUTED_STATES

    @property
    def awaiting_device(self) -> bool:
        """Sent (its first message, or a retry notice) and nothing reported about it since: the row's
        ``updated_at`` is when that message was issued."""
        return self.state == QUEUED and self.published_at is not None and self.retry_at is None

    @property
    def retry_waiting(self) -> bool:
        """A retry is due (or will be) and has not gone out yet."""
        return self.state == QUEUED and self.retry_at is not None


@dataclass(frozen=True, slots=True)
class StatusReport:
    """What a device said about one action (docs/device-protocol.md)."""

    action_id: str
    device_id: str
    state: str
    seq: int
    ts: int
    details: str = ""
    attempt: int | None = None
    """The attempt the device worked on (None: a device that does not say, on the earlier protocol)."""
    received_at: int | None = None
    """When the platform received it (the broker's append time, epoch ms); None: unknown, ``ts`` stands in."""

    @property
    def at(self) -> int:
        """The report's time on the platform's clock: when it was received, else the device's ``ts``."""
        return self.ts if self.received_at is None else self.received_at


def queued(
    action_id: str, device_id: str, now_ms: int, published_at: int | None = None, phase: int | None = None
) -> Execution:
    """The first row of an execution, written when the action is fanned out."""
    return Execution(action_id, device_id, QUEUED, 1, 0, "", now_ms, now_ms, published_at, phase=phase)


def apply_report(current: Execution | None, report: StatusReport) -> Execution | None:
    """The row after ``report``, or None when the report changes nothing (stale, duplicate or illegal).

    A report for a device without a row (a late joiner that picked the action up from a group topic) starts
    one as if it had been queued at the report's time. Times are the report's :attr:`StatusReport.at`.
    """
    if report.state not in DEVICE_REPORTED_STATES:
        return None
    if current is None:
        current = queued(report.action_id, report.device_id, report.at)
        current = replace(current, version=0)
    if report.seq <= current.report_seq or not is_legal_transition(current.state, report.state):
        return None
    if report.attempt is not None and report.attempt < current.attempt:
        return None  # about an attempt that has been retried since
    started_at = current.started_at
    if started_at is None and report.state == IN_PROGRESS:
        started_at = report.at
    finished_at = report.at if report.state in TERMINAL_STATES else None
    return replace(
        current,
        state=report.state,
        version=current.version + 1,
        report_seq=report.seq,
        status_details=report.details,
        updated_at=report.at,
        started_at=started_at,
        finished_at=finished_at,
    )


def apply_reports(current: Execution | None, reports: list[StatusReport]) -> Execution | None:
    """Fold many reports for one execution, in sequence order; None when nothing changed."""
    row = current
    changed = False
    for report in sorted(reports, key=lambda r: r.seq):
        updated = apply_report(row, report)
        if updated is not None:
            row, changed = updated, True
    return row if changed else None


def platform_transition(current: Execution, state: str, details: str, now_ms: int) -> Execution | None:
    """A change the platform makes (TIMED_OUT, CANCELED, EXPIRED); None when the row is already terminal."""
    if state not in PLATFORM_STATES or not is_legal_transition(current.state, state):
        return None
    return replace(
        current,
        state=state,
        version=current.version + 1,
        status_details=details,
        updated_at=now_ms,
        finished_at=now_ms,
    )
