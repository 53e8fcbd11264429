"""What a valid ``actions`` row is: one definition, checked wherever a row enters.

Operators write rows with ``timestone ota create``, a notebook, SQL or any Delta writer; only the row says
what they meant. The actions job checks every row it reads against these rules before anything is
published, and ``timestone ota create`` checks the row it is about to write against the same rules. A row
that breaks one is never published: the job gives the action the final state ``REJECTED`` in
``action_summary``, with the problem naming the field (``payload.url: required for an ota action``).

The rules are data. :data:`KINDS` says which payload fields each kind of action uses and needs;
:data:`FIELD_RULES` checks one field's value wherever it is set; :data:`ROW_RULES` checks fields that only
make sense together (exactly one target); :data:`LIST_RULES` checks every item of an array column (the
phases of a rollout, its abort rules, retries, maintenance windows), naming the item (``phases[1].percent``,
counted from 0 as Spark SQL indexes arrays). A new column of the row or a new kind of action is one more
entry in these tables, and both the job and the command line check it from then on. The value checks
themselves are in ``checks.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipelines.actions.arrow_rows import out_of_range
from pipelines.actions.checks import (
    MAX_DEVICE_IDS,
    MAX_ID_LENGTH,
    Check,
    boolean,
    clock_time,
    command_args,
    device_ids,
    http_url,
    integer,
    number,
    one_of,
    percentage,
    sha256_hex,
    text,
    time_zone,
    timestamp,
    topic_level,
    weekdays,
)

__all__ = [
    "ABORT_KINDS",
    "FIELD_RULES",
    "KINDS",
    "LIST_RULES",
    "MAX_DEVICE_IDS",
    "RETRY_KINDS",
    "ROW_RULES",
    "ActionKind",
    "FieldRule",
    "InvalidAction",
    "ListRule",
    "RowRule",
    "check_action_row",
    "field_value",
    "given",
    "problems",
]

MAX_FIRMWARE_BYTES = 1 << 40
MAX_PER_MINUTE = 1_000_000
MAX_TIMEOUT_S = 30 * 24 * 3600
MAX_PHASE_DEVICES = 10_000_000
MAX_WAIT_S = 365 * 24 * 3600
MAX_BACKOFF_S = 7 * 24 * 3600
MAX_RETRIES = 10
"""Retries of one device for one failure kind, as AWS IoT Jobs allows."""
MINUTES_PER_DAY = 24 * 60

ABORT_KINDS = ("failed", "rejected", "timed_out", "any")
"""What an abort rule counts: FAILED, REJECTED or TIMED_OUT executions, or all three (``any``)."""
RETRY_KINDS = ("failed", "timed_out", "any")
"""What a retry rule retries (a device that rejected an action refused it: it is not retried)."""
END_BEHAVIORS = ("stop", "cancel")


class InvalidAction(ValueError):
    """An actions row breaks a rule; ``field`` is the dotted path of the column (``payload.url``)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


# -- the definition -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActionKind:
    """A kind of action: the payload fields it uses, and which of them it cannot do without."""

    uses: tuple[str, ...]
    required: tuple[str, ...]


KINDS: dict[str, ActionKind] = {
    "ota": ActionKind(uses=("version", "url", "sha256", "size"), required=("version", "url", "sha256")),
    "command": ActionKind(uses=("command", "args"), required=("command",)),
}
"""Every kind of action devices understand (docs/device-protocol.md), by the ``kind`` column's value."""

PAYLOAD_FIELDS: tuple[str, ...] = ("version", "url", "sha256", "size", "command", "args")


@dataclass(frozen=True)
class FieldRule:
    """The checks of one field's value, applied when it is set (null fields are the kinds' business)."""

    field: str
    checks: tuple[Check, ...]


@dataclass(frozen=True)
class ListRule:
    """The checks of every item of an array column: its own fields' rules, the fields it cannot do
    without, and how many items it may have."""

    field: str
    max_items: int
    items: tuple[FieldRule, ...]
    required: tuple[str, ...] = ()


@dataclass(frozen=True)
class RowRule:
    """A check of fields that only make sense together; ``field`` is the one a problem is reported on,
    unless the check names another (an item of an array: ``phases[2].wait_s``)."""

    field: str
    check: Callable[[Mapping[str, Any]], str | InvalidAction | None]


def given(value: Any) -> bool:
    """Whether a value is set: not null, and for a struct, not a struct of nulls only (what a SQL writer's
    ``named_struct`` of nulls gives)."""
    if isinstance(value, Mapping):
        return any(given(v) for v in value.values())
    return value is not None


