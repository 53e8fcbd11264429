"""Checks of one value of an ``actions`` row: a value in, what is wrong with it out (None: nothing).

Each check skips nothing: whether a field must be set at all is said by the rules that use these
(``validation.py``). Devices use a few of them on what they receive (``pipelines/fleet/device.py``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

Check = Callable[[Any], str | None]
"""A value in, what is wrong with it out (None: nothing)."""

MAX_DEVICE_IDS = 100_000
"""Devices one explicit-id action may list; a larger target is a group (``devices.group``)."""
MAX_ID_LENGTH = 128
MAX_TEXT_LENGTH = 256
MAX_URL_LENGTH = 2048
MAX_COMMAND_ARGS = 64
MAX_IDS_SHOWN = 20
"""Unusable device ids one refusal names; it counts the others."""
MAX_SHOWN_LENGTH = 48
"""Characters of a refused value a refusal quotes."""

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
"""Day names of a weekly maintenance window, in ``datetime.weekday()`` order."""

_TOPIC_UNSAFE = re.compile("[/+#\x00-\x1f\x7f-\x9f\ufeff]")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_CLOCK_TIME = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")
_NOT_ONE_LEVEL = "contains '/', '+' or '#', which cannot be part of one topic level"


def text(max_length: int = MAX_TEXT_LENGTH) -> Check:
    """A non-blank string of at most ``max_length`` characters without control characters."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"expected a string, got {type(value).__name__}"
        if not value.strip():
            return "must not be empty"
        if len(value) > max_length:
            return f"longer than {max_length} characters"
        if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):  # C0, DEL and C1
            return "contains control characters"
        if "\ufeff" in value:  # files joined with their byte order marks: 'dev-3' became '\ufeffdev-3'
            return "contains a byte order mark (U+FEFF), as a text file joined to another leaves one"
        return None

    return check


def topic_level(value: Any) -> str | None:
    """A name that becomes one MQTT topic level (``actions/groups/<group>``, ``actions/devices/<id>``)."""
    problem = _level_problem(value)
    return f"{value!r} {problem}" if problem == _NOT_ONE_LEVEL else problem


def _level_problem(value: Any) -> str | None:
    """What keeps ``value`` from being one topic level, without naming the value."""
    problem = text(MAX_ID_LENGTH)(value)
    if problem is None and _TOPIC_UNSAFE.search(value):
        return _NOT_ONE_LEVEL
    return problem


def unusable_ids(ids: Sequence[Any]) -> str | None:
    """Every id of ``ids`` that cannot be one topic level, by its index and grouped by what is wrong with it
    (the first :data:`MAX_IDS_SHOWN` named, the others counted); None when every one can."""
    bad = [(index, problem) for index, value in enumerate(ids) if (problem := _level_problem(value))]
    if not bad:
        return None
    named: dict[str, list[str]] = {}
    for index, problem in bad[:MAX_IDS_SHOWN]:
        named.setdefault(problem, []).append(f"[{index}] {_shown(ids[index])}")
    said = "; ".join(f"{', '.join(listed)}: {problem}" for problem, listed in named.items())
    more = f"; and {len(bad) - MAX_IDS_SHOWN} more" if len(bad) > MAX_IDS_SHOWN else ""
    return f"{len(bad)} device {'id' if len(bad) == 1 else 'ids'} cannot be used: {said}{more}"


def _shown(value: Any) -> str:
    """``value`` as a refusal quotes it: its ``repr``, cut short past :data:`MAX_SHOWN_LENGTH` characters."""
    quoted = repr(value)
    return quoted if len(quoted) <= MAX_SHOWN_LENGTH else f"{quoted[: MAX_SHOWN_LENGTH - 3]}..."


def usable_as_topic_level(value: Any) -> bool:
    """Whether a name read from elsewhere (the ``devices`` table) can be one topic level at all: a non-blank
    string without ``/``, ``+``, ``#`` or control characters, of any length."""
    return isinstance(value, str) and bool(value.strip()) and not _TOPIC_UNSAFE.search(value)


def integer(minimum: int, maximum: int) -> Check:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an integer, got {type(value).__name__}"
        if not minimum <= value <= maximum:
            return f"must be from {minimum} to {maximum}, got {value}"
        return None

    return check


def number(above: float, maximum: float) -> Check:
    """A number above ``above`` and at most ``maximum``."""

    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected a number, got {type(value).__name__}"
        if not above < value <= maximum:
            return f"must be above {above:g} and at most {maximum:g}, got {value}"
        return None

    return check


percentage = number(0, 100)
"""A share in percent: above 0, at most 100."""


def one_of(*allowed: str) -> Check:
    def check(value: Any) -> str | None:
        if value not in allowed:
            return f"expected one of {', '.join(allowed)}, got {value!r}"
        return None

    return check


def boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"expected true or false, got {type(value).__name__}"


def timestamp(value: Any) -> str | None:
    """A point in time (a Delta ``timestamp``: timezone-aware once read)."""
    if not isinstance(value, datetime):
        return f"expected a timestamp, got {type(value).__name__}"
    if value.tzinfo is None:
        return "a timestamp without a time zone (give it in UTC)"
    try:
        value.astimezone(UTC)
    except OverflowError:
        return "a timestamp outside the years 1 to 9999 in UTC"
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
    return unusable_ids(value) or _twice(value)


def _twice(values: list | tuple) -> str | None:
    if len(set(values)) == len(values):
        return None
    twice = sorted(str(v) for v, n in Counter(values).items() if n > 1)
    return f"lists {', '.join(twice[:5])}{' ...' if len(twice) > 5 else ''} more than once"


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


def clock_time(value: Any) -> str | None:
    """A time of day, ``HH:MM`` on the 24-hour clock."""
    if not isinstance(value, str) or not _CLOCK_TIME.match(value):
        return f"expected a time of day as HH:MM (00:00 to 23:59), got {value!r}"
    return None


def time_zone(value: Any) -> str | None:
    """An IANA time zone name that this machine's zone database knows (``Europe/Berlin``, ``UTC``)."""
    if not isinstance(value, str) or not value:
        return f"expected an IANA time zone name, got {value!r}"
    try:
        ZoneInfo(value)
    # a name that is a directory of the zone database (Europe), or too long for a file name, fails on
    # opening the file (OSError): as unknown as a name that is not there
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return f"unknown time zone {value!r} (an IANA name such as Europe/Berlin or UTC)"
    return None


def weekdays(value: Any) -> str | None:
    """Days of the week by their three-letter names, none twice, at least one."""
    if not isinstance(value, list | tuple) or not value:
        return f"expected a list of days ({', '.join(WEEKDAYS)}), got {value!r}"
    unknown = [day for day in value if day not in WEEKDAYS]
    if unknown:
        return f"unknown day {unknown[0]!r}; days are {', '.join(WEEKDAYS)}"
    return _twice(value)
