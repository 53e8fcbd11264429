"""A thin asyncio wrapper over aetcd: what the cluster asks of etcd, each call bounded in time.

aetcd speaks etcd's gRPC API but leaves gaps this module fills: one gRPC target for several endpoints
(``ipv4:a:p,b:q``, so any one etcd member may fail), a timeout on every call (aetcd's default is none),
lease keepalive as single requests run by the caller's own loop (aetcd has no keepalive loop; an expired
lease answers TTL <= 0, not an error), compare-and-swap on a key's ``mod_revision`` and create-if-absent as
transactions, and a prefix watch that resumes from the last revision it delivered when its stream fails.

Every failure to reach etcd (or a timeout) raises ``EtcdError``; keys are ``str`` (UTF-8), values ``bytes``.
The layout of the cluster's keys under its prefix is ``ClusterKeys``.

With ``cluster.etcd_tls`` and ``cluster.etcd_auth`` the channel is TLS with a client certificate and the
calls carry an etcd auth token (``etcd_secure``); a call refused for a token etcd forgot (it restarted) is
made again once after authenticating anew. ``renew`` (SIGHUP) opens a new channel with the files as they
are now and lets the old one finish what it carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import socket
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions

from broker_edge.cluster.coordination.etcd_secure import SecureClient, tls_failure_said
from broker_edge.settings.cluster import EtcdAuthConfig, EtcdTlsConfig, etcd_endpoint

__all__ = [
    "ClusterKeys",
    "Etcd",
    "EtcdError",
    "KeyValue",
    "WatchCompacted",
    "WatchEvent",
    "grpc_target",
]

log = logging.getLogger("broker_edge.cluster.etcd")

T = TypeVar("T")

Guard = tuple[str, int]
"""(key, mod_revision) that must still hold for a write to apply: how a writer proves it still holds the
key it was elected or registered under."""

_CHANNEL_OPTIONS = {
    # find a dead etcd member under an idle watch stream (etcd refuses pings more often than every 5 s)
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    # come back soon after etcd does (gRPC's default backoff grows to two minutes)
    "grpc.initial_reconnect_backoff_ms": 200,
    "grpc.max_reconnect_backoff_ms": 1_000,
    # the time a connection attempt may take (TCP, TLS, HTTP/2), gRPC's "min connect timeout": at the
    # 0.2 s it was (the same option) an etcd 0.25 s away could never be reached, its handshake cut short
    "grpc.min_reconnect_backoff_ms": 5_000,
}


class EtcdError(Exception):
    """etcd did not answer in time, could not be reached, or refused the request."""


class WatchCompacted(EtcdError):
    """A watch asked for revisions etcd has compacted away: re-read the keys, then watch again."""


class EtcdRefusedWatch(EtcdError):
    """etcd refused to make a watch (its answer: "created" and "canceled", watch id -1)."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    """Revision of the key's last write: what a compare-and-swap compares."""
    lease: int
    """ID of the lease the key is bound to (0: none)."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    key: str
    value: bytes | None
    """The new value; None when the key was deleted (or its lease expired)."""
    mod_revision: int

    @property
    def deleted(self) -> bool:
        return self.value is None


@dataclass(frozen=True, slots=True)
class ClusterKeys:
    """Where a cluster's state lives in etcd, under ``prefix`` (``cluster.key_prefix``)."""

    prefix: str

    @property
    def root(self) -> str:
        """Prefix of every key of the cluster (ends with '/')."""
        return f"{self.prefix}/"

    @property
    def config(self) -> str:
        """JSON ``{"partitions": N}``, written once when the cluster is created."""
        return f"{self.prefix}/config"

    @property
    def controller(self) -> str:
        """node_id of the controller, bound to its lease."""
        return f"{self.prefix}/controller"

    @property
    def uplink(self) -> str:
        """node_id of the member holding a site cluster's uplink, bound to its lease."""
        return f"{self.prefix}/uplink"

    @property
    def members(self) -> str:
        return f"{self.prefix}/members/"

    def member(self, node_id: str) -> str:
        """``Member.to_json()`` of a live broker, bound to its lease."""
        return f"{self.members}{node_id}"

    @property
    def partitions(self) -> str:
        return f"{self.prefix}/partitions/"

    def partition(self, partition: int) -> str:
        """``PartitionState.to_json()``, written only by compare-and-swap."""
        return f"{self.partitions}{partition}"

    def partition_number(self, key: str) -> int | None:
        """The partition a key under ``partitions`` names (None for anything else)."""
        if not key.startswith(self.partitions):
            return None
        tail = key[len(self.partitions) :]
        return int(tail) if tail.isdigit() else None


