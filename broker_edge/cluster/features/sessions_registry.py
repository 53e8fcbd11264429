"""The session registry's etcd side: each client id's record read, created, swapped or deleted by
compare-and-swap, one writer at a time per client id on this node (the record format is
``sessions_records``).

Every CONNECT on a cluster node reads and writes its record, so a reconnect storm (a site's devices coming
back at once) is a burst of these calls. At most ``CALLS_IN_FLIGHT`` of them are outstanding at a time, the
rest waiting their turn here: with a thousand outstanding on one channel, the node's own lease renewals on
it were answered seconds late (while etcd answered other clients at once) and the node fenced itself,
disconnecting its clients."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from broker_edge.cluster.coordination.etcd import EtcdError
from broker_edge.cluster.features.sessions_records import SessionRecord
from broker_edge.cluster.tasks import stop_task

if TYPE_CHECKING:
    from broker_edge.cluster.coordination.etcd import Etcd

__all__ = ["BackgroundTasks", "Change", "SessionRegistry"]

log = logging.getLogger("broker_edge.cluster.sessions")

T = TypeVar("T")

CALLS_IN_FLIGHT = 8
"""The registry's etcd calls a node has outstanding at most (a reconnect storm's claims take turns)."""

BATCH_RECORDS = 64
"""Records ``update_all`` writes in one etcd transaction at most (etcd allows 128 operations by default)."""

BATCH_BYTES = 256 * 1024
"""Bytes of records ``update_all`` writes in one etcd transaction at most (etcd takes 1.5 MiB a request)."""

Change = Callable[[SessionRecord], "SessionRecord | None"]
"""A change of a record: the new record, or None to delete it."""


class BackgroundTasks:
    """Tasks started from callbacks of the loop: kept referenced until done, failures logged."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coroutine: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    async def stop(self) -> None:
        for task in list(self._tasks):
            await stop_task(task)