def _one_target(row: Mapping[str, Any]) -> str | None:
    listed = field_value(row, "target.device_ids")
    group = field_value(row, "target.group")
    every = field_value(row, "target.all")
    named = [
        name
        for name, set_ in (
            ("device_ids", listed is not None and len(listed) > 0),
            ("group", group is not None),
            ("all", every is True),
        )
        if set_
    ]
    if not named:
        return "no target: set device_ids, a group, or all = true (an empty target is never every device)"
    if len(named) > 1:
        return f"sets {' and '.join(named)}: give exactly one target"
    return None


def _rollout_agrees(row: Mapping[str, Any]) -> str | None:
    broadcast = field_value(row, "rollout.broadcast")
    rate = field_value(row, "rollout.max_per_minute")
    exponential = given(row.get("exponential_rate"))
    if broadcast is True and (rate is not None or exponential):
        paced = f"max_per_minute is {rate}" if rate is not None else "exponential_rate is set"
        return f"broadcast is true but {paced}: a broadcast has no rate"
    if broadcast is False and rate is None and not exponential:
        return "broadcast is false but max_per_minute is not set: a paced rollout needs a rate"
    return None


def _exponential_complete(row: Mapping[str, Any]) -> str | InvalidAction | None:
    growth = row.get("exponential_rate")
    if not isinstance(growth, Mapping) or not given(growth):
        return None
    for name in ("base_per_minute", "increment_factor"):
        if growth.get(name) is None:
            return InvalidAction(f"exponential_rate.{name}", "required for an exponential rollout")
    triggers = [name for name in ("notified_devices", "succeeded_devices") if growth.get(name) is not None]
    if len(triggers) != 1:
        return "give exactly one of notified_devices and succeeded_devices: what makes the rate grow"
    ceiling = field_value(row, "rollout.max_per_minute")
    base = growth["base_per_minute"]
    if isinstance(ceiling, int) and isinstance(base, int) and base > ceiling:
        return InvalidAction(
            "exponential_rate.base_per_minute",
            f"{base} is above rollout.max_per_minute {ceiling}, the rate's ceiling",
        )
    return None


def _phases_share_the_target(row: Mapping[str, Any]) -> str | InvalidAction | None:
    """Each phase but the last names its share (a percentage or a count); the last takes the rest."""
    phases = row.get("phases")
    if not isinstance(phases, list | tuple) or not phases or not all(isinstance(p, Mapping) for p in phases):
        return None
    last = len(phases) - 1
    for index, phase in enumerate(phases[:last]):
        shares = [name for name in ("percent", "devices") if phase.get(name) is not None]
        if len(shares) != 1:
            return InvalidAction(f"phases[{index}]", "give exactly one of percent and devices: its share")
    final = phases[last]
    if final.get("devices") is not None:
        return InvalidAction(f"phases[{last}].devices", "the last phase takes every device left: no count")
    for name in ("wait_s", "success_pct"):
        if final.get(name) is not None:
            return InvalidAction(f"phases[{last}].{name}", "the last phase has no next phase to hold back")
    percents = [p.get("percent") for p in phases[:last] if p.get("percent") is not None]
    before_last = sum(v for v in percents if isinstance(v, int | float))
    if before_last >= 100:
        return f"the phases before the last take {before_last:g} % of the target: leave some for the last"
    if isinstance(final.get("percent"), int | float):
        every_percent = len(percents) == last
        if not every_percent or abs(before_last + final["percent"] - 100) > 1e-9:
            return InvalidAction(
                f"phases[{last}].percent",
                "the last phase takes every device left: leave its percent null, or make every phase a "
                "percentage adding up to 100",
            )
    return None


def _rollback_usable(row: Mapping[str, Any]) -> str | InvalidAction | None:
    rollback = row.get("rollback")
    if not isinstance(rollback, Mapping) or not given(rollback):
        return None
    if row.get("kind") != "ota":
        return "only an ota action is rolled back (to a firmware version)"
    for name in ("version", "url", "sha256"):
        if rollback.get(name) in (None, ""):
            return InvalidAction(f"rollback.{name}", "required to roll back")
    aborts = given(row.get("abort_rules")) or field_value(row, "abort_criteria.failure_pct") is not None
    if not aborts:
        return "a rollback happens on abort: give abort_rules (or abort_criteria.failure_pct)"
    if rollback.get("version") == field_value(row, "payload.version"):
        return InvalidAction("rollback.version", "is the version this action installs")
    return None


