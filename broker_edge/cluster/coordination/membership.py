"""This node's membership: its ``Member`` record under an etcd lease, the lease's renewal, and fencing.

The member key ``<prefix>/members/<node_id>`` is created (create-if-absent: a live broker with the same
node_id keeps its name) bound to a lease of ``lease_ttl_s`` seconds, renewed every third of it (counted from
when the last renewal was sent, so that slow answers do not space renewals out). etcd deletes the key when
renewals stop, which is how the others learn that this node is gone.

**Fencing.** A renewal sent at time t that succeeds proves the lease alive until t + TTL. When no renewal
has succeeded for TTL minus a margin, this node can no longer prove it is a member, so it sets
``view.fenced`` (and calls ``view.changed()``) before etcd can have expired the lease and before anyone can
have taken over its partitions. It unfences when a renewal proves the same lease still alive, or, when the
lease is lost, after registering again under a new lease (and after ``before_unfence``, e.g. a re-read of
the cluster's state, has run).

**An unreachable etcd is not a lost lease.** While renewals fail (etcd restarting, out of reach) the node
is fenced but keeps renewing the same lease; it registers anew only when etcd answers that the lease is
gone. etcd restores leases when it restarts (each with its full TTL), so after an etcd restart every
member is still registered under its own lease and nobody looks dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable

from broker_edge.cluster.coordination.etcd import ClusterKeys, Etcd, EtcdError, Guard
from broker_edge.cluster.tasks import stop_task
from broker_edge.cluster.view import ClusterView
from broker_edge.placement import Member

__all__ = ["Membership", "fence_margin_s"]

log = logging.getLogger("broker_edge.cluster.membership")


def fence_margin_s(ttl_s: float) -> float:
    """How long before its lease could expire a node fences itself: a quarter of the TTL, at most 1 s."""
    return min(1.0, ttl_s / 4)


class Membership:
    """Registers ``member`` under a lease and keeps it renewed; fences ``view`` when it cannot."""

    def __init__(
        self,
        etcd: Etcd,
        keys: ClusterKeys,
        member: Member,
        view: ClusterView,
        lease_ttl_s: int,
        before_unfence: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        if lease_ttl_s < 2:
            raise ValueError(f"lease_ttl_s: must be >= 2 (etcd's minimum), got {lease_ttl_s}")
        self.etcd = etcd
        self.keys = keys
        self.member = member
        self.view = view
        self.ttl_s = lease_ttl_s
        self.before_unfence = before_unfence
        self.lease_id: int | None = None
        """The lease this node is registered under (None while it is not)."""
        self.registration: Guard | None = None
        """(member key, its mod_revision) while registered: a guard for writes that only a live member may
        make (an in-sync set change by a leader)."""
        self.proven_until = 0.0
        """``time.monotonic()`` until which the lease is known to be alive."""
        self._registered = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._fence_timer: asyncio.TimerHandle | None = None
        self._stopping = False
        self._listeners: list[Callable[[], None]] = []
        self._own_leases: set[int] = set()
        self._failures = 0
        self._renewal_sent = 0.0
        """``time.monotonic()`` when the last renewal was sent (the next is due one interval later)."""
        self._register_wait = min(0.5, self.interval_s)
        """Seconds before the next registration attempt: doubled (with jitter) after each that failed."""

    @property
    def interval_s(self) -> float:
        """Time between two renewals."""
        return self.ttl_s / 3

    def on_registered(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every (re-)registration under a new lease."""
        self._listeners.append(listener)

    async def wait_registered(self) -> None:
        """Return once this node is registered (at once if it is)."""
        await self._registered.wait()

    async def start(self) -> None:
        """Try to register once, then keep the lease renewed (and re-register when it is lost) until
        ``stop``; a node that cannot reach etcd starts fenced and keeps trying."""
        await self._register_once()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cluster-membership")

    async def stop(self) -> None:
        """Stop renewing and revoke the lease: the member key disappears now, not after the TTL (unless
        etcd is out of reach already: then the lease runs out by itself)."""
        self._stopping = True
        if self._task is not None:
            await stop_task(self._task)
        self._cancel_fence_timer()
        reachable = not self.view.fenced
        self._set_fenced(True, "membership stopped")
        if self.lease_id is not None and reachable:
            lease, self.lease_id = self.lease_id, None
            try:
                await self.etcd.revoke_lease(lease)
            except EtcdError as exc:
                log.warning("could not revoke lease %x (it expires by itself): %s", lease, exc)
        self.registration = None
        self._registered.clear()

    def abandon(self) -> None:
        """Stop renewing without telling etcd (as a process that hangs would): the member key disappears
        when the lease expires. For tests and tools that need a member to die."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()

    # -- the loop -----------------------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping:
            if self.lease_id is None:
                await asyncio.sleep(self._register_wait)
                if await self._register_once():
                    self._register_wait = min(0.5, self.interval_s)
                else:  # each failure waits longer (doubled, jittered), at most the lease's TTL
                    doubled = self._register_wait * (1 + random.random())
                    self._register_wait = min(float(self.ttl_s), max(0.05, doubled))
                continue
            # due one interval after the last was sent, not after it was answered: a slow answer (etcd or
            # this loop busy) does not push the next renewal later; while renewals fail, try again soon
            # (etcd gives a lease it restores one TTL from its restart)
            wait = self.interval_s if not self._failures else min(0.2, self.interval_s)
            await asyncio.sleep(max(0.0, self._renewal_sent + wait - time.monotonic()))
            await self._renew_once()

    async def _register_once(self) -> bool:
        sent = self._renewal_sent = time.monotonic()  # the grant counts as the first renewal
        key = self.keys.member(self.member.node_id)
        lease: int | None = None
        try:
            lease = await self.etcd.grant_lease(self.ttl_s)
            revision = await self.etcd.create(key, self.member.to_json().encode(), lease)
            if revision is None and await self._revoke_own_stale_key(key):
                revision = await self.etcd.create(key, self.member.to_json().encode(), lease)
            if revision is None:
                await self.etcd.revoke_lease(lease)
                log.error(
                    "node_id %r is registered by another live broker; waiting for its lease to end",
                    self.member.node_id,
                )
                return False
        except EtcdError as exc:
            self._failed(f"cannot register {self.member.node_id} in etcd: {exc}")
            if lease is not None:
                with contextlib.suppress(EtcdError):
                    await self.etcd.revoke_lease(lease)
            return False
        self.lease_id = lease
        self._own_leases.add(lease)
        self.registration = (key, revision)
        self._proven(sent)
        log.info("registered %s under lease %x (TTL %d s)", self.member.node_id, lease, self.ttl_s)
        self._registered.set()
        for listener in list(self._listeners):
            listener()
        await self._unfence("registered under a new lease")
        return True

    async def _revoke_own_stale_key(self, key: str) -> bool:
        """The member key exists: if it is bound to a lease of this node's own that it gave up on, end that
        lease (so the key goes now rather than at its expiry) and say so."""
        existing = await self.etcd.get(key)
        if existing is None:
            return True
        if existing.lease not in self._own_leases:
            return False
        await self.etcd.revoke_lease(existing.lease)
        return True

    async def _renew_once(self) -> None:
        lease = self.lease_id
        if lease is None:
            return
        sent = self._renewal_sent = time.monotonic()
        try:
            # an answer is worth waiting for until the node would fence (it proves the lease to sent + TTL);
            # after failures the connection is made again (TLS, etcd's auth): allow it the time a TTL gives
            ttl = await self.etcd.keep_alive(
                lease,
                timeout_s=self.ttl_s - fence_margin_s(self.ttl_s) if not self._failures else self.ttl_s,
            )
        except EtcdError as exc:
            # fenced by the timer meanwhile, but the lease is kept: etcd restores leases when it restarts,
            # and only etcd knows whether this one ran out (a new one would look like a death and a birth)
            self._failed(f"lease {lease:x} renewal failed: {exc}")
            if "lease not found" in str(exc):
                self._lose_lease("etcd no longer knows the lease")
            return
        if ttl <= 0:
            self._lose_lease("lease expired")
            return
        self._proven(sent)
        if self.view.fenced:
            await self._unfence("lease proven alive again")

    def _lose_lease(self, why: str) -> None:
        log.error("%s lost its etcd lease (%s): fenced, registering again", self.member.node_id, why)
        self.lease_id = None
        self.registration = None
        self._registered.clear()
        self._cancel_fence_timer()
        if self.view.fenced:  # fenced already (its renewals failed): the view's listeners learn the loss
            self.view.changed()
        self._set_fenced(True, why)

    # -- fencing ------------------------------------------------------------------------------------------

    def _failed(self, message: str) -> None:
        """Log an etcd failure: the first of a run at WARNING, the others at DEBUG (they repeat quickly)."""
        self._failures += 1
        (log.warning if self._failures == 1 else log.debug)("%s", message)

    def _proven(self, sent: float) -> None:
        """A renewal (or grant) sent at ``sent`` succeeded: the lease lives until sent + TTL."""
        if self._failures > 1:
            log.info("etcd answers again (after %d failed attempts)", self._failures)
        self._failures = 0
        self.proven_until = sent + self.ttl_s
        self._cancel_fence_timer()
        delay = max(0.0, self.proven_until - fence_margin_s(self.ttl_s) - time.monotonic())
        self._fence_timer = asyncio.get_running_loop().call_later(delay, self._fence_now)

    def _fence_now(self) -> None:
        self._fence_timer = None
        if not self.view.fenced:
            log.error(
                "%s cannot prove its etcd lease alive (no renewal for %.1f s): fenced",
                self.member.node_id,
                self.ttl_s - fence_margin_s(self.ttl_s),
            )
        self._set_fenced(True, "lease not proven alive")

    def _cancel_fence_timer(self) -> None:
        if self._fence_timer is not None:
            self._fence_timer.cancel()
            self._fence_timer = None

    async def _unfence(self, why: str) -> bool:
        if not self.view.fenced:
            return True
        if self.lease_id is None:
            return False
        if self.before_unfence is not None:
            try:
                await self.before_unfence()
            except EtcdError as exc:
                self._failed(f"still fenced: re-reading the cluster state failed: {exc}")
                return False
        if time.monotonic() >= self.proven_until - fence_margin_s(self.ttl_s) or self._stopping:
            return False
        self._set_fenced(False, why)
        log.info("%s unfenced: %s", self.member.node_id, why)
        return True

    def _set_fenced(self, fenced: bool, why: str) -> None:
        if self.view.fenced == fenced:
            return
        self.view.fenced = fenced
        log.debug("fenced=%s: %s", fenced, why)
        self.view.changed()
