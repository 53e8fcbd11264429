"""One client id, one session, cluster-wide: the registry in etcd and the handover between brokers.

Every CONNECT on a cluster node claims the client id in the registry (``sessions_records``) before the
standalone CONNECT handling goes on, so what a client sees is what the standalone broker does, whichever
broker it reaches. Where no record is, one etcd transaction creates this node's; else the same transaction
returns the record there, and:

- the registry names another owner: refused as the standalone broker refuses (``session_owner``);
- another live member holds the session: it is asked over the peer link (service ``SERVICE_TAKE_OVER``) to
  give it up. That broker disconnects the client's connection (v5 DISCONNECT 0x8E, 3.1.1 close; its will
  handled as by a broker alone) and, unless the new CONNECT starts clean, replies with its state
  (subscriptions, log positions), which this broker restores: the client's resumed session redelivers, from
  this broker's own copy of the log, everything after its last acknowledged offsets (offsets are the same
  on every replica). With a clean start the other broker discards the session. It answers once the
  client's publishes it is still forwarding are appended or refused, so that they keep their place ahead of
  what the client publishes next (it keeps the record of a session whose connection ended until then, too);
- the holder is no longer a member (it died): the state it last saved in the registry is restored (at
  most ``session_save_interval_ms`` old: messages acknowledged since may be delivered again);
- then the record is compare-and-swapped to this node with the next generation and the new will.

A connection moved here by another member on this host (``cluster.links.handoff``) comes with the record
that member wrote for it and its revision (``carried``; the member lets go of it, ``moved_away``): the claim
swaps that revision without reading the record first, and reads it only when the swap finds it changed.

The holder of a session keeps its record current: the saved state of each persistent session every
``session_save_interval_ms`` (when it changed), the will when the connection ends (cancelled by a normal
DISCONNECT, or its due time), and the record's removal once the session ended. A holder that finds its
record taken by another CONNECT lets its copy go. Nothing of this is on the path of a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from broker_edge.cluster.coordination.etcd import EtcdError
from broker_edge.cluster.features.sessions_records import (
    SavedWill,
    SessionRecord,
    restore_saved_session,
    saved_session,
    will_message,
    will_to_save,
)
from broker_edge.cluster.features.sessions_registry import BackgroundTasks, Change
from broker_edge.cluster.links.peer_link import PeerLinkDown, PeerRequestFailed
from broker_edge.cluster.tasks import stop_task
from broker_edge.engine.sessions.session import NEVER_EXPIRES
from broker_edge.protocol.topics import EARLIEST
from broker_edge.storage.errors import UnknownTopic

if TYPE_CHECKING:
    from broker_edge.cluster.features.sessions_registry import SessionRegistry
    from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
    from broker_edge.cluster.reads.remote_starts import RemoteStarts
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.ports import ClaimDone, SessionClaim
    from broker_edge.engine.publish import PublishPath
    from broker_edge.engine.routing.router import Router
    from broker_edge.engine.sessions.session import Outlet, Session
    from broker_edge.log_info import LogInfo
    from broker_edge.protocol.packets import Will
    from broker_edge.security.acl import AccessControl
    from broker_edge.settings.broker import BrokerConfig
    from broker_edge.settings.cluster import ClusterConfig
    from broker_edge.storage.store import LogStore

__all__ = ["SERVICE_TAKE_OVER", "ClusterSessions", "SessionHost", "SharedInFlight"]

log = logging.getLogger("broker_edge.cluster.sessions")

SERVICE_TAKE_OVER = 10
"""Peer service: give up a client id's session to the asking broker (the sessions' services are 10-19)."""


class SharedInFlight(Protocol):
    """The shared deliveries a session has in flight, moved with it (``SharedGroups``)."""

    def hand_over(self, session: Session, node: str) -> list[dict[str, Any]]:
        """Those of ``session`` it takes to the broker ``node``, tracked here no more."""
        ...

    def adopt(self, session: Session, moved: list[Any]) -> None:
        """Those another broker handed over, put into ``session``'s window here."""
        ...


