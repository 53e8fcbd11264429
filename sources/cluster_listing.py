"""The planner side of reading a cluster: find its members, list their logs, route every topic.

Once per micro-batch the planner asks a member for the layout (``GET /v1/cluster``), lists the logs of
every live member in parallel (one ``GET /v1/logs?pattern=`` per pattern and member, no retries: a member
that does not answer is simply left out, its topics come from the other replicas) and keeps, per topic,
the longest committed extent and the order of members to read it from (``cluster_plan.route_topics``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial

from broker_edge.offsets_api.client import retry_wait_s
from broker_edge.offsets_api.discovery import ClusterDiscovery, ClusterLayout, ClusterUnreachableError
from broker_edge.offsets_api.errors import AuthError, TlsRefused

from .cluster_plan import TopicRoute, route_topics
from .offsets_planner import LogExtent
from .slice_reader import BrokerAuthError, BrokerUnreachableError, FetchSettings
from .topic_cover import listing

__all__ = ["ClusterLister", "ClusterListing"]

log = logging.getLogger(__name__)

ClusterListing = tuple[ClusterLayout, dict[str, TopicRoute]]


class ClusterLister:
    """Lists a cluster's logs for the planner; ``settings`` carries the source's timeouts and token."""

    def __init__(self, cluster: str, bootstrap: Sequence[str], settings: FetchSettings) -> None:
        self.cluster = cluster
        self.settings = settings
        self.discovery = ClusterDiscovery(
            bootstrap, settings.auth_token, settings.timeout_ms / 1000, settings.tls
        )
        self.complete = False
        """Whether every member of the layout listed its logs at the last ``list``: no topic was missed."""

    def layout(self) -> ClusterLayout:
        """The current layout, asking members in turn, for ``fetchRetries`` more rounds with backoff.

        Raises BrokerUnreachableError naming the cluster when no member answers."""
        settings = self.settings
        began = time.monotonic()
        for attempt in range(settings.retries + 1):
            if attempt:
                time.sleep(retry_wait_s(settings.retry_backoff_ms / 1000, attempt))
            try:
                return self.discovery.discover()
            except ClusterUnreachableError as error:
                failure = error
            except (AuthError, TlsRefused) as error:
                url = ",".join(self.discovery.candidates())
                raise BrokerAuthError(self.cluster, url, error, settings.token_option) from error
        raise BrokerUnreachableError(
            self.cluster, ",".join(self.discovery.candidates()), time.monotonic() - began, failure
        )

    def list(self, patterns: Sequence[str]) -> ClusterListing:
        """The layout and every listed topic's route (see the module docstring)."""
        began = time.monotonic()
        layout = self.layout()
        members = sorted(layout.members)
        with ThreadPoolExecutor(max_workers=min(8, len(members)) or 1) as pool:
            futures = {node: pool.submit(self._list_member, layout, node, patterns) for node in members}
        listings: dict[str, dict[str, LogExtent]] = {}
        for node, future in futures.items():
            try:
                listings[node] = future.result()
            except BrokerUnreachableError as error:
                log.warning("timestone source: cluster member %r did not list its logs: %s", node, error)
        self.complete = len(listings) == len(members)
        if not listings:
            self.discovery.layout = None  # every member it named is gone: start again from the bootstrap list
            raise BrokerUnreachableError(
                self.cluster,
                ",".join(layout.offsets_api(node) for node in members),
                time.monotonic() - began,
                RuntimeError("no member listed its logs"),
            )
        return layout, route_topics(layout, listings)

    def _list_member(self, layout: ClusterLayout, node: str, patterns: Sequence[str]) -> dict[str, LogExtent]:
        member = replace(self.settings, broker=node, url=layout.offsets_api(node), retries=0)
        logs: dict[str, LogExtent] = {}
        sent, keep = listing(patterns)
        with member.client() as client:
            for pattern in sent:
                for info in member.call(partial(client.list_logs, pattern)):
                    if keep is None or keep(info.topic):
                        logs[info.topic] = LogExtent(info.start_offset, info.end_offset)
        return logs
