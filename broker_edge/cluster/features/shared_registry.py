"""Which brokers have members of which shared group, kept in etcd: one key per broker, under its lease.

``<prefix>/shared/<node_id>`` holds JSON ``{"groups": [[group, filter], ...]}``: the shared subscriptions
this broker has at least one member of. It is written when that set changes (a group's first member joins
here, or its last one leaves: not on every SUBSCRIBE) and after every registration under a new lease; it is
bound to the member lease, so it goes when the broker does. Every broker follows the prefix into its
``SharedDirectory``; its own entry there is updated at once, without waiting for etcd.

A small, slowly changing fact: nothing here is on the path of a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from broker_edge.cluster.coordination.etcd import EtcdError, WatchCompacted
from broker_edge.cluster.coordination.etcd_values import load_json
from broker_edge.cluster.tasks import stop_task
from broker_edge.protocol.errors import InvalidTopic
from broker_edge.protocol.topics import validate_topic_filter

if TYPE_CHECKING:
    from broker_edge.cluster.coordination.etcd import Etcd
    from broker_edge.cluster.coordination.membership import Membership
    from broker_edge.cluster.features.shared_directory import GroupKey, SharedDirectory

__all__ = ["SharedRegistry", "decode_groups", "encode_groups"]

log = logging.getLogger("broker_edge.cluster.shared_registry")

RETRY_S = 0.5


def encode_groups(groups: set[GroupKey]) -> bytes:
    return json.dumps({"groups": sorted([group, topic_filter] for group, topic_filter in groups)}).encode()


def decode_groups(value: bytes) -> set[GroupKey]:
    """The groups of a registry value (``ValueError`` when it is not one)."""
    groups = load_json(value, "shared groups").get("groups")
    if not isinstance(groups, list) or not all(
        isinstance(entry, list) and len(entry) == 2 and all(isinstance(part, str) for part in entry)
        for entry in groups
    ):
        raise ValueError('expected {"groups": [[group, filter], ...]}')
    for group, topic_filter in groups:
        try:
            validate_topic_filter(f"$share/{group}/{topic_filter}")
        except InvalidTopic as error:
            raise ValueError(str(error)) from None
    return {(group, topic_filter) for group, topic_filter in groups}


class SharedRegistry:
    """This broker's shared groups in etcd, and every other broker's from etcd, in ``directory``."""

    def __init__(
        self,
        node_id: str,
        directory: SharedDirectory,
        etcd: Etcd | None,
        key_prefix: str,
        membership: Membership | None,
    ) -> None:
        self.node_id = node_id
        self.directory = directory
        self.etcd = etcd
        self.prefix = f"{key_prefix}/shared/"
        self.membership = membership
        self._members: Counter[GroupKey] = Counter()
        self._others: set[str] = set()
        """Other brokers with an entry, as last read."""
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        if membership is not None:
            membership.on_registered(self._dirty.set)

    # -- this broker's members (the ``shared_members`` port) ------------------------------------------------

    def count_existing(self, subscriptions: Iterable[tuple[str, object, object, str | None]]) -> None:
        """Count the shared subscriptions made before the router told this registry of changes
        (``SubscriptionTrie.subscriptions()``: filter, subscriber, options, group)."""
        for topic_filter, _subscriber, _options, group in subscriptions:
            if group is not None:
                self.member_changed(group, topic_filter, True)

    def member_changed(self, group: str, topic_filter: str, joined: bool) -> None:
        key = (group, topic_filter)
        members = self._members
        before = members[key]
        members[key] = before + (1 if joined else -1)
        if members[key] <= 0:
            del members[key]
        if (before == 0) != (key not in members):
            self.directory.replace(self.node_id, set(members))
            self._dirty.set()

    # -- etcd ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.etcd is None:
            return
        loop = asyncio.get_running_loop()
        self._dirty.set()
        self._tasks = [
            loop.create_task(self._write_forever(), name="cluster-shared-registry-write"),
            loop.create_task(self._follow_forever(), name="cluster-shared-registry-watch"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            await stop_task(task)
        self._tasks = []

    async def _write_forever(self) -> None:
        assert self.etcd is not None
        while True:
            await self._dirty.wait()
            membership = self.membership
            if membership is not None:
                await membership.wait_registered()
            self._dirty.clear()
            lease = membership.lease_id if membership is not None else None
            try:
                await self.etcd.put(self.prefix + self.node_id, encode_groups(set(self._members)), lease)
            except EtcdError as exc:
                log.warning("writing this broker's shared groups to etcd failed: %s; retrying", exc)
                self._dirty.set()
                await asyncio.sleep(RETRY_S)

    async def _follow_forever(self) -> None:
        assert self.etcd is not None
        while True:
            try:
                revision = await self._load()
                watch = self.etcd.watch_prefix(self.prefix, revision + 1)
                async with contextlib.aclosing(watch) as events:
                    async for event in events:
                        self._apply(event.key, event.value)
            except (WatchCompacted, EtcdError) as exc:
                log.warning("following the shared groups in etcd: %s; reading them again", exc)
                await asyncio.sleep(RETRY_S)

    async def _load(self) -> int:
        assert self.etcd is not None
        found, revision = await self.etcd.get_prefix(self.prefix)
        present = set()
        for kv in found:
            self._apply(kv.key, kv.value)
            present.add(kv.key[len(self.prefix) :])
        for node in self._others - present:
            self._apply(self.prefix + node, None)
        return revision

    def _apply(self, key: str, value: bytes | None) -> None:
        node = key[len(self.prefix) :]
        if node == self.node_id or not node:
            return  # this broker's own entry is what it holds, not what etcd last said
        if value is None:
            self._others.discard(node)
            self.directory.remove(node)
            return
        try:
            groups = decode_groups(value)
        except (ValueError, TypeError) as exc:
            log.error("shared groups of %s in etcd are not readable (%s): ignored", node, exc)
            return
        self._others.add(node)
        self.directory.replace(node, groups)
