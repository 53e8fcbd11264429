"""The PUBLISH path: accept → persist → durable → replicated → route and acknowledge, in arrival order.

Every application message enters the broker here: client PUBLISHes (from ``handlers/publish.py``, once the
packet is valid and allowed) and the broker's own (wills, ``Broker.publish``). The storage rules decide
whether a topic is logged; a message that is not is routed and acknowledged at once. A logged one goes
through five stages, each a method below:

1. **accept** (``accept``): queued as a ``PendingPublish``. An acknowledgement that must keep its turn
   behind logged publishes (a QoS 2 duplicate's PUBREC, a refusal) is queued as an entry without a message.
2. **persist** (``_persist``): at the start of the next loop iteration the queued messages are appended,
   one batch per topic (one encode loop and one bookkeeping step per topic), all in one call
   (``append_batches``: the group committer learns of them once per partition, not once per topic).
   A topic whose batch fails is retried one message at a time, so only the publishes that fail are refused.
3. **durable** (``_durable``): the store calls back on the loop once the batch is on disk (its policy).
4. **replicated** (``_durable`` hands the batch to the ``Replication`` port, which calls ``_done``): a
   single broker has nothing to wait for (``LocalOnly``); a cluster's leader holds the batch until its
   in-sync replicas hold it, so a device is acknowledged only for what survives the leader.
5. **route and acknowledge** (``_route_and_acknowledge``): each message is routed, carrying its offset,
   and every publisher answered in the order its publishes arrived (``answers``). Log readers (``replay``)
   are given the appended runs so sessions catching up share the decoded messages.

On a cluster member (``join_cluster``: the ``forwarding`` and ``replication`` ports of
``broker_edge.engine.ports``) the persist stage asks the ``Forwarding`` port which topics are appended here;
the others are handed to it, and each such part of the batch completes when its answers come back (the
leader's, once it has the records on its in-sync replicas, or a refusal: v5 publishers get 0x83 with a
reason string, v3 publishers are disconnected). What happens to them meanwhile is the cluster's
(``broker_edge.cluster.forwarding``). Unlogged publishes are also handed to it, to be routed on every other
member. Publishes another broker forwarded here enter as a ``ForwardedBatch`` (``accept_forwarded``),
answered to that batch as a client's are to the client. Batches then complete in any order (a forwarded part
waits for another broker), so each publisher's answers wait for its earlier ones (``answers.AnswersInTurn``,
[MQTT-4.6.0-2..4]). A broker alone's batches complete in the order they were persisted (the log makes them
durable in that order): its answers go through the same class, as soon as they are known. It never calls
the ``forwarding`` port: an unlogged publish costs it one test of it.

If writing fails, v5 publishers get 0x80 in their acknowledgement and v3 publishers are disconnected (they
resend after reconnecting); nothing is acknowledged that is not durable.

Nothing here touches a socket or a clock: the broker passes in how to run something at the start of the
next loop iteration (``call_soon``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol, cast

from broker_edge.engine.answers import (
    AnswersInTurn,
    ForwardedBatch,
    PendingPublish,
    Publisher,
    acknowledge,
)
from broker_edge.engine.connection.inbound import MAX_TOPICS_APPENDED_HERE
from broker_edge.engine.connection.states import CLOSED
from broker_edge.engine.message import Message
from broker_edge.engine.ports import LOCAL_ONLY, AppendedRun, ForwardAck, PublishRefused
from broker_edge.engine.publish_run import LoggedRun
from broker_edge.engine.records import record_fields
from broker_edge.observe.refusal_log import LogSummary
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.storage.errors import DISK_FULL, StorageError, StorageShortage, TooManyTopics
from broker_edge.storage.persistence import NOT_LOGGED
from broker_edge.storage.quarantine import LogQuarantined

if TYPE_CHECKING:
    from broker_edge.engine.connection.inbound import Inbound
    from broker_edge.engine.cursors import ReplayManager
    from broker_edge.engine.ports import ClusterPorts, Forwarding, Replication
    from broker_edge.engine.publish_run import PublishRun
    from broker_edge.engine.routing.router import Router
    from broker_edge.observe.counters import BrokerCounters
    from broker_edge.observe.metrics import BrokerMetrics
    from broker_edge.storage.record import RecordFields

__all__ = ["HeldReader", "PublishPath", "PublishStore"]

log = logging.getLogger("broker_edge.publish_path")

_NO_MATCHING = ReasonCode.NO_MATCHING_SUBSCRIBERS
_REFUSED = ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
_NOT_KEPT = {
    "retained_full": "the broker holds as many retained messages as it may (retain.max_retained)",
    "retained_bytes": "the retained messages' bytes are at their bound (retain.max_retained_bytes)",
    "retained_client_bytes": (
        "this client's retained bytes are at their bound (retain.max_retained_bytes_per_client)"
    ),
}
"""Why a retained message was not kept, as its MQTT 5 publisher is told (a PUBACK / PUBREC reason string)."""


def retained_not_kept(router: Router, message: Message) -> str | None:
    """The reason string of the acknowledgement of ``message``, just routed: None, unless it was a retained
    message the bounds did not keep. It was accepted, logged and delivered all the same, so the reason code
    stays a success (0x00, or 0x10); only a v5 client that did not set Request Problem Information to 0
    gets the string ([MQTT-3.1.2-29], ``Connection.send_puback``)."""
    refusal = router.retained_refusal
    if refusal is None or not message.retain or not message.payload:
        return None
    return f"retained message not kept: {_NOT_KEPT.get(refusal, refusal)}; delivered and logged all the same"


class HeldReader(Protocol):
    """A publisher whose reading waits for answers to its publishes (``PublishPath.wait_for_answers``)."""

    def acknowledged(self) -> bool:
        """Some of its publishes were answered: True once it reads again (or is closed)."""


class PublishStore(Protocol):
    """What the PUBLISH path needs of the commitlog (``storage.LogStore`` is one)."""

    def should_persist(self, topic: str, qos: int) -> bool: ...

    def persist_as(self, topic: str, qos: int) -> int:
        """``NOT_LOGGED``, ``LOGGED`` or ``CREATES_LOG`` (``broker_edge.storage.persistence``)."""

    def append_batch(self, topic: str, records: Sequence[RecordFields]) -> int: ...

    def append_batches(
        self, batches: Sequence[tuple[str, Sequence[RecordFields]]]
    ) -> list[int | StorageError]: ...

    def when_durable(
        self, callback: Callable[[], object], on_error: Callable[[BaseException], object] | None = None
    ) -> None: ...

    def logs_created_by(self, client_id: str) -> int: ...

    def __contains__(self, topic: object) -> bool: ...


@dataclass(slots=True)
class _Batch:
    """The part of one persisted batch appended here, until it is durable and replicated."""

    entries: list[PendingPublish]
    """What it answers: every publish of the batch on a broker alone; on a cluster member, those not handed
    to the ``forwarding`` port (each forwarded part is answered when its own answers come back)."""
    runs: list[AppendedRun]


def _never_logged(topic: str, qos: int) -> bool:
    """``PublishPath.is_logged`` of a broker that keeps no log."""
    return False


def _never_persisted(topic: str, qos: int) -> int:
    """``PublishPath.persist_as`` of a broker that keeps no log."""
    return NOT_LOGGED


class PublishPath:
    """Routes, logs and acknowledges every application message of one broker (see the module docstring)."""

    def __init__(
        self,
        router: Router,
        counters: BrokerCounters,
        metrics: BrokerMetrics,
        call_soon: Callable[[Callable[[], None]], object],
    ) -> None:
        self.router = router
        self.counters = counters
        self.metrics = metrics
        self.replication: Replication = LOCAL_ONLY
        """The stage between durable and acknowledged (``join_cluster``)."""
        self.store: PublishStore | None = None
        """The commitlog; None when the broker keeps no log (everything is routed at once)."""
        self.is_logged: Callable[[str, int], bool] = _never_logged
        """Whether a publish on ``topic`` at ``qos`` goes through the log (the storage rules decide): the
        store's ``should_persist`` once one is attached, called as is (asked once per publish)."""
        self.persist_as: Callable[[str, int], int] = _never_persisted
        """``is_logged``, telling too whether the publish creates its topic's log (``NOT_LOGGED``, ``LOGGED``
        or ``CREATES_LOG``): the store's ``persist_as``, what a client's publish handler asks."""
        self.replays: ReplayManager | None = None
        self.forwarding: Forwarding | None = None
        """Where a cluster member's logged publishes go (None: a broker alone, all are appended here)."""
        self._refusals = LogSummary(log)
        self._call_soon = call_soon
        self._pending: list[PendingPublish] = []
        self._by_topic: dict[str, list[Message]] = {}
        self.keeps_qos2_ids = True
        """Whether a broker alone's QoS 2 records keep their packet ids (``storage.record_format`` 2); False:
        version 1 records only, which brokers before version 2 read."""
        self._qos2_ids: dict[Message, int] = {}
        """The packet ids of the QoS 2 publishes queued (a broker alone): their records keep them, so that a
        restart after a crash can tell a resend of one from a new message (``runtime.qos2_log_ids``)."""
        self._scheduled = False
        self._answers = AnswersInTurn()
        """Each publisher's answers in the order of its publishes."""
        self._held_readers: list[HeldReader] = []
        """Publishers not read until enough of their publishes are answered (``wait_for_answers``)."""
        self._creating: dict[str, set[str]] = {}
        """The logs each client's publishes queued this turn create (``will_create_log``)."""

    def attach_store(self, store: PublishStore, replays: ReplayManager | None) -> None:
        """Log from now on into ``store``; ``replays`` learns of every appended run."""
        self.store = store
        self.is_logged = store.should_persist
        self.persist_as = store.persist_as
        self.replays = replays

    def join_cluster(self, ports: ClusterPorts) -> None:
        """Run as a cluster member from now on (``BrokerCore.join_cluster``): logged publishes go where the
        ``forwarding`` port places them, unlogged ones are also routed on the other members, and appended
        batches wait for the ``replication`` port."""
        self.forwarding = ports.forwarding
        self.replication = ports.replication

    # -- 1. accept ----------------------------------------------------------------------------------------

    def logs_created_by(self, client_id: str) -> int:
        """Logs ``client_id`` created, and those its publishes queued this turn will create (its topic quota
        counts them all: a pipelined run of publishes to new topics is read before any of them is made)."""
        store = self.store
        made = store.logs_created_by(client_id) if store is not None else 0
        creating = self._creating.get(client_id)
        return made if creating is None else made + len(creating)

    def creates_log(self, client_id: str, topic: str) -> bool:
        """Whether a publish of ``client_id`` queued this turn creates ``topic``'s log (another one to the
        same topic takes nothing more of its quota)."""
        creating = self._creating.get(client_id)
        return creating is not None and topic in creating

    def will_create_log(self, client_id: str, topic: str) -> None:
        """A publish of ``client_id`` to ``topic``, whose log does not exist, is taken: the append at the end
        of this turn creates it (``logs_created_by`` counts it meanwhile)."""
        self._creating.setdefault(client_id, set()).add(topic)

    def accept(self, publisher: Publisher, message: Message, packet_id: int | None, logged: bool) -> None:
        """Take a client's publish: logged, it waits for the log; otherwise it is routed and acknowledged now.

        ``logged`` is what ``persist_as(message.topic, message.qos)`` told the handler (not ``NOT_LOGGED``).
        """
        if logged:
            qos = message.qos
            if qos == 1 or (qos and not publisher.v5):  # an MQTT 5 QoS 2 publish counts from its id's hold
                (publisher.inbound or publisher.started_inbound).pending += 1
            self._queue_message(message, PendingPublish(publisher, message, packet_id, message.qos))
            return
        forwarding = self.forwarding
        if forwarding is not None:  # a cluster member: routed on every other member too
            forwarding.broadcast(message)
        matched = self.router.publish(message)
        message.frame = None  # its live deliveries are made: what keeps it (a queue) keeps no second copy
        if forwarding is not None:
            matched = 1  # subscribers on other members are not known here: 0x00 (docs/cluster.md)
        elif not matched:
            self.counters.drop("no_subscribers")
        if packet_id is not None:
            note = retained_not_kept(self.router, message) if message.retain else None
            code = 0 if matched else _NO_MATCHING
            if (inbound := publisher.inbound) is not None and inbound.pending:  # its earlier ones go first
                self.acknowledge_in_turn(publisher, packet_id, message.qos, code, note)
            else:
                acknowledge(publisher, message.qos, packet_id, code, note)

    def accept_run(self, publisher: Publisher, run: PublishRun) -> None:
        """Take a client's run of plain QoS 0 publishes of one unlogged topic (``engine.publish_run``): routed
        together when they would all be routed alike, else each through ``accept``."""
        matched = self.router.publish_run(run) if self.forwarding is None else None
        if matched is None:
            for message in run.messages():
                self.accept(publisher, message, None, False)
        elif not matched:
            for _ in range(len(run)):
                self.counters.drop("no_subscribers")

    def accept_logged_run(self, publisher: Publisher, run: PublishRun) -> None:
        """Take a client's run of plain QoS 1 publishes of one logged topic (``engine.publish_run``): queued
        for the next persist together, as ``accept`` queues each of them."""
        messages = run.messages()
        publisher.started_inbound.pending += len(messages)
        queued = self._by_topic.get(run.topic)
        if queued is None:
            self._by_topic[run.topic] = messages  # the run's own list: nothing else holds it after this call
        else:
            queued += messages
        self._pending += [
            PendingPublish(publisher, message, packet_id, 1)
            for message, packet_id in zip(messages, run.packet_ids, strict=True)
        ]
        self._persist_soon()

    def accept_forwarded(self, batch: ForwardedBatch) -> None:
        """Take the logged publishes of a batch another broker forwarded (this node leads their partition, or
        did when they were sent): appended and answered like a client's QoS 1 publishes, in turn, each to
        the batch; never forwarded again."""
        for index, message in enumerate(batch.messages):
            self._queue_message(message, PendingPublish(None, message, index, 1, batch=batch))

    def accept_ahead(self, batch: ForwardedBatch) -> None:
        """Take the publishes of one topic that waited to be forwarded until this node led their partition
        (``broker_edge.cluster.forwarding``): appended like ``accept_forwarded``'s, but ahead of the
        publishes of their topic queued since, which were published after them."""
        messages = list(batch.messages)
        if not messages:
            return
        topic = messages[0].topic
        queued = self._by_topic.get(topic)
        self._by_topic[topic] = messages if queued is None else messages + queued
        entries = [
            PendingPublish(None, message, index, 1, batch=batch) for index, message in enumerate(messages)
        ]
        pending = self._pending
        at = _first_on(pending, topic)
        pending[at:at] = entries
        self._persist_soon()

    def publish(self, message: Message) -> None:
        """Publish as the broker itself (a will, a tool): logged per the rules, never acknowledged."""
        if not message.topic.startswith("$") and self.is_logged(message.topic, message.qos):
            self._queue_message(message, PendingPublish(None, message, None, message.qos))
        else:
            self.router.publish(message)
            forwarding = self.forwarding
            if forwarding is not None and not message.topic.startswith("$"):
                forwarding.broadcast(message)

    def acknowledge_in_turn(
        self,
        publisher: Publisher,
        packet_id: int,
        qos: int,
        reason_code: int,
        reason_string: str | None = None,
    ) -> None:
        """Acknowledge behind every publish still waiting for the log, so acks keep the publishes' order."""
        if self.store is None:
            acknowledge(publisher, qos, packet_id, reason_code, reason_string)
            return
        if qos == 1 or not publisher.v5:  # waits for its answer as a publish does
            publisher.started_inbound.pending += 1
        self._pending.append(PendingPublish(publisher, None, packet_id, qos, reason_code, reason_string))
        self._persist_soon()

    def wait_for_answers(self, reader: HeldReader) -> None:
        """``reader`` is not read until enough of its publishes are answered: it is told after every batch
        answered (``HeldReader.acknowledged``) until it reads again."""
        self._held_readers.append(reader)

    def _answered(self) -> None:
        """A batch was answered: tell the held readers; those still held wait for the next batch."""
        readers, self._held_readers = self._held_readers, []
        for reader in readers:
            if not reader.acknowledged():
                self._held_readers.append(reader)

    def _queue_message(self, message: Message, entry: PendingPublish) -> None:
        """Queue ``entry``, the publish of ``message``, for the next persist."""
        queued = self._by_topic.get(message.topic)
        if queued is None:
            self._by_topic[message.topic] = [message]
        else:
            queued.append(message)
        if entry.qos == 2 and entry.packet_id is not None and self.forwarding is None and self.keeps_qos2_ids:
            self._qos2_ids[message] = entry.packet_id
        self._pending.append(entry)
        if not self._scheduled:  # (``_persist_soon``, inlined: a device's every publish comes this way)
            self._scheduled = True
            self._call_soon(self._persist)

    def _persist_soon(self) -> None:
        """Persist what is queued at the start of the next loop iteration (once, however much is queued)."""
        if not self._scheduled:
            self._scheduled = True
            self._call_soon(self._persist)

    # -- 2. persist ---------------------------------------------------------------------------------------

    def _persist(self) -> None:
        """Append the queued publishes (a batch per topic) and wait for them to be durable."""
        self._scheduled = False
        batch, self._pending = self._pending, []
        topics, self._by_topic = self._by_topic, {}
        fields: Callable[[Message], RecordFields] = record_fields
        if self._qos2_ids:
            fields = partial(_fields_keeping_ids, self._qos2_ids)
            self._qos2_ids = {}
        if self._creating:  # made by this append, or refused by it: the store counts what it made
            self._creating = {}
        store = self.store
        assert store is not None, "only logged publishes are queued"
        if not batch:
            return
        current = _Batch(batch, [])
        if self.forwarding is not None:  # its parts complete in any order: answers wait for their turn
            self._answers.expect(batch)
            topics = self._place(current, topics, self.forwarding)
        retry: dict[str, StorageError] = {}
        runs = current.runs
        firsts = store.append_batches(
            [
                (
                    topic,
                    [fields(messages[0])] if len(messages) == 1 else list(map(fields, messages)),
                )
                for topic, messages in topics.items()
            ]  # (a topic per device: one message each, and no inner comprehension per topic)
        )
        for (topic, messages), first in zip(topics.items(), firsts, strict=True):
            if isinstance(first, StorageError):
                retry[topic] = first  # one by one below, so that only the publishes that fail are refused
                continue
            if len(messages) == 1:  # a topic per device: most batches hold one message
                messages[0].offset = first
            else:
                for offset, message in enumerate(messages, first):
                    message.offset = offset
            runs.append(AppendedRun(topic, first, messages))
        if retry:
            for entry in batch:
                if entry.message is not None and entry.message.topic in retry:
                    self._append_one(store, entry, retry[entry.message.topic], fields)
        store.when_durable(
            lambda: self._durable(current), lambda exc: self._failed(current, exc, "log_failed")
        )

    def _place(
        self, current: _Batch, topics: dict[str, list[Message]], forwarding: Forwarding
    ) -> dict[str, list[Message]]:
        """Split a batch by where its topics go: returns the topics appended here, and keeps in ``current``
        only their entries; hands the others to the ``forwarding`` port, whose answers settle their entries,
        acknowledged in their turn as soon as they come back.

        A forwarded part never waits for the part appended here, nor the other way round: the answers to
        publishes another broker forwarded here must not wait for this broker's own forwards, which may wait
        for that broker (its forwards of a topic are sent one after the other, to keep their order)."""
        local: dict[str, list[Message]] = {}
        elsewhere: set[str] = set()
        for topic, messages in topics.items():
            if forwarding.appends_here(topic):
                local[topic] = messages
            else:
                elsewhere.add(topic)
        moves_publishers = forwarding.moves_publishers
        if not elsewhere:
            if moves_publishers:
                _appended_here(current.entries)
            return local
        parts: dict[tuple[str, bool], list[PendingPublish]] = {}
        here: list[PendingPublish] = []
        for entry in current.entries:
            message = entry.message
            if message is not None and message.topic in elsewhere:
                parts.setdefault((message.topic, entry.batch is not None), []).append(entry)
            else:
                here.append(entry)
        if moves_publishers:
            _appended_here(here)
        current.entries = here
        for (topic, from_peer), entries in parts.items():
            messages = [entry.message for entry in entries if entry.message is not None]
            forwarding.forward(
                topic,
                messages,
                from_peer,
                partial(self._forwarded, topic, entries),
                partial(_wanted, entries),
            )
        return local

    def _forwarded(self, topic: str, entries: list[PendingPublish], acks: Sequence[ForwardAck]) -> None:
        for entry, ack in zip(entries, acks, strict=True):
            self._settle(entry, ack)
        self._answers.ready_all(entries)
        forwarding = self.forwarding
        if forwarding is not None and forwarding.moves_publishers:
            self._move_publishers(topic, entries, forwarding)
        if self._held_readers:
            self._answered()

    @staticmethod
    def _move_publishers(topic: str, entries: list[PendingPublish], forwarding: Forwarding) -> None:
        """Publishers whose publishes on ``topic`` its leader acknowledged go there (``_move``), each once,
        unless they stay (``_stays``: this member leads a topic it appended a publish of theirs on)."""
        moved: set[int] = set()
        for entry in entries:
            publisher = entry.publisher
            if (
                publisher is None  # the broker's own, or another broker's (in a batch)
                or entry.reason_code >= 0x80
                or publisher.state == CLOSED
                or id(publisher) in moved
            ):
                continue
            inbound = getattr(publisher, "inbound", None)
            if inbound is None:
                continue
            moved.add(id(publisher))
            if not _stays(inbound, forwarding):
                _move(topic, publisher, inbound, forwarding)

    def move_after_qos2(self, publisher: Publisher, inbound: Inbound) -> None:
        """The last QoS 2 flow ``publisher`` had open when a publish of its was forwarded and answered has
        ended (PUBCOMP sent): it goes to that topic's leader now, as it would have then."""
        topic, inbound.move_due = inbound.move_due, None
        forwarding = self.forwarding
        if topic is None or forwarding is None or publisher.state == CLOSED or _stays(inbound, forwarding):
            return
        _move(topic, publisher, inbound, forwarding)

    def _settle(self, entry: PendingPublish, ack: ForwardAck) -> None:
        """Record the answer for an entry answered elsewhere; it is acknowledged in its turn."""
        message = entry.message
        if message is not None and ack.offset is not None:
            message.offset = ack.offset
        entry.message = None
        entry.settled = True
        entry.reason_code = ack.reason_code
        entry.reason_string = ack.reason_string
        if ack.reason_code >= 0x80:
            self.counters.drop("forward_refused")
            publisher = entry.publisher
            if publisher is not None and entry.qos == 2 and entry.packet_id is not None and publisher.v5:
                publisher.release_qos2(entry.packet_id)

    def _append_one(
        self,
        store: PublishStore,
        entry: PendingPublish,
        refusal: StorageError,
        fields: Callable[[Message], RecordFields],
    ) -> None:
        """Append one publish of a batch that failed with `refusal`; at the topic limit it is refused at
        once (no log can be made for it, and the store would count the refusal again)."""
        message = entry.message
        assert message is not None
        if isinstance(refusal, TooManyTopics):
            self._refuse(entry, refusal)
            return
        try:
            message.offset = store.append_batch(message.topic, [fields(message)])
        except StorageError as exc:
            self._refuse(entry, exc)

    def _refuse(self, entry: PendingPublish, exc: StorageError) -> None:
        """A publish whose append failed: a refusal, acknowledged in its turn with the reason (v5), so that
        acknowledgements keep the order of the publishes.

        At the broker's topic limit (`storage.max_topics`) a v3.1.1 publisher cannot be told why: its publish
        is not acknowledged at all and its connection stays open, so it keeps the message (nothing is lost)
        and does not resend it on this connection ([MQTT-4.4.0-1]); it resends once when it reconnects. The
        store counts and logs these refusals once per interval, not once per publish. So are the refusals
        of a store short of file descriptors (``descriptor_shortage``: 0x80) or of disk space
        (``disk_full``: 0x97 Quota exceeded), with the reason string; a v3.1.1 publisher closed. A QoS 0
        publish refused (a topic whose rules log QoS 0) is dropped and counted, its publisher never closed:
        nothing was promised for it, and it would not be sent again."""
        message = entry.message
        assert message is not None
        entry.message = None
        entry.settled = True
        publisher = entry.publisher
        if isinstance(exc, TooManyTopics):
            self.counters.drop("topic_limit")
            entry.reason_code = ReasonCode.QUOTA_EXCEEDED
            if publisher is not None and not publisher.v5:
                if entry.qos and (inbound := publisher.inbound) is not None and inbound.pending > 0:
                    inbound.pending -= 1  # answered with silence: a slot free
                entry.packet_id = None
                return
        else:
            if isinstance(exc, StorageShortage):  # passing, and every publish meets it: summarised
                self.counters.drop(exc.cause.reason)
                self._refusals.log(logging.WARNING, exc.cause.reason, "publish refused: %s", exc)
                entry.reason_string = str(exc)
            elif isinstance(exc, LogQuarantined):  # every publish to it meets it: summarised
                self.counters.drop("log_quarantined")
                self._refusals.log(logging.WARNING, "log_quarantined", "publish refused: %s", exc)
            else:  # a failed log refuses every publish after: summarised too
                self.counters.drop("log_failed")
                self._refusals.log(
                    logging.WARNING,
                    "append_failed",
                    "append to %r failed: %s",
                    message.topic,
                    exc,
                    extra={"client_id": message.origin or "-"},
                )
            entry.reason_code = _refusal_code(exc)
            if publisher is not None and not publisher.v5 and entry.qos:
                publisher.close()  # a v3 client cannot be told: it resends after reconnecting
                return
        if publisher is not None and entry.qos == 2 and entry.packet_id is not None:
            publisher.release_qos2(entry.packet_id)

    # -- 3. durable ---------------------------------------------------------------------------------------

    def _durable(self, current: _Batch) -> None:
        if not current.runs and self.forwarding is not None:
            self._done(current)  # everything went elsewhere: nothing here to replicate
            return
        self.replication.when_replicated(
            current.runs,
            lambda: self._done(current),
            lambda exc: self._failed(current, exc, "replication_failed"),
        )

    def _done(self, current: _Batch) -> None:
        """``current`` is durable (and replicated): route and acknowledge it."""
        self._route_and_acknowledge(current.entries, current.runs)
        if self._held_readers:
            self._answered()

    def _failed(self, current: _Batch, exc: BaseException, reason: str) -> None:
        """Writing (``log_failed``) or replicating (``replication_failed``) failed: acknowledge nothing
        appended here (entries answered otherwise keep their answer); a ``PublishRefused`` says why."""
        batch = current.entries
        if isinstance(exc, StorageShortage):
            reason = exc.cause.reason
        refused = isinstance(exc, PublishRefused | StorageShortage)
        if refused:  # expected while a partition changes hands, passing with descriptors: summarised
            self._refusals.log(
                logging.WARNING,
                reason,
                "%s, %d publishes refused: %s",
                reason.replace("_", " "),
                len(batch),
                exc,
            )
        else:  # the store said it once at ERROR; each batch after meets it again: summarised
            self._refusals.log(
                logging.ERROR,
                reason,
                "%s, %d publishes not acknowledged: %s",
                reason.replace("_", " "),
                len(batch),
                exc,
            )
        reason_code = exc.reason_code if isinstance(exc, PublishRefused) else _refusal_code(exc)
        reason_string = str(exc) if refused else None
        for entry in batch:
            if not entry.settled:
                if entry.message is not None:
                    self.counters.drop(reason)
                entry.reason_code = reason_code
                entry.reason_string = reason_string
        self._answers.ready_all(batch)
        if self._held_readers:
            self._answered()

    # -- 4. route and acknowledge -------------------------------------------------------------------------

    def _route_and_acknowledge(self, batch: list[PendingPublish], runs: list[AppendedRun]) -> None:
        """Route the publishes of ``batch``, now durable (and replicated), and answer them in turn. A broker
        alone tells a publisher no subscriber matched (0x10); a cluster member cannot know (subscribers on
        other members get it from their copy of the log): 0x00."""
        router = self.router
        alone = self.forwarding is None
        appends = appended_bytes = 0
        count = len(batch)
        run_end = tried_until = 0  # the entries before them: routed as a run, looked at for one
        for index, entry in enumerate(batch):
            message = entry.message
            if message is not None:
                appends += 1
                appended_bytes += len(message.payload)
                if (
                    index >= tried_until
                    and message.frame is not None
                    and message.qos == 1
                    and index + 1 < count
                    and batch[index + 1].publisher is entry.publisher  # (a device's one publish: no run)
                ):
                    end = tried_until = _logged_run_end(batch, index, count)
                    if end - index > 1:
                        run = LoggedRun([cast(Message, e.message) for e in batch[index:end]])
                        matched = router.publish_run(run)  # None: shared groups, one by one
                        if matched is not None:
                            run_end = end
                            if not matched and alone:
                                for routed in batch[index:end]:
                                    routed.reason_code = _NO_MATCHING
                if index >= run_end and not router.publish(message) and alone:
                    entry.reason_code = _NO_MATCHING
                message.frame = None  # routed: recent messages and queues keep no second copy of it
                if message.retain:
                    entry.reason_string = retained_not_kept(router, message)
        self._answers.ready_all(batch)  # every answer once the batch is routed, a publisher's in runs
        replays = self.replays
        if replays is not None:
            replays.appended_runs(runs)
        if appends:
            self.metrics.log_appends_total.inc(appends)
            self.metrics.log_bytes_total.inc(appended_bytes)


