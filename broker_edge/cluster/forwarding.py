"""Publish anywhere: the forwarding broker's path, from the device's PUBLISH to the leader's answer.

``ClusterForwarding`` is the ``forwarding`` port (``broker_edge.engine.ports``) of a cluster member's PUBLISH
path (``broker_edge.engine.publish``). A logged publish on a broker that does not lead its topic's
partition goes:

1. ``appends_here``: the PUBLISH path asks, per topic of a batch, whether this node appends it: it leads the
   partition, is not fenced and has at least ``min_insync_replicas`` in sync. The others are handed to
   ``forward``, and that part of the batch is acknowledged to the devices when its answers come back.
2. ``forward``: a partition led here with too few in-sync replicas refuses them at once (0x83 with the
   reason). Publishes another broker forwarded here are never forwarded again: they are answered
   ``ANSWER_NOT_LEADER`` and that broker asks the leader it learns of next. The others go to the leader over
   its peer link (``broker_edge.cluster.links.peer_link``: the ``FORWARD`` part, the records in the log's
   frame format), the leader's answer coming back per batch (``ANSWER``). While no leader is known or
   reachable (an election, this node fenced, the link being dialed) they wait, up to
   ``forward_timeout_ms``, for one; then they are refused. A "not the leader" answer (leadership moved
   while they travelled) sends them to the leader the view names next, within the same deadline. When this
   node itself becomes the leader while they wait, they enter its own PUBLISH path, ahead of the publishes
   of their topic it has taken in since and not yet placed (``PublishPath.accept_ahead``).

   **Order.** Each topic's forwarded publishes form one lane, first in first out: one send at a time is on
   its way, later publishes wait behind an earlier one that waits (and go with it, in one send, when it
   goes), and ``appends_here`` is false for a topic whose lane is not empty, so a device's publish cannot be
   appended here ahead of its earlier ones still travelling. A publish that cannot keep its place (no leader
   within the deadline, or answered "not the leader" after a later one was appended) is refused, with
   everything behind it in the first case: never appended out of order.
3. On the leader, ``forwarded`` (this object is the peer links' ``PeerReceiver``) puts them into the
   PUBLISH path as one ``ForwardedBatch`` (``accept_forwarded``): appended, replicated (acks=all) and
   answered like a device's QoS 1 publishes, in turn, each to the batch, which sends its answers back over
   the link once it has them all.

``broadcast``: unlogged publishes go to every other member, which routes them locally (``unlogged``), its
shared groups left to the broker they were published on.

Once a client's forwarded publishes are answered, the PUBLISH path asks to move it to the leader
(``hand_over``: its connection handed to the leader when that member runs on this host and advertises a
handoff socket, ``cluster.links.handoff``; else ``server_for``: an MQTT 5 client sent there, with
``cluster.redirect_publishers``), so that what it publishes next is appended where it arrives.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from broker_edge.engine.answers import ForwardedBatch
from broker_edge.engine.ports import ForwardAck
from broker_edge.observe import path_trace
from broker_edge.protocol.reason_codes import ReasonCode

if TYPE_CHECKING:
    from broker_edge.cluster.links.handoff import ConnectionHandoff, Movable
    from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.message import Message
    from broker_edge.engine.publish import PublishPath
    from broker_edge.engine.routing.router import Router

__all__ = ["ANSWER_NOT_LEADER", "ClusterForwarding"]

log = logging.getLogger("broker_edge.cluster.forwarding")

RETRY_S = 0.02
"""How often publishes waiting for a leader look again (besides every view change and link coming up)."""
ANSWER_NOT_LEADER = ReasonCode.USE_ANOTHER_SERVER
"""The answer for a forwarded publish that was not appended because this broker does not lead its partition
(the forwarding broker tries the leader it learns of next; devices never see this code)."""
_REFUSED = ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
_PUBLISHER_GONE = ForwardAck(0x83, None, "its publisher disconnected while it waited")
_OVERTAKEN = "a later publish on this topic was appended first: refused rather than stored out of order"


@dataclass(slots=True)
class _Forward:
    """Publishes of one topic handed over together, with one answer slot per message."""

    topic: str
    messages: list[Message]
    done: Callable[[Sequence[ForwardAck]], None]
    deadline: float
    answers: list[ForwardAck | None] = field(default_factory=list)
    traced_ns: int = 0
    """When it was handed over (`time.monotonic_ns`), noted only with `path_trace.ON`."""
    wanted: Callable[[], bool] | None = None

    def unanswered(self) -> list[int]:
        return [index for index, answer in enumerate(self.answers) if answer is None]

    def finish(self) -> None:
        if path_trace.ON:
            _trace_answers("forward", self.topic, self.traced_ns, self.answers)
        self.done([ack if ack is not None else ForwardAck(0x83) for ack in self.answers])


_Sent = list[tuple[_Forward, list[int]]]
"""What one send carried: each request with the indices of its messages, in the order they were sent."""


@dataclass(slots=True)
class _Lane:
    """One topic's forwarded publishes, first in first out: at most one send is on its way at a time, and
    later publishes wait behind an earlier one that waits (for a leader, a link, or another try), so a
    publisher's publishes reach the log in the order it sent them."""

    topic: str
    requests: deque[_Forward] = field(default_factory=deque)
    in_flight: bool = False
    waiting: bool = False


