"""The topic filters a broker read by topic was last listed with: which of its logs are new.

A broker's offsets read by topic hold every topic its last listing found (``offsets_planner`` records each
listed topic, read or not). ``"#f<filter>": 0`` beside them (MQTT topic names cannot hold ``#``) says the
broker answered a listing with that filter and every topic it listed is among these offsets. So a log the
broker lists later, matching a filter named there, appeared after that listing: it starts at offset 0, and
a log start above 0 means retention removed its first records before the query read them (data loss, as
Kafka's source reports an added partition that does not start at 0).

Logs that are new otherwise are read from their start, as before: the query's first start (a broker that
was down then has no filters named, and ``earliest`` is its log start), a filter added to ``topics`` between
runs (its topics were never listed), offsets written before the filters were kept. A broker down at a
batch keeps the filters of its last listing. A cluster's offsets name them (under the cluster's name) when
every member listed its logs: a topic whose replicas were all silent was not listed. Not kept past
MAX_KEPT_FILTERS filters (the offsets stay small), nor for a hub's sites.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from broker_edge.protocol.topics import topic_matches

from .partition_offsets import MAX_KEPT_FILTERS

__all__ = ["LISTED_PREFIX", "appeared", "listed_filters", "with_listed", "without_listed"]

LISTED_PREFIX = "#f"

Offsets = dict[str, dict[str, int]]


def listed_filters(offsets: Mapping[str, int]) -> list[str]:
    """The filters a broker's offsets say it was last listed with (none: not recorded)."""
    return [key[len(LISTED_PREFIX) :] for key in offsets if key.startswith(LISTED_PREFIX)]


def without_listed(offsets: Mapping[str, Mapping[str, int]]) -> Offsets:
    """``offsets`` without the listed filters' keys (what the planner takes)."""
    return {
        broker: {key: value for key, value in keys.items() if not key.startswith(LISTED_PREFIX)}
        for broker, keys in offsets.items()
    }


def appeared(
    start: Mapping[str, Mapping[str, int]], topics: Mapping[str, Iterable[str]]
) -> dict[str, set[str]]:
    """Per broker, the ``topics`` absent from ``start`` that match a filter ``start`` says it was listed
    with: logs created since, which must start at offset 0."""
    found: dict[str, set[str]] = {}
    for broker, names in topics.items():
        keys = start.get(broker, {})
        filters = listed_filters(keys)
        if not filters:
            continue
        new = {
            topic
            for topic in names
            if topic not in keys and any(topic_matches(topic_filter, topic) for topic_filter in filters)
        }
        if new:
            found[broker] = new
    return found


def with_listed(
    offsets: Mapping[str, Mapping[str, int]],
    start: Mapping[str, Mapping[str, int]],
    listed: Collection[str],
    filters: Collection[str],
) -> Offsets:
    """``offsets`` (without listed filters' keys) with each broker of ``listed`` naming ``filters`` (none past
    MAX_KEPT_FILTERS) and every other broker the filters ``start`` named (a broker down keeps them). Not
    sorted: ``offsets_planner.canonical`` the batch's offsets once they are complete."""
    kept = len(filters) <= MAX_KEPT_FILTERS
    named: Offsets = {broker: dict(keys) for broker, keys in offsets.items()}
    for broker in set(named) | set(listed):
        marks = filters if broker in listed else listed_filters(start.get(broker, {}))
        if broker in listed and not kept:
            continue
        for topic_filter in marks:
            named.setdefault(broker, {})[LISTED_PREFIX + topic_filter] = 0
    return named
