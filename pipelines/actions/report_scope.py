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

A late joiner of a group's broadcast is taken only when the ``devices`` registry has it in that group. Any
client may subscribe to a group's topic; before, a device of another group (or of none) that reported as
itself created a row of that group's action, which counted towards its abort rules and completion. Such a
report is left out too, named in a WARNING and counted (``not_a_target``). Every device is a target of every
device's broadcast, registered or not (yet).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TypeVar

from pipelines.actions.model import Action
from pipelines.actions.states import Execution, StatusReport

log = logging.getLogger(__name__)

Reports = dict[tuple[str, str], list[StatusReport]]
"""Reports by (action id, device id)."""
_Held = TypeVar("_Held")
"""What is held per (action id, device id): its reports, or their fold (``reports.ReportFold``)."""
SHOWN = 5
"""Reports named in the WARNING about those left out; the rest are counted."""


def late_joiners(
    by_key: Mapping[tuple[str, str], object],
    rows: Mapping[str, Mapping[str, Execution]],
    actions: Iterable[Action],
) -> set[str]:
    """The devices of ``by_key`` reporting about a group's broadcast (of ``actions``) without a row: those
    whose registered group decides whether they are its targets."""
    groups = {action.id for action in actions if action.shared_topic is not None and not action.all_devices}
    return {d for a, d in by_key if a in groups and rows.get(a, {}).get(d) is None}


def in_scope(
    by_key: Mapping[tuple[str, str], _Held],
    rows: Mapping[str, Mapping[str, Execution]],
    actions: Iterable[Action],
    batch_id: int,
    registered: Mapping[str, str | None] | None = None,
) -> tuple[dict[tuple[str, str], _Held], Counter]:
    """The reports of ``by_key`` about an execution that was sent (``rows``: by action and device) or may
    start now (a shared topic's late joiner of ``actions``, the valid ones: any device for every device's
    broadcast, one that ``registered`` has in the group for a group's; ``registered``: the group of each
    late joiner of a group's broadcast that the ``devices`` table holds; None: not checked); the
    others are left out with one WARNING for the batch per reason, and counted by reason (``not_sent``,
    ``not_a_target``)."""
    shared = {action.id: action for action in actions if action.shared_topic is not None}
    kept: dict[tuple[str, str], _Held] = {}
    left_out: dict[str, list[str]] = {"not_sent": [], "not_a_target": []}
    for (action_id, device_id), reports in by_key.items():
        row = rows.get(action_id, {}).get(device_id)
        action = shared.get(action_id)
        if row is not None and (row.published_at is not None or action is not None):
            kept[(action_id, device_id)] = reports
        elif action is None:
            left_out["not_sent"].append(f"{action_id} from {device_id}")
        elif registered is not None and not _targets(action, device_id, registered):
            group = registered.get(device_id, _UNREGISTERED)
            left_out["not_a_target"].append(f"{action_id} from {device_id} ({_where(group)})")
        else:
            kept[(action_id, device_id)] = reports
    _warn(batch_id, "reports about an action never sent to their device ignored", left_out["not_sent"])
    _warn(
        batch_id,
        "reports of a group's broadcast from a device the devices table does not have in the group ignored",
        left_out["not_a_target"],
    )
    return kept, Counter({reason: len(named) for reason, named in left_out.items() if named})


_UNREGISTERED = object()


def _targets(action: Action, device_id: str, registered: Mapping[str, str | None]) -> bool:
    """Whether ``device_id`` is a target of ``action`` (a shared topic's): every device is every device's;
    a group's, only as ``registered`` there."""
    return action.all_devices or (device_id in registered and registered[device_id] == action.group)


def _where(group: object) -> str:
    if group is _UNREGISTERED:
        return "not registered"
    return f"registered in group {group!r}"


def _warn(batch_id: int, what: str, named: list[str]) -> None:
    if not named:
        return
    more = f" and {len(named) - SHOWN} more" if len(named) > SHOWN else ""
    log.warning("reports batch %d: %s: %s%s", batch_id, what, ", ".join(named[:SHOWN]), more)
