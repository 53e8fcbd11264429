"""What a site does when its hub holds more of a topic than the site does: its log was lost or replaced, or
another broker with the site's certificate sent the hub more of it.

The hub keeps a site's records at the site's offsets and takes none below the end it holds (a batch sent
again is skipped there), so a site broker that lost its data directory and gives offsets from 0 again
would have every record below the hub's end dropped, until its log passed that end. At each connection a
site broker alone moves such a log on to the hub's end (``ReplicatedLog.continue_at``: a log holding
nothing restarts there, one holding records goes on past a gap), so what its devices publish from then on
reaches the hub; the records it holds below the hub's end stay in its log, are named at ERROR and are not
sent up. The site cannot tell whether the hub's records at those offsets are these (sent before, by this
broker) or others (its old disk's, another broker's): its line says that the hub holds records there, not
that these were never sent. A cluster member only says so: the logs are the cluster's, led by their
partition's leader.
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
WHY = "this site's log was lost or replaced, or another broker with this site's certificate sent the hub more"
"""Why the hub holds more of a topic than the site: the site cannot tell which."""
HELD_THERE = "the hub holds records at those offsets already: these if they were sent before, else others"
"""What the site knows of the hub's records below the hub's end: that there are some, not whose."""


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
                "uplink: the hub holds %r up to %d, this member only to %d: %s; its records below %d are not "
                "sent up (%s)",
                topic,
                end,
                store.committed_end(topic),
                WHY,
                end,
                HELD_THERE,
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
                "uplink: the hub holds %r up to %d, this site only to %d: %s; its records %d to %d stay "
                "here, not sent up (%s); the log goes on at %d",
                topic,
                end,
                before,
                WHY,
                start,
                before - 1,
                HELD_THERE,
                end,
            )
        else:
            log.warning(
                "uplink: the hub holds %r up to %d, this site none of it (%s): the log goes on at %d",
                topic,
                end,
                WHY,
                end,
            )
    _say_more(len(moved))
    return moved


def _say_more(count: int) -> None:
    if count > SHOWN_TOPICS:
        log.error("uplink: and %d more topics the hub holds further than this site", count - SHOWN_TOPICS)
