"""The device status reports stream of the actions job, from separate brokers or from one cluster.

Separate brokers each hold their own reports: one ``timestone`` query reads all of them (``BrokerReports``).
A cluster holds every report on every replica at the same offset, so ``ClusterReports`` reads them once,
with the members as the source's ``bootstrapServers`` and offsets checkpointed by topic under the cluster
name ``cluster``: they stay valid whichever member serves them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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

    def start(self) -> StreamingQuery:
        self.query = self._start(self._brokers)
        return self.query

    def running(self) -> bool:
        return self.query is not None and bool(self.query.isActive)

    def stop(self) -> None:
        if self.query is not None:
            stop_between_batches(self.query)


class ClusterReports(BrokerReports):
    """One query over a whole cluster: the ``timestone`` source reads it through ``bootstrapServers``, finds
    each topic's replicas itself and reads a dead member's ranges from another replica, so the query
    outlives any one member."""


ReportStream = BrokerReports
"""Either kind: what the job holds."""
