"""Which member of a site cluster holds the uplink: the one holding ``<prefix>/uplink``.

A site is one writer of its logs on the hub, so one member at a time dials it. Every member campaigns for
the key as for the controller's (``lease_claim``: created while absent, bound to its membership lease).
The holder runs the link; a member that loses the key (fenced, its lease gone, the key deleted) stops it
at once. When the holder dies its lease expires, etcd deletes the key, and the next member to campaign
takes it and dials; the hub's ``ENDS`` tell it where to resume, so nothing crosses twice or is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from broker_edge.cluster.coordination.backoff import Backoff
from broker_edge.cluster.coordination.etcd import Etcd, EtcdError, Guard
from broker_edge.cluster.coordination.lease_claim import claim_key
from broker_edge.cluster.tasks import stop_task

__all__ = ["LinkHolder"]

log = logging.getLogger("broker_edge.cluster.link_holder")


class LinkHolder:
    """Campaigns for ``key`` under the lease ``lease_of()`` gives (None while fenced or unregistered) every
    ``interval_s``; ``hold()`` when this member takes it, ``release()`` when it no longer holds it."""

    def __init__(
        self,
        etcd: Etcd,
        key: str,
        node_id: str,
        lease_of: Callable[[], int | None],
        hold: Callable[[], None],
        release: Callable[[], Awaitable[None]],
        interval_s: float,
    ) -> None:
        self.etcd = etcd
        self.key = key
        self.node_id = node_id
        self.lease_of = lease_of
        self.hold = hold
        self.release = release
        self.interval_s = interval_s
        self.holding: Guard | None = None
        """(key, its mod_revision) while this member holds the link."""
        self._backoff = Backoff("the uplink's holder (etcd)", log)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="uplink-holder")

    async def stop(self, resign: bool = True) -> None:
        """Stop campaigning and the link; ``resign`` deletes the key at once, so another member takes the
        link without waiting for this lease to expire."""
        await stop_task(self._task)
        self._task = None
        holding = self.holding
        await self._let_go("stopping")
        if holding is not None and resign:
            with contextlib.suppress(EtcdError):
                await self.etcd.delete_if(*holding)

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except EtcdError as error:
                await asyncio.sleep(self._backoff.failed(error))
                continue
            self._backoff.succeeded()
            await asyncio.sleep(self.interval_s)

    async def step(self) -> None:
        """One look: let the link go if the key is no longer this member's, take it if it is free."""
        lease = self.lease_of()
        if lease is None:
            await self._let_go("fenced")
            return
        if self.holding is not None:
            current = await self.etcd.get(self.key)
            if current is None or current.mod_revision != self.holding[1] or current.lease != lease:
                await self._let_go("its key is gone")
        if self.holding is None:
            claim = await claim_key(self.etcd, self.key, self.node_id.encode(), lease)
            if claim.revision is not None:
                self.holding = (self.key, claim.revision)
                log.info("%s holds the uplink", self.node_id)
                self.hold()

    async def _let_go(self, why: str) -> None:
        if self.holding is None:
            return
        self.holding = None
        log.warning("%s no longer holds the uplink (%s)", self.node_id, why)
        await self.release()
