"""The store's appends: records of publishes into their topics' logs, a loop turn's topics in one call.

``persist_as`` says whether a publish is logged (the persistence rules) and whether it creates its topic's
log; ``append_batches`` appends a loop turn's batches, one per topic, telling the group commit once per
partition; a topic over the store's limits (``max_topics``, a log set aside) is refused alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .errors import (
    StorageError,
)
from .persistence import CREATES_LOG, LOGGED, NOT_LOGGED
from .record import RecordFields
from .store_state import StoreState, _NewTopics
from .topic_table import NO_RULE

if TYPE_CHECKING:
    pass

log = logging.getLogger("broker_edge.storage.store")

__all__ = ["ASKED_MAX", "Appends"]

ASKED_MAX = 16_384
"""Topic ids `persist_as` keeps at most for the next publishes on their topics (`StoreState._asked`): a
fleet of that many devices finds each one's in a dict, not by probing the topic table; about 1 MiB full."""

_PartitionAppends = tuple[list[tuple[int, Sequence[RecordFields]]], list[int]]
"""A loop turn's appends to one partition, (topic id, records) each, and the index of each's batch."""


class Appends(StoreState):
    """Appending records (see the module docstring)."""

    def should_persist(self, topic: str, qos: int) -> bool:
        """Whether a publish on `topic` with `qos` goes to the log (the persistence rules decide)."""
        return self.persist_as(topic, qos) != NOT_LOGGED

    def persist_as(self, topic: str, qos: int) -> int:
        """`should_persist`, and whether appending would create the topic's log, with one lookup of the
        topic: `NOT_LOGGED`, `LOGGED` or `CREATES_LOG` (a publish handler checks a client's topic quota for
        the last only; asking `in` apart looked every topic up once more per publish)."""
        rules = self.rules
        if qos not in rules.logged_qos:  # QoS 0 with the default rules: no topic looked up
            return NOT_LOGGED
        asked = self._asked
        topic_id = asked.get(topic)  # a topic asked for already (a fleet's, a fan-in's: most publishes)
        if topic_id is None:
            topic_id = self._ids.get(topic)
            if topic_id is None:
                return CREATES_LOG if rules.should_persist(topic, qos) else NOT_LOGGED
            if len(asked) >= ASKED_MAX:
                asked.clear()
            asked[topic] = topic_id
        rule = self._table.rule[topic_id]  # (`_rule_of`, its common case inlined: the rule is known)
        if qos not in rules.qos_of_rule[rule if rule != NO_RULE else self._rule_of(topic_id)]:
            return NOT_LOGGED
        return LOGGED

    def append(self, topic: str, record) -> int:
        """Append to `topic`'s log (created on first use) and return the offset; ack after `when_durable`."""
        fields = record.fields()
        return self.append_batch(topic, [fields[:7] + fields[8:]], fields[7])

    def append_message(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        retain: bool = False,
        client_id: str = "",
        user_properties: Sequence[tuple[str, str]] = (),
        content_type: str | None = None,
        payload_format_indicator: int | None = None,
        timestamp_ms: int | None = None,
        message_expiry_interval: int | None = None,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
    ) -> int:
        """`append` from the fields of a publish (no `AppendRecord` per publish)."""
        fields = (
            payload, qos, retain, client_id, user_properties, content_type, payload_format_indicator,
            message_expiry_interval, response_topic, correlation_data,
        )  # fmt: skip
        return self.append_batch(topic, [fields], timestamp_ms)

    def append_batch(
        self, topic: str, records: Sequence[RecordFields], timestamp_ms: int | None = None
    ) -> int:
        """Append `records` to `topic`'s log with one broker time; returns the first offset (record i gets
        it + i). All or nothing; a new log counts for the first record's client id."""
        topic_id = self._writable_id(topic, records[0][3] if records else "")
        if not records:
            return self._table.next[topic_id]
        part = self._partitions[self._table.partition[topic_id]]
        timestamp = self._clock.wall_ms() if timestamp_ms is None else timestamp_ms
        first = part.append(topic_id, records, timestamp)
        self._committer.appended_many(part, len(records), part.last_append_size)
        return first

    def append_batches(
        self, batches: Sequence[tuple[str, Sequence[RecordFields]]]
    ) -> list[int | StorageError]:
        """`append_batch` of each (topic, records), with one broker time: the first offset of each, or the
        `StorageError` that refused that batch alone (the others are appended all the same).

        A publish path with a topic per device has a batch per message: each partition takes its share in one
        call (`PartitionLog.append_many`: one loop encodes and indexes them), and the group committer learns
        of them once per partition, not once per topic. `fsync` durability (a job per append) takes them one
        by one."""
        if self.config.durability == "fsync":
            return [self._append_or_error(topic, records, None) for topic, records in batches]
        timestamp = self._clock.wall_ms()
        results, groups = self._writable_groups(batches)
        committer = self._committer
        for number, (appends, indexes) in groups.items():
            part = self._partitions[number]
            firsts, count, size = part.append_many(appends, timestamp)
            if len(firsts) == len(results):  # every batch, in order: one partition, no topic refused
                results = firsts
            else:
                for index, first in zip(indexes, firsts, strict=True):
                    results[index] = first
            if count:
                committer.appended_many(part, count, size)
        return results

    def _writable_groups(
        self, batches: Sequence[tuple[str, Sequence[RecordFields]]]
    ) -> tuple[list[int | StorageError], dict[int, _PartitionAppends]]:
        """`_writable_ids` of the batches, grouped by partition: each (topic id, records) with its batch's
        index."""
        results, appends, indexes = self._writable_ids(batches)
        if len(self._partitions) == 1:
            return results, {0: (appends, indexes)} if appends else {}
        partition_of = self._table.partition
        groups: dict[int, _PartitionAppends] = {}
        for append, index in zip(appends, indexes, strict=True):
            group = groups.setdefault(partition_of[append[0]], ([], []))
            group[0].append(append)
            group[1].append(index)
        return results, groups

    def _writable_ids(
        self, batches: Sequence[tuple[str, Sequence[RecordFields]]]
    ) -> tuple[list[int | StorageError], list[tuple[int, Sequence[RecordFields]]], list[int]]:
        """A result per batch: the `StorageError` of a topic that cannot be written now, a placeholder
        otherwise; and the others' (topic id, records) (logs created on first use) with their batch's index.
        The turn's new topics get their rows in the topic table and places in the listing together."""
        ids_get, committer = self._ids.get, self._committer
        asked_get = self._asked.get
        refusing = committer.failure is not None or committer.shortage is not None or bool(self._quarantined)
        results: list[int | StorageError] = []
        appends: list[tuple[int, Sequence[RecordFields]]] = []
        indexes: list[int] = []
        new = _NewTopics()
        try:
            for index, (topic, records) in enumerate(batches):
                topic_id = asked_get(topic)
                if topic_id is None:
                    topic_id = ids_get(topic)
                try:
                    if topic_id is None:
                        topic_id = self._register(topic, records[0][3] if records else "", new)
                    elif refusing:
                        self._check_writable()
                        self._refuse_quarantined(topic, topic_id)
                except StorageError as error:
                    results.append(error)
                    continue
                results.append(topic_id)
                appends.append((topic_id, records))
                indexes.append(index)
        finally:
            if new.names:
                self._add_new(new)
        return results, appends, indexes

    def _append_or_error(
        self, topic: str, records: Sequence[RecordFields], timestamp_ms: int | None
    ) -> int | StorageError:
        try:
            return self.append_batch(topic, records, timestamp_ms)
        except StorageError as error:
            return error

    def logs_created_by(self, client_id: str) -> int:
        """Logs created by appends of `client_id` since the store was opened."""
        return self._created_by.get(client_id, 0)
