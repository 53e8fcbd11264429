"""The device status reports stream of the actions job, from separate brokers or from one cluster.

Separate brokers each hold their own reports: one ``timestone`` query reads all of them (``BrokerReports``).
A cluster holds every report on every replica at the same offset, so ``ClusterReports`` reads them once,
with the members as the source's ``bootstrapServers`` and offsets checkpointed by topic under the cluster
name ``cluster``: they stay valid whichever member serves them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from pyspark.sql.streaming import StreamingQuery

from broker_edge.config.endpoints import BrokerEndpoint
from pipelines.spark_session import stop_between_batches

__all__ = ["CLUSTER_BROKER_ID", "BrokerReports", "ClusterReports", "ReportStream"]

CLUSTER_BROKER_ID = "cluster"
"""The cluster name a cluster's reports are checkpointed under, whichever member serves them."""

StartQuery = Callable[[Sequence[BrokerEndpoint]], StreamingQuery]
"""Starts the reports query over the given endpoints (their names are the checkpoint's broker ids)."""


class BrokerReports:
    """One query over every broker: each holds its own devices' reports. :meth:`start` starts it, again after
    a failure (the supervisor of the job calls it)."""

    def __init__(self, start: StartQuery, brokers: Sequence[BrokerEndpoint]) -> None:
        self._start = start
        self._brokers = list(brokers)
        self.query: StreamingQuery | None = None
        self._watched: StreamingQuery | None = None
        self._read_until = 0

    def read_until(self, now_ms: int, trigger_ms: int) -> int:
        """A time (epoch ms) before which every report the brokers took in has been handled, as far as the
        query running now says; 0 until it has caught up once (a query started again reads what came in
        while it was down first). Caught up: its last trigger found nothing new (then every report taken in
        before that trigger began, at most two trigger intervals ago, was handled), or its last batch read
        up to the latest offsets there were when it began."""
        query = self.query
        if query is not self._watched:
            self._watched, self._read_until = query, 0
        if query is None:
            return 0
        try:
            status, last = query.status, query.lastProgress
        except Exception:  # a query that stopped meanwhile: what was known stays known
            return self._read_until
        if last is None:  # no trigger has ended yet
            return self._read_until
        caught_up = _caught_up_at(last)
        if not status.get("isTriggerActive") and not status.get("isDataAvailable"):
            caught_up = max(caught_up or 0, now_ms - 2 * trigger_ms)
        self._read_until = max(self._read_until, caught_up or 0)
        return self._read_until

    def start(self) -> StreamingQuery:
        self.query = self._start(self._brokers)
        return self.query

    def running(self) -> bool:
        return self.query is not None and bool(self.query.isActive)

    def stop(self) -> None:
        if self.query is not None:
            stop_between_batches(self.query)


def _caught_up_at(progress: Any) -> int | None:
    """When the batch of ``progress`` began (epoch ms), if it read up to the latest offsets of every source
    as they were then (sources that report them); else None."""
    try:
        sources = list(progress["sources"])
        ends = [(source["latestOffset"], source["endOffset"]) for source in sources]
        if not ends or any(latest is None or latest != end for latest, end in ends):
            return None
        return int(
            datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00")).timestamp() * 1000
        )
    except (KeyError, TypeError, ValueError):
        return None


class ClusterReports(BrokerReports):
    """One query over a whole cluster: the ``timestone`` source reads it through ``bootstrapServers``, finds
    each topic's replicas itself and reads a dead member's ranges from another replica, so the query
    outlives any one member."""


ReportStream = BrokerReports
"""Either kind: what the job holds."""
