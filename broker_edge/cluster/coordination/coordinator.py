"""Keeps this node's ``ClusterView`` current from etcd, and makes the leader's in-sync set changes.

The coordinator reads every key under the cluster's prefix once, then follows a watch from the revision
after that read: members (``view.members``), partition states (``view.states``, with the ``mod_revision``
each was read at, for compare-and-swap), the partition count (``<prefix>/config``, which wins over the
configured one) and who the controller is. Each key's value is applied only if it is newer than the one
held, so the initial read, the watch and this node's own writes can interleave in any order. Changes that
arrive together are told to ``view.changed()`` once.

A leader changes only the in-sync set of a partition it leads, by compare-and-swap on the partition's key,
guarded by its own member key (a node whose lease is gone cannot write): ``shrink_isr`` and ``expand_isr``
answer False once the partition has another leader or epoch (the caller steps down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from broker_edge.cluster.coordination.backoff import Backoff
from broker_edge.cluster.coordination.etcd import (
    ClusterKeys,
    Etcd,
    EtcdError,
    Guard,
    KeyValue,
    WatchCompacted,
)
from broker_edge.cluster.coordination.etcd_values import (
    BadValue,
    BadValues,
    check_progress,
    parse_config,
    parse_controller,
    parse_member,
    parse_partition_state,
)
from broker_edge.cluster.coordination.membership import Membership
from broker_edge.cluster.tasks import stop_task
from broker_edge.cluster.view import ClusterView
from broker_edge.config import ConfigError
from broker_edge.placement import PartitionState

__all__ = ["Coordinator"]

log = logging.getLogger("broker_edge.cluster.coordinator")

CAS_ATTEMPTS = 5
"""Compare-and-swap attempts of one in-sync set change before giving up (each re-reads the key)."""


class Coordinator:
    """Follows the cluster's keys in etcd into ``view``; offers ``shrink_isr``/``expand_isr`` to leaders."""

    def __init__(
        self,
        etcd: Etcd,
        keys: ClusterKeys,
        view: ClusterView,
        membership: Membership | None = None,
        resync_interval_s: float = 10.0,
    ) -> None:
        self.etcd = etcd
        self.keys = keys
        self.view = view
        self.membership = membership
        self.resync_interval_s = resync_interval_s
        self.controller: str | None = None
        """node_id of the current controller (None while there is none)."""
        self.stored_partitions: int | None = None
        """The partition count stored in etcd (None before the cluster is created, or while the stored one
        is not the configured one: that one is used)."""
        self.bad_values = BadValues()
        """Values read from etcd that were ignored (logged at ERROR, rate-limited)."""
        self.revisions: dict[str, int] = {}
        """mod_revision of every key held (the key of a partition state is ``keys.partition(p)``)."""
        self._task: asyncio.Task[None] | None = None
        self._change_pending = False
        self._loaded = asyncio.Event()
        self._backoff = Backoff("reading the cluster state from etcd", log)

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the cluster's keys, then follow them (if etcd cannot be reached now, keep trying in the
        background: the view stays empty meanwhile). ``ConfigError`` when the cluster was created with
        another partition count than this broker's: it would place topics on other partitions."""
        try:
            revision = await self._load()
            await self._check_partitions()
        except EtcdError as exc:
            log.warning("cannot read the cluster state yet: %s", exc)
            revision = -1
        self._start_watch(revision)

    async def _check_partitions(self) -> None:
        found = await self.etcd.get(self.keys.config)
        if found is None:  # not created yet: the controller creates it with this broker's count
            return
        try:
            stored = parse_config(found.value, None)
        except BadValue:  # not a config record at all: reported by the read, as every bad value is
            return
        if stored != self.view.partitions:
            raise ConfigError(
                "cluster.partitions",
                f"the cluster under {self.keys.prefix} was created with {stored} partitions, this broker is "
                f"configured with {self.view.partitions} (every broker of a cluster has the count it was "
                "created with)",
            )

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def resync(self) -> None:
        """Read every key again and watch from there (after an outage: the view must be current before this
        node acts on it again)."""
        revision = await self._load()
        await self.stop()
        self._start_watch(revision)

    async def until(self, condition: Callable[[ClusterView], bool], timeout_s: float) -> bool:
        """Wait until ``condition(view)`` holds (checked after every change); False after ``timeout_s``."""
        if condition(self.view):
            return True
        event = asyncio.Event()

        def check() -> None:
            if condition(self.view):
                event.set()

        self.view.on_change(check)
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
            return True
        except TimeoutError:
            return condition(self.view)
        finally:
            self.view._listeners.remove(check)

    # -- reading etcd -------------------------------------------------------------------------------------

    def _start_watch(self, revision: int) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._follow(revision), name="cluster-coordinator")

    async def _follow(self, revision: int) -> None:
        if revision < 0:
            revision = await self._load_retrying()
        next_resync = time.monotonic() + self.resync_interval_s
        while True:
            try:
                watch = self.etcd.watch_prefix(self.keys.root, revision + 1)
                # The watch runs in this task (not wait_for's task of its own): a stop's cancellations reach
                # it here, so it has ended when it is closed, however long its own cleanup takes.
                async with contextlib.aclosing(watch) as events:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(0.0, next_resync - time.monotonic())):
                            async for event in events:
                                self._apply(event.key, event.value, event.mod_revision)
                                self._schedule_changed()
                revision = await self._load()
            except WatchCompacted:
                log.warning("etcd compacted the watched revisions: reading the cluster state again")
                revision = await self._load_retrying()
            except EtcdError as exc:
                await asyncio.sleep(self._backoff.failed(exc))
                revision = await self._load_retrying()
            next_resync = time.monotonic() + self.resync_interval_s

    async def _load_retrying(self) -> int:
        backoff = self._backoff
        while True:
            try:
                revision = await self._load()
            except EtcdError as exc:
                await asyncio.sleep(backoff.failed(exc))
            else:
                backoff.succeeded()
                return revision

    async def _load(self) -> int:
        """Apply a fresh read of every key; forget held keys that it no longer has. Its revision."""
        kvs, revision = await self.etcd.get_prefix(self.keys.root)
        present = {kv.key for kv in kvs}
        for kv in kvs:
            self._apply(kv.key, kv.value, kv.mod_revision)
        for key, held in list(self.revisions.items()):
            if key not in present and held <= revision:
                self._apply(key, None, revision)
        self._loaded.set()
        self._schedule_changed()
        return revision

    def _apply(self, key: str, value: bytes | None, revision: int) -> None:
        """Take in one key's value (None: deleted) if newer than the one held; a bad value is reported and
        ignored, and what was held for the key stays (see ``etcd_values``)."""
        held = self.revisions.get(key, 0)
        if revision < held or (value is not None and revision == held):
            return  # older, or the very write already held (a re-read, or this node's own write)
        try:
            changed = self._take(key, value, revision)
        except BadValue as error:
            self.bad_values.report(key, error)
            return
        if not changed:
            return
        if value is None:
            self.revisions.pop(key, None)
        else:
            self.revisions[key] = revision
        self._change_pending = True

    def _take(self, key: str, value: bytes | None, revision: int) -> bool:
        """Apply one key's checked value, written at ``revision``, to the view; False for a key that is none
        of the cluster's."""
        keys = self.keys
        view = self.view
        if key == keys.controller:
            self.controller = None if value is None else parse_controller(value)
        elif key == keys.config:
            self.stored_partitions = None if value is None else parse_config(value, view.partitions)
        elif key.startswith(keys.members):
            node_id = key[len(keys.members) :]
            if value is None:
                view.members.pop(node_id, None)
                view.registrations.pop(node_id, None)
            else:
                view.members[node_id] = parse_member(node_id, value)
                view.registrations[node_id] = revision
        else:
            partition = keys.partition_number(key)
            if partition is None:
                return False
            if value is None:
                view.states.pop(partition, None)
            else:
                state = parse_partition_state(partition, value, view.partitions)
                check_progress(view.states.get(partition), state)
                view.states[partition] = state
        return True

    def _schedule_changed(self) -> None:
        if self._change_pending:
            self._change_pending = False
            asyncio.get_running_loop().call_soon(self.view.changed)

    # -- the leader's in-sync set changes -----------------------------------------------------------------

    async def shrink_isr(self, partition: int, expected_epoch: int, node: str) -> bool:
        """Remove ``node`` (a follower that lagged) from the in-sync set of ``partition``, which this node
        leads under ``expected_epoch``. True once ``node`` is out of it; False if this node no longer leads
        it under that epoch (or is fenced). ``EtcdError`` if etcd cannot be reached."""
        if node == self.view.node_id:
            raise ValueError("node: a leader does not remove itself from the in-sync set")
        return await self._change_isr(
            partition, expected_epoch, lambda state: tuple(n for n in state.isr if n != node)
        )

    async def expand_isr(self, partition: int, expected_epoch: int, node: str) -> bool:
        """Add ``node`` (a replica that caught up) to the in-sync set of ``partition``, which this node leads
        under ``expected_epoch``. True once ``node`` is in it; False if this node no longer leads it under
        that epoch, is fenced, or ``node`` is not one of its replicas or not a live member (a replica that
        died caught up still looks caught up to the leader until its fetch session expires: adding it back
        would undo the controller's removal, again and again). ``EtcdError`` if etcd cannot be reached."""

        def grown(state: PartitionState) -> tuple[str, ...] | None:
            if node not in state.replicas or node not in self.view.members:
                return None
            return state.isr if node in state.isr else (*state.isr, node)

        return await self._change_isr(partition, expected_epoch, grown)

    async def _change_isr(
        self,
        partition: int,
        expected_epoch: int,
        change: Callable[[PartitionState], tuple[str, ...] | None],
    ) -> bool:
        key = self.keys.partition(partition)
        state = self.view.states.get(partition)
        revision = self.revisions.get(key)
        for _ in range(CAS_ATTEMPTS):
            guards = self._guards()
            if self.view.fenced or guards is None:
                return False
            if state is None or revision is None:
                state, revision = await self._read_state(partition)
                if state is None or revision is None:
                    return False
            if state.leader != self.view.node_id or state.epoch != expected_epoch:
                return False
            isr = change(state)
            if isr is None:
                return False
            if isr == state.isr:
                return True
            wanted = replace(state, isr=isr)
            written = await self.etcd.compare_and_swap(key, wanted.to_json().encode(), revision, guards)
            if written is not None:
                self._apply(key, wanted.to_json().encode(), written)
                self._schedule_changed()
                return True
            state = revision = None  # someone wrote first: read again
        return False

    def _guards(self) -> list[Guard] | None:
        """What must hold for this node's write to apply: its registration (None: not registered)."""
        if self.membership is None:
            return []
        registration = self.membership.registration
        return None if registration is None else [registration]

    async def _read_state(self, partition: int) -> tuple[PartitionState | None, int | None]:
        """The partition's record as etcd holds it now (None, None when there is none or it is bad)."""
        found: KeyValue | None = await self.etcd.get(self.keys.partition(partition))
        if found is None:
            return None, None
        self._apply(found.key, found.value, found.mod_revision)
        self._schedule_changed()
        if self.revisions.get(found.key) != found.mod_revision:
            return None, None  # not taken in: a bad value
        return self.view.states.get(partition), found.mod_revision
