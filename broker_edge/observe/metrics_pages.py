"""Pages of ``GET /metrics``, built on the event loop for at most a bounded share of its time, each one
built after the request it answers arrived.

Building a page reads and formats every family (about a millisecond for a broker's 15 KB page), on the
loop that serves the devices. Built once per request, a few dozen connections pipelining ``GET /metrics``
kept the loop building pages and a QoS 1 publisher's PUBACK waiting about a hundred times longer. So a
page is built at once only when the loop has rested ``rest`` times the last build's time since it ended;
a request arriving sooner waits for the next build, which answers every request that came meanwhile (in
each format asked for). Building pages then takes at most ``1 / (1 + rest)`` of the loop's time (10 %
by default), however many ask, and no answer is older than its request: a reader sees everything that
happened before it asked. A wait is at most ``MAX_REST_S``, whatever one build cost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from broker_edge.observe.metrics import BrokerMetrics

__all__ = ["MAX_REST_S", "REST", "MetricsPages"]

REST = 9.0
"""How many times its build time the loop rests after a page is built before it builds the next."""
MAX_REST_S = 1.0
"""The longest rest after one build, in seconds (a build slowed by a pause of the whole process)."""

Encoder = Callable[["CollectorRegistry"], bytes]


class MetricsPages:
    """The pages of one broker's ``/metrics`` (see the module docstring)."""

    def __init__(self, metrics: BrokerMetrics, rest: float = REST) -> None:
        self.metrics = metrics
        self.rest = rest
        self._rested_at = 0.0
        """When (``time.monotonic``) the loop has rested enough after the last build to build again."""
        self._waiting: dict[str, tuple[Encoder, asyncio.Future[bytes]]] = {}
        """The formats asked for by requests waiting for the next build (by content type)."""
        self._timer: asyncio.TimerHandle | None = None

    async def page(self, encode: Encoder, content_type: str) -> bytes:
        """A page in ``encode``'s format, built after this call began."""
        if self._timer is None and time.monotonic() >= self._rested_at:
            return self._build({content_type: encode})[content_type]
        waiting = self._waiting.get(content_type)
        if waiting is None:
            loop = asyncio.get_running_loop()
            waiting = self._waiting[content_type] = (encode, loop.create_future())
            if self._timer is None:
                delay = self._rested_at - time.monotonic()
                self._timer = loop.call_later(max(delay, 0.0), self._build_for_waiting)
        return await asyncio.shield(waiting[1])  # a request that goes away leaves the others theirs

    def _build_for_waiting(self) -> None:
        self._timer = None
        waiting, self._waiting = self._waiting, {}
        try:
            pages = self._build({content_type: encode for content_type, (encode, _) in waiting.items()})
        except Exception as exc:  # each waiting request answers it as its own build would have
            for _, future in waiting.values():
                if not future.done():
                    future.set_exception(exc)
                    future.exception()  # retrieved: requests that went away say nothing of it
            return
        for content_type, (_, future) in waiting.items():
            if not future.done():
                future.set_result(pages[content_type])

    def _build(self, encoders: dict[str, Encoder]) -> dict[str, bytes]:
        """Build a page in each format, counting its time and setting when the next may be built."""
        metrics = self.metrics
        began = time.monotonic()
        try:
            registry = metrics.registry
            return {content_type: encode(registry) for content_type, encode in encoders.items()}
        finally:
            ended = time.monotonic()
            took = ended - began
            self._rested_at = ended + min(self.rest * took, MAX_REST_S)
            metrics.metrics_pages_built_total.inc(len(encoders))
            metrics.metrics_page_build_seconds_total.inc(took)