class SessionHost(Protocol):
    """The broker as cluster-wide sessions use it: its router's sessions, its clock, its PUBLISH path (for
    the wills of brokers that died), the ACL and the store that restored sessions read."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def router(self) -> Router: ...

    @property
    def publish_path(self) -> PublishPath: ...

    @property
    def acl(self) -> AccessControl | None: ...

    @property
    def store(self) -> LogStore | None: ...

    def now(self) -> float: ...


def _disconnect_taken_over(conn: Outlet) -> None:
    """Another connection claimed the client id [MQTT-3.1.4-3]: MQTT 5 DISCONNECT 0x8E, 3.1.1 close. Its
    will follows the broker alone's rule (section 3.1.4 sends it on as section 3.1.2.5 says): published now
    unless delayed; a delayed will is cancelled when the new connection resumes the session and published
    at once when it starts clean (the local copy of the session is then discarded with its will)."""
    conn.taken_over()


def _deleted(record: SessionRecord) -> None:
    """The ``Change`` that deletes the record."""
    return None


def _will_due(at: float) -> Change:
    """The ``Change`` that gives the record's will its due time (a connection ended at ``at``)."""

    def change(record: SessionRecord) -> SessionRecord:
        if record.will is None or record.will.due_at is not None:
            return record
        return replace(record, will=replace(record.will, due_at=at + record.will.delay))

    return change


def _with_state(state: dict[str, Any], saved_at: float) -> Change:
    """The ``Change`` that saves a persistent session's state."""
    return lambda record: replace(record, state=state, saved_at=saved_at)


