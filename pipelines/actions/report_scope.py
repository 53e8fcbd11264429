"""Which device reports the executions take: those about an action that reached their device.

A report for a row the action was sent to (``published_at`` set) is taken. Any device may take an action
that went out on a shared topic (a group's or every device's broadcast, a late joiner), so its reports are
taken with or without a row. Any other is about an action the job never sent that device: an action it does
not know (no valid row in ``actions``, a rejected one), an explicit list that does not name it, a staged
rollout that does not target it, or one that targets it but has not sent it yet (a later phase, a rate's
turn to come: its row is still ``QUEUED`` and unsent). Such a report changes no row and no count: before,
it created a row that counted towards the action's abort rules, phase gates and completion, a phantom
summary for an action id nobody wrote, or (unsent) finished a device that was then never sent the action
and aborted a rollout on devices that never had its build.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from pipelines.actions.model import Action
from pipelines.actions.states import Execution, StatusReport

log = logging.getLogger(__name__)

Reports = dict[tuple[str, str], list[StatusReport]]
"""Reports by (action id, device id)."""
SHOWN = 5
"""Reports named in the WARNING about those left out; the rest are counted."""


def in_scope(
    by_key: Reports, rows: Mapping[str, Mapping[str, Execution]], actions: Iterable[Action], batch_id: int
) -> Reports:
    """The reports of ``by_key`` about an execution that was sent (``rows``: by action and device) or may
    start now (a shared topic's late joiner of ``actions``, the valid ones); the others are left out with one
    WARNING for the batch."""
    shared = {action.id for action in actions if action.shared_topic is not None}
    kept: Reports = {}
    left_out: list[str] = []
    for (action_id, device_id), reports in by_key.items():
        row = rows.get(action_id, {}).get(device_id)
        if action_id in shared or (row is not None and row.published_at is not None):
            kept[(action_id, device_id)] = reports
        else:
            left_out.append(f"{action_id} from {device_id}")
    if left_out:
        more = f" and {len(left_out) - SHOWN} more" if len(left_out) > SHOWN else ""
        log.warning(
            "reports batch %d: reports about an action never sent to their device ignored: %s%s",
            batch_id,
            ", ".join(left_out[:SHOWN]),
            more,
        )
    return kept
