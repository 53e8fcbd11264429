"""Reading a cluster: whose listing of a topic counts, and which member a task reads each topic from.

Pure functions over a ``ClusterLayout`` and the members' log listings; the Spark glue does the I/O.

Every replica of a partition serves the same committed records at the same offsets; replicas differ only in
how far their committed end has got (a follower learns the leader's high watermark a moment later, a leader
elected a moment ago may trail the old one until its followers fetch again). So a topic's extent is the
longest committed one among the members holding its partition that answered, and the task reading it goes
to that member first, then to the topic's other readers (``ClusterLayout.readers_of``) if it dies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from broker_edge.offsets_api.discovery import ClusterLayout

from .offsets_planner import LogExtent

__all__ = ["TopicRoute", "by_reader", "readers_for", "route_topics"]

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """Where a topic stands in the cluster: its committed extent and the members to read it from."""

    extent: LogExtent
    readers: tuple[str, ...]
    """node ids, best first: the member whose listing gave ``extent``, then the topic's other readers."""


def route_topics(
    layout: ClusterLayout, listings: Mapping[str, Mapping[str, LogExtent]]
) -> dict[str, TopicRoute]:
    """Each listed topic's route, from the listings of the members that answered (node id -> topic ->
    extent). A member's listing of a topic whose partition it does not hold (files left behind when its
    copy moved away) is ignored: it no longer follows the log. Topics no reader listed are left out."""
    routes: dict[str, TopicRoute] = {}
    topics = sorted({topic for logs in listings.values() for topic in logs})
    for topic in topics:
        readers = layout.readers_of(topic)
        best: tuple[str, LogExtent] | None = None
        for node in readers:
            extent = listings.get(node, {}).get(topic)
            if extent is not None and (best is None or extent.end > best[1].end):
                best = (node, extent)
        if best is not None:
            first = best[0]
            routes[topic] = TopicRoute(best[1], (first, *(node for node in readers if node != first)))
    return routes


def readers_for(layout: ClusterLayout, topic: str, preferred: str | None = None) -> tuple[str, ...]:
    """The members to read ``topic`` from, ``preferred`` first when it still holds the partition; every
    live member when none holds it (the readers then say which, if any, has it)."""
    readers = layout.readers_of(topic) or tuple(sorted(layout.members))
    if preferred is not None and preferred in readers:
        return (preferred, *(node for node in readers if node != preferred))
    return readers


def by_reader(
    per_topic: Mapping[str, V], routes: Mapping[str, TopicRoute], layout: ClusterLayout
) -> dict[str, dict[str, V]]:
    """Offsets (or extents) by topic, grouped by the member each topic is read from first (``{node id:
    {topic: value}}``), the shape the planner cuts into tasks of one member each: a task asks one member."""
    grouped: dict[str, dict[str, V]] = {}
    for topic, value in per_topic.items():
        route = routes.get(topic)
        readers = route.readers if route is not None else readers_for(layout, topic)
        grouped.setdefault(readers[0] if readers else "", {})[topic] = value
    return grouped
