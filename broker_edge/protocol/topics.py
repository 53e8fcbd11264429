"""Topic names and filters: validation, matching, and the ``$share`` / ``$offset`` filter prefixes.

Length and level limits are broker policy, enforced by the broker with ``topic_levels``; this module only
applies the MQTT rules (spec 4.7) and parses Timestone's replay prefix.
"""

from dataclasses import dataclass
from enum import Enum

from .errors import InvalidTopic
from .reason_codes import ReasonCode

SHARE_PREFIX = "$share/"
OFFSET_PREFIX = "$offset/"
_MAX_OFFSET = 2**63 - 1


def validate_topic_name(name: str) -> None:
    """Raise InvalidTopic (TOPIC_NAME_INVALID) unless ``name`` may be published to."""
    if not name:
        raise InvalidTopic("empty topic name")
    if "+" in name or "#" in name:
        raise InvalidTopic(f"wildcard in topic name {name!r}")
    _check_text(name, ReasonCode.TOPIC_NAME_INVALID)


def validate_topic_filter(topic_filter: str) -> None:
    """Raise InvalidTopic (TOPIC_FILTER_INVALID) unless ``topic_filter`` may be subscribed to.

    ``+`` must fill a whole level, ``#`` must be the whole last level, and a ``$share/`` filter must
    name a group (see ``parse_shared``).
    """
    if topic_filter.startswith(SHARE_PREFIX):
        parse_shared(topic_filter)
        return
    if not topic_filter:
        raise InvalidTopic("empty topic filter", ReasonCode.TOPIC_FILTER_INVALID)
    _check_text(topic_filter, ReasonCode.TOPIC_FILTER_INVALID)
    if "+" not in topic_filter and "#" not in topic_filter:
        return
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if level in ("+", "") or (level == "#" and index == last):
            continue
        if "+" in level or "#" in level:
            raise InvalidTopic(
                f"misplaced wildcard in topic filter {topic_filter!r}", ReasonCode.TOPIC_FILTER_INVALID
            )


def _check_text(topic: str, reason_code: int) -> None:
    if "\x00" in topic:
        raise InvalidTopic(f"U+0000 in topic {topic!r}", reason_code)
    if len(topic) > 0x3FFF and len(topic.encode("utf-8", "surrogatepass")) > 0xFFFF:
        raise InvalidTopic("topic longer than 65535 bytes", reason_code)


def topic_matches(topic_filter: str, name: str) -> bool:
    """Whether a message published to ``name`` is delivered to a subscription on ``topic_filter``.

    ``#`` also matches the parent level (``a/#`` matches ``a``); a filter starting with a wildcard does not
    match a ``$`` topic (spec 4.7.2).
    """
    if "+" not in topic_filter and "#" not in topic_filter:
        return topic_filter == name
    if name.startswith("$") and topic_filter[0] in "+#":
        return False
    filter_levels = topic_filter.split("/")
    name_levels = name.split("/")
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True
        if index >= len(name_levels) or (level != "+" and level != name_levels[index]):
            return False
    return len(filter_levels) == len(name_levels)


def topic_levels(name: str) -> int:
    """Number of levels of a topic name or filter (``a/b`` has 2, ``/`` has 2, ``a`` has 1)."""
    return name.count("/") + 1


def parse_shared(topic_filter: str) -> tuple[str | None, str]:
    """Split ``$share/<group>/<filter>`` into (group, filter); any other filter gives (None, filter).

    The group must be non-empty without wildcards, and the inner filter must be a valid filter.
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        return None, topic_filter
    group, separator, inner = topic_filter[len(SHARE_PREFIX) :].partition("/")
    if not group or "+" in group or "#" in group or not separator:
        raise InvalidTopic(f"invalid shared subscription {topic_filter!r}", ReasonCode.TOPIC_FILTER_INVALID)
    validate_topic_filter(inner)
    return group, inner


class OffsetStartKind(Enum):
    OFFSET = "offset"
    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "time"


@dataclass(frozen=True, slots=True)
class OffsetStart:
    """Where a replaying subscription starts reading a topic's log."""

    kind: OffsetStartKind
    value: int | None = None
    """The offset for OFFSET, epoch milliseconds for TIMESTAMP, None otherwise."""


EARLIEST = OffsetStart(OffsetStartKind.EARLIEST)
LATEST = OffsetStart(OffsetStartKind.LATEST)


def parse_offset_start(text: str) -> OffsetStart:
    """Parse ``<decimal offset>``, ``earliest``, ``latest`` or ``time:<epoch-ms>``; ValueError otherwise.

    The grammar of both the ``$offset/<start>/`` prefix and the v5 ``offset`` user property.
    """
    if text == "earliest":
        return EARLIEST
    if text == "latest":
        return LATEST
    kind = OffsetStartKind.OFFSET
    digits = text
    if text.startswith("time:"):
        kind, digits = OffsetStartKind.TIMESTAMP, text[len("time:") :]
    if not (digits.isascii() and digits.isdigit()) or int(digits) > _MAX_OFFSET:
        raise ValueError(
            f"invalid offset start {text!r}: expected an offset, earliest, latest or time:<epoch-ms>"
        )
    return OffsetStart(kind, int(digits))


def parse_offset_filter(topic_filter: str) -> tuple[OffsetStart | None, str]:
    """Split the MQTT 3.1.1 replay form ``$offset/<start>/<filter>``; other filters give (None, filter)."""
    if not topic_filter.startswith(OFFSET_PREFIX):
        return None, topic_filter
    start_text, separator, inner = topic_filter[len(OFFSET_PREFIX) :].partition("/")
    if not separator:
        raise InvalidTopic(
            f"replay filter without a topic filter: {topic_filter!r}", ReasonCode.TOPIC_FILTER_INVALID
        )
    try:
        start = parse_offset_start(start_text)
    except ValueError as exc:
        raise InvalidTopic(str(exc), ReasonCode.TOPIC_FILTER_INVALID) from None
    validate_topic_filter(inner)
    return start, inner
