"""The executor side of reading a cluster: a task's slices from whichever replica is alive and caught up.

A task is planned to read its topics from one member (the one whose listing set the batch's end). Any
replica serves a topic's committed records at the same offsets, byte for byte, so when that member dies
mid-task (connection refused, timeout) the task asks the topic's next reader for the rest of the very same
range, and when it runs out of readers it asks the cluster again (``GET /v1/cluster`` on any member it
knows) who holds the partition now. A replica that has not committed the range yet (a follower a moment
behind, a leader elected a moment ago) is long-polled for a while, then passed over too. The records a
task yields are exactly those of its slices whichever members served them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa

from broker_edge.offsets_api.client import OffsetsClient, retry_wait_s
from broker_edge.offsets_api.discovery import ClusterDiscovery, ClusterLayout, ClusterUnreachableError
from broker_edge.offsets_api.errors import AuthError, TlsRefused

from .cluster_plan import readers_for
from .offsets_planner import Slice
from .slice_reader import (
    BrokerAuthError,
    BrokerUnreachableError,
    FetchSettings,
    fetch_round,
    log_lost,
    pending_slices,
    take_answer,
    to_source_batch,
)

__all__ = ["LAG_WAIT_MS", "ClusterFetch", "ClusterReadError", "read_cluster_slices"]

log = logging.getLogger(__name__)

LAG_WAIT_MS = 500
"""Long-poll of a replica found behind a slice: it usually commits the range within milliseconds."""


class ClusterReadError(RuntimeError):
    """No member of the cluster served a slice within the retries; the message says which and why."""


@dataclass(frozen=True)
class ClusterFetch:
    """How a task reaches its cluster; travels to executors inside each partition."""

    cluster: str
    """The cluster's name: the ``broker`` column of its rows."""
    layout: ClusterLayout
    """The cluster as the planner last saw it."""
    preferred: str
    """node id of the member the task's topics are read from first."""
    bootstrap: tuple[str, ...]
    settings: FetchSettings
    """Timeouts, retries, token and byte budget; its broker and URL are replaced per member."""

    def member(self, node: str, layout: ClusterLayout) -> FetchSettings:
        """Settings for one member: no retries of its own (another replica is asked instead)."""
        return replace(self.settings, broker=node, url=layout.offsets_api(node), retries=0)