def _fields_keeping_ids(packet_ids: dict[Message, int], message: Message) -> RecordFields:
    """The record of ``message``, keeping its publisher's packet id when ``packet_ids`` has it (QoS 2)."""
    return record_fields(message, packet_ids.get(message))


def _first_on(pending: list[PendingPublish], topic: str) -> int:
    """The index of the first entry of ``pending`` publishing on ``topic`` (its length when none does)."""
    for index, entry in enumerate(pending):
        message = entry.message
        if message is not None and message.topic == topic:
            return index
    return len(pending)


def _logged_run_end(batch: list[PendingPublish], start: int, count: int) -> int:
    """Where the run of plain QoS 1 messages (each with its received frame) of ``batch[start]``'s publisher on
    its topic ends (``engine.publish_run.LoggedRun``); ``batch[start]``'s message is one. The broker's own
    publishes and those another broker forwarded make no run."""
    first = batch[start]
    publisher = first.publisher
    if publisher is None:
        return start + 1
    topic = cast(Message, first.message).topic
    end = start + 1
    while end < count:
        entry = batch[end]
        message = entry.message
        if (
            message is None
            or message.frame is None
            or message.qos != 1
            or entry.publisher is not publisher
            or message.topic != topic
        ):
            break
        end += 1
    return end


