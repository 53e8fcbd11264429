"""Who a publish is answered to, and in which order: a client's PUBACK / PUBREC, or a peer's forwarded batch.

Every publish the PUBLISH path takes in is answered once: a client's with its acknowledgement (or, for an
MQTT 3.1.1 client refused, by closing its connection: it cannot be told), a publish another broker forwarded
here with a ``ForwardAck`` in its batch's answer, which goes back to that broker when every publish of the
batch has one (``ForwardedBatch``).

``AnswersInTurn`` keeps each publisher's answers in the order of its publishes ([MQTT-4.6.0-2..4]). A
broker alone needs no queue for that: its batches complete in the order they were appended, so an answer is
sent when it is known. A cluster member's batches complete in any order (a part forwarded to another broker
waits for it), so the publish path says which answers to wait for (``expect``) as it splits a batch, and an
answer known early waits for the earlier ones of the same publisher, never for anyone else's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from broker_edge.engine.connection.states import CLOSED
from broker_edge.engine.ports import ForwardAck

if TYPE_CHECKING:
    from broker_edge.engine.connection.inbound import Inbound
    from broker_edge.engine.message import Message

__all__ = ["AnswersInTurn", "ForwardedBatch", "PendingPublish", "Publisher", "acknowledge", "answer_all"]


class Publisher(Protocol):
    """The side of a client connection the PUBLISH path acknowledges (``Connection`` is one)."""

    @property
    def v5(self) -> bool: ...

    state: int
    inbound: Inbound | None
    """What its publishes hold on the connection, made with the first one (None before). Its ``pending``
    counts its QoS 1/2 publishes read and not yet answered: a QoS 1 publish until its PUBACK; a QoS 2 publish
    read on this connection until its PUBCOMP from an MQTT 5 client (as its Receive Maximum counts: a flow
    a former connection of the session began counts only where its PUBLISH is sent again; ``Inbound.qos2``),
    until its PUBREC from an older one (whose reading waits on this count, so its PUBRELs must stay
    readable). Bounded by
    ``limits.receive_maximum``: an MQTT 5 client sending more is disconnected, an older one is not read
    while it has that many (``Connection``). The PUBLISH path counts there itself, a device's every publish
    in and out, with no call (``Connection.incoming_pending`` reads it for everyone else)."""

    @property
    def started_inbound(self) -> Inbound:
        """Its ``inbound``, made now if none was yet."""

    def send_puback(self, packet_id: int, reason_code: int = 0, reason_string: str | None = None) -> None: ...

    def send_pubacks(self, packet_ids: list[int], reason_code: int = 0) -> None:
        """The PUBACKs of several accepted QoS 1 publishes (reason code 0 or 0x10) at once, in order."""

    def send_pubrec(self, packet_id: int, reason_code: int = 0, reason_string: str | None = None) -> None: ...

    def release_qos2(self, packet_id: int) -> None:
        """Forget a held incoming QoS 2 id: its publish was refused, so a resend is a new publish."""

    def close(self, reason_code: int | None = None, reason_string: str | None = None) -> None: ...


class ForwardedBatch:
    """Publishes another broker forwarded here (this broker leads their partition), answered together: one
    ``ForwardAck`` per message, in order (with its offset once appended), handed to ``answered`` when the
    last one is known. The peer link sends that back to the forwarding broker."""

    __slots__ = ("_acks", "_answered", "_left", "messages")

    def __init__(self, messages: Sequence[Message], answered: Callable[[Sequence[ForwardAck]], None]) -> None:
        self.messages = messages
        self._acks: list[ForwardAck | None] = [None] * len(messages)
        self._left = len(messages)
        self._answered = answered

    def answer(self, index: int, reason_code: int, reason_string: str | None) -> None:
        """The answer for message ``index`` (a second one is ignored)."""
        acks = self._acks
        if acks[index] is not None:
            return
        offset = self.messages[index].offset if reason_code < 0x80 else None
        acks[index] = ForwardAck(reason_code, offset, reason_string)
        self._left -= 1
        if not self._left:
            self._answered([ack for ack in acks if ack is not None])


@dataclass(slots=True)
class PendingPublish:
    """One publish (or an acknowledgement keeping its turn) between accept and its answer."""

    publisher: Publisher | None
    """The client to acknowledge; None for the broker's own publishes and for forwarded ones."""
    message: Message | None
    """None for an acknowledgement only (a QoS 2 duplicate, a refusal), and once answered elsewhere."""
    packet_id: int | None
    """The client's packet id (None: not acknowledged); a forwarded publish's index in its batch."""
    qos: int
    reason_code: int = 0
    reason_string: str | None = None
    settled: bool = False
    """Answered elsewhere (forwarded to the leader, or refused): not routed here, not refused again."""
    ready: bool = False
    """Its answer is known (it is sent once its publisher's earlier answers are)."""
    batch: ForwardedBatch | None = None
    """The batch of another broker's this publish came in (then ``publisher`` is None)."""