class _Router:
    """Which member each unfinished topic is read from, and what to do when one dies or lags."""

    def __init__(self, cluster: ClusterFetch, topics: Sequence[str]) -> None:
        self.cluster = cluster
        self.layout = cluster.layout
        settings = cluster.settings
        self.discovery = ClusterDiscovery(
            cluster.bootstrap, settings.auth_token, settings.timeout_ms / 1000, settings.tls
        )
        self.discovery.layout = cluster.layout
        self.down: set[str] = set()
        self.failed: set[str] = set()
        self.readers = {topic: list(readers_for(self.layout, topic, cluster.preferred)) for topic in topics}
        self.lag_since: dict[str, float] = {}
        self.lag_moves: dict[str, int] = {}
        self.rounds = 0

    def assignment(self, topics: Sequence[str]) -> dict[str, list[str]]:
        """Member -> the topics to ask it for now; rediscovers the cluster when a topic has no reader left."""
        if any(not self._live_readers(topic) for topic in topics):
            self._rediscover()
        groups: dict[str, list[str]] = {}
        for topic in topics:
            readers = self._live_readers(topic)
            if readers:  # else: the next round rediscovers again (after a backoff), or gives up
                groups.setdefault(readers[0], []).append(topic)
        return groups

    def _live_readers(self, topic: str) -> list[str]:
        return [node for node in self.readers[topic] if node not in self.down and node in self.layout.members]

    def member_down(self, node: str, error: BaseException) -> None:
        log.warning(
            "timestone source: cluster member %r failed, reading from another replica: %s", node, error
        )
        self.down.add(node)
        self.failed.add(node)

    def lagging(self, topic: str, node: str, timeout_s: float, pending_from: int) -> None:
        """Note that ``node`` has not committed ``topic`` up to ``pending_from`` yet: it is long-polled for
        ``timeout_s``, then the topic moves to its next reader; after ``fetchRetries + 1`` turns over every
        reader, the task fails (no replica ever committed what the listing said was committed)."""
        now = time.monotonic()
        since = self.lag_since.setdefault(topic, now)
        if now - since < timeout_s:
            return
        del self.lag_since[topic]
        readers = self.readers[topic]
        moves = self.lag_moves[topic] = self.lag_moves.get(topic, 0) + 1
        if moves > len(readers) * (self.cluster.settings.retries + 1):
            raise ClusterReadError(
                f"timestone source: cluster {self.cluster.cluster!r}: no replica ({', '.join(readers)}) "
                f"served topic {topic!r} from offset {pending_from} within {timeout_s:.0f} s each, "
                f"{moves} times (see the options fetchTimeoutMs, fetchRetries)"
            )
        if node in readers:
            readers.remove(node)
            readers.append(node)  # the others first; it may have caught up by its turn

    def progressed(self, topic: str) -> None:
        """``topic`` was served: it is no longer lagging, and the retry budget starts afresh."""
        self.lag_since.pop(topic, None)
        self.rounds = 0

    def _rediscover(self) -> None:
        """Ask the cluster who holds the partitions now, backing off between rounds; give up after
        ``fetchRetries`` rounds in which no reader was left."""
        settings = self.cluster.settings
        if self.rounds > settings.retries:
            unread = ", ".join(sorted(t for t in self.readers if not self._live_readers(t)))
            failed = ", ".join(sorted(self.failed)) or "none"
            raise ClusterReadError(
                f"timestone source: cluster {self.cluster.cluster!r}: no live member holds {unread} after "
                f"{self.rounds} rounds over its replicas (members that failed: {failed}; "
                "see the options fetchRetries, retryBackoffMs, fetchTimeoutMs)"
            )
        if self.rounds:
            time.sleep(retry_wait_s(settings.retry_backoff_ms / 1000, self.rounds))
        self.rounds += 1
        dead_urls = {self.layout.members[n].offsets_api for n in self.down if n in self.layout.members}
        try:
            self.layout = self.discovery.discover(avoid=dead_urls)
        except ClusterUnreachableError as error:
            log.warning("timestone source: cluster %r: %s", self.cluster.cluster, error)
        except (AuthError, TlsRefused) as error:
            urls = ",".join(self.discovery.candidates(dead_urls))
            raise BrokerAuthError(self.cluster.cluster, urls, error, settings.token_option) from error
        self.down.clear()  # a new round: every member the layout lists gets another chance
        for topic, readers in self.readers.items():
            fresh = readers_for(self.layout, topic, readers[0] if readers else None)
            self.readers[topic] = list(fresh)


def read_cluster_slices(cluster: ClusterFetch, slices: Sequence[Slice]) -> Iterator[pa.RecordBatch]:
    """Yield exactly the records of ``slices`` from the cluster's replicas, as batches of the source schema.

    Each round asks every member that currently serves some unfinished topic for their rest (one request
    per member); see the module docstring for failures and lag.
    """
    pending = pending_slices(slices)
    router = _Router(cluster, list(pending))
    clients: dict[str, OffsetsClient] = {}
    lag_timeout_s = cluster.settings.timeout_ms / 1000
    lost = 0
    try:
        while pending:
            for node, topics in router.assignment(list(pending)).items():
                member = cluster.member(node, router.layout)
                client = clients.get(node)
                if client is None or client.base_url != member.url:
                    client = clients[node] = member.client()
                wanted = {topic: pending[topic].offset for topic in topics}
                wait_ms = LAG_WAIT_MS if any(topic in router.lag_since for topic in topics) else 0
                try:
                    answer = fetch_round(member, client, pending, wanted, wait_ms)
                except BrokerUnreachableError as error:
                    router.member_down(node, error)
                    clients.pop(node).close()
                    continue
                taken = take_answer(member, pending, wanted, answer, lag_is_loss=False)
                lost += taken.lost
                for topic in wanted:
                    if topic not in taken.lagging:
                        router.progressed(topic)
                for topic in taken.lagging:  # long-polled by the next round, or moved to another reader
                    router.lagging(topic, node, lag_timeout_s, pending[topic].offset)
                if taken.batch is not None:
                    yield to_source_batch(taken.batch, cluster.cluster, cluster.settings.sites)
    finally:
        for client in clients.values():
            client.close()
    log_lost(lost, cluster.cluster)
