"""MQTT topic-filter matching for persistence rules and log listings (MQTT 5 section 4.7)."""

from __future__ import annotations


def topic_matches(topic_filter: str, topic: str) -> bool:
    """True when `topic` matches `topic_filter` (`+` one level, `#` the rest, `$`-topics need a literal)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    for depth, level in enumerate(filter_levels):
        if level == "#":
            return True
        if depth >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[depth]:
            return False
    return len(filter_levels) == len(topic_levels)


def validate_filter(topic_filter: str) -> None:
    """Raise `ValueError` unless `topic_filter` is a well-formed MQTT topic filter."""
    if not topic_filter:
        raise ValueError("a topic filter is at least one character")
    levels = topic_filter.split("/")
    for depth, level in enumerate(levels):
        if "#" in level and (level != "#" or depth != len(levels) - 1):
            raise ValueError(f"'#' must be a whole last level in {topic_filter!r}")
        if "+" in level and level != "+":
            raise ValueError(f"'+' must be a whole level in {topic_filter!r}")
