"""The logs a member holds no copy of, for the uplink hub's downlink: which match, and their records.

With fewer replicas than members, the member a site is connected to may hold no copy of a downlinked
topic's partition. It then asks the partitions' leaders (a live replica while one has none) which of their
logs match the downlink's filters, with their bounds (``LogStarts``, peer service ``LOGS_MATCHING``), and
reads their committed records over the members' endpoint (``read_committed``): exactly as stored, at the
offsets every replica gives them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from broker_edge.protocol.topics import EARLIEST

from .log_starts import ASK_ERRORS, LogStart, LogStarts
from .remote_reads import read_committed

if TYPE_CHECKING:
    from broker_edge.cluster.links.member_clients import MemberClients
    from broker_edge.cluster.view import ClusterView
    from broker_edge.storage.record import Record

__all__ = ["LogsElsewhere"]

log = logging.getLogger(__name__)


class LogsElsewhere:
    """What the ``mirror_logs`` port of a member reads of logs held by others (see the module docstring)."""

    def __init__(
        self,
        view: ClusterView,
        starts: LogStarts,
        copy_here: Callable[[int], bool],
        clients: MemberClients,
    ) -> None:
        """``copy_here(partition)``: whether this member holds a complete copy of the partition."""
        self.view = view
        self.starts = starts
        self.copy_here = copy_here
        self.clients = clients

    def holds(self, topic: str) -> bool:
        return self.copy_here(self.view.partition_of(topic))

    async def matching(self, filters: Sequence[str]) -> dict[str, tuple[int, int]]:
        """The logs matching ``filters`` in the partitions held elsewhere (no ``$`` topics), with their
        start and committed end; partitions whose holders do not answer now are left out (asked again
        next time)."""
        view = self.view
        elsewhere = {number for number in view.states if not self.copy_here(number)}
        if not elsewhere:
            return {}
        by_node, _unreachable = self.starts.readers(elsewhere)
        asks = [(node, topic_filter) for node in by_node for topic_filter in filters]
        answers = await asyncio.gather(
            *(self.starts.ask(node, topic_filter, EARLIEST, by_node[node]) for node, topic_filter in asks),
            return_exceptions=True,
        )
        found: dict[str, tuple[int, int]] = {}
        for (node, topic_filter), answer in zip(asks, answers, strict=True):
            if isinstance(answer, ASK_ERRORS):
                log.debug("logs matching %r on %s: %s", topic_filter, node, answer)
                continue
            if isinstance(answer, BaseException):
                raise answer
            for start in answer:
                if not start.topic.startswith("$"):
                    found[start.topic] = _bounds(start)
        return found

    async def read(self, topic: str, offset: int, max_bytes: int) -> list[Record]:
        return await read_committed(self.view, self.clients, topic, offset, max_bytes)


def _bounds(start: LogStart) -> tuple[int, int]:
    return start.start, start.end
