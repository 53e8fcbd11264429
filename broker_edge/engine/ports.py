"""The seam: every point where the engine lets a cluster in, and what a broker alone does there.

As EMQX lets a cluster or an extension in through one small behaviour (``emqx_external_broker``: a few
callbacks, one registration, nothing when none is registered), the engine declares each point here as a
small ``Protocol`` and ``ClusterPorts`` holds one implementation of each. A broker alone runs with ``ALONE``;
a cluster node (``broker_edge.cluster.node``) builds its ports and registers them once, with
``BrokerCore.join_cluster``, which hands each engine part the ports it asks. Nothing else of the engine is
set from outside, and nothing of the engine imports the cluster.

A port left ``None`` is absent: the engine then does what a broker alone does, at the cost of one test on
the paths that run per message. ``Replication`` alone is an object, ``LOCAL_ONLY``, since every logged batch
passes through it.

==================  =================================================  =======================================
port                asked by                                           a broker alone
==================  =================================================  =======================================
``forwarding``      the PUBLISH path: is a logged publish appended     everything logged is appended here,
                    here, else get it to the leader; an unlogged one   routed here only
                    is routed on the other members too
``replication``     the PUBLISH path, between durable and              ``LOCAL_ONLY``: done at once
                    acknowledged (acks=all on a leader)
``sessions``        CONNECT claims its client id first; a connected    the session is opened here
                    client's connection ended
``wills``           the router, when a will is to be published         through the PUBLISH path
``shared_dispatch`` the router, per message: who serves ``$share``     the groups' members here, round robin
                    groups (the partition's leader picks a broker)
``shared_members``  the router: a member joined or left a group here   nothing
``retained_sync``   the router: a retained message changed; whether    nothing; retained messages at once
                    retained messages can be sent yet
``interest``        the router: a filter was subscribed or dropped     nothing
``subscribe_gate``  SUBSCRIBE: whether the SUBACK waits (the new       the SUBACK goes at once
                    subscriptions' partitions are not routed here yet)
``remote_logs``     the cursors: topics whose log this broker holds    every log is here
                    no complete copy of, read from another broker
``remote_starts``   the cursors: replays positioned in logs held       every log is here
                    elsewhere, before the SUBACK
``mirror_logs``     the uplink: a site's frames appended at its        the uplink's own, over the store
                    offsets on their partition's leader, acknowledged  (``uplink.mirror.LocalMirrorLogs``):
                    once replicated; the ends committed there; the     appended here, acknowledged once
                    downlinked logs held elsewhere, read from a copy   durable; every downlinked log is here
==================  =================================================  =======================================

``mirror_logs`` is the uplink's: asked by it (beside the cluster, above the engine), never by the engine, and
declared here because this is where both the uplink and the cluster may read it: the port is how the uplink
reaches a cluster without importing it. A broker alone's is the uplink's own (``uplink.mirror``); the
rule both follow, appending another broker's frames at its offsets once, is the store's
(``storage.mirrored``). The uplink's other hook is ``BrokerCore.reserved_topics``: a site's link says which
topics only its hub writes, and the PUBLISH handler refuses a client's publish to one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from broker_edge.protocol.reason_codes import ReasonCode

if TYPE_CHECKING:
    from broker_edge.engine.message import Message
    from broker_edge.engine.sessions.session import Session
    from broker_edge.protocol.packets import Will
    from broker_edge.protocol.topics import OffsetStart
    from broker_edge.storage.errors import OffsetOutOfRange
    from broker_edge.storage.mirrored import MirrorAppend
    from broker_edge.storage.record import Record

__all__ = [
    "ALONE",
    "LOCAL_ONLY",
    "AppendedRun",
    "ClaimDone",
    "ClusterPorts",
    "ForwardAck",
    "Forwarding",
    "Interest",
    "LocalOnly",
    "MirrorLogs",
    "MirrorPart",
    "MirrorRefused",
    "PublishRefused",
    "RemoteLogs",
    "RemoteStarts",
    "Replication",
    "RetainedSync",
    "SessionClaim",
    "SessionClaims",
    "SharedDispatch",
    "SharedMembers",
    "SubscribeGate",
    "Wills",
]


# -- the PUBLISH path -------------------------------------------------------------------------------------


@dataclass(slots=True)
class AppendedRun:
    """Records appended to one topic's log in one batch: record i has offset ``first_offset + i``. They are
    ``messages`` (the PUBLISH path's) or, for another broker's frames appended verbatim, ``frames`` records
    with no ``Message``."""

    topic: str
    first_offset: int
    messages: list[Message] = field(default_factory=list)
    frames: int = 0

    @property
    def end_offset(self) -> int:
        """The offset after the run."""
        return self.first_offset + len(self.messages) + self.frames


@dataclass(frozen=True, slots=True)
class ForwardAck:
    """The answer for one publish forwarded to another broker: its reason code and, once appended there,
    its offset (a reason code of 0x80 or more refuses it, with the reason string)."""

    reason_code: int
    offset: int | None = None
    reason_string: str | None = None


class PublishRefused(Exception):
    """A stage refuses the publishes of a batch (e.g. too few in-sync replicas): v5 publishers get
    ``reason_code`` with the message as reason string, v3 publishers are disconnected."""

    def __init__(self, message: str, reason_code: int = ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR) -> None:
        super().__init__(message)
        self.reason_code = reason_code


class Forwarding(Protocol):
    """Where a cluster member's logged publishes go, and getting them there."""

    def appends_here(self, topic: str) -> bool:
        """Whether logged publishes on ``topic`` are appended to this broker's log now (it leads the topic's
        partition); the others are handed to ``forward``. Asked once per topic of a batch."""

    def forward(
        self,
        topic: str,
        messages: list[Message],
        from_peer: bool,
        done: Callable[[Sequence[ForwardAck]], None],
        wanted: Callable[[], bool] | None = None,
    ) -> None:
        """Get ``messages`` (all on ``topic``) appended where they belong, or refuse them; ``done`` is called
        once, on the loop (possibly at once), with one answer per message in order. ``from_peer``: another
        broker forwarded them here (``PublishPath.accept_forwarded``). ``wanted()`` false: their publishers
        are gone, so publishes still waiting are refused rather than appended behind the ones their
        publishers sent since, on another connection."""

    def broadcast(self, message: Message) -> None:
        """Route an unlogged publish on every other member."""

    @property
    def moves_publishers(self) -> bool:
        """Whether publishers may be moved to their topic's leader at all (``hand_over``, ``server_for``):
        the PUBLISH path asks neither otherwise."""

    def hand_over(self, topic: str, publisher: object) -> bool:
        """Move ``publisher``'s connection (an ``answers.Publisher``) to the member leading ``topic``'s
        partition, on this host, after this turn's writes (it stays if it cannot move by then): False when
        that member is not on this host or takes no connections, or the connection cannot move."""

    def server_for(self, topic: str) -> str | None:
        """The MQTT address of the member a client publishing on ``topic`` is better connected to (the
        leader of its partition), when this member sends publishers there; None otherwise."""


class Replication(Protocol):
    """The stage between durable and acknowledged: call ``done`` once ``runs`` are replicated enough."""

    def when_replicated(
        self, runs: Sequence[AppendedRun], done: Callable[[], None], failed: Callable[[BaseException], None]
    ) -> None: ...


class LocalOnly:
    """A broker without followers: a durable batch is as replicated as it will get."""

    __slots__ = ()

    def when_replicated(
        self, runs: Sequence[AppendedRun], done: Callable[[], None], failed: Callable[[BaseException], None]
    ) -> None:
        done()


LOCAL_ONLY = LocalOnly()


# -- sessions and wills -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MovedClaim:
    """The claim a connection moved here from another member on this host comes with: that member's
    registry record of its session (it wrote it for the CONNECT numbered ``generation``, at etcd
    ``revision``), which it no longer keeps current. The claim here swaps that record for its own without
    reading it first."""

    node: str
    generation: int
    revision: int


@dataclass(frozen=True, slots=True)
class SessionClaim:
    """What a CONNECT on a cluster node claims: its client id's session, for its identity, as it asks."""

    client_id: str
    username: str | None
    """The identity the session belongs to (user name, certificate CN, or None: anonymous)."""
    clean_start: bool
    expiry_interval: int
    """The Session Expiry Interval granted (seconds, capped by the broker's maximum)."""
    will: Will | None
    will_delay: int
    """The will's v5 Will Delay Interval (0: none)."""
    takes_reference: bool = True
    """An MQTT 5 client: a refusal ``use_another_server`` names it a member (3.1.1 has no Server
    Reference)."""
    moved_from: MovedClaim | None = None
    """A connection moved here (``connection.handover``): the record the member it left wrote."""


ClaimDone = Callable[[str | None, str | None], None]
"""How a claim ends: ``(refusal, server_reference)``, ``(None, None)`` when the CONNECT may go on."""


class SessionClaims(Protocol):
    """Sessions held beyond this broker: one client id, one session, cluster-wide."""

    def claim(self, claim: SessionClaim, done: ClaimDone) -> None:
        """Make this broker the holder of ``claim.client_id``'s session (moving it here if it is elsewhere);
        ``done(refusal, server_reference)`` later on the loop: refusal None to go on, else the CONNECT
        refusal's name; ``use_another_server`` comes with the broker to name to a v5 client."""

    def connection_ended(self, session: Session, will: Will | None) -> None:
        """The connection of ``session``'s client ended, ``will`` still to be handled (None: a normal
        DISCONNECT, or none was given)."""


class Wills(Protocol):
    """Publishing a will (each once, cluster-wide)."""

    def publish_will(self, message: Message) -> None: ...


# -- routing ----------------------------------------------------------------------------------------------


class SharedDispatch(Protocol):
    """Who serves a message's ``$share`` groups."""

    def dispatch(self, message: Message) -> int:
        """Serve the shared groups of ``message`` (this broker's members through
        ``Router.deliver_to_group``); returns how many groups it went to, or will."""

    def serves(self, topic: str) -> bool:
        """Whether a shared group's filter matches ``topic`` (else ``dispatch`` of a message on it serves
        none)."""

    def undelivered(self, message: Message) -> None:
        """A member's session ended holding ``message`` (a copy ``dispatch`` handed here) unacknowledged, and
        no other member here took it: another broker's member gets it, as when a broker has none left."""


class SharedMembers(Protocol):
    def member_changed(self, group: str, topic_filter: str, joined: bool) -> None:
        """A member joined (``joined``) or the last one left ``group`` of ``topic_filter`` here."""


class RetainedSync(Protocol):
    """Retained messages held cluster-wide."""

    def retained_changed(self, topic: str) -> None:
        """The retained message of ``topic`` was set or cleared here."""

    def retained_gate(self, send: Callable[[], object]) -> bool:
        """True when retained messages cannot be sent yet: ``send`` runs once they can."""


class Interest(Protocol):
    def interest_changed(self, topic_filter: str, added: bool) -> None:
        """A subscription (shared memberships included) to ``topic_filter`` was added or removed."""


class SubscribeGate(Protocol):
    def subscribe_gate(self, send: Callable[[], object]) -> bool:
        """True when a SUBACK must wait (the records of its new subscriptions are not routed here yet):
        ``send`` runs once it may go."""


# -- log cursors ------------------------------------------------------------------------------------------


class RemoteLogs(Protocol):
    """Reads of the topics whose log this broker holds no complete copy of, from a broker that does."""

    def handles(self, topic: str) -> bool:
        """Whether ``topic`` is read from another broker (this one holds no complete copy of it)."""

    def live_end(self, topic: str) -> int | None:
        """Where this broker's routing of ``topic`` stands (None: not known yet)."""

    def read(self, topic: str, offset: int, max_records: int, session: Session) -> list[Record] | None:
        """Committed records of ``topic`` from ``offset``, or None while they are fetched (``session`` is
        pumped again then)."""

    def retry_later(self, session: Session) -> None:
        """``session`` waits for something not known yet: pump it again soon."""


class RemoteStarts(Protocol):
    """Replays from an offset positioned in logs held by other brokers, before the SUBACK."""

    def start(self, session: Session, topic_filter: str, start: OffsetStart) -> bool:
        """Position ``session``'s replay of ``topic_filter`` in the logs held elsewhere (asynchronously);
        False when there are none."""

    def pending(self, session: Session) -> bool:
        """Whether replays of ``session`` are being positioned."""

    def holding(self, session: Session, topic: str, offset: int) -> bool:
        """Whether a live message of ``topic`` at ``offset`` waits for the session's replay to be
        positioned (it is read from the log then)."""

    def when_started(
        self, session: Session, outside: list[OffsetOutOfRange], ready: Callable[[], None]
    ) -> bool:
        """Whether ``session`` has replays being positioned; if so, ``ready()`` runs once they all are,
        after adding to ``outside`` the logs whose asked offset was outside them."""

    def forget(self, session: Session) -> None:
        """The session ended."""


# -- mirrored logs (the uplink) -----------------------------------------------------------------------------


class MirrorRefused(Exception):
    """Frames that cannot be acknowledged now (no leader for their partition, too few in-sync replicas,
    leadership moved): nothing is lost, the sender sends them again from the ends it is given next."""


@dataclass(frozen=True, slots=True)
class MirrorPart:
    """One log's part of a batch: ``count`` stored frames that start at the sender's offset ``first``."""

    topic: str
    first: int
    count: int
    frames: bytes | memoryview


class MirrorLogs(Protocol):
    """Logs holding another broker's records at its offsets (``broker_edge.storage.mirrored``)."""

    async def append(self, parts: Sequence[MirrorPart]) -> list[MirrorAppend]:
        """Append each part (``append_mirrored``) where its log is written, and return once every one is
        acknowledged, in order (``end``: the log's acknowledged end). ``InvalidRecord``: bad frames, that
        part appends nothing; ``MirrorRefused``: not acknowledged now. Parts appended before either stay:
        whole, at their offsets, and skipped when sent again."""

    async def ends(self, prefix: str) -> dict[str, int]:
        """The acknowledged end of every log whose topic starts with ``prefix``; ``MirrorRefused`` when
        one cannot be known now."""

    def holds(self, topic: str) -> bool:
        """Whether this broker holds a complete copy of ``topic``'s log (the hub's downlink reads it here)."""

    async def logs_elsewhere(self, filters: Sequence[str]) -> dict[str, tuple[int, int]]:
        """The logs matching ``filters`` (no ``$`` topics) that this broker holds no copy of, each with its
        start and committed end as a broker holding it has them (a broker alone: none)."""

    async def read_elsewhere(self, topic: str, offset: int, max_bytes: int) -> list[Record]:
        """Committed records of ``topic`` from ``offset`` (later after retention), exactly as stored, from a
        broker holding its log ([]: none answered, or nothing there yet)."""


# -- the ports together -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterPorts:
    """One implementation of every port (see the module docstring); ``None`` where it is absent."""

    forwarding: Forwarding | None = None
    replication: Replication = LOCAL_ONLY
    sessions: SessionClaims | None = None
    wills: Wills | None = None
    shared_dispatch: SharedDispatch | None = None
    shared_members: SharedMembers | None = None
    retained_sync: RetainedSync | None = None
    interest: Interest | None = None
    subscribe_gate: SubscribeGate | None = None
    remote_logs: RemoteLogs | None = None
    remote_starts: RemoteStarts | None = None
    mirror_logs: MirrorLogs | None = None


ALONE = ClusterPorts()
"""A broker alone: every port absent, replication local only."""