class ClusterForwarding:
    """The ``forwarding`` port: placement, forwarding to leaders, and the publishes peers forward here."""

    def __init__(
        self,
        view: ClusterView,
        path: PublishPath,
        router: Router,
        links: PeerLinks | None,
        loop: asyncio.AbstractEventLoop,
        min_insync_replicas: int,
        forward_timeout_s: float,
        redirect_publishers: bool = False,
    ) -> None:
        self.view = view
        self.redirect_publishers = redirect_publishers
        """``cluster.redirect_publishers``: ``server_for`` names leaders."""
        self.handoff: ConnectionHandoff | None = None
        """This member's end of connection handoffs (``cluster.hand_over_connections``): ``hand_over``
        moves publishers to leaders on this host."""
        self.path = path
        self.router = router
        self.links = links
        self.loop = loop
        self.min_insync_replicas = min_insync_replicas
        self.forward_timeout_s = forward_timeout_s
        if path_trace.ON:
            path_trace.set_node(view.node_id)
        self._lanes: dict[str, _Lane] = {}
        self._waiting: list[_Lane] = []
        self._retry: asyncio.TimerHandle | None = None
        self._stopped: str | None = None

    # -- the forwarding port (the PUBLISH path asks) --------------------------------------------------------

    @property
    def moves_publishers(self) -> bool:
        return self.handoff is not None or self.redirect_publishers

    def hand_over(self, topic: str, publisher: object) -> bool:
        handoff = self.handoff
        if handoff is None:
            return False
        view = self.view
        leader = view.leader_of(view.partition_of(topic))
        if leader is None or leader.node_id == view.node_id or leader.handoff is None:
            return False
        may_move = getattr(publisher, "may_move", None)  # a WebSocket's connection has no socket to move
        if may_move is None or not handoff.reaches(leader.handoff) or not may_move():
            return False
        handoff.hand_over(cast("Movable", publisher), leader.node_id, leader.handoff)
        return True

    def server_for(self, topic: str) -> str | None:
        if not self.redirect_publishers:
            return None
        view = self.view
        leader = view.leader_of(view.partition_of(topic))
        return leader.mqtt if leader is not None and leader.node_id != view.node_id else None

    def appends_here(self, topic: str) -> bool:
        view = self.view
        state = view.state_of(topic)
        return (
            state is not None
            and state.leader == view.node_id
            and not view.fenced
            and len(state.isr) >= self.min_insync_replicas
            and topic not in self._lanes  # earlier publishes of the topic are still on their way: behind them
        )

    def forward(
        self,
        topic: str,
        messages: list[Message],
        from_peer: bool,
        done: Callable[[Sequence[ForwardAck]], None],
        wanted: Callable[[], bool] | None = None,
    ) -> None:
        view = self.view
        state = view.state_of(topic)
        lane = self._lanes.get(topic)
        if state is not None and state.leader == view.node_id and not view.fenced and lane is None:
            reason = (  # too few in sync
                f"partition {view.partition_of(topic)} has {len(state.isr)} in-sync replicas, "
                f"fewer than min_insync_replicas {self.min_insync_replicas}"
            )
            done([ForwardAck(_REFUSED, None, reason)] * len(messages))
            return
        if from_peer:  # never forwarded twice: the peer asks the leader it learns of next
            done([ForwardAck(ANSWER_NOT_LEADER, None, "not the leader of this partition")] * len(messages))
            return
        request = _Forward(topic, messages, done, self.loop.time() + self.forward_timeout_s, wanted=wanted)
        request.answers = [None] * len(messages)
        if path_trace.ON:
            request.traced_ns = time.monotonic_ns()
        if self._stopped is not None:
            request.answers = [ForwardAck(0x83, None, self._stopped)] * len(messages)
            request.finish()
            return
        if lane is None:
            lane = self._lanes[topic] = _Lane(topic)
        lane.requests.append(request)
        if not lane.in_flight and not lane.waiting:
            self._send(lane)

    def broadcast(self, message: Message) -> None:
        if self.links is not None:
            self.links.broadcast(message)

    # -- getting publishes to the leader, in order ----------------------------------------------------------

    def _send(self, lane: _Lane) -> None:
        """Send every unanswered publish of ``lane``, in order, to the current leader in one go, or wait."""
        lane.waiting = False
        self._drop_unwanted(lane)
        if not lane.requests:
            if self._lanes.get(lane.topic) is lane:
                del self._lanes[lane.topic]
            return
        view = self.view
        partition = view.partition_of(lane.topic)
        state = view.states.get(partition)
        leader = state.leader if state is not None else None
        sent: _Sent = [(request, request.unanswered()) for request in lane.requests]
        messages = [request.messages[index] for request, indices in sent for index in indices]
        if leader is not None and not view.fenced:
            if leader == view.node_id:  # into this node's own PUBLISH path: whatever comes later is behind
                del self._lanes[lane.topic]
                here = ForwardedBatch(messages, lambda acks: self._answered(lane, sent, acks, here=True))
                self.path.accept_ahead(here)
                return
            links = self.links
            if leader in view.members and links is not None and links.up(leader):
                lane.in_flight = True
                links.link(leader).forward(
                    lane.topic, messages, lambda acks: self._answered(lane, sent, acks)
                )
                return
        if self.loop.time() >= lane.requests[0].deadline:
            reason = (
                "this broker lost its cluster membership"
                if view.fenced
                else f"no leader for partition {partition} within forward_timeout_ms"
            )
            self._refuse_lane(lane, reason)
            return
        self._wait(lane)

    def _answered(self, lane: _Lane, sent: _Sent, acks: Sequence[ForwardAck], here: bool = False) -> None:
        """The answers for one send: settle them in order; publishes answered "not the leader" try again
        (the leader named next) unless one sent after them was appended, which they can no longer precede:
        those are refused. A send into this node's own path left the lane (later publishes went in behind
        it): its "not the leader" answers are refusals."""
        lane.in_flight = False
        answers = iter(acks)
        retried: list[tuple[_Forward, int]] = []
        for request, indices in sent:
            for index in indices:
                ack = next(answers)
                if ack.reason_code == ANSWER_NOT_LEADER and here:
                    ack = ForwardAck(0x83, None, "this broker stopped leading the partition")
                elif ack.reason_code == ANSWER_NOT_LEADER:
                    retried.append((request, index))
                    continue
                if ack.reason_code < 0x80 and retried:  # appended behind publishes that were not
                    for earlier, at in retried:
                        earlier.answers[at] = ForwardAck(0x83, None, _OVERTAKEN)
                    retried.clear()
                request.answers[index] = ack
        requests = lane.requests
        while requests and not requests[0].unanswered():
            requests.popleft().finish()
        if self._stopped is not None:
            self._refuse_lane(lane, self._stopped)
        elif not requests:
            if self._lanes.get(lane.topic) is lane:
                del self._lanes[lane.topic]
        elif retried:
            if self.loop.time() >= requests[0].deadline:
                self._refuse_lane(
                    lane,
                    f"no leader for partition {self.view.partition_of(lane.topic)} within forward_timeout_ms",
                )
            else:
                self._wait(lane)  # the next leader, after a view change, a link coming up or a tick
        else:
            self._send(lane)  # what queued behind while this was on its way

    @staticmethod
    def _drop_unwanted(lane: _Lane) -> None:
        """Refuse the waiting publishes whose publishers are gone: nobody can be told, and their publishers
        may have sent later ones since, on another connection, which they must not follow."""
        kept: deque[_Forward] = deque()
        for request in lane.requests:
            if request.wanted is not None and not request.wanted():
                for index in request.unanswered():
                    request.answers[index] = _PUBLISHER_GONE
                request.finish()
            else:
                kept.append(request)
        lane.requests = kept

    def _wait(self, lane: _Lane) -> None:
        lane.waiting = True
        self._waiting.append(lane)
        if self._retry is None:
            self._retry = self.loop.call_later(RETRY_S, self.retry)

    def _refuse_lane(self, lane: _Lane, reason: str) -> None:
        """Refuse every publish of ``lane`` not yet answered: the first cannot keep its place, nor can the
        ones behind it."""
        refusal = ForwardAck(0x83, None, reason)
        if self._lanes.get(lane.topic) is lane:
            del self._lanes[lane.topic]
        lane.waiting = False
        requests, lane.requests = lane.requests, deque()
        for request in requests:
            for index in request.unanswered():
                request.answers[index] = refusal
            request.finish()

    def carries(self, client_id: str) -> bool:
        """Whether a publish of ``client_id`` waits in a lane or is on its way to its leader."""
        return any(
            request.messages[index].origin == client_id
            for lane in self._lanes.values()
            for request in lane.requests
            for index in request.unanswered()
        )

    async def settle(self, client_id: str, timeout_s: float) -> bool:
        """Wait until no publish of ``client_id`` is left in a lane (each appended or refused), at most
        ``timeout_s`` (False then). A session taken over by another broker waits for it: its client
        publishes there only once the publishes of its old connection have their place in the log, so a
        publisher that reconnects elsewhere keeps its order."""
        deadline = self.loop.time() + timeout_s
        while self.carries(client_id):
            if self.loop.time() >= deadline:
                return False
            await asyncio.sleep(RETRY_S)
        return True

    def retry(self) -> None:
        """Send waiting publishes to the leader now known (the view changed, a link came up, or a tick)."""
        self._retry = None
        waiting, self._waiting = self._waiting, []
        for lane in waiting:
            if lane.waiting and not lane.in_flight:
                self._send(lane)

    def fail_waiting(self, reason: str) -> None:
        """Refuse every publish still waiting for a leader, and every later one (the node stops)."""
        self._stopped = reason
        waiting, self._waiting = self._waiting, []
        for lane in waiting:
            if lane.waiting and not lane.in_flight:
                self._refuse_lane(lane, reason)

    # -- PeerReceiver (what peers send) -----------------------------------------------------------------

    def forwarded(self, link: PeerLink, batch: int, messages: list[Message]) -> None:
        if path_trace.ON and messages:
            received_ns, topic = time.monotonic_ns(), messages[0].topic

            def answer(acks: Sequence[ForwardAck]) -> None:
                _trace_answers("received", topic, received_ns, acks)
                link.answer(batch, acks)

            self.path.accept_forwarded(ForwardedBatch(messages, answer))
            return
        self.path.accept_forwarded(ForwardedBatch(messages, lambda acks: link.answer(batch, acks)))

    def unlogged(self, message: Message) -> None:
        self.router.publish(message, groups_served=True)  # the broker it was published on served them


def _trace_answers(stage: str, topic: str, at_ns: int, acks: Sequence[ForwardAck | None]) -> None:
    """Mark the appended publishes of a forward at ``stage`` (at ``at_ns``) and as answered now."""
    for ack in acks:
        if ack is not None and ack.offset is not None:
            path_trace.mark_at(stage, topic, ack.offset, ack.offset + 1, at_ns)
            path_trace.mark("answered", topic, ack.offset, ack.offset + 1)
