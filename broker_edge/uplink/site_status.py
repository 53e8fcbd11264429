"""What a hub knows of each site: connected or not, last contact, bytes and records received, gaps, and lag
(records the site holds that the hub does not, and how old the oldest of them is), for ``/metrics`` and
``timestone uplink status``."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker_edge.settings.uplink import SITE_ID, SITE_PREFIX, site_topic

if TYPE_CHECKING:
    from broker_edge.observe.metrics import BrokerMetrics
    from broker_edge.storage import LogStore

__all__ = ["CLOSE_REASONS", "SiteStatus", "SitesStatus", "held_sites"]

CLOSE_REASONS = ("expired", "untrusted", "revoked")
"""Why the hub ended a site's link for its certificate (``site_certificates``): the ``reason`` of
``uplink_site_certificate_closes``."""


@dataclass
class SiteStatus:
    site_id: str
    connected: bool = False
    last_contact: float = 0.0
    """Wall time of the last message from the site (0: never)."""
    received_bytes: int = 0
    """Bytes of batches received, as they travelled (compressed)."""
    received_records: int = 0
    duplicate_records: int = 0
    gap_records: int = 0
    refused_connections: int = 0
    """Connections refused while the site was connected from another broker (two using its certificate)."""
    certificate_closes: dict[str, int] = field(default_factory=dict)
    """Links the hub ended for the site's certificate, by why (``CLOSE_REASONS``)."""
    site_ends: dict[str, list[int]] = field(default_factory=dict)
    """The site's last report: topic → [end, last append ms]."""
    site_oldest: dict[str, int] = field(default_factory=dict)
    """Of the topics reported while the hub held nothing of them: the time of the oldest record (ms)."""
    report_bound_said: bool = False
    """Whether this connection's reports past the bound on their topics were said."""

    def report(self, ends: dict[str, list[int]], most_topics: int, oldest: dict[str, int]) -> int:
        """Take the site's report of its logs' ``ends`` (and ``oldest``, the time of the oldest record of
        those the hub holds nothing of), holding at most ``most_topics`` topics: the topics known keep
        being updated, new ones past the bound are left out. Returns how many were left out."""
        known = self.site_ends
        left_out = 0
        if len(known) + len(ends) <= most_topics:
            known.update(ends)
        else:
            for topic, end in ends.items():
                if topic in known or len(known) < most_topics:
                    known[topic] = end
                else:
                    left_out += 1
        for topic, timestamp in oldest.items():
            if topic in known:
                self.site_oldest[topic] = timestamp
        return left_out

    def lag(self, store: LogStore) -> tuple[int, float]:
        """Records the site reported that the hub does not hold, and the seconds the hub is behind on a
        lagging topic (the largest): between the site's newest record and the hub's newest of it, or for a
        topic the hub holds nothing of, the age of its oldest record on the site (when the site said it)."""
        records = 0
        seconds = 0.0
        now_ms = time.time() * 1000
        for topic, (end, last_ms) in self.site_ends.items():
            name = site_topic(self.site_id, topic)
            held = store.durable_end(name) if name in store else 0
            if end > held:
                records += end - held
                hub_ms = store.log_info(name).last_append_ms if name in store else None
                if hub_ms is not None:
                    behind = (last_ms - hub_ms) / 1000
                else:
                    oldest = self.site_oldest.get(topic)
                    behind = (now_ms - oldest) / 1000 if oldest is not None else 0.0
                seconds = max(seconds, behind, 0.0)
        return records, seconds

    def as_json(self, store: LogStore) -> dict[str, object]:
        records, seconds = self.lag(store)
        return {
            "site": self.site_id,
            "connected": self.connected,
            "last_contact": self.last_contact or None,
            "received_bytes": self.received_bytes,
            "received_records": self.received_records,
            "duplicate_records": self.duplicate_records,
            "gap_records": self.gap_records,
            "refused_connections": self.refused_connections,
            "certificate_closes": dict(self.certificate_closes),
            "lag_records": records,
            "lag_seconds": round(seconds, 3),
            "topics": len(store.logs(site_topic(self.site_id, "#"))),
        }