def _retries_distinct(row: Mapping[str, Any]) -> str | None:
    rules = row.get("retries")
    if not isinstance(rules, list | tuple):
        return None
    kinds = [rule.get("failure_kind") for rule in rules if isinstance(rule, Mapping)]
    if len(set(kinds)) < len(kinds):
        return "a failure kind is given twice: one rule per kind"
    if "any" in kinds and len(kinds) > 1:
        return "'any' retries every failure kind: give it alone"
    return None


def _schedule_in_order(row: Mapping[str, Any]) -> InvalidAction | None:
    start, end = field_value(row, "schedule.start_at"), field_value(row, "schedule.end_at")
    created = row.get("created_at")
    if end is None or timestamp(end) is not None:
        return None
    if start is not None and timestamp(start) is None and end <= start:
        return InvalidAction("schedule.end_at", f"{end.isoformat()} is not after schedule.start_at")
    if created is not None and timestamp(created) is None and end <= created:
        return InvalidAction("schedule.end_at", f"{end.isoformat()} is not after the action's created_at")
    return None


def _continuous_target(row: Mapping[str, Any]) -> str | None:
    if row.get("continuous") is True and not (
        field_value(row, "target.group") is not None or field_value(row, "target.all") is True
    ):
        return "a continuous action targets a group or all devices: a list of devices does not grow"
    return None


def _windows_fit(row: Mapping[str, Any]) -> InvalidAction | None:
    windows = row.get("maintenance_windows")
    if not isinstance(windows, list | tuple):
        return None
    for index, window in enumerate(windows):
        if not isinstance(window, Mapping):
            continue
        duration = window.get("duration_min")
        daily = window.get("days") is None
        if daily and isinstance(duration, int) and duration > MINUTES_PER_DAY:
            return InvalidAction(
                f"maintenance_windows[{index}].duration_min",
                f"a daily window lasts at most {MINUTES_PER_DAY} minutes, got {duration}",
            )
    return None


FIELD_RULES: tuple[FieldRule, ...] = (
    FieldRule("id", (text(MAX_ID_LENGTH),)),
    FieldRule("target.device_ids", (device_ids,)),
    FieldRule("target.group", (topic_level,)),
    FieldRule("payload.version", (text(64),)),
    FieldRule("payload.url", (http_url,)),
    FieldRule("payload.sha256", (sha256_hex,)),
    FieldRule("payload.size", (integer(1, MAX_FIRMWARE_BYTES),)),
    FieldRule("payload.command", (text(64),)),
    FieldRule("payload.args", (command_args,)),
    FieldRule("rollout.max_per_minute", (integer(1, MAX_PER_MINUTE),)),
    FieldRule("abort_criteria.failure_pct", (percentage,)),
    FieldRule("abort_criteria.min_executed", (integer(1, MAX_DEVICE_IDS),)),
    FieldRule("in_progress_timeout_s", (integer(1, MAX_TIMEOUT_S),)),
    FieldRule("exponential_rate.base_per_minute", (integer(1, MAX_PER_MINUTE),)),
    FieldRule("exponential_rate.increment_factor", (number(1, 5),)),
    FieldRule("exponential_rate.notified_devices", (integer(1, MAX_PHASE_DEVICES),)),
    FieldRule("exponential_rate.succeeded_devices", (integer(1, MAX_PHASE_DEVICES),)),
    FieldRule("rollback.version", (text(64),)),
    FieldRule("rollback.url", (http_url,)),
    FieldRule("rollback.sha256", (sha256_hex,)),
    FieldRule("rollback.size", (integer(1, MAX_FIRMWARE_BYTES),)),
    FieldRule("schedule.start_at", (timestamp,)),
    FieldRule("schedule.end_at", (timestamp,)),
    FieldRule("schedule.end_behavior", (one_of(*END_BEHAVIORS),)),
    FieldRule("continuous", (boolean,)),
)
"""The checks of each field's value (dotted paths into the row, as ``docs/tables.md`` lists them)."""

LIST_RULES: tuple[ListRule, ...] = (
    ListRule(
        "phases",
        100,
        (
            FieldRule("percent", (percentage,)),
            FieldRule("devices", (integer(1, MAX_PHASE_DEVICES),)),
            FieldRule("wait_s", (integer(0, MAX_WAIT_S),)),
            FieldRule("success_pct", (percentage,)),
        ),
    ),
    ListRule(
        "abort_rules",
        16,
        (
            FieldRule("failure_kind", (one_of(*ABORT_KINDS),)),
            FieldRule("threshold_pct", (percentage,)),
            FieldRule("min_executed", (integer(1, MAX_PHASE_DEVICES),)),
        ),
        required=("failure_kind", "threshold_pct"),
    ),
    ListRule(
        "retries",
        len(RETRY_KINDS),
        (
            FieldRule("failure_kind", (one_of(*RETRY_KINDS),)),
            FieldRule("max_retries", (integer(1, MAX_RETRIES),)),
            FieldRule("backoff_s", (integer(0, MAX_BACKOFF_S),)),
            FieldRule("backoff_factor", (number(0.999999, 10),)),
        ),
        required=("failure_kind", "max_retries"),
    ),
    ListRule(
        "maintenance_windows",
        32,
        (
            FieldRule("days", (weekdays,)),
            FieldRule("start", (clock_time,)),
            FieldRule("duration_min", (integer(1, 7 * MINUTES_PER_DAY),)),
            FieldRule("time_zone", (time_zone,)),
        ),
        required=("start", "duration_min"),
    ),
)
"""The checks of every item of each array column."""

