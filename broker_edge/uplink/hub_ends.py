"""What a site does when its hub holds more of a topic than the site does: its log was lost or replaced.

The hub keeps a site's records at the site's offsets and takes none below the end it holds (a batch sent
again is skipped there), so a site broker that lost its data directory and gives offsets from 0 again
would have every record below the hub's end dropped, until its log passed that end. At each connection a
site broker alone moves such a log on to the hub's end (``ReplicatedLog.continue_at``: a log holding
nothing restarts there, one holding records goes on past a gap), so what its devices publish from then on
reaches the hub; the records it took meanwhile stay in its log and are named at ERROR, never sent. A
cluster member only says so: the logs are the cluster's, led by their partition's leader.
"""

from __future__ import annotations

import logging
from itertools import islice
from typing import TYPE_CHECKING

from broker_edge.storage import StorageError

if TYPE_CHECKING:
    from broker_edge.storage import LogStore

__all__ = ["SHOWN_TOPICS", "follow_hub_ends"]

log = logging.getLogger("broker_edge.uplink.site_link")

SHOWN_TOPICS = 20
"""Topics named one line each; the rest are counted in one line."""


def follow_hub_ends(store: LogStore, hub_ends: dict[str, int], member: bool) -> dict[str, int]:
    """Move each of ``store``'s logs the hub holds further on to the hub's end (a cluster ``member``: only
    say so); returns the end each moved log had."""
    behind: dict[str, int] = {}
    for topic, end in hub_ends.items():
        held = store.committed_end(topic) if topic in store else None
        if (held if held is not None else 0) < end and (held is not None or not member):
            behind[topic] = end
    if not behind:
        return {}
    if member:
        for topic, end in islice(behind.items(), SHOWN_TOPICS):
            log.error(
                "uplink: the hub holds %r up to %d, this member only to %d: this site's log was lost or "
                "replaced; its records below %d are not sent again",
                topic,
                end,
                store.committed_end(topic),
                end,
            )
        _say_more(len(behind))
        return {}
    try:
        moved = store.replicated_log.continue_at(behind)
    except StorageError as error:
        count = len(behind)
        log.error(
            "uplink: the hub holds %d topics further than this site; they cannot go on there: %s",
            count,
            error,
        )
        return {}
    for topic, before in islice(moved.items(), SHOWN_TOPICS):
        end = behind[topic]
        start = store.start_offset(topic)
        if start < before:  # it held records: they stay, before the gap
            log.error(
                "uplink: the hub holds %r up to %d, this site only to %d: this site's log was lost or "
                "replaced; its records %d to %d stay here, never sent (the hub holds others at those "
                "offsets); the log goes on at %d",
                topic,
                end,
                before,
                start,
                before - 1,
                end,
            )
        else:
            log.warning(
                "uplink: the hub holds %r up to %d, this site none of it (its log was lost or replaced): "
                "the log goes on at %d",
                topic,
                end,
                end,
            )
    _say_more(len(moved))
    return moved


def _say_more(count: int) -> None:
    if count > SHOWN_TOPICS:
        log.error("uplink: and %d more topics the hub holds further than this site", count - SHOWN_TOPICS)