def _refusal_code(exc: BaseException) -> ReasonCode:
    """A refused append's reason code: 0x97 Quota exceeded for a full disk, else 0x80."""
    full = isinstance(exc, StorageShortage) and exc.cause is DISK_FULL
    return ReasonCode.QUOTA_EXCEEDED if full else ReasonCode.UNSPECIFIED_ERROR


def _wanted(entries: list[PendingPublish]) -> bool:
    """Whether a publisher of ``entries`` is still connected (or the broker itself published one)."""
    return any(entry.publisher is None or entry.publisher.state != CLOSED for entry in entries)


def _move(topic: str, publisher: Publisher, inbound: Inbound, forwarding: Forwarding) -> None:
    """Send ``publisher`` to the member leading ``topic``'s partition: its connection handed over when that
    member runs on this host (``cluster.hand_over_connections``), else an MQTT 5 publisher sent there
    (``cluster.redirect_publishers``) once all its publishes are answered. One with a QoS 2 flow open (its
    PUBREL still to come) is neither yet: it goes once the last such flow ends (``move_after_qos2``)."""
    session = getattr(publisher, "session", None)
    if session is not None and session.incoming_qos2:  # a QoS 2 publish of its waits for its PUBREL
        inbound.move_due = topic
        return
    if forwarding.hand_over(topic, publisher):  # it moves once its publishes read are answered
        return
    redirect = getattr(publisher, "redirect", None)
    if not publisher.v5 or redirect is None or (publisher.inbound is not None and publisher.inbound.pending):
        return  # answers still to write go first; their forwards' answers try again
    address = forwarding.server_for(topic)
    if address:  # "" or None: this member sends nobody away
        redirect(address, "the member leading this topic's partition appends its publishes")


