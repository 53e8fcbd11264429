"""The controller: one member at a time assigns replicas and elects leaders, applying ``assignment``.

Every member campaigns: it creates ``<prefix>/controller`` (its node_id, bound to its membership lease)
if the key is absent. The one that created it is the controller until its lease ends (then etcd deletes the
key and the others campaign again). Each of its writes is a transaction guarded by that key's revision, so
a controller that lost its lease and does not know yet writes nothing.

The controller creates the cluster (``<prefix>/config`` with the partition count, then every partition's
initial state), and after every change of members or states it re-reads the cluster's keys and applies
``assignment.plan``: elections (asking the candidates' offsets API ``GET /v1/logs`` for their log ends),
replicas for partitions short of the replication factor, leadership moves that spread leadership
evenly, and replicas moved (an extra one added, caught up, then one dropped) from the most loaded members
to the least loaded, such as a member that just joined. Every state is written by compare-and-swap on its
revision; on a conflict it reads again and recomputes. An unclean election is logged at ERROR.

**Grace.** For one renewal interval plus a second after this node becomes the controller (``grace_s``: 2 s
at the default TTL of 3 s), and for one TTL plus a second after etcd answers again (this node was fenced or
its calls failed), no member is taken for dead: a member whose key is missing then may only be registering
again (etcd restores every lease with a full TTL when it restarts: a member renews within it, or, if it
could not, registers again at once). Partitions are led as they are meanwhile; what a member's absence
calls for is done once the grace is over, each change logged once with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from broker_edge import bounds
from broker_edge.cluster.coordination.assignment import Change, LogEnds, initial_states, needs_election, plan
from broker_edge.cluster.coordination.backoff import Backoff
from broker_edge.cluster.coordination.coordinator import Coordinator
from broker_edge.cluster.coordination.etcd import ClusterKeys, Etcd, EtcdError, Guard, KeyValue
from broker_edge.cluster.coordination.etcd_values import (
    BadValue,
    StoredCluster,
    parse_controller,
    read_cluster,
)
from broker_edge.cluster.coordination.lease_claim import claim_key
from broker_edge.cluster.coordination.membership import Membership
from broker_edge.cluster.links.member_clients import MemberClients
from broker_edge.cluster.links.member_proofs import MemberProofs
from broker_edge.cluster.tasks import stop_task
from broker_edge.cluster.view import ClusterView
from broker_edge.placement import Member, PartitionState, partition_of
from broker_edge.settings.cluster import ClusterConfig

__all__ = ["Controller", "grace_s", "read_log_ends"]

log = logging.getLogger("broker_edge.cluster.controller")

LOG_ENDS_TIMEOUT_S = 1.0
"""How long an election waits for a candidate's log ends (one that does not answer is ranked last)."""

RECHECK_INTERVAL_S = 1.0
"""A controller (or a candidate for it) looks again at least this often, changes or not."""


async def read_log_ends(
    members: Iterable[Member],
    partitions: int,
    token: str | None = None,
    timeout_s: float = LOG_ENDS_TIMEOUT_S,
    clients: MemberClients | None = None,
) -> dict[str, dict[int, int]]:
    """node_id → partition → sum of the end offsets of its topics in that partition, from each member
    (``GET /v1/logs``), all asked at once: over its members' endpoint with ``clients`` (a controller: each
    answer comes from the member it names), else over its offsets API as a reader with ``token`` (a
    status command). A member that does not answer in ``timeout_s`` (or answers badly) is left out."""
    import aiohttp  # here: only a controller's election or a status command asks

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def one(session: aiohttp.ClientSession, member: Member) -> tuple[str, dict[int, int] | None]:
        base = member.offsets_api if clients is None else member.peer
        if base is None:
            return member.node_id, None
        if clients is not None:
            session = clients.session(member.node_id)
        try:
            async with session.get(f"{base.rstrip('/')}/v1/logs", headers=headers, timeout=timeout) as answer:
                if answer.status != 200:
                    return member.node_id, None
                body = await answer.json()
            ends: dict[int, int] = {}
            for entry in body["logs"]:
                partition = partition_of(str(entry["topic"]), partitions)
                ends[partition] = ends.get(partition, 0) + bounds.offset(entry["end_offset"], "end_offset")
            return member.node_id, ends
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            log.debug("log ends of %s: %s", member.node_id, exc)
            return member.node_id, None

    async with aiohttp.ClientSession(timeout=timeout) as session:
        answers = await asyncio.gather(*(one(session, member) for member in members))
    return {node: ends for node, ends in answers if ends is not None}


def grace_s(lease_ttl_s: float) -> float:
    """How long a controller takes nobody for dead after its election or etcd's return: a member renews
    within a third of the TTL, or registers again within a second of learning its lease is gone."""
    return lease_ttl_s / 3 + 1.0


LogEndsReader = Callable[[list[Member], int], Awaitable[LogEnds]]
"""(candidates, partition count) → their log ends (``read_log_ends`` over the members' endpoints)."""