def grpc_target(urls: Sequence[str]) -> str:
    """The gRPC target for etcd client URLs: ``host:port`` for one, ``ipv4:a:p,b:q`` (or ``ipv6:``) for
    several, so the channel moves to another endpoint when one fails. Several host names are resolved here
    (gRPC takes one address list, not several names)."""
    endpoints = [etcd_endpoint(url) for url in urls]
    if not endpoints:
        raise ValueError("etcd: at least one URL is required")
    if len(endpoints) == 1:
        host, port = endpoints[0]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    addresses: list[tuple[str, int]] = []
    for host, port in endpoints:
        try:
            addresses.append((str(ipaddress.ip_address(host)), port))
        except ValueError:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            addresses.append((str(info[0][4][0]), port))
    if all(":" not in host for host, _ in addresses):
        return "ipv4:" + ",".join(f"{host}:{port}" for host, port in addresses)
    if all(":" in host for host, _ in addresses):
        return "ipv6:" + ",".join(f"[{host}]:{port}" for host, port in addresses)
    raise ValueError("etcd: mix IPv4 and IPv6 endpoints in one list is not supported")


def _timed_out(error: EtcdError) -> bool:
    """Whether ``error`` is a request etcd did not answer in time (it may still answer it)."""
    return isinstance(error.__cause__, (aetcd.exceptions.WatchTimeoutError, TimeoutError))