class AnswersInTurn:
    """Each publisher's answers in the order of its publishes (see the module docstring)."""

    __slots__ = ("_queues",)

    def __init__(self) -> None:
        self._queues: dict[object, deque[PendingPublish]] = {}
        """Per publisher (or forwarded batch), the publishes whose answers wait, oldest first."""

    def expect(self, entries: Sequence[PendingPublish]) -> None:
        """Answers of ``entries`` (in arrival order) may complete out of order: each waits for the earlier
        ones of its publisher."""
        queues = self._queues
        last: object = None  # a publisher's publishes mostly follow each other: one lookup for each run
        queue: deque[PendingPublish] = deque()  # replaced at the first entry waited for
        for entry in entries:
            sink = entry.publisher if entry.publisher is not None else entry.batch
            if sink is None or entry.packet_id is None:
                continue
            if sink is not last:
                last = sink
                queue = queues.setdefault(sink, deque())
            queue.append(entry)

    def ready(self, entry: PendingPublish) -> None:
        """``entry``'s answer is known (``reason_code``, ``reason_string``): ``ready_all`` of it alone."""
        self.ready_all((entry,))

    def ready_all(self, entries: Sequence[PendingPublish]) -> None:
        """The answers of ``entries`` (in arrival order) are known: send each that no earlier answer of its
        publisher still waits for, with the answers behind it that waited for it. What comes due goes out
        with ``answer_all``: a publisher's PUBACKs due together in one write, as a broker alone's, whose
        answers never wait."""
        queues = self._queues
        if not queues:
            answer_all(entries)
            return
        due: list[PendingPublish] = []
        for entry in entries:
            sink = entry.publisher if entry.publisher is not None else entry.batch
            queue = queues.get(sink) if sink is not None else None
            if queue is None:  # not waited for: in turn already
                due.append(entry)
                continue
            entry.ready = True
            while queue and queue[0].ready:
                due.append(queue.popleft())
            if not queue:
                del queues[sink]
        answer_all(due)

    def pending(self) -> int:
        """Answers waiting for an earlier one of their publisher."""
        return sum(len(queue) for queue in self._queues.values())


def answer(entry: PendingPublish) -> None:
    """Send ``entry``'s answer: to its batch, or to its client, unless that client is gone. An MQTT 3.1.1
    client refused is closed (it cannot be told; it sends again once reconnected)."""
    batch = entry.batch
    packet_id = entry.packet_id
    if batch is not None:
        if packet_id is not None:
            batch.answer(packet_id, entry.reason_code, entry.reason_string)
        return
    publisher = entry.publisher
    if publisher is None or packet_id is None or publisher.state == CLOSED:
        return
    qos = entry.qos
    reason_code = entry.reason_code
    if qos == 1 or not publisher.v5:  # answered now
        inbound = publisher.inbound
        if inbound is not None and inbound.pending > 0:
            inbound.pending -= 1
    if reason_code >= 0x80 and not publisher.v5:
        publisher.close()
        return
    acknowledge(publisher, qos, packet_id, reason_code, entry.reason_string)


def answer_all(entries: Sequence[PendingPublish]) -> None:
    """``answer`` each of ``entries``, in order, when none waits for another (a broker alone's batch): the
    accepted QoS 1 publishes of one client that follow each other are acknowledged with one write of their
    PUBACKs, not one call chain per publish."""
    run: list[int] = []
    owner: Publisher | None = None
    code = 0
    for entry in entries:
        publisher = entry.publisher
        packet_id = entry.packet_id
        if (
            entry.qos == 1
            and publisher is not None
            and packet_id is not None
            and entry.batch is None
            and entry.reason_string is None
            and entry.reason_code in _RUN_CODES
        ):
            if publisher is owner and entry.reason_code == code:
                run.append(packet_id)
                continue
            if owner is not None:
                _acknowledge_run(owner, run, code)
            run, owner, code = [packet_id], publisher, entry.reason_code
            continue
        if owner is not None:
            _acknowledge_run(owner, run, code)
            run, owner = [], None
        answer(entry)
    if owner is not None:
        _acknowledge_run(owner, run, code)


_RUN_CODES = (0, 0x10)
"""The reason codes of an accepted publish (success, no matching subscribers): the ones ``answer_all``
sends in runs."""


def _acknowledge_run(publisher: Publisher, packet_ids: list[int], reason_code: int) -> None:
    """``answer`` of several accepted QoS 1 publishes of ``publisher``, in one write."""
    if publisher.state == CLOSED:
        return
    inbound = publisher.inbound
    if inbound is not None and inbound.pending > 0:
        pending = inbound.pending - len(packet_ids)
        inbound.pending = pending if pending > 0 else 0
    if len(packet_ids) == 1:  # a device with one publish in flight: its own PUBACK, no run to pack
        publisher.send_puback(packet_ids[0], reason_code)
    else:
        publisher.send_pubacks(packet_ids, reason_code)


def acknowledge(
    publisher: Publisher, qos: int, packet_id: int, reason_code: int, reason_string: str | None = None
) -> None:
    """PUBACK for a QoS 1 publish, PUBREC for a QoS 2 one."""
    if qos == 1:
        publisher.send_puback(packet_id, reason_code, reason_string)
    elif qos == 2:
        publisher.send_pubrec(packet_id, reason_code, reason_string)
