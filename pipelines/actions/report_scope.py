"""Which device reports the executions take: those about an action that reached their device.

A device has an execution row once the action was fanned out to it (queued, sent, or a continuous action's
joiner), so a report for a row is taken. A report for a device without one is a device that took the action
from a shared topic (a group's or every device's broadcast, a late joiner) only when the action went out on
one; any other is about an action the job never sent it: an action it does not know (no valid row in
``actions``, a rejected one), an explicit list that does not name it, a staged rollout that does not target
it. Such a report changes no row and no count: before, it created a row that counted towards the action's
abort rules, phase gates and completion, and a phantom summary for an action id nobody wrote.
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
    """The reports of ``by_key`` about an execution that exists (``rows``: by action and device) or may start
    now (a shared topic's late joiner of ``actions``, the valid ones); the others are left out with one
    WARNING for the batch."""
    shared = {action.id for action in actions if action.shared_topic is not None}
    kept: Reports = {}
    left_out: list[str] = []
    for (action_id, device_id), reports in by_key.items():
        if device_id in rows.get(action_id, {}) or action_id in shared:
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
