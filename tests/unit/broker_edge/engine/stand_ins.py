"""Stand-ins, in memory, for what the engine's parts write to: a commitlog that is durable when the test says
so (``MemoryLog``), a cluster's ``forwarding`` port whose answers the test gives (``HeldForwarding``), a
session's connection that records what is written (``RecordingConnection``), a transport that takes everything
and writes nothing (``NullTransport``); and members of a shared group (``group_members``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from broker_edge.engine.message import Message
from broker_edge.engine.ports import ForwardAck
from broker_edge.engine.routing.router import Router
from broker_edge.engine.routing.subscriptions import SubscriptionOptions
from broker_edge.engine.sessions.session import Session
from broker_edge.storage.errors import StorageError
from broker_edge.storage.persistence import CREATES_LOG, LOGGED, NOT_LOGGED
from broker_edge.storage.record import RecordFields

LOCAL_TOPIC = "site/led-here"
REMOTE_TOPIC = "site/led-elsewhere"


class MemoryLog:
    """A ``PublishStore`` in memory: appends at once, durable only when ``make_durable`` is called (or, given
    ``durable_soon``, at the end of the loop iteration it is asked in, as a store that keeps up)."""

    def __init__(self, durable_soon: Callable[[Callable[[], object]], object] | None = None) -> None:
        self.logs: dict[str, list[RecordFields]] = {}
        self.waiting: list[Callable[[], object]] = []
        self.failing: list[Callable[[BaseException], object]] = []
        """The error callbacks of the batches in ``waiting`` (``fail`` calls them)."""
        self.durable_soon = durable_soon

    def should_persist(self, topic: str, qos: int) -> bool:
        return qos > 0

    def persist_as(self, topic: str, qos: int) -> int:
        if not self.should_persist(topic, qos):
            return NOT_LOGGED
        return LOGGED if topic in self.logs else CREATES_LOG

    def append_batch(self, topic: str, records: Sequence[RecordFields]) -> int:
        log = self.logs.setdefault(topic, [])
        first = len(log)
        log.extend(records)
        return first

    def append_batches(
        self, batches: Sequence[tuple[str, Sequence[RecordFields]]]
    ) -> list[int | StorageError]:
        results: list[int | StorageError] = []
        for topic, records in batches:
            try:
                results.append(self.append_batch(topic, records))
            except StorageError as error:  # as ``LogStore``: that batch alone is refused
                results.append(error)
        return results

    def when_durable(
        self, callback: Callable[[], object], on_error: Callable[[BaseException], object] | None = None
    ) -> None:
        if self.durable_soon is not None:
            self.durable_soon(callback)
        else:
            self.waiting.append(callback)
            if on_error is not None:
                self.failing.append(on_error)

    def make_durable(self) -> None:
        waiting, self.waiting, self.failing = self.waiting, [], []
        for callback in waiting:
            callback()

    def fail(self, error: BaseException) -> None:
        """The write of every batch waiting failed (as ``LogStore`` reports a failed write or fsync)."""
        failing, self.waiting, self.failing = self.failing, [], []
        for on_error in failing:
            on_error(error)

    def logs_created_by(self, client_id: str) -> int:
        return 0

    def __contains__(self, topic: object) -> bool:
        return topic in self.logs


Forward = tuple[str, list[Message], bool, Callable[[Sequence[ForwardAck]], None]]


class HeldForwarding:
    """A ``forwarding`` port that appends here the topics the test says, refuses at once those it says, and
    holds the other forwards until the test answers them."""

    def __init__(self) -> None:
        self.here = {LOCAL_TOPIC}
        self.refused: set[str] = set()
        self.forwarded: list[Forward] = []
        self.broadcasts: list[Message] = []
        self.leaders: dict[str, str] = {}
        """Topic → the MQTT address its publishers are sent to (``redirect_publishers``); none by default."""
        self.on_this_host: set[str] = set()
        """Topics whose leader runs on this host: their publishers' connections are handed over."""
        self.handed_over: list[tuple[str, object]] = []
        self.stays: set[int] = set()
        """Ids of publishers that may not move (``hand_over`` says False for them)."""

    def appends_here(self, topic: str) -> bool:
        return topic in self.here

    @property
    def moves_publishers(self) -> bool:
        return bool(self.leaders or self.on_this_host)

    def hand_over(self, topic: str, publisher: object) -> bool:
        if topic not in self.on_this_host or id(publisher) in self.stays:
            return False
        self.handed_over.append((topic, publisher))
        return True

    def server_for(self, topic: str) -> str | None:
        return self.leaders.get(topic)

    def forward(
        self,
        topic: str,
        messages: list[Message],
        from_peer: bool,
        done: Callable[[Sequence[ForwardAck]], None],
        wanted: Callable[[], bool] | None = None,
    ) -> None:
        if topic in self.refused:
            done([ForwardAck(0x83, None, f"too few in-sync replicas for {topic}")] * len(messages))
            return
        self.forwarded.append((topic, messages, from_peer, done))

    def broadcast(self, message: Message) -> None:
        self.broadcasts.append(message)

    def answer(self, index: int, reason_code: int = 0, first_offset: int = 100) -> None:
        _, messages, _, done = self.forwarded[index]
        done(
            [
                ForwardAck(reason_code, first_offset + n if reason_code < 0x80 else None)
                for n in range(len(messages))
            ]
        )


class RecordingConnection:
    """What ``Session`` writes through: every delivery and PUBREL, in order."""

    def __init__(self, send_quota: int = 65_535) -> None:
        self.terms = SimpleNamespace(paused=False, send_quota=send_quota)
        self.sent: list[tuple] = []

    def send_message(self, message, qos, retain, subscription_ids, packet_id, dup=False) -> bool:
        self.sent.append((message.payload, qos, packet_id, dup))
        return True

    def fits(self, message, qos, retain, subscription_ids) -> bool:
        return True

    def send_run(self, run, subscription_ids) -> None:
        for message in run.messages():
            self.send_message(message, 0, False, subscription_ids, None)

    def encode_while_framed(self, messages, qos, retain, subscription_ids) -> None:
        """Nothing is encoded here: what is sent is recorded as its parts."""

    def send_pubrel(self, packet_id: int, reason_code: int = 0) -> None:
        self.sent.append(("PUBREL", packet_id))

    def taken_over(self) -> None:
        self.sent.append(("TAKEN OVER",))


class NullTransport:
    """A transport that takes everything and writes nothing: one object can serve every connection, so that
    only what the broker keeps (or spends) is counted."""

    def write(self, data: bytes) -> None:
        pass

    def writelines(self, parts: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def is_reading(self) -> bool:
        return True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 50000) if name == "peername" else default


def group_members(router: Router, *names: str) -> list[Session]:
    """Sessions of ``router``, one per name, each a member of the shared group ``g`` of ``jobs/#``."""
    sessions = []
    for name in names:
        session = router.session_type(name)
        router.subscribe(session, "$share/g/jobs/#", "jobs/#", "g", SubscriptionOptions(1))
        sessions.append(session)
    return sessions