class SessionRegistry:
    """The registry's etcd side: one client id's record read, created, swapped or deleted, writers on this
    node serialized per client id (``lock``)."""

    def __init__(self, etcd: Etcd, key_prefix: str, retry_s: float = 1.0) -> None:
        self.etcd = etcd
        self.prefix = f"{key_prefix}/sessions/"
        self.retry_s = retry_s
        self._locks: dict[str, asyncio.Lock] = {}
        self._in_flight = asyncio.Semaphore(CALLS_IN_FLIGHT)
        self._known: dict[str, tuple[SessionRecord, int]] = {}
        """Client id → the record this node last wrote and its revision: an update tries a
        compare-and-swap on it first, without a read."""

    async def _send(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, an etcd call, once fewer than ``CALLS_IN_FLIGHT`` of the registry's are in flight."""
        async with self._in_flight:
            return await call()

    def key(self, client_id: str) -> str:
        return self.prefix + client_id

    @contextlib.asynccontextmanager
    async def lock(self, client_id: str) -> Any:
        """Serialize this node's reads and writes of one client id's record."""
        lock = self._locks.get(client_id)
        if lock is None:
            lock = self._locks[client_id] = asyncio.Lock()
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and self._locks.get(client_id) is lock:
                del self._locks[client_id]

    async def read(self, client_id: str) -> tuple[SessionRecord | None, int]:
        """The record and its revision (None, 0 when there is none; an unreadable record counts as none and
        is logged: the next CONNECT writes a good one over it)."""
        found = await self._send(partial(self.etcd.get, self.key(client_id)))
        if found is None:
            return None, 0
        return self._parsed(client_id, found.value), found.mod_revision

    @staticmethod
    def _parsed(client_id: str, value: bytes) -> SessionRecord | None:
        try:
            return SessionRecord.from_json(value)
        except ValueError as exc:
            log.error("session record of %r is not readable (%s); replacing it", client_id, exc)
            return None

    async def create_or_read(
        self, client_id: str, record: SessionRecord
    ) -> tuple[SessionRecord | None, int] | None:
        """Create ``record`` where ``client_id`` has none (None), else the record there and its revision
        (read by the same etcd call; an unreadable one as ``read`` gives it)."""
        revision, found = await self._send(
            partial(self.etcd.create_or_get, self.key(client_id), record.to_json())
        )
        if revision is not None:
            self._known[client_id] = (record, revision)
            return None
        if found is None:  # removed between the two halves of the call: cannot be, but read again
            return await self.read(client_id)
        return self._parsed(client_id, found.value), found.mod_revision

    async def records(self) -> list[tuple[str, SessionRecord, int]]:
        """Every readable record: (client id, record, revision)."""
        found, _ = await self._send(partial(self.etcd.get_prefix, self.prefix))
        records: list[tuple[str, SessionRecord, int]] = []
        for kv in found:
            with contextlib.suppress(ValueError):
                record = SessionRecord.from_json(kv.value)
                records.append((kv.key[len(self.prefix) :], record, kv.mod_revision))
        return records

    async def write(self, client_id: str, record: SessionRecord, revision: int) -> bool:
        """Create the record (``revision`` 0) or swap it for the one at ``revision``; False if someone else
        wrote first."""
        key = self.key(client_id)
        if revision == 0:
            written = await self._send(partial(self.etcd.create, key, record.to_json()))
        else:
            written = await self._send(partial(self.etcd.compare_and_swap, key, record.to_json(), revision))
        if written is None:
            return False
        self._known[client_id] = (record, written)
        return True

    async def update(
        self, client_id: str, node: str, generation: int, change: Change
    ) -> SessionRecord | None:
        """Apply ``change`` while the record is still ``node``'s for CONNECT ``generation`` (retrying when
        another write of that record came between); the record as it was before, or None when it is no
        longer theirs (gone, or taken by a newer CONNECT). Call it holding ``lock(client_id)``."""
        known = self._known.pop(client_id, None)
        while True:
            if known is not None and known[0].held_by(node, generation):
                record, revision = known  # most likely still current: try it without a read
            else:
                found, revision = await self.read(client_id)
                if found is None or not found.held_by(node, generation):
                    return None
                record = found
            known = None
            changed = change(record)
            key = self.key(client_id)
            if changed is None:
                if await self._send(partial(self.etcd.delete_if, key, revision)):
                    return record
            else:
                written = await self._send(
                    partial(self.etcd.compare_and_swap, key, changed.to_json(), revision)
                )
                if written is not None:
                    self._known[client_id] = (changed, written)
                    return record

    async def update_until_done(
        self, client_id: str, node: str, generation: int, change: Change, stopped: Callable[[], bool]
    ) -> SessionRecord | None:
        """``update`` under the client id's lock, retried every ``retry_s`` while etcd cannot be reached
        (until ``stopped()``, then ``EtcdError``): the compare-and-swap decides whatever happened meanwhile,
        so a late update never undoes a newer one."""
        while True:
            try:
                async with self.lock(client_id):
                    return await self.update(client_id, node, generation, change)
            except EtcdError:
                if stopped():
                    raise
            await asyncio.sleep(self.retry_s)

    async def update_all(self, node: str, changes: list[tuple[str, int, Change]]) -> set[str]:
        """Apply each ``(client_id, generation, change)`` as ``update`` does, many records per etcd
        transaction (a fleet's saved sessions in a few calls rather than one call each): the client ids
        whose change was written. Only records this node last wrote and still holds, that nobody on this
        node is changing meanwhile, and that the change keeps go in; a transaction finding any of its
        records written by someone else writes none of them. The caller ``update``s the rest."""
        written: set[str] = set()
        pending = list(changes)
        while pending:
            async with contextlib.AsyncExitStack() as held:
                batch, pending = await self._batch(node, pending, held)
                if batch and await self._write_all(batch):
                    written.update(entry[0] for entry in batch)
        return written

    async def _batch(
        self, node: str, changes: list[tuple[str, int, Change]], held: contextlib.AsyncExitStack
    ) -> tuple[list[tuple[str, SessionRecord, bytes, int]], list[tuple[str, int, Change]]]:
        """The next transaction's ``(client_id, changed record, its JSON, revision)``, each client id's
        lock taken into ``held`` (a client id whose lock is in use is left out: ``update`` writes it), and
        the changes after them."""
        batch: list[tuple[str, SessionRecord, bytes, int]] = []
        size = 0
        for index, (client_id, generation, change) in enumerate(changes):
            known = self._known.get(client_id)
            if client_id in self._locks or known is None or not known[0].held_by(node, generation):
                continue  # being changed here now (its lock is in use), or not as this node wrote it
            changed = change(known[0])
            value = b"" if changed is None else changed.to_json()
            if changed is None or len(value) > BATCH_BYTES:
                continue  # a deletion, or a record too large to share a transaction
            if len(batch) == BATCH_RECORDS or size + len(value) > BATCH_BYTES:
                return batch, changes[index:]
            await held.enter_async_context(self.lock(client_id))  # free: taken at once
            batch.append((client_id, changed, value, known[1]))
            size += len(value)
        return batch, []

    async def _write_all(self, batch: list[tuple[str, SessionRecord, bytes, int]]) -> bool:
        """Swap every record of ``batch`` in one transaction; whether it was written."""
        items = [(self.key(client_id), value, revision) for client_id, _, value, revision in batch]
        revision = await self._send(partial(self.etcd.swap_all, items))
        if revision is None:
            return False
        for client_id, record, _, _ in batch:
            self._known[client_id] = (record, revision)
        return True

    def known(self, client_id: str) -> tuple[SessionRecord, int] | None:
        """The record this node last wrote of ``client_id`` and its revision (None: none kept)."""
        return self._known.get(client_id)

    def forget(self, client_id: str) -> None:
        """Another node writes this record from now on."""
        self._known.pop(client_id, None)