ROW_RULES: tuple[RowRule, ...] = (
    RowRule("target", _one_target),
    RowRule("rollout", _rollout_agrees),
    RowRule("exponential_rate", _exponential_complete),
    RowRule("phases", _phases_share_the_target),
    RowRule("rollback", _rollback_usable),
    RowRule("retries", _retries_distinct),
    RowRule("schedule", _schedule_in_order),
    RowRule("continuous", _continuous_target),
    RowRule("maintenance_windows", _windows_fit),
)
"""Checks across fields."""


def field_value(row: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path of a row (None when it or a struct on the way is null)."""
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _kind_problems(row: Mapping[str, Any]) -> Iterable[InvalidAction]:
    kind = row.get("kind")
    if kind not in KINDS:
        known = ", ".join(sorted(KINDS))
        yield InvalidAction("kind", f"unknown kind {kind!r}; one of {known}")
        return
    spec = KINDS[kind]
    for name in spec.required:
        if field_value(row, f"payload.{name}") in (None, "", [], {}):
            yield InvalidAction(f"payload.{name}", f"required for {_a(kind)} action")
    for name in PAYLOAD_FIELDS:
        if name not in spec.uses and field_value(row, f"payload.{name}") not in (None, [], {}):
            yield InvalidAction(f"payload.{name}", f"not used by {_a(kind)} action")


def _a(kind: str) -> str:
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def _value_problem(checks: tuple[Check, ...], value: Any) -> str | None:
    for check in checks:
        problem = check(value)
        if problem is not None:
            return problem
    return None


def _list_problems(rule: ListRule, items: Any) -> Iterable[InvalidAction]:
    if not isinstance(items, list | tuple):
        yield InvalidAction(rule.field, f"expected a list, got {type(items).__name__}")
        return
    if len(items) > rule.max_items:
        yield InvalidAction(rule.field, f"has {len(items)} items, more than {rule.max_items}")
    for index, item in enumerate(items):
        where = f"{rule.field}[{index}]"
        if not isinstance(item, Mapping):
            yield InvalidAction(where, f"expected a struct, got {type(item).__name__}")
            continue
        for name in rule.required:
            if item.get(name) is None:
                yield InvalidAction(f"{where}.{name}", "required")
        for item_rule in rule.items:
            value = item.get(item_rule.field)
            problem = None if value is None else _value_problem(item_rule.checks, value)
            if problem is not None:
                yield InvalidAction(f"{where}.{item_rule.field}", problem)


def problems(row: Mapping[str, Any]) -> list[InvalidAction]:
    """Everything wrong with an ``actions`` row (as read from the table, or about to be written).

    A row holding a timestamp no ``datetime`` can hold (``arrow_rows.OutOfRange``) is only that: its other
    columns are not looked at."""
    unreadable = out_of_range(row)
    if unreadable:
        return [InvalidAction(value.field, value.problem) for value in unreadable]
    found: list[InvalidAction] = []
    if row.get("id") is None:
        found.append(InvalidAction("id", "required"))
    if row.get("created_at") is None:
        found.append(InvalidAction("created_at", "required"))
    found += _kind_problems(row)
    for rule in ROW_RULES:
        problem = rule.check(row)
        if isinstance(problem, InvalidAction):
            found.append(problem)
        elif problem is not None:
            found.append(InvalidAction(rule.field, problem))
    for field_rule in FIELD_RULES:
        value = field_value(row, field_rule.field)
        problem = None if value is None else _value_problem(field_rule.checks, value)
        if problem is not None:
            found.append(InvalidAction(field_rule.field, problem))
    for list_rule in LIST_RULES:
        items = row.get(list_rule.field)
        if items is not None:
            found += _list_problems(list_rule, items)
    return found


def check_action_row(row: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidAction` for the first problem of ``row``, naming its field."""
    found = problems(row)
    if found:
        raise found[0]