def _appended_here(entries: list[PendingPublish]) -> None:
    """Note the topics of ``entries`` appended here (this member leads them) on their publishers
    (``Inbound.appended_here``)."""
    last: tuple[object, str] | None = None  # a publisher's run on one topic is noted once
    for entry in entries:
        message = entry.message
        if message is None:  # an answer alone (a QoS 2 publish sent again, a refusal)
            continue
        publisher = entry.publisher
        topic = message.topic
        if last is not None and last[0] is publisher and last[1] == topic:
            continue
        last = (publisher, topic)
        inbound = getattr(publisher, "inbound", None)  # a client's (a peer has none)
        if inbound is None:
            continue
        topics = inbound.appended_here
        if topics is None:
            inbound.appended_here = {topic}
        elif len(topics) < MAX_TOPICS_APPENDED_HERE:
            topics.add(topic)


def _stays(inbound: Inbound, forwarding: Forwarding) -> bool:
    """Whether a publisher whose publish was forwarded stays connected here: this member still leads a
    topic of its it appended (a device publishing on topics led by several members stays put rather than
    go back and forth). Once it leads none of them (their leadership moved away) they are forgotten, and
    the publisher follows the leader of the topics it is forwarded."""
    topics = inbound.appended_here
    if topics is None:
        return False
    if any(forwarding.appends_here(topic) for topic in topics):
        return True
    inbound.appended_here = None
    return False