class Controller:
    """Campaigns for the controller key while this node is a member; while it holds it, keeps the
    partitions assigned and led (see the module docstring). ``log_ends`` reads candidates' log ends
    (default: their members' endpoints, through ``clients``). With ``proofs``, copies and leaderships go
    to members that proved their node id only, and a member that does not prove it in time is taken for
    dead (``member_proofs``)."""

    def __init__(
        self,
        etcd: Etcd,
        keys: ClusterKeys,
        view: ClusterView,
        coordinator: Coordinator,
        membership: Membership,
        config: ClusterConfig,
        log_ends: LogEndsReader | None = None,
        clients: MemberClients | None = None,
        proofs: MemberProofs | None = None,
    ) -> None:
        self.etcd = etcd
        self.keys = keys
        self.view = view
        self.coordinator = coordinator
        self.membership = membership
        self.config = config
        self.log_ends: LogEndsReader = log_ends or (
            lambda members, partitions: read_log_ends(members, partitions, clients=clients)
        )
        self.proofs = proofs
        self.holding: Guard | None = None
        """(controller key, its mod_revision) while this node is the controller."""
        self.bad_values = coordinator.bad_values
        self.changes_applied = 0
        """Partition state changes this node has written as controller (for tests and logs)."""
        self._wake = asyncio.Event()
        self._backoff = Backoff("the controller's step (etcd)", log)
        self._task: asyncio.Task[None] | None = None
        self.grace_until = 0.0
        """``time.monotonic()`` until which no member is taken for dead (see the module docstring)."""
        self._interrupted = False

    @property
    def is_controller(self) -> bool:
        return self.holding is not None

    async def start(self) -> None:
        self.view.on_change(self._wake.set)
        if self.proofs is not None:
            self.proofs.on_proof(self._wake.set)
        self.membership.on_registered(self._wake.set)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cluster-controller")

    async def stop(self, resign: bool = True) -> None:
        """Stop campaigning and controlling; ``resign`` deletes the controller key at once (otherwise it
        goes with the lease)."""
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
        with contextlib.suppress(ValueError):
            self.view._listeners.remove(self._wake.set)
        holding, self.holding = self.holding, None
        if holding is not None and resign and not self.view.fenced:
            with contextlib.suppress(EtcdError):
                await self.etcd.delete_if(*holding)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), RECHECK_INTERVAL_S)
            self._wake.clear()
            try:
                again = await self._step()
            except EtcdError as exc:
                self._interrupted = True  # said once by the backoff; a grace follows when etcd answers
                again = False
                await asyncio.sleep(self._backoff.failed(exc))
            except Exception:
                log.exception("controller step failed")
                again = False
                await asyncio.sleep(1.0)
            else:
                self._backoff.succeeded()
            if again:
                self._wake.set()

    async def _step(self) -> bool:
        """One look: campaign or reconcile. True when it should look again at once (a write conflicted)."""
        lease = self.membership.lease_id
        if self.view.fenced or lease is None:
            self._interrupted = True
            if self.holding is not None:
                log.warning("%s is no longer the controller (fenced)", self.view.node_id)
                self.holding = None
            return False
        if self.holding is not None and self.coordinator.controller != self.view.node_id:
            current = await self.etcd.get(self.keys.controller)
            if current is None or current.mod_revision != self.holding[1]:
                log.warning("%s is no longer the controller", self.view.node_id)
                self.holding = None
        if self.holding is None:
            held_by = self.coordinator.controller
            if held_by is not None and held_by != self.view.node_id and held_by in self.view.members:
                return False
            claim = await claim_key(self.etcd, self.keys.controller, self.view.node_id.encode(), lease)
            if claim.revision is None:
                return True if claim.holder is None else await self._remove_if_bogus(claim.holder)
            self.holding = (self.keys.controller, claim.revision)
            if not self._interrupted:
                self._start_grace("after its election", grace_s(self.membership.ttl_s))
        if self._interrupted:
            self._interrupted = False
            self._start_grace("after etcd answered again", self.membership.ttl_s + 1.0)
        return await self._reconcile(self.holding)

    def _start_grace(self, why: str, grace: float) -> None:
        self.grace_until = time.monotonic() + grace
        log.info(
            "%s is the controller; no member is taken for dead for %.1f s (%s)", self.view.node_id, grace, why
        )

    def _in_grace(self, states: Iterable[PartitionState]) -> set[str]:
        """During the grace: every member a partition names as leader or in sync, taken as alive."""
        if time.monotonic() >= self.grace_until:
            return set()
        named: set[str] = set()
        for state in states:
            named.update(state.isr)
            if state.leader is not None:
                named.add(state.leader)
        return named

    async def _remove_if_bogus(self, current: KeyValue) -> bool:
        """The controller key names someone else: a live member holding it under its own lease, or a value
        no controller wrote (unreadable, not bound to the named member's lease: it would never expire and
        no member would ever control again), which is deleted. True when it was (campaign again at once)."""
        try:
            named = parse_controller(current.value)
        except BadValue as error:
            self.bad_values.report(current.key, error)
            named = None
        if named is not None:
            member = await self.etcd.get(self.keys.member(named))
            if member is not None and member.lease != 0 and member.lease == current.lease:
                return False
        if await self.etcd.delete_if(current.key, current.mod_revision):
            log.error(
                "deleted a controller key no member holds (%r, lease %x): campaigning again",
                current.value[:64],
                current.lease,
            )
            return True
        return False

    async def _reconcile(self, holding: Guard) -> bool:
        kvs, _ = await self.etcd.get_prefix(self.keys.root)
        if not any(kv.key == holding[0] and kv.mod_revision == holding[1] for kv in kvs):
            # the key was deleted or written over (by hand: the coordinator may have ignored the value):
            # every guarded write would fail; campaign again (a bogus key is removed then)
            log.warning("%s is no longer the controller (its key changed)", self.view.node_id)
            self.holding = None
            return True
        stored = read_cluster(kvs, self.keys, self.config.partitions, self.bad_values)
        members, states, revisions = stored.members, stored.states, stored.revisions
        guards = [holding]
        if not stored.config_present:
            count = self.config.partitions
            created = await self.etcd.create(
                self.keys.config, json.dumps({"partitions": count}).encode(), None, guards
            )
            if created is None:
                return True
            log.info("created the cluster: %d partitions", count)
        count = self.config.partitions
        if self.proofs is not None:  # only members that proved who they are get anything
            alive, proven = self.proofs.alive(), self.proofs.eligible()
            eligible = {node: member for node, member in members.items() if node in proven}
            members = {node: member for node, member in members.items() if node in alive}
        else:
            eligible = members
        if not eligible:
            return False
        repairs = self._repairable(stored, kvs)
        for number, (state, revision) in repairs.items():
            states[number] = state
            revisions[number] = revision
        missing = [p for p in range(count) if p not in states and p not in stored.unreadable]
        if missing:
            for state in initial_states(missing, eligible, self.config.replication_factor):
                created = await self.etcd.create(
                    self.keys.partition(state.partition), state.to_json().encode(), None, guards
                )
                if created is None:
                    return True
                self.changes_applied += 1
            log.info(
                "assigned %d partitions over %s (replication factor %d)",
                len(missing),
                ", ".join(sorted(eligible)),
                min(self.config.replication_factor, len(eligible)),
            )
            return True
        live = set(members) | self._in_grace(states.values())
        electing = needs_election(states.values(), live)
        log_ends: LogEnds = {}
        if electing:
            candidates: set[str] = set()
            for p in electing:
                pool = states[p].replicas if self.config.unclean_election else states[p].isr
                live_pool = {node for node in pool if node in eligible}
                if len(live_pool) > 1:  # one candidate needs no ranking: do not wait for its answer
                    candidates |= live_pool
            if candidates:
                log_ends = await self.log_ends([members[n] for n in sorted(candidates)], count)
        rf, unclean = self.config.replication_factor, self.config.unclean_election
        min_isr = self.config.min_insync_replicas
        changes = plan(states, live, rf, log_ends, unclean, min_isr, eligible=set(eligible))
        if any(
            change.after.leader != change.before.leader and change.before.leader in live for change in changes
        ):
            # a live leader's leadership (spread, or handed over before its copy is dropped) moves only to a
            # replica that is not behind: ask every member where it stands
            asked = [eligible[n] for n in sorted(eligible) if n not in log_ends]
            log_ends = {**log_ends, **await self.log_ends(asked, count)}
            changes = plan(states, live, rf, log_ends, unclean, min_isr, eligible=set(eligible))
        changed = {change.partition for change in changes}
        changes += [
            Change(state, state, ("its record was unreadable: written again from the last good one",))
            for number, (state, _) in sorted(repairs.items())
            if number not in changed
        ]
        conflicted = False
        for change in changes:
            partition = change.partition
            written = await self.etcd.compare_and_swap(
                self.keys.partition(partition), change.after.to_json().encode(), revisions[partition], guards
            )
            if written is None:
                conflicted = True
                continue
            self.changes_applied += 1
            before, after = change.before, change.after
            (log.error if change.unclean else log.info)(
                "partition %d: %s (leader %s epoch %d -> leader %s epoch %d, isr %s, replicas %s)",
                partition,
                "; ".join(change.reasons),
                before.leader,
                before.epoch,
                after.leader,
                after.epoch,
                ",".join(after.isr),
                ",".join(after.replicas),
            )
        return conflicted

    def _repairable(
        self, stored: StoredCluster, kvs: list[KeyValue]
    ) -> dict[int, tuple[PartitionState, int]]:
        """Partitions whose record is unreadable now and of which this node holds a good one (the last it
        took in): that state, and the bad record's revision to swap it over with. The held state is the
        latest good record this node saw (every write passes its watch in order), so writing it back loses
        nothing; a partition held by no one stays as it is (nothing is known to write)."""
        if not stored.unreadable:
            return {}
        by_key = {kv.key: kv.mod_revision for kv in kvs}
        repairs: dict[int, tuple[PartitionState, int]] = {}
        for number in sorted(stored.unreadable):
            held = self.view.states.get(number)
            revision = by_key.get(self.keys.partition(number))
            if held is not None and revision is not None:
                repairs[number] = (held, revision)
        return repairs