def held_sites(store: LogStore) -> list[str]:
    """The sites whose logs ``store`` holds (its ``$site/<site>/...`` topics), sorted."""
    sites = set()
    for topic in store.topics():
        if topic.startswith(SITE_PREFIX):
            site = topic[len(SITE_PREFIX) :].partition("/")[0]
            if SITE_ID.match(site):
                sites.add(site)
    return sorted(sites)


class SitesStatus:
    """Every site this hub admits by name (``admitted``; None: every site, then those it holds logs of) or
    heard from, and their metrics (one series per site): such a site not connected since the hub started
    is shown, not connected, where it was absent from the status and ``/metrics`` until it dialled again."""

    def __init__(
        self, store: LogStore, metrics: BrokerMetrics, admitted: Sequence[str] | None = None
    ) -> None:
        self.store = store
        self.sites: dict[str, SiteStatus] = {}
        self._lag_records = metrics.gauge(
            "uplink_site_lag_records",
            "Records a site holds that the hub does not (its last report).",
            ["site"],
        )
        self._lag_seconds = metrics.gauge(
            "uplink_site_lag_seconds",
            "How far the hub's copy of a site is behind the site, in seconds.",
            ["site"],
        )
        self._bytes = metrics.gauge(
            "uplink_site_received_bytes", "Bytes of batches received from a site (as sent).", ["site"]
        )
        self._records = metrics.gauge(
            "uplink_site_received_records", "Records received from a site.", ["site"]
        )
        self._gaps = metrics.gauge(
            "uplink_site_gap_records",
            "Records a site's retention deleted before they reached the hub.",
            ["site"],
        )
        self._refused = metrics.gauge(
            "uplink_site_refused_connections",
            "Connections of a site refused while it was connected from another broker.",
            ["site"],
        )
        self._certificate_closes = metrics.gauge(
            "uplink_site_certificate_closes",
            "Links of a site the hub ended for its certificate: expired, no longer trusted, revoked.",
            ["site", "reason"],
        )
        self._contact = metrics.gauge(
            "uplink_site_last_contact_timestamp", "Wall time of the last message from a site.", ["site"]
        )
        self._connected = metrics.gauge("uplink_site_connected", "1 while a site is connected.", ["site"])
        for site_id in held_sites(store) if admitted is None else admitted:
            self.site(site_id)

    def site(self, site_id: str) -> SiteStatus:
        status = self.sites.get(site_id)
        if status is None:
            status = self.sites[site_id] = SiteStatus(site_id)
            self._bind(status)
        return status

    def contact(self, status: SiteStatus) -> None:
        status.last_contact = time.time()

    def _bind(self, status: SiteStatus) -> None:
        site = status.site_id
        store = self.store
        self._lag_records.labels(site).set_function(lambda: status.lag(store)[0])
        self._lag_seconds.labels(site).set_function(lambda: status.lag(store)[1])
        self._bytes.labels(site).set_function(lambda: status.received_bytes)
        self._records.labels(site).set_function(lambda: status.received_records)
        self._gaps.labels(site).set_function(lambda: status.gap_records)
        self._refused.labels(site).set_function(lambda: status.refused_connections)
        self._contact.labels(site).set_function(lambda: status.last_contact)
        for reason in CLOSE_REASONS:
            self._certificate_closes.labels(site, reason).set_function(_closes(status, reason))
        self._connected.labels(site).set_function(lambda: float(status.connected))

    def as_json(self) -> dict[str, object]:
        return {"sites": [self.sites[site].as_json(self.store) for site in sorted(self.sites)]}


def _closes(status: SiteStatus, reason: str) -> Callable[[], float]:
    """How many of ``status``'s links were ended for ``reason`` (its certificate expired, ...)."""
    return lambda: status.certificate_closes.get(reason, 0)