class ClusterSessions:
    """This node's side of cluster-wide sessions (see the module docstring), the ``sessions`` port: the
    CONNECT claim, the takeover service, keeping its records current."""

    def __init__(
        self,
        broker: SessionHost,
        registry: SessionRegistry,
        view: ClusterView,
        links: PeerLinks,
        cluster: ClusterConfig,
        referrals: Callable[[], list[str] | None],
    ) -> None:
        self.broker = broker
        self.referrals = referrals
        """Where this node, fenced after it was a member, sends a CONNECT now: None while it does not send
        clients away, else the members that answered they are members (``broker_edge.cluster.fenced_clients``:
        empty, the CONNECT is refused server unavailable)."""
        self._turn = 0
        self.registry = registry
        self.view = view
        self.links = links
        self.node_id = cluster.node_id
        self.save_interval_s = cluster.session_save_interval_ms / 1000
        self.handover_timeout_s = cluster.session_handover_timeout_ms / 1000
        self.owned: dict[str, int] = {}
        """Client id → generation of the CONNECT this node registered (the records it keeps current)."""
        self._saved: dict[str, bytes] = {}
        self._answering: dict[str, int] = {}
        """Client ids whose CONNECT is claimed and not yet answered: the session of one claimed comes
        into the router with its CONNACK, and a save pass meanwhile must not take it for one that ended."""
        self._saver: asyncio.Task[None] | None = None
        self.tasks = BackgroundTasks()
        self.observed_logs: Callable[[str], list[LogInfo]] | None = None
        """The topics this node observes that a filter matches (``Followers.observed_logs``)."""
        self.remote_starts: RemoteStarts | None = None
        """Positions a restored session in the topics of partitions this node holds no copy of."""
        self.closed = False
        """Set once this node leaves: its records stay as they are, for the others to act on."""
        self.forwards_settled: Callable[[str], Awaitable[bool]] | None = None
        """Waits until no publish of a client id is still being forwarded from here
        (``ClusterForwarding.settle``): a takeover answers after it."""
        self.shared_in_flight: SharedInFlight | None = None
        """Moves the shared QoS 2 deliveries a session has in flight with it (set once shared groups are
        built): its member completes them on the broker it resumes on [MQTT-4.8.2-4]."""
        self._handed: dict[str, list[Any]] = {}
        """Client id → the shared deliveries its former broker handed over with its session (``_take_over``),
        until the session is restored (``_restore``)."""
        links.serve_requests(SERVICE_TAKE_OVER, self._serve_take_over)

    def start(self) -> None:
        self._saver = self.tasks.spawn(self._save_periodically(), "saving sessions to the registry")

    async def stop(self) -> None:
        """Save once more (a broker stopping cleanly hands over exact positions), then stop saving."""
        await stop_task(self._saver)
        with contextlib.suppress(EtcdError):
            await self.save()
        self.closed = True
        await self.tasks.stop()

    # -- CONNECT ------------------------------------------------------------------------------------------

    def claim(self, claim: SessionClaim, done: ClaimDone) -> None:
        """Claim ``claim.client_id`` for a CONNECT on this node; ``done(refusal, server_reference)`` on the
        loop, refusal None when the standalone CONNECT handling may go on (the session, if it was
        elsewhere, is now in the router); ``use_another_server`` names a member that answered it is a member
        now to an MQTT 5 client, in turn (a 3.1.1 client, which cannot be told one, takes no turn)."""
        task = self.tasks.spawn(self._claim_or_refuse(claim), f"claiming session {claim.client_id}")
        self._answering[claim.client_id] = self._answering.get(claim.client_id, 0) + 1

        def finished(task: asyncio.Task[str | None]) -> None:
            failed = task.cancelled() or task.exception() is not None  # a failure was logged by ``tasks``
            refusal = "session_unavailable" if failed else task.result()
            reference = None
            if refusal == "use_another_server":
                elsewhere = self.referrals()
                if not elsewhere:
                    refusal = "session_unavailable"  # the other members left meanwhile
                elif claim.takes_reference:
                    reference = self._next_of(elsewhere)
            try:
                done(refusal, reference)
            finally:
                self._answered(claim.client_id)

        task.add_done_callback(finished)

    def _answered(self, client_id: str) -> None:
        """One CONNECT of ``client_id`` was answered (``_answering``)."""
        left = self._answering.pop(client_id) - 1
        if left:
            self._answering[client_id] = left

    def _next_of(self, elsewhere: list[str]) -> str:
        """The MQTT address of one of the live members ``elsewhere`` (not empty), each in turn."""
        self._turn += 1
        return elsewhere[self._turn % len(elsewhere)]

    async def _claim_or_refuse(self, claim: SessionClaim) -> str | None:
        """``_claim``, or the refusal ``session_unavailable`` when etcd or the holder does not answer.

        Caught here, inside the task, rather than in ``claim``'s done callback: a task that fails is logged
        with its traceback by ``tasks``, and these failures are expected (one warning line each)."""
        try:
            return await self._claim(claim)
        except (EtcdError, PeerLinkDown, TimeoutError, RuntimeError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            log.warning("session of %r not claimed (%s): CONNECT refused", claim.client_id, reason)
            return "session_unavailable"

    async def _claim(self, claim: SessionClaim) -> str | None:
        refusal = await self._not_member()
        if refusal is not None:
            return refusal  # not (yet, or no longer) a member: it cannot tell who holds the session
        client_id = claim.client_id
        async with self.registry.lock(client_id):
            local = self.broker.router.sessions.get(client_id)
            if local is not None and local.username != claim.username:
                return "session_owner"  # neither taken over nor discarded: it is someone else's
            over_quota = self._over_quota(local, claim.expiry_interval)
            claimed = self._first_record(claim)
            current = await self._created_or_current(claim, claimed, create=not over_quota)
            if current is not None and current[0] is not None and current[0].owner != claim.username:
                return "session_owner"
            if over_quota:
                return "session_quota"  # checked before the session leaves the broker holding it
            if current is None:  # no record was there: the session, if any, is this node's own
                state, left_behind, saved = await self._bring_here(None, client_id, claim.clean_start)
            else:
                record, revision = current
                state, left_behind, saved = await self._bring_here(record, client_id, claim.clean_start)
                persistent_state = state if claim.expiry_interval > 0 else None
                claimed = replace(
                    claimed,
                    generation=(record.generation if record is not None else 0) + 1,
                    state=persistent_state,
                    saved_at=time.time() if persistent_state is not None else None,
                )
                for _ in range(5):
                    if await self.registry.write(client_id, claimed, revision):
                        break
                    record, revision = await self.registry.read(client_id)  # a save of the holder came first
                    if record is not None and record.owner != claim.username:
                        return "session_owner"
                    claimed = replace(
                        claimed, generation=(record.generation if record is not None else 0) + 1
                    )
                else:
                    return "session_unavailable"
        self.owned[client_id] = claimed.generation
        self._saved.pop(client_id, None)
        if state is not None and not claim.clean_start:
            self._restore(state, saved)
        now = time.time()
        if left_behind is not None and (claim.clean_start or left_behind.due(now) <= now):
            # its session ends now, or its delay has passed: published once, here (a new connection
            # within the Will Delay Interval cancels it, MQTT 5 3.1.3.2.2)
            self.broker.publish_path.publish(will_message(left_behind, self.broker.now()))
        return None

    def _first_record(self, claim: SessionClaim) -> SessionRecord:
        """The record of ``claim`` where none was before: this node's, generation 1, with its will."""
        saved_will = None
        if claim.will is not None:
            saved_will = will_to_save(
                claim.will, claim.client_id, claim.will_delay, claim.expiry_interval, self.broker.now()
            )
        return SessionRecord(self.node_id, 1, claim.username, claim.expiry_interval, saved_will)

    async def _created_or_current(
        self, claim: SessionClaim, first: SessionRecord, create: bool
    ) -> tuple[SessionRecord | None, int] | None:
        """None once ``first`` is written where no record was (only if ``create``); else the record there
        and its revision: as the member that moved the connection here wrote it (a session holding nothing,
        whose will came with the connection), or as the same etcd call found it."""
        moved = claim.moved_from
        if moved is not None and moved.node != self.node_id:
            return SessionRecord(moved.node, moved.generation, claim.username, 0), moved.revision
        if not create:
            return await self.registry.read(claim.client_id)
        return await self.registry.create_or_read(claim.client_id, first)

    async def _not_member(self) -> str | None:
        """None once this node is a member, waiting up to ``session_handover_timeout_ms`` for it to become
        one (a broker starting up registers within moments of opening its listeners; a fence of a moment
        lifts), else the refusal: ``session_unavailable``, or ``use_another_server`` as soon as this node,
        fenced after it was a member, sends its clients away and another member answered that it is one, to
        send the client there (``session_unavailable`` at once when none did)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.handover_timeout_s
        while self.view.fenced:
            referrals = self.referrals()
            if referrals:
                return "use_another_server"
            if referrals is not None or loop.time() >= deadline or self.closed:
                return "session_unavailable"
            await asyncio.sleep(0.05)
        return None

    def _over_quota(self, local: Session | None, expiry_interval: int) -> bool:
        """Whether a persistent session coming here would pass ``sessions.max_persistent`` (the
        standalone rule, counting a session that moves here as one more)."""
        bound = self.broker.config.sessions.max_persistent
        adds = expiry_interval > 0 and (local is None or local.expiry_interval == 0)
        return bool(adds and bound and self.broker.router.persistent_count >= bound)

    async def _bring_here(
        self, record: SessionRecord | None, client_id: str, clean_start: bool
    ) -> tuple[dict[str, Any] | None, SavedWill | None, bool]:
        """Make this node the only holder of the session: ``(state to restore, will its dead holder left,
        whether the state is one saved earlier rather than handed over now)``.

        Held by another live member: it hands the session over (or discards it, for a clean start). Held
        by a node that is no longer a member: its saved state. Held here: a connection still open is taken
        over now, as the standalone broker would (so its will is handled while the record is still its
        own), and a clean start discards the session here."""
        router = self.broker.router
        local = router.sessions.get(client_id)
        self._handed.pop(client_id, None)  # of an earlier claim that did not restore the session
        if record is not None and record.node != self.node_id:
            self._discard_local(client_id, fire_will=False)  # a copy from before is out of date
            if record.node in self.view.members:
                try:
                    held, state = await self._take_over(record.node, client_id, clean_start)
                    if held or clean_start:
                        return state, None, False
                    return record.state, None, True  # it restarted without the session: what it saved
                except PeerLinkDown:
                    if not clean_start and record.node in self.view.members:
                        raise  # alive as far as etcd knows, and not answering: the client retries
            # the holder died: what it saved last (a clean start discards it, and ends its will's wait)
            return (None if clean_start else record.state), record.will, True
        if local is not None:
            if local.connection is not None:
                _disconnect_taken_over(local.connection)
            if clean_start:
                self._discard_local(client_id, fire_will=True)
            return None, None, False
        if record is not None and not clean_start:
            return record.state, None, True  # held here, and lost in a crash since
        return None, None, False

    async def _take_over(
        self, node: str, client_id: str, clean_start: bool
    ) -> tuple[bool, dict[str, Any] | None]:
        """Ask ``node`` to give up the session: (whether it held it, its state). While the link to it is
        down, a resumed session waits for it to come up (``PeerLinkDown`` once ``node`` has left the
        cluster, or at the timeout); a clean start does not wait (there is nothing to move)."""
        body = json.dumps({"client_id": client_id, "clean_start": clean_start}).encode()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.handover_timeout_s
        while True:
            try:
                reply = await self.links.link(node).request(
                    SERVICE_TAKE_OVER, body, max(0.1, deadline - loop.time())
                )
                break
            except PeerLinkDown:
                if clean_start or loop.time() >= deadline or node not in self.view.members:
                    raise
                await asyncio.sleep(0.05)
            except PeerRequestFailed as exc:
                raise RuntimeError(f"{node} did not hand over the session: {exc}") from exc
        answer = json.loads(reply)
        state = answer.get("state")
        shared = answer.get("shared")
        if isinstance(shared, list) and shared:
            self._handed[client_id] = shared
        return bool(answer.get("held")), state if isinstance(state, dict) else None

    def _restore(self, state: dict[str, Any], saved: bool) -> None:
        """Put a session from elsewhere into the router; the CONNECT resuming it at once gives it its
        Session Expiry Interval (until then it must not expire). A ``saved`` state (its holder died) reads
        the topics created since from their start, wherever they are."""
        broker = self.broker
        acl = broker.acl
        try:
            restore_saved_session(
                broker.router,
                {**state, "expiry_interval": NEVER_EXPIRES, "expires_in_s": None},
                self._logs,
                broker.now(),
                broker.config.sessions.max_session_expiry_s,
                acl.can_subscribe if acl is not None else None,
            )
        except ValueError as exc:
            log.error("a session handed over could not be restored (%s); it starts empty", exc)
            return
        session = broker.router.sessions.get(state.get("client_id", ""))
        moved = self._handed.pop(state.get("client_id", ""), None)
        if moved and session is not None and self.shared_in_flight is not None:
            self.shared_in_flight.adopt(session, moved)
        if saved and session is not None:  # (a state handed over now names every topic there is)
            self._read_topics_created_since(session)

    def _read_topics_created_since(self, session: Session) -> None:
        """Topics a restored session's subscriptions read that its saved state does not name (created
        since it was saved) are read from their start: those of partitions this node holds no copy of are
        found by asking their leaders (``remote_starts``), as for a subscription from ``earliest``."""
        starts = self.remote_starts
        if starts is None or not session.subscriptions:
            return
        known = frozenset(session.cursors or ())
        asked = False
        for entry in session.subscriptions.values():
            if entry.group is None and entry.options.qos > 0:
                asked |= starts.start(session, entry.topic_filter, EARLIEST, keep=known)
        router = self.broker.router
        if asked:
            starts.when_started(session, [], lambda: router.pump_replays(session))

    def _discard_local(self, client_id: str, fire_will: bool) -> None:
        """End this node's copy of a session; a will still waiting is published only if ``fire_will``."""
        router = self.broker.router
        session = router.sessions.get(client_id)
        if session is None:
            return
        if session.connection is not None:
            _disconnect_taken_over(session.connection)
        now = self.broker.now()
        if not fire_will:
            router.open_session(client_id, False, 0, now)  # cancels a waiting will; expiry 0
        session.expiry_interval = 0
        router.connection_closed(session, None, 0, now)  # ends it: subscriptions, cursors, queue

    # -- connections moved to another member on this host ---------------------------------------------------

    def carried(self, client_id: str) -> dict[str, int] | None:
        """The record this node wrote of ``client_id`` for its connection being moved away: its
        generation and revision (None while an update of it is under way, or it was never written)."""
        generation = self.owned.get(client_id)
        known = self.registry.known(client_id)
        if generation is None or known is None or not known[0].held_by(self.node_id, generation):
            return None
        return {"generation": generation, "revision": known[1]}

    def moved_away(self, client_id: str) -> None:
        """``client_id``'s connection went to another member on this host, with its record (``carried``):
        the member that took it writes the record from now on, and the end of the connection here leaves
        it as it is (its removal would only be undone by that member's claim)."""
        self.owned.pop(client_id, None)
        self._saved.pop(client_id, None)
        self.registry.forget(client_id)

    # -- the takeover service (on the broker that held the session) ---------------------------------------

    async def _serve_take_over(self, link: PeerLink, body: memoryview) -> bytes:
        request = json.loads(bytes(body))
        client_id = str(request["client_id"])
        clean_start = bool(request["clean_start"])
        self.owned.pop(client_id, None)  # the asking broker writes the record from now on
        self._saved.pop(client_id, None)
        self.registry.forget(client_id)
        router = self.broker.router
        session = router.sessions.get(client_id)
        if session is not None and session.connection is not None:
            _disconnect_taken_over(session.connection)  # first: its state counts what is in flight to it
        if self.forwards_settled is not None and not await self.forwards_settled(client_id):
            log.warning("handing session %r over with publishes of it still on their way", client_id)
        session = router.sessions.get(client_id)
        if session is None:
            return b'{"held":false}'  # lost (a restart without it): the asking broker uses the saved state
        log.info("handing session %r over to %s (clean start: %s)", client_id, link.peer, clean_start)
        answer: dict[str, Any] = {"held": True, "state": None}
        if not clean_start:  # even a session ending with its connection is resumed by a takeover
            answer["state"] = saved_session(session, self._saved_logs, self.broker.now())
            shared = self.shared_in_flight
            if shared is not None and (moved := shared.hand_over(session, link.peer)):
                answer["shared"] = moved  # a member of an earlier version reads no more than it knows
        self._discard_local(client_id, fire_will=clean_start)
        return json.dumps(answer, separators=(",", ":")).encode()

    def _saved_logs(self, topic_filter: str) -> list[LogInfo]:
        """What a saved session reads: the logs here, and the topics this node observes (it holds no copy
        of their partition) ending where its routing of them stands."""
        logs = self._logs(topic_filter)
        if self.observed_logs is not None:
            held = {info.topic for info in logs}
            logs += [info for info in self.observed_logs(topic_filter) if info.topic not in held]
        return logs

    def _logs(self, topic_filter: str) -> list[LogInfo]:
        """The logs ``topic_filter`` matches (a filter without wildcards is one lookup, not a scan)."""
        store = self.broker.store
        if store is None:
            return []
        if "+" in topic_filter or "#" in topic_filter:
            return store.logs(pattern=topic_filter)
        try:
            return [store.log_info(topic_filter)]
        except UnknownTopic:
            return []

    # -- keeping this node's records current ---------------------------------------------------------------

    def connection_ended(self, session: Session, will: Will | None) -> None:
        """A connected client's connection ended (before its will is handled; the engine does not call it
        for a connection taken over, whose record is the new connection's): a will cancelled by a normal
        DISCONNECT leaves the record (and a non-persistent session's record goes), a delayed one gets its
        due time (a survivor publishes it then, should this node die meanwhile)."""
        client_id = session.client_id
        generation = self.owned.get(client_id)
        if generation is None or self.closed:
            return  # not claimed here, or this node has left
        change: Change
        if will is None:
            change = _deleted if session.expiry_interval == 0 else SessionRecord.without_will
            if session.expiry_interval == 0:
                self.owned.pop(client_id, None)
        elif session.expiry_interval == 0:
            return  # published at once: taking it out of the record removes the record (``ClusterWills``)
        else:
            change = _will_due(time.time())
        self.tasks.spawn(self._ended(client_id, generation, change), f"session {client_id} ended")

    async def _ended(self, client_id: str, generation: int, change: Change) -> None:
        """Change the record of a session whose connection ended once the client's publishes still being
        forwarded from here are appended or refused: until then a CONNECT elsewhere finds this node in the
        record and asks it to hand over, which waits for them too."""
        if self.forwards_settled is not None:
            await self.forwards_settled(client_id)
        await self._update(client_id, generation, change)

    async def _update(self, client_id: str, generation: int, change: Change) -> SessionRecord | None:
        """Change this node's record of ``client_id``, retried while etcd cannot be reached (until this
        node leaves)."""
        try:
            return await self.registry.update_until_done(
                client_id, self.node_id, generation, change, lambda: self.closed
            )
        except EtcdError as exc:
            log.warning("session record of %r not updated: %s", client_id, exc)
            return None

    async def _save_periodically(self) -> None:
        failures = 0
        while True:
            await asyncio.sleep(self.save_interval_s)
            try:
                await self.save()
                failures = 0
            except EtcdError as exc:
                failures += 1
                (log.warning if failures == 1 else log.debug)(
                    "saving sessions to the registry failed (retrying every interval): %s", exc
                )

    async def save(self) -> None:
        """Save the state of every persistent session held here that changed; drop the records of sessions
        that ended; let go of sessions whose record another CONNECT took. ``EtcdError`` at the first
        failure (the next save starts over)."""
        router = self.broker.router
        changed: list[tuple[str, int, Change, bytes]] = []
        for client_id, generation in list(self.owned.items()):
            session = router.sessions.get(client_id)
            if session is None and client_id in self._answering:
                continue  # claimed, and its CONNECT not yet answered
            if session is None:
                await self._save_once(client_id, generation, _deleted)
                if self.owned.get(client_id) == generation:
                    self.owned.pop(client_id, None)
                    self._saved.pop(client_id, None)
                continue
            if session.expiry_interval == 0:
                continue
            state = saved_session(session, self._saved_logs, self.broker.now())
            encoded = json.dumps(state, sort_keys=True).encode()
            if self._saved.get(client_id) != encoded:
                changed.append((client_id, generation, _with_state(state, time.time()), encoded))
        await self._save_states(changed)

    async def _save_states(self, changed: list[tuple[str, int, Change, bytes]]) -> None:
        """Save the changed states, many per etcd transaction; one whose record is not as this node last
        wrote it is saved on its own (and its session let go when another CONNECT took the record)."""
        written = await self.registry.update_all(self.node_id, [entry[:3] for entry in changed])
        for client_id, generation, change, encoded in changed:
            if client_id not in written and await self._save_once(client_id, generation, change) is None:
                if self.owned.get(client_id) == generation:
                    self._let_go(client_id)
                continue
            if self.owned.get(client_id) == generation:
                self._saved[client_id] = encoded

    async def _save_once(self, client_id: str, generation: int, change: Change) -> SessionRecord | None:
        """One attempt (``EtcdError`` if etcd does not answer): a save is not retried, the next one comes."""
        registry = self.registry
        return await registry.update_until_done(client_id, self.node_id, generation, change, lambda: True)

    def _let_go(self, client_id: str) -> None:
        """Another CONNECT took this client id (a race between two brokers): this copy goes."""
        self.owned.pop(client_id, None)
        self._saved.pop(client_id, None)
        session = self.broker.router.sessions.get(client_id)
        if session is None:
            return
        log.info("session %r was taken by a CONNECT on another broker; letting this copy go", client_id)
        if session.connection is not None:
            _disconnect_taken_over(session.connection)
        self._discard_local(client_id, fire_will=False)
