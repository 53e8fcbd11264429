"""A warning when option ``topics`` matches none of the logs the brokers hold.

A misspelt filter (``plnt/+/telemetry``) read nothing, batch after batch, without a word. Once a run, when
brokers have answered, the reader looks: a broker read by topic was listed with the filters (its listing
is what they match); one read by storage partition is asked for its logs matching them. Brokers holding no
record yet (a new deployment) are no reason to warn, nor is a broker that cannot be asked.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

from broker_edge.offsets_api.client import OffsetsClient

from .offsets_planner import LogExtent
from .slice_reader import FetchSettings
from .topic_cover import listing

__all__ = ["BrokerWay", "say_if_nothing_matches"]

log = logging.getLogger("sources.timestone_source")


@dataclass(frozen=True)
class BrokerWay:
    """How one broker that answered is read and asked."""

    by_partition: bool
    fetch: FetchSettings
    client: OffsetsClient


def say_if_nothing_matches(
    topics: tuple[str, ...],
    patterns: tuple[str, ...],
    listings: Mapping[str, Mapping[str, LogExtent]],
    ways: Mapping[str, BrokerWay],
) -> None:
    """Warn when ``topics`` (listed as ``patterns``) match none of the logs of the brokers of ``listings``
    that hold records."""
    if any(logs and not ways[broker].by_partition for broker, logs in listings.items()):
        return  # (listed with the filters: they match)
    holding = [broker for broker, logs in listings.items() if _holds_records(logs, ways[broker])]
    read_by_partition = [broker for broker in holding if ways[broker].by_partition]
    if holding and not any(_matches_a_log(patterns, ways[broker]) for broker in read_by_partition):
        log.warning(
            "option 'topics' (%s) matches none of the logs %s holds: nothing is read until one it matches "
            "is created (a filter misspelt?)",
            ", ".join(topics),
            ", ".join(sorted(holding)),
        )


def _holds_records(logs: Mapping[str, LogExtent], way: BrokerWay) -> bool:
    """Whether the broker holds records (False when unsure: a cluster, a token limited to topics)."""
    if way.by_partition:
        return any(extent.end for extent in logs.values())
    try:
        return any(extent.end_position for extent in way.fetch.call(way.client.partitions))
    except Exception:
        return False


def _matches_a_log(patterns: tuple[str, ...], way: BrokerWay) -> bool:
    """Whether a log of a broker read by partition matches ``patterns`` (True when unsure)."""
    sent, keep = listing(patterns)
    try:
        for pattern in sent:
            listed = way.fetch.call(partial(way.client.list_logs, pattern))
            if any(keep is None or keep(info.topic) for info in listed):
                return True
    except Exception:  # (a broker gone since its listing: no warning on a guess)
        return True
    return False
