"""What a valid ``actions`` row is: one definition, checked wherever a row enters.

Operators write rows with ``timestone ota create``, a notebook, SQL or any Delta writer; only the row says
what they meant. The actions job checks every row it reads against these rules before anything is
published, and ``timestone ota create`` checks the row it is about to write against the same rules. A row
that breaks one is never published: the job gives the action the final state ``REJECTED`` in
``action_summary``, with the problem naming the field (``payload.url: required for an ota action``).

The rules are data. :data:`KINDS` says which payload fields each kind of action uses and needs;
:data:`FIELD_RULES` checks one field's value wherever it is set; :data:`ROW_RULES` checks fields that only
make sense together (exactly one target). A new column of the row (a rollout phase, a schedule, a
maintenance window) or a new kind of action is one more entry in these tables, and both the job and the
command line check it from then on.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "FIELD_RULES",
    "KINDS",
    "ROW_RULES",
    "ActionKind",
    "FieldRule",
    "InvalidAction",
    "RowRule",
    "check_action_row",
    "field_value",
    "problems",
]

Check = Callable[[Any], str | None]
"""A value in, what is wrong with it out (None: nothing)."""

MAX_DEVICE_IDS = 100_000
"""Devices one explicit-id action may list; a larger target is a group (``devices.group``)."""
MAX_ID_LENGTH = 128
MAX_TEXT_LENGTH = 256
MAX_URL_LENGTH = 2048
MAX_COMMAND_ARGS = 64
MAX_FIRMWARE_BYTES = 1 << 40
MAX_PER_MINUTE = 1_000_000
MAX_TIMEOUT_S = 30 * 24 * 3600

_TOPIC_UNSAFE = re.compile(r"[/+#\x00-\x1f\x7f]")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


class InvalidAction(ValueError):
    """An actions row breaks a rule; ``field`` is the dotted path of the column (``payload.url``)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


# -- checks of one value (each skips None: whether a field must be set is said apart) -------------------


def text(max_length: int = MAX_TEXT_LENGTH) -> Check:
    """A non-blank string of at most ``max_length`` characters without control characters."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"expected a string, got {type(value).__name__}"
        if not value.strip():
            return "must not be empty"
        if len(value) > max_length:
            return f"longer than {max_length} characters"
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            return "contains control characters"
        return None

    return check


def topic_level(value: Any) -> str | None:
    """A name that becomes one MQTT topic level (``actions/groups/<group>``, ``actions/devices/<id>``)."""
    problem = text(MAX_ID_LENGTH)(value)
    if problem is None and _TOPIC_UNSAFE.search(value):
        return f"{value!r} contains '/', '+' or '#', which cannot be part of one topic level"
    return problem


def integer(minimum: int, maximum: int) -> Check:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an integer, got {type(value).__name__}"
        if not minimum <= value <= maximum:
            return f"must be from {minimum} to {maximum}, got {value}"
        return None

    return check


def percentage(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a number, got {type(value).__name__}"
    if not 0 < value <= 100:
        return f"must be above 0 and at most 100, got {value}"
    return None


def http_url(value: Any) -> str | None:
    """An absolute http(s) URL with a host: what a device can download from."""
    problem = text(MAX_URL_LENGTH)(value)
    if problem is not None:
        return problem
    try:
        parts = urlsplit(value)
    except ValueError as exc:
        return f"not a URL: {value!r} ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in value:
        return f"not an http(s) URL with a host: {value!r}"
    return None


def sha256_hex(value: Any) -> str | None:
    if not isinstance(value, str) or not _SHA256.match(value):
        return f"expected 64 hexadecimal digits (a SHA-256), got {value!r}"
    return None


def device_ids(value: Any) -> str | None:
    """A non-empty list of device ids, each a topic level, none twice, at most :data:`MAX_DEVICE_IDS`."""
    if not isinstance(value, list | tuple):
        return f"expected a list of device ids, got {type(value).__name__}"
    if len(value) > MAX_DEVICE_IDS:
        return f"lists {len(value)} devices, more than {MAX_DEVICE_IDS} (target a group instead)"
    for index, device_id in enumerate(value):
        problem = topic_level(device_id)
        if problem is not None:
            return f"[{index}]: {problem}"
    if len(set(value)) < len(value):
        twice = sorted(d for d, n in Counter(value).items() if n > 1)
        return f"lists {', '.join(twice[:5])}{' ...' if len(twice) > 5 else ''} more than once"
    return None


def command_args(value: Any) -> str | None:
    pairs = list(value.items()) if isinstance(value, Mapping) else value
    if not isinstance(pairs, list):
        return f"expected a map of strings, got {type(value).__name__}"
    if len(pairs) > MAX_COMMAND_ARGS:
        return f"has {len(pairs)} arguments, more than {MAX_COMMAND_ARGS}"
    for key, argument in pairs:
        problem = text()(key) or (None if argument is None else text(MAX_URL_LENGTH)(argument))
        if problem is not None:
            return f"[{key!r}]: {problem}"
    return None


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
class RowRule:
    """A check of fields that only make sense together; ``field`` is the one a problem is reported on."""

    field: str
    check: Callable[[Mapping[str, Any]], str | None]


def _one_target(row: Mapping[str, Any]) -> str | None:
    listed = field_value(row, "target.device_ids")
    group = field_value(row, "target.group")
    every = field_value(row, "target.all")
    given = [
        name
        for name, set_ in (
            ("device_ids", listed is not None and len(listed) > 0),
            ("group", group is not None),
            ("all", every is True),
        )
        if set_
    ]
    if not given:
        return "no target: set device_ids, a group, or all = true (an empty target is never every device)"
    if len(given) > 1:
        return f"sets {' and '.join(given)}: give exactly one target"
    return None


def _rollout_agrees(row: Mapping[str, Any]) -> str | None:
    broadcast = field_value(row, "rollout.broadcast")
    rate = field_value(row, "rollout.max_per_minute")
    if broadcast is True and rate is not None:
        return f"broadcast is true but max_per_minute is {rate}: a broadcast has no rate"
    if broadcast is False and rate is None:
        return "broadcast is false but max_per_minute is not set: a paced rollout needs a rate"
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
)
"""The checks of each field's value (dotted paths into the row, as ``docs/tables.md`` lists them)."""

ROW_RULES: tuple[RowRule, ...] = (
    RowRule("target", _one_target),
    RowRule("rollout", _rollout_agrees),
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


def problems(row: Mapping[str, Any]) -> list[InvalidAction]:
    """Everything wrong with an ``actions`` row (as read from the table, or about to be written)."""
    found: list[InvalidAction] = []
    if row.get("id") is None:
        found.append(InvalidAction("id", "required"))
    if row.get("created_at") is None:
        found.append(InvalidAction("created_at", "required"))
    found += _kind_problems(row)
    for rule in ROW_RULES:
        problem = rule.check(row)
        if problem is not None:
            found.append(InvalidAction(rule.field, problem))
    for field_rule in FIELD_RULES:
        value = field_value(row, field_rule.field)
        if value is None:
            continue
        for check in field_rule.checks:
            problem = check(value)
            if problem is not None:
                found.append(InvalidAction(field_rule.field, problem))
                break
    return found


def check_action_row(row: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidAction` for the first problem of ``row``, naming its field."""
    found = problems(row)
    if found:
        raise found[0]
