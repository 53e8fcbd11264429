"""Publish anywhere: where a topic's logged publishes go, getting them to the leader, and answering peers.

``ClusterForwarding`` is the ``Forwarding`` of a cluster member's PUBLISH path (``publish_path``):

- ``placement``: a topic whose partition this node leads (and is not fenced) is appended here, unless its
  in-sync set is smaller than ``min_insync_replicas`` (refused); any other goes to the leader.
- ``forward``: publishes go to the leader over its peer link and the leader's answer comes back per batch.
  While no leader is known or reachable (an election, this node fenced, the link being dialed) they wait, up
  to ``forward_timeout_ms``, for one; then they are refused. A "not the leader" answer (leadership moved
  while they travelled) sends them to the leader the view names next, within the same deadline. When this
  node itself becomes the leader while they wait, they enter its own PUBLISH path.
- ``broadcast``: unlogged publishes go to every other member, which routes them locally.

It is also the ``PeerReceiver`` of the peer links: publishes a peer forwarded enter this node's PUBLISH path
(``accept_forwarded``: the peer is their publisher, answered once the batch is acknowledged, i.e. after
acks=all), and unlogged publishes from peers are routed here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker_edge.engine.publish import APPEND, FORWARD, NOT_LEADER, REFUSE, ForwardAck
from broker_edge.observe import path_trace

if TYPE_CHECKING:
    import asyncio

    from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.message import Message
    from broker_edge.engine.publish import PublishPath
    from broker_edge.engine.routing.router import Router

__all__ = ["ClusterForwarding"]

log = logging.getLogger("broker_edge.cluster.forwarding")

RETRY_S = 0.02
"""How often publishes waiting for a leader look again (besides every view change and link coming up)."""


@dataclass(slots=True)
class _Forward:
    """Publishes of one topic on their way to the leader, with one answer slot per message."""

    topic: str
    messages: list[Message]
    done: Callable[[Sequence[ForwardAck]], None]
    deadline: float
    answers: list[ForwardAck | None] = field(default_factory=list)
    traced_ns: int = 0
    """When it was handed over (`time.monotonic_ns`), noted only with `path_trace.ON`."""

    def unanswered(self) -> list[int]:
        return [index for index, answer in enumerate(self.answers) if answer is None]


class ClusterForwarding:
    """The PUBLISH path's cluster placement, the forwarding to leaders and the answering of peers."""

    def __init__(
        self,
        view: ClusterView,
        path: PublishPath,
        router: Router,
        links: PeerLinks | None,
        loop: asyncio.AbstractEventLoop,
        min_insync_replicas: int,
        forward_timeout_s: float,
    ) -> None:
        self.view = view
        self.path = path
        self.router = router
        self.links = links
        self.loop = loop
        self.min_insync_replicas = min_insync_replicas
        self.forward_timeout_s = forward_timeout_s
        if path_trace.ON:
            path_trace.set_node(view.node_id)
        self._waiting: list[_Forward] = []
        self._retry: asyncio.TimerHandle | None = None

    # -- Forwarding (the PUBLISH path asks) -----------------------------------------------------------------

    def placement(self, topic: str) -> int:
        view = self.view
        state = view.state_of(topic)
        if state is None or state.leader != view.node_id or view.fenced:
            return FORWARD
        if len(state.isr) < self.min_insync_replicas:
            return REFUSE
        return APPEND

    def refusal(self, topic: str) -> str:
        state = self.view.state_of(topic)
        in_sync = len(state.isr) if state is not None else 0
        return (
            f"partition {self.view.partition_of(topic)} has {in_sync} in-sync replicas, "
            f"fewer than min_insync_replicas {self.min_insync_replicas}"
        )

    def forward(
        self, topic: str, messages: list[Message], done: Callable[[Sequence[ForwardAck]], None]
    ) -> None:
        request = _Forward(topic, messages, done, self.loop.time() + self.forward_timeout_s)
        request.answers = [None] * len(messages)
        if path_trace.ON:
            request.traced_ns = time.monotonic_ns()
        self._send(request)

    def broadcast(self, message: Message) -> None:
        if self.links is not None:
            self.links.broadcast(message)

    # -- getting publishes to the leader --------------------------------------------------------------------

    def _send(self, request: _Forward) -> None:
        """Send what is unanswered of ``request`` to the current leader, or wait for one."""
        view = self.view
        partition = view.partition_of(request.topic)
        state = view.states.get(partition)
        leader = state.leader if state is not None else None
        indices = request.unanswered()
        messages = [request.messages[index] for index in indices]
        if leader is not None and not view.fenced:
            if leader == view.node_id:
                self.path.accept_forwarded(messages, lambda acks: self._answered(request, indices, acks))
                return
            links = self.links
            if leader in view.members and links is not None and links.up(leader):
                links.link(leader).forward(
                    request.topic, messages, lambda acks: self._answered(request, indices, acks)
                )
                return
        if self.loop.time() >= request.deadline:
            reason = (
                "this broker lost its cluster membership"
                if view.fenced
                else f"no leader for partition {partition} within forward_timeout_ms"
            )
            self._answered(request, indices, [ForwardAck(0x83, None, reason)] * len(indices))
            return
        self._waiting.append(request)
        if self._retry is None:
            self._retry = self.loop.call_later(RETRY_S, self.retry)

    def _answered(self, request: _Forward, indices: list[int], acks: Sequence[ForwardAck]) -> None:
        retry = False
        for index, ack in zip(indices, acks, strict=True):
            if ack.reason_code == NOT_LEADER and self.loop.time() < request.deadline:
                retry = True  # not appended there: ask the next leader
            else:
                request.answers[index] = ack
        if retry:
            self._waiting.append(request)
            if self._retry is None:
                self._retry = self.loop.call_later(RETRY_S, self.retry)
            return
        if path_trace.ON:
            _trace_answers("forward", request.topic, request.traced_ns, request.answers)
        request.done([ack if ack is not None else ForwardAck(0x83) for ack in request.answers])

    def retry(self) -> None:
        """Send waiting publishes to the leader now known (the view changed, a link came up, or a tick)."""
        self._retry = None
        waiting, self._waiting = self._waiting, []
        for request in waiting:
            self._send(request)

    def fail_waiting(self, reason: str) -> None:
        """Refuse every publish still waiting for a leader (the node stops)."""
        waiting, self._waiting = self._waiting, []
        for request in waiting:
            indices = request.unanswered()
            self._answered_final(request, indices, ForwardAck(0x83, None, reason))

    @staticmethod
    def _answered_final(request: _Forward, indices: list[int], ack: ForwardAck) -> None:
        for index in indices:
            request.answers[index] = ack
        request.done([answer if answer is not None else ack for answer in request.answers])

    # -- PeerReceiver (what peers send) -----------------------------------------------------------------

    def forwarded(self, link: PeerLink, batch: int, messages: list[Message]) -> None:
        if path_trace.ON and messages:
            received_ns, topic = time.monotonic_ns(), messages[0].topic

            def answer(acks: Sequence[ForwardAck]) -> None:
                _trace_answers("received", topic, received_ns, acks)
                link.answer(batch, acks)

            self.path.accept_forwarded(messages, answer)
            return
        self.path.accept_forwarded(messages, lambda acks: link.answer(batch, acks))

    def unlogged(self, message: Message) -> None:
        self.router.publish(message, groups_served=True)  # the broker it was published on served them


def _trace_answers(stage: str, topic: str, at_ns: int, acks: Sequence[ForwardAck | None]) -> None:
    """Mark the appended publishes of a forward at ``stage`` (at ``at_ns``) and as answered now."""
    for ack in acks:
        if ack is not None and ack.offset is not None:
            path_trace.mark_at(stage, topic, ack.offset, ack.offset + 1, at_ns)
            path_trace.mark("answered", topic, ack.offset, ack.offset + 1)
