"""Records that reach the hub already past its retention: said, not deleted in silence.

A site's records carry the site's time, byte for byte, and the hub's retention judges them by it. A site
whose clock is days behind (a gateway that lost its time), or a backlog older than the hub keeps records,
has every such record deleted at the hub's next retention pass after its segment is sealed, while both
ends' lag says nothing is missing. The hub says so at WARNING: at a site's first such batch, then at most
once per ``NOTICE_S`` with what arrived since.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker_edge.settings.uplink import site_topic
from broker_edge.storage.record import BODY_HEAD, PREFIX, PREFIX_SIZE

if TYPE_CHECKING:
    from broker_edge.storage import LogStore
    from broker_edge.uplink.wire import Batch

__all__ = ["ExpiredOnArrival"]

log = logging.getLogger("broker_edge.uplink.hub")

NOTICE_S = 60.0
"""Most often a site's records arriving past retention are said (with their count since the last time)."""
DAY_MS = 86_400_000


@dataclass(slots=True)
class _Seen:
    records: int = 0
    topics: set[str] = field(default_factory=set)
    oldest_ms: int | None = None
    retention_ms: int = 0
    first_topic: str = ""
    said_at: float | None = None


class ExpiredOnArrival:
    """Counts, per site, the records of its batches past the retention of their logs here, and says them."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self._sites: dict[str, _Seen] = {}

    def check(self, site: str, batch: Batch) -> None:
        """Look at ``batch`` (appended here) for records older than their log's ``retention_ms``."""
        now_ms = int(time.time() * 1000)
        seen = self._sites.setdefault(site, _Seen())
        frames = memoryview(batch.frames)
        position = 0
        for part in batch.topics:
            chunk = frames[position : position + part.size]
            position += part.size
            name = site_topic(site, part.topic)
            if name not in self.store:  # a cluster member holding no copy: its leader's business
                continue
            retention_ms = self.store.retention_of(name).retention_ms
            if retention_ms is None:
                continue
            past, oldest = _older_than(chunk, now_ms - retention_ms)
            if past:
                if not seen.topics:
                    seen.first_topic, seen.retention_ms = part.topic, retention_ms
                seen.records += past
                seen.topics.add(part.topic)
                seen.oldest_ms = oldest if seen.oldest_ms is None else min(seen.oldest_ms, oldest)
        self._say(site, seen, now_ms)

    def _say(self, site: str, seen: _Seen, now_ms: int) -> None:
        now = time.monotonic()
        if not seen.records or (seen.said_at is not None and now - seen.said_at < NOTICE_S):
            return
        age_days = (now_ms - (seen.oldest_ms or now_ms)) / DAY_MS
        log.warning(
            "site %s: %d records of %d topics arrive past this hub's retention (the first %r, the oldest "
            "%.1f days old; its retention is %.1f days): retention deletes them at its next pass once their "
            "segment is sealed. Their times are the site's: is its clock behind?",
            site,
            seen.records,
            len(seen.topics),
            seen.first_topic,
            age_days,
            seen.retention_ms / DAY_MS,
        )
        self._sites[site] = _Seen(said_at=now)


def _older_than(chunk: memoryview, cutoff_ms: int) -> tuple[int, int]:
    """How many frames of ``chunk`` carry a time before ``cutoff_ms``, and the oldest time among them; none
    when its first frame does not (a log's times go forward: a batch's usual records cost one look)."""
    if len(chunk) < PREFIX_SIZE + BODY_HEAD.size or _time_at(chunk, 0) >= cutoff_ms:
        return 0, cutoff_ms
    count = 0
    oldest = cutoff_ms
    position = 0
    end = len(chunk)
    while position + PREFIX_SIZE + BODY_HEAD.size <= end:
        body_length, _crc = PREFIX.unpack_from(chunk, position)
        timestamp_ms = _time_at(chunk, position)
        if timestamp_ms < cutoff_ms:
            count += 1
            oldest = min(oldest, timestamp_ms)
        position += PREFIX_SIZE + body_length
    return count, oldest


def _time_at(chunk: memoryview, position: int) -> int:
    """The time of the frame at ``position``."""
    _version, _offset, timestamp_ms, *_rest = BODY_HEAD.unpack_from(chunk, position + PREFIX_SIZE)
    return int(timestamp_ms)
