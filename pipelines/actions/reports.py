"""The device status reports stream of the actions job, from separate brokers or from one cluster.

Separate brokers each hold their own reports: one ``timestone`` query reads all of them (``BrokerReports``).
A cluster holds every report on every replica at the same offset, so ``ClusterReports`` reads them once,
through one live member at a time, under the one broker id ``cluster`` in the checkpoint: the checkpointed
offsets stay valid whichever member serves them. A watchdog thread moves the query to the next live member
when its member stops answering or the query fails (e.g. a member that has not yet committed as far as the
checkpoint: the next attempt, a moment later, finds it caught up).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from pyspark.sql.streaming import StreamingQuery

from broker_edge.config.endpoints import BrokerEndpoint
from pipelines.actions.cluster import BrokerKind, live_endpoints, probe
from pipelines.spark_session import stop_between_batches

__all__ = ["CLUSTER_BROKER_ID", "BrokerReports", "ClusterReports", "ReportStream"]

log = logging.getLogger(__name__)

CLUSTER_BROKER_ID = "cluster"
"""The broker id a cluster's reports are checkpointed under, whichever member serves them."""

STOP_WAIT_S = 5.0
"""How long a query moving away from a dead member may finish its batch (it fails soon without the member)."""

StartQuery = Callable[[Sequence[BrokerEndpoint]], StreamingQuery]
"""Starts the reports query over the given endpoints (their names are the checkpoint's broker ids)."""


class ReportStream(Protocol):
    @property
    def query(self) -> StreamingQuery: ...

    def running(self) -> bool: ...

    def stop(self) -> None: ...


class BrokerReports:
    """One query over every broker: each holds its own devices' reports."""

    def __init__(self, start: StartQuery, brokers: Sequence[BrokerEndpoint]) -> None:
        self.query = start(brokers)

    def running(self) -> bool:
        return bool(self.query.isActive)

    def stop(self) -> None:
        stop_between_batches(self.query)


class ClusterReports:
    """One query through one live member of a cluster, moved to another member when it fails."""

    def __init__(self, start: StartQuery, members: Sequence[BrokerEndpoint], check_interval_s: float) -> None:
        self._start = start
        self.members = list(members)
        self.check_interval_s = check_interval_s
        self.moves = 0
        """Times the query was restarted on another member."""
        self._index = 0
        self.member, self.query = self._start_on_live_member()
        self._stopping = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="actions-reports-watchdog", daemon=True)
        self._watchdog.start()

    def running(self) -> bool:
        return not self._stopping.is_set()

    def stop(self) -> None:
        self._stopping.set()
        self._watchdog.join(timeout=60)
        stop_between_batches(self.query)

    def _start_on_live_member(self) -> tuple[BrokerEndpoint, StreamingQuery]:
        live = live_endpoints(self.members, self._index)
        if not live:
            raise RuntimeError(f"no cluster member answers: {[m.name for m in self.members]}")
        member = live[0]
        self._index = self.members.index(member)
        log.info("reading device reports from the cluster through %s (%s)", member.name, member.offsets_api)
        as_cluster = BrokerEndpoint(CLUSTER_BROKER_ID, member.offsets_api, member.token)
        return member, self._start([as_cluster])

    def _watch(self) -> None:
        while not self._stopping.wait(self.check_interval_s):
            try:
                self.check()
            except Exception:  # the next check tries again
                log.exception("moving the reports stream to another member failed")

    def check(self) -> None:
        """Restart the query on the next live member if its member is down or the query has failed."""
        failed = not self.query.isActive
        if not failed and probe(self.member) is not BrokerKind.DOWN:
            return
        why = (
            f"the query stopped: {self.query.exception()}"
            if failed
            else f"{self.member.name} does not answer"
        )
        log.warning("device reports: %s; moving to another member", why)
        if not failed:
            stop_between_batches(self.query, timeout_s=STOP_WAIT_S)
        self._index = (self._index + 1) % len(self.members)
        self.member, self.query = self._start_on_live_member()
        self.moves += 1
