"""``$SYS/broker/...`` topics: the broker's key figures as retained MQTT messages.

Operators and dashboards that speak only MQTT (and tools written for Mosquitto) read these instead of the
Prometheus endpoint, so the names and the text formats follow Mosquitto's (``uptime`` is ``"N seconds"``,
numbers are decimal text). The router publishes the result of ``sys_topic_messages`` as retained messages
every ``interval_s``; this module only formats, so it needs no clock and no router.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker_edge.config import ConfigError

__all__ = ["SYS_PREFIX", "SysTopicsConfig", "sys_topic_messages"]

SYS_PREFIX = "$SYS/broker/"

# topic suffix -> key of BrokerMetrics.snapshot()
_COUNTS = {
    "clients/connected": "clients_connected",
    "clients/disconnected": "sessions_offline",
    "clients/refused": "connections_refused",
    "connections/total": "connections_total",
    "messages/received": "messages_received",
    "messages/sent": "messages_sent",
    "messages/inflight": "inflight",
    "publish/messages/dropped": "messages_dropped",
    "bytes/received": "bytes_received",
    "bytes/sent": "bytes_sent",
    "subscriptions/count": "subscriptions",
    "retained messages/count": "retained_messages",
    "log/appends": "log_appends",
    "log/bytes": "log_bytes",
}


@dataclass
class SysTopicsConfig:
    """Whether and how often the broker publishes its ``$SYS`` topics."""

    enabled: bool = True
    """Publish ``$SYS/broker/...`` retained messages."""
    interval_s: float = 10.0
    """Seconds between two updates (each update is one retained publish per topic)."""

    def __post_init__(self) -> None:
        if isinstance(self.interval_s, bool) or not isinstance(self.interval_s, (int, float)):
            raise ConfigError("interval_s", f"expected a number, got {self.interval_s!r}")
        if self.interval_s < 1:
            raise ConfigError("interval_s", f"must be >= 1 second, got {self.interval_s!r}")


def sys_topic_messages(
    metrics_snapshot: dict[str, Any], broker_version: str, started_at: float, now: float
) -> dict[str, bytes]:
    """Topic name -> payload of every ``$SYS/broker/...`` topic, from ``BrokerMetrics.snapshot()``.

    ``started_at`` and ``now`` are seconds on the same clock. A figure missing from the snapshot is
    published as 0, so a broker that does not track something yet still has the full set of topics.
    ``clients/total`` counts sessions, online and offline, like Mosquitto.
    """
    figures = {suffix: _integer(metrics_snapshot.get(key, 0)) for suffix, key in _COUNTS.items()}
    online = _integer(metrics_snapshot.get("sessions_online", 0))
    offline = _integer(metrics_snapshot.get("sessions_offline", 0))
    figures["clients/total"] = online + offline
    messages = {
        f"{SYS_PREFIX}version": f"timestone {broker_version}".encode(),
        f"{SYS_PREFIX}uptime": f"{max(0, int(now - started_at))} seconds".encode(),
    }
    for suffix, value in figures.items():
        messages[f"{SYS_PREFIX}{suffix}"] = str(value).encode()
    return messages


def _integer(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
