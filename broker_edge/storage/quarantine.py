"""Logs set aside at open: no entry on disk can stop a broker from starting.

A topic's log that cannot be opened (an entry, a sealed index's group or a catalog entry holding a number no
log can hold, what an older version may have written; a partition log whose files cannot be read) is set
aside, and the store opens with every other log. A log set aside is not served, not listed and not
written to (``LogQuarantined``); its entries stay on disk as they are. The store says so at open (one ERROR
per log), in ``/health`` and in the ``storage_quarantined_logs`` metric, and keeps the list in
``<data>/meta/quarantine.json`` (topic, why, since when): a log stays aside through restarts, also once its
damaged entries are gone (retention), until an operator removes its entry there with the broker stopped.
A partition log that cannot be read at all is moved to ``<data>/log/<nn>.quarantined-<time>`` first, and
its partition starts empty.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from broker_edge.bounds import MAX_OFFSET

from .errors import UnknownTopic
from .topic_ids import TopicIds

__all__ = [
    "QUARANTINE_FILE",
    "LogQuarantined",
    "Quarantine",
    "QuarantinedLog",
    "read_list",
    "set_aside",
    "write_list",
]

log = logging.getLogger(__name__)

QUARANTINE_FILE = "quarantine.json"


class LogQuarantined(UnknownTopic):
    """The topic's log was set aside at open: it is neither read nor written (to a reader, as a log that is
    not there)."""

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(topic)
        self.args = (f"the log of {topic!r} is quarantined: {reason}",)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class QuarantinedLog:
    """One log set aside: its topic, why, and since when (ms since the epoch)."""

    topic: str
    reason: str
    since_ms: int


class Quarantine:
    """The topic ids opening found that cannot be opened, each with why (the first reason found)."""

    __slots__ = ("reasons",)

    def __init__(self) -> None:
        self.reasons: dict[int, str] = {}

    def __contains__(self, topic_id: int) -> bool:
        return topic_id in self.reasons

    def __bool__(self) -> bool:
        return bool(self.reasons)

    def set_aside(self, topic_id: int, reason: str) -> None:
        self.reasons.setdefault(topic_id, reason)

    def past_ceiling(self, topic_id: int, offset: int, what: str) -> bool:
        """Whether ``topic_id`` is set aside, or is now for ``offset`` (an end or a marker's offset, named
        by ``what``) lying outside what a log holds."""
        if topic_id in self.reasons:
            return True
        if 0 <= offset <= MAX_OFFSET:
            return False
        self.reasons[topic_id] = f"{what} at offset {offset}, past what a log holds ({MAX_OFFSET})"
        return True


def set_aside(found: Quarantine, names: Sequence[str], ids: TopicIds, path: str) -> dict[int, QuarantinedLog]:
    """The logs set aside, by topic id: those this open ``found`` it could not open, and those an earlier
    open set aside (the list at ``path``, rewritten when it changes); each one found now is logged."""
    listed = read_list(path)
    kept = {topic: entry for topic, entry in listed.items() if ids.get(topic) is not None}
    for topic_id, reason in found.reasons.items():
        topic = names[topic_id]
        if topic not in kept:
            log.error("the log of %r is set aside (quarantined): %s", topic, reason)
            kept[topic] = QuarantinedLog(topic, reason, time.time_ns() // 1_000_000)
    if kept != listed:
        write_list(path, kept)
    if kept:
        shown = ", ".join(repr(topic) for topic in sorted(kept)[:10]) + (" ..." if len(kept) > 10 else "")
        log.warning("%d logs are quarantined, neither read nor written (%s): %s", len(kept), path, shown)
    return {ids[topic]: entry for topic, entry in kept.items()}


def read_list(path: str) -> dict[str, QuarantinedLog]:
    """The logs a previous open set aside, by topic (none when the file is absent or unreadable)."""
    try:
        with open(path, "rb") as file:
            document = json.loads(file.read())
        return {
            str(item["topic"]): QuarantinedLog(str(item["topic"]), str(item["reason"]), int(item["since_ms"]))
            for item in document["logs"]
        }
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError) as error:
        log.error("%s cannot be read (%s): the logs it set aside are found again as they open", path, error)
        return {}


def write_list(path: str, logs: dict[str, QuarantinedLog]) -> None:
    """Replace the list at ``path`` durably (a temporary file, fsync, rename)."""
    items = [{"topic": q.topic, "reason": q.reason, "since_ms": q.since_ms} for q in logs.values()]
    temporary = path + ".tmp"
    with open(temporary, "w") as file:
        json.dump({"logs": items}, file, indent=1)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