def _reraise_cancellation(error: BaseException) -> None:
    """gRPC turns the cancellation of the task awaiting a call into an error of the call: make it a
    cancellation again, so that stopping a task stops it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from error


def _key(kv: Any) -> KeyValue:
    return KeyValue(kv.key.decode("utf-8"), bytes(kv.value), int(kv.mod_revision), int(kv.lease))


RENEWED_CHANNEL_GRACE_S = 30.0
"""How long the channel a ``renew`` replaced stays open for the calls and watches it still carries."""


class Etcd:
    """One gRPC channel to an etcd cluster; ``timeout_s`` bounds every call; ``tls`` and ``auth`` as the
    ``cluster:`` section's ``etcd_tls`` and ``etcd_auth``; ``explain_tls``: an error of a channel over TLS
    says which ``etcd_tls`` file to mend (a broker's; a command line names its options itself)."""

    def __init__(
        self,
        urls: Sequence[str],
        timeout_s: float = 2.0,
        tls: EtcdTlsConfig | None = None,
        auth: EtcdAuthConfig | None = None,
        explain_tls: bool = True,
    ) -> None:
        target = grpc_target(urls)
        host, _, port = target.rpartition(":")
        # aetcd joins host and port with ':'; a multi-address target is split the same way
        self._target = (host, int(port))
        self._tls = tls
        self._auth = auth
        self._explain_tls = explain_tls
        self._client = self._new_client(timeout_s)
        self._retired: dict[asyncio.Task[None], SecureClient] = {}
        """Clients ``renew`` replaced, each closed by its task when its grace period ends, or by ``close``."""
        self.timeout_s = timeout_s
        self.urls = tuple(urls)

    def _new_client(self, timeout_s: float) -> SecureClient:
        host, port = self._target
        return SecureClient(host, port, timeout_s, _CHANNEL_OPTIONS, self._tls, self._auth)

    async def _call(self, operation: Callable[[], Awaitable[T]], timeout_s: float | None = None) -> T:
        """Run ``operation()`` on the client; once more after authenticating anew when etcd forgot the
        token (it restarted). A channel ``renew`` opened while the call was under way authenticates as it
        connects: the call is made again on it."""
        bound = (timeout_s or self.timeout_s) + 0.5
        client = self._client
        try:
            try:
                return await asyncio.wait_for(operation(), bound)
            except aetcd.exceptions.UnauthenticatedError:
                if self._client is client and not await client.reauthenticate():
                    raise
                return await asyncio.wait_for(operation(), bound)
        except aetcd.exceptions.RevisionCompactedError as exc:
            raise WatchCompacted(str(exc)) from exc
        except (aetcd.exceptions.ClientError, TimeoutError) as exc:
            _reraise_cancellation(exc)
            said = ""
            tls = self._tls if self._explain_tls else None
            if isinstance(exc, aetcd.exceptions.ConnectionFailedError) and tls is not None:
                said = tls_failure_said(str(exc), tls)
            raise EtcdError(f"etcd {','.join(self.urls)}: {type(exc).__name__}: {exc}{said}") from exc

    def renew(self, reason: str = "TLS files and password read again") -> None:
        """Use a new channel from now on, made with the TLS files as they are now (SIGHUP); the old one
        is closed after ``RENEWED_CHANNEL_GRACE_S``, its watches re-made on the new one meanwhile."""
        old, self._client = self._client, self._new_client(self.timeout_s)

        async def retire() -> None:
            await asyncio.sleep(RENEWED_CHANNEL_GRACE_S)
            await self._close(old)

        task = asyncio.get_running_loop().create_task(retire())
        self._retired[task] = old
        task.add_done_callback(self._retired.pop)
        log.info("etcd channel renewed (%s)", reason)

    async def _close(self, client: aetcd.Client) -> None:
        try:
            await asyncio.wait_for(client.close(), self.timeout_s)
        except (aetcd.exceptions.ClientError, TimeoutError):
            log.debug("closing the etcd channel failed", exc_info=True)

    async def close(self) -> None:
        """Close the channel in use and those ``renew`` replaced whose grace period has not ended."""
        retired = list(self._retired.items())  # (each task takes its own entry out once it has ended)
        for task, _ in retired:
            task.cancel()
        for _, client in retired:
            await self._close(client)
        await self._close(self._client)

    async def __aenter__(self) -> Etcd:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- keys ---------------------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        found = await self._call(lambda: self._client.get(key.encode("utf-8")))
        return None if found is None else _key(found)

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` (sorted by key) and the store's revision they were read at."""
        found = await self._call(lambda: self._client.get_prefix(prefix.encode("utf-8"), sort_order="ascend"))
        return [_key(kv) for kv in found.kvs], int(found.header.revision)

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        """Write unconditionally; the revision it was written at."""
        done = await self._call(lambda: self._client.put(key.encode("utf-8"), value, lease=lease or None))
        return int(done.header.revision)

    async def delete(self, key: str) -> bool:
        done = await self._call(lambda: self._client.delete(key.encode("utf-8")))
        return done is not None and done.deleted > 0

    async def _transaction(self, compare: list[Any], success: list[Any]) -> tuple[bool, int]:
        succeeded, responses = await self._call(
            lambda: self._client.transaction(compare=compare, success=success, failure=[])
        )
        revision = 0
        for response in responses:
            put = getattr(response, "response_put", None)
            if put is not None and put.header.revision:
                revision = int(put.header.revision)
        return bool(succeeded), revision

    def _guards(self, guards: Sequence[Guard]) -> list[Any]:
        tx = self._client.transactions
        return [tx.mod(key.encode("utf-8")) == revision for key, revision in guards]

    async def create(
        self, key: str, value: bytes, lease: int | None = None, guards: Sequence[Guard] = ()
    ) -> int | None:
        """Write ``key`` only if it does not exist (and every guard holds): its revision, or None."""
        tx = self._client.transactions
        encoded = key.encode("utf-8")
        compare = [tx.version(encoded) == 0, *self._guards(guards)]
        succeeded, revision = await self._transaction(compare, [tx.put(encoded, value, lease or None)])
        return revision if succeeded else None

    async def create_or_get(self, key: str, value: bytes) -> tuple[int | None, KeyValue | None]:
        """Write ``key`` if it does not exist: ``(its revision, None)``; else, read by the same call,
        ``(None, the key as it is)``."""
        tx = self._client.transactions
        encoded = key.encode("utf-8")
        succeeded, responses = await self._call(
            lambda: self._client.transaction(
                compare=[tx.version(encoded) == 0],
                success=[tx.put(encoded, value)],
                failure=[tx.get(encoded)],
            )
        )
        if succeeded:
            return int(responses[0].response_put.header.revision), None
        found = responses[0] if responses else []
        return None, (_key(found[0][1]) if found else None)

    async def compare_and_swap(
        self, key: str, value: bytes, mod_revision: int, guards: Sequence[Guard] = ()
    ) -> int | None:
        """Write ``key`` only if its ``mod_revision`` is still the given one (and every guard holds): the
        new revision, or None when someone else wrote first."""
        tx = self._client.transactions
        encoded = key.encode("utf-8")
        compare = [tx.mod(encoded) == mod_revision, *self._guards(guards)]
        succeeded, revision = await self._transaction(compare, [tx.put(encoded, value)])
        return revision if succeeded else None

    async def swap_all(self, items: Sequence[tuple[str, bytes, int]]) -> int | None:
        """Write every ``(key, value, mod_revision)`` in one transaction, only if each key's ``mod_revision``
        is still the given one: the revision they were written at, or None (nothing written) when any was
        written by someone else first."""
        tx = self._client.transactions
        compare = [tx.mod(key.encode("utf-8")) == revision for key, _, revision in items]
        success = [tx.put(key.encode("utf-8"), value) for key, value, _ in items]
        succeeded, revision = await self._transaction(compare, success)
        return revision if succeeded else None

    async def delete_if(self, key: str, mod_revision: int) -> bool:
        """Delete ``key`` only if its ``mod_revision`` is still the given one."""
        tx = self._client.transactions
        encoded = key.encode("utf-8")
        succeeded, _ = await self._transaction([tx.mod(encoded) == mod_revision], [tx.delete(encoded)])
        return succeeded

    # -- leases -------------------------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds (etcd's minimum is 2); its ID."""
        lease = await self._call(lambda: self._client.lease(ttl_s))
        return int(lease.id)

    async def keep_alive(self, lease_id: int, timeout_s: float | None = None) -> int:
        """Renew a lease once: its new TTL in seconds, <= 0 when it has already expired."""
        reply = await self._call(lambda: self._client.refresh_lease(lease_id), timeout_s)
        return int(reply.TTL) if reply is not None else 0

    async def revoke_lease(self, lease_id: int) -> None:
        """End a lease now: the keys bound to it are deleted at once."""
        await self._call(lambda: self._client.revoke_lease(lease_id))

    # -- watches ------------------------------------------------------------------------------------------

    def _watch(self, prefix: bytes, start_revision: int) -> Awaitable[Any]:
        return self._client.watch_prefix(prefix, start_revision=start_revision)

    async def _drop_refused(self, watch: Any) -> None:
        """Forget a watch etcd refused (aetcd took its refusal, "created" and "canceled" with watch id -1,
        for a watch made, which would never deliver anything)."""
        with contextlib.suppress(aetcd.exceptions.ClientError, TimeoutError):
            await asyncio.wait_for(watch.cancel(), self.timeout_s)

    async def watch_prefix(
        self, prefix: str, start_revision: int, retry_delay_s: float = 0.5
    ) -> AsyncGenerator[WatchEvent, None]:
        """Every change under ``prefix`` from ``start_revision`` on, in revision order, for ever: when the
        stream fails the watch is made again from the revision after the last event delivered.
        ``WatchCompacted`` when etcd no longer has those revisions (re-read, then watch again).

        A stream that ends is routine (etcd and gRPC reset streams) and is logged at INFO; a watch that
        cannot be made again is a WARNING, once per run of failures."""
        next_revision = start_revision
        encoded = prefix.encode("utf-8")
        failures = 0
        warned = False
        renewed_for_refusal = False
        while True:
            client = self._client
            try:
                watch = await self._call(functools.partial(self._watch, encoded, next_revision))
                if watch.watch_id < 0:
                    await self._drop_refused(watch)
                    raise EtcdRefusedWatch(f"etcd {','.join(self.urls)}: the watch was refused (watch id -1)")
            except WatchCompacted:
                raise
            except EtcdError as exc:
                if _timed_out(exc) and client is self._client:
                    # aetcd takes the next "created" answer on the stream for the watch it waits for: this
                    # create, answered late, would wire the next watch made on it to this range, its events
                    # delivered there and its own range's nowhere. A new channel leaves that answer behind.
                    self.renew("a watch was not made in time")
                elif isinstance(exc, EtcdRefusedWatch) and client is self._client and not renewed_for_refusal:
                    # The watch stream carries the auth token it was made with: one made while etcd was
                    # down carries a token etcd forgot when it restarted, and every watch made on it is
                    # refused. A new channel authenticates anew (once in a run of refusals: one that goes
                    # on is not the token's doing).
                    renewed_for_refusal = True
                    self.renew("etcd refused a watch: its stream's auth token may be one etcd forgot")
                failures += 1
                (log.debug if warned else log.warning)("etcd watch on %s: %s; retrying", prefix, exc)
                warned = True
                await asyncio.sleep(retry_delay_s)
                continue
            try:
                async for event in watch:
                    failures = 0
                    warned = False
                    renewed_for_refusal = False
                    kv = event.kv
                    deleted = event.kind == "DELETE"
                    change = WatchEvent(
                        kv.key.decode("utf-8"), None if deleted else bytes(kv.value), int(kv.mod_revision)
                    )
                    next_revision = change.mod_revision + 1
                    yield change
            except aetcd.exceptions.RevisionCompactedError as exc:
                raise WatchCompacted(str(exc)) from exc
            except aetcd.exceptions.ClientError as exc:
                _reraise_cancellation(exc)
                if isinstance(exc, aetcd.exceptions.UnauthenticatedError):
                    with contextlib.suppress(aetcd.exceptions.ClientError):
                        await self._client.reauthenticate()
                failures += 1
                (log.info if failures == 1 else log.debug)(
                    "etcd watch on %s ended (%s); watching again from revision %d",
                    prefix,
                    exc,
                    next_revision,
                )
                await asyncio.sleep(retry_delay_s)
            finally:
                with contextlib.suppress(aetcd.exceptions.ClientError, TimeoutError):
                    await asyncio.wait_for(watch.cancel(), self.timeout_s)
