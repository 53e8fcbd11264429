"""What a site holds that the hub has not acknowledged: its uplink lag (records, and the age of the oldest),
and the check of unsent records against the site's retention.

The lag is what ``/metrics`` (``uplink_lag_records``, ``uplink_lag_seconds``) and a site's status show; the
retention check, every ``heartbeat_s``, raises a WARNING and ``uplink_unsent_at_risk_records`` for the unsent
records that retention is about to delete. Both walk every log carried, so each log's oldest unsent record's
time is read once while it stays the oldest unsent, and the lag is counted once in a turn of the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker_edge.storage import OffsetOutOfRange, UnknownTopic
from broker_edge.uplink.hub_ends import SHOWN_TOPICS

if TYPE_CHECKING:
    from broker_edge.storage import LogStore

__all__ = ["CHECKED_AT_ONCE", "UnsentRecords"]

log = logging.getLogger("broker_edge.uplink.site_link")  # (the link's lines, under the name they had)

CHECKED_AT_ONCE = 512
"""Logs the retention check (and a report, of records' times) looks at between two turns of the event
loop."""


@dataclass(slots=True, eq=False, repr=False)  # (compared by identity; its dicts can hold 20,000 logs)
class UnsentRecords:
    """The records of ``topics()`` past what the hub holds durable (``hub_ends``, and for the logs this
    member holds no copy of, their committed ends ``elsewhere_ends``): both dicts are the link's own,
    updated in place."""

    store: LogStore
    retention_warning_ratio: float
    """``uplink.retention_warning_ratio``: at risk past this share of a log's retention."""
    topics: Callable[[], list[str]]
    """The logs the uplink carries that this broker holds (``SiteLink.topics``)."""
    hub_ends: dict[str, int]
    """What the hub holds of each topic, durable."""
    elsewhere_ends: dict[str, int]
    """The committed ends of the logs carried that this member holds no copy of."""
    at_risk_records: int = field(default=0, init=False)
    """Unsent records retention is about to delete, as the last check found."""
    _said_at_risk: int = field(default=0, init=False)
    """Logs with unsent records at risk said in their own line in the current retention check."""
    _oldest: dict[str, tuple[int, int]] = field(default_factory=dict, init=False)
    """Each log's oldest unsent record as last read: its offset and time."""
    _lag_in_turn: tuple[int, float] | None = field(default=None, init=False)
    """``lag`` as counted in this turn of the event loop (None: not yet)."""

    def lag(self) -> tuple[int, float]:
        """Records the hub has not acknowledged, and the age in seconds of the oldest of them: counted over
        every log once in a turn of the event loop (a metrics page reads both of its gauges in one turn)."""
        lag = self._lag_in_turn
        if lag is None:
            lag = self._count_lag()
            with contextlib.suppress(RuntimeError):  # (outside the loop: nothing kept)
                asyncio.get_running_loop().call_soon(setattr, self, "_lag_in_turn", None)
                self._lag_in_turn = lag
        return lag

    def _count_lag(self) -> tuple[int, float]:
        span, hub_ends = self.store.span, self.hub_ends
        records = 0
        oldest_ms: int | None = None
        for topic in self.topics():
            start, end = span(topic)
            held = max(hub_ends.get(topic, 0), start)
            if end > held:
                records += end - held
                timestamp = self.timestamp(topic, held)
                if timestamp is not None and (oldest_ms is None or timestamp < oldest_ms):
                    oldest_ms = timestamp
        for topic, end in self.elsewhere_ends.items():  # counted, not aged: their records are elsewhere
            records += max(0, end - hub_ends.get(topic, 0))
        seconds = max(0.0, time.time() - oldest_ms / 1000) if oldest_ms is not None else 0.0
        return records, seconds

    def timestamp(self, topic: str, offset: int) -> int | None:
        """The time of ``topic``'s record at ``offset`` (its oldest unsent one), read once while that stays
        its oldest unsent: a site of many logs checks them all at each heartbeat and each metrics scrape."""
        known = self._oldest.get(topic)
        if known is not None and known[0] == offset:
            return known[1]
        try:
            records = self.store.read(topic, offset, 1)
        except (OffsetOutOfRange, UnknownTopic):
            return None
        if not records:
            return None
        self._oldest[topic] = (offset, records[0].timestamp_ms)
        return records[0].timestamp_ms

    async def check_retention(self) -> None:
        """Warn about unsent records retention is about to delete (each log by its own retention, from
        its persist rule or the store's): by age, or by size. It gives way to other work every
        ``CHECKED_AT_ONCE`` logs."""
        ratio = self.retention_warning_ratio
        at_risk = unsaid_logs = unsaid_records = 0
        self._said_at_risk = 0
        store, hub_ends = self.store, self.hub_ends
        topics = self.topics()
        self._oldest = {topic: self._oldest[topic] for topic in topics if topic in self._oldest}
        for index, topic in enumerate(topics):
            if index % CHECKED_AT_ONCE == CHECKED_AT_ONCE - 1:
                await asyncio.sleep(0)
            start, end = store.span(topic)  # (0, 0) for a log gone meanwhile (the store's limits)
            held = max(hub_ends.get(topic, 0), start)
            unsent = end - held
            if unsent > 0:
                retention = store.retention_of(topic)
                said = self._said_at_risk
                by_age = self._at_risk_by_age(topic, retention.retention_ms, ratio, held, unsent)
                by_size = self._at_risk_by_size(topic, retention.retention_bytes, ratio, start, held, unsent)
                risk = max(by_age, by_size)
                at_risk += risk
                if risk and self._said_at_risk == said:  # past the lines named
                    unsaid_logs += 1
                    unsaid_records += risk
        self.at_risk_records = at_risk
        if unsaid_logs:
            log.warning(
                "uplink: and %d more logs hold unsent records retention is about to delete (%d records)",
                unsaid_logs,
                unsaid_records,
            )

    def _say_at_risk(self, message: str, *args: object) -> None:
        """A log's unsent records at risk, at WARNING: the first ``SHOWN_TOPICS`` of a check one line each
        (the rest are counted in one line), where a site of many device topics wrote a line for each."""
        if self._said_at_risk < SHOWN_TOPICS:
            self._said_at_risk += 1
            log.warning(message, *args)

    def _at_risk_by_age(
        self, topic: str, retention_ms: int | None, ratio: float, held: int, unsent: int
    ) -> int:
        """All unsent records once the oldest is older than ``ratio`` of ``retention_ms``."""
        timestamp = self.timestamp(topic, held) if retention_ms is not None else None
        if timestamp is None or retention_ms is None:
            return 0
        age_ms = time.time() * 1000 - timestamp
        if age_ms <= retention_ms * ratio:
            return 0
        self._say_at_risk(
            "uplink: %d records of %r not yet sent are %.0f s old; retention deletes them at %.0f s",
            unsent,
            topic,
            age_ms / 1000,
            retention_ms / 1000,
        )
        return unsent

    def _at_risk_by_size(
        self, topic: str, retention_bytes: int | None, ratio: float, start: int, held: int, unsent: int
    ) -> int:
        """Unsent records among the oldest bytes of a log larger than ``ratio`` of its ``retention_bytes``
        (the bytes size retention takes first), by the log's mean record size."""
        if retention_bytes is None:
            return 0
        info = self.store.log_info(topic)
        records = info.end_offset - start
        excess = info.bytes - retention_bytes * ratio
        if excess <= 0 or records <= 0:
            return 0
        at_risk = max(0, min(unsent, math.ceil(excess * records / info.bytes) - (held - start)))
        if at_risk:
            self._say_at_risk(
                "uplink: %d records of %r not yet sent are in the oldest bytes of a log of %d bytes; "
                "retention keeps %d",
                at_risk,
                topic,
                info.bytes,
                retention_bytes,
            )
        return at_risk
