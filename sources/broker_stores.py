"""Which store a standalone broker's checkpointed offsets were taken from, and what to do when it changed.

A broker's data directory wiped or replaced (a device swapped, a disk lost) starts its logs again at offset 0
under a new store identity (the offsets API's ``Timestone-Store``, ``broker_edge.storage.store_identity``).
Offsets of the old store mean nothing there: resuming at them would skip every record of the new logs below
them. So each broker's offsets name the store they were taken from, ``"#s<store id>": 0`` beside its topics
or positions (MQTT topic names cannot hold ``#``), and a batch whose start names another store than the
broker's now is refused (``failOnDataLoss``) or reads the new store from its start, once.

Offsets without the key (a checkpoint written before identities, a broker older than them, a broker down when
they were taken) adopt the broker's identity at the next listing. Reading a cluster, offsets name no store
(each member holds its own store of the replicated logs).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

__all__ = [
    "STORE_PREFIX",
    "StoreReplacedError",
    "answer_store_matches",
    "batch_bounds",
    "resumed_start",
    "store_key",
    "store_of",
    "with_stores",
    "without_store",
]

log = logging.getLogger(__name__)

Offsets = dict[str, dict[str, int]]
STORE_PREFIX = "#s"


class StoreReplacedError(RuntimeError):
    """A broker's store is not the one the query's offsets were taken from (its logs were replaced)."""

    def __init__(self, broker: str, recorded: str, current: str) -> None:
        super().__init__(
            f"timestone source: broker {broker!r} now serves store {current}, not store {recorded} that the "
            "checkpoint's offsets were taken from: its data directory was wiped or replaced, and its logs "
            "started again at offset 0. Set failOnDataLoss=false to read the new store's logs from their "
            "start (what the old store held past the checkpoint is lost), or start the query on a new "
            "checkpoint"
        )
        self.broker = broker
        self.recorded = recorded
        self.current = current


def store_key(store_id: str) -> str:
    return STORE_PREFIX + store_id


def store_of(offsets: Mapping[str, int]) -> str | None:
    """The store a broker's offsets name (None: none, a checkpoint written before identities)."""
    for key in offsets:
        if key.startswith(STORE_PREFIX):
            return key[len(STORE_PREFIX) :]
    return None


def without_store(offsets: Mapping[str, int]) -> dict[str, int]:
    return {key: value for key, value in offsets.items() if not key.startswith(STORE_PREFIX)}


def _replaced(
    broker: str, recorded: str | None, current: str | None, fail_on_data_loss: bool, what: str
) -> bool:
    """Whether ``recorded`` and ``current`` are both known and differ: raises, or warns, per the option."""
    if recorded is None or current is None or recorded == current:
        return False
    error = StoreReplacedError(broker, recorded, current)
    if fail_on_data_loss:
        raise error
    log.warning("%s; %s (failOnDataLoss=false)", error.args[0].split(". Set")[0], what)
    return True


def resumed_start(
    start: Mapping[str, Mapping[str, int]], current: Mapping[str, str | None], fail: bool
) -> Offsets:
    """``start`` without store keys, ready for the planner. A broker whose offsets name another store than
    ``current`` (the listed brokers' stores now) raises `StoreReplacedError` when ``fail``, else loses its
    offsets: every log of the new store is then new to the query, read from its start."""
    resumed: Offsets = {}
    for broker, keys in start.items():
        what = "its logs are read from their start"
        if broker in current and _replaced(broker, store_of(keys), current[broker], fail, what):
            continue
        resumed[broker] = without_store(keys)
    return resumed


def with_stores(
    offsets: Mapping[str, Mapping[str, int]],
    start: Mapping[str, Mapping[str, int]],
    current: Mapping[str, str | None],
) -> Offsets:
    """``offsets`` (the planner's, no store keys) with each broker naming its store: the one listed now
    (``current``), else the one ``start`` named (a broker down keeps its offsets and their store). A listed
    broker missing from ``offsets`` (no logs yet) is added with its store alone. Not sorted:
    ``offsets_planner.canonical`` the batch's offsets once they are complete."""
    named: Offsets = {broker: dict(keys) for broker, keys in offsets.items()}
    for broker in set(named) | {broker for broker, store in current.items() if store is not None}:
        store = current.get(broker) or store_of(start.get(broker, {}))
        if store is not None:
            named.setdefault(broker, {})[store_key(store)] = 0
    return named


def batch_bounds(
    start: Mapping[str, Mapping[str, int]],
    end: Mapping[str, Mapping[str, int]],
    current: Mapping[str, str | None],
    fail: bool,
) -> tuple[Offsets, Offsets]:
    """A batch's ``start`` and ``end`` for the planner (no store keys). A broker whose end names another
    store than its start was replaced before the batch was planned, which then chose to read the new store
    from its start: its start is dropped. A broker whose end names another store than ``current`` was
    replaced after (a batch replayed once its store is gone): raises, or reads nothing of it in this batch
    (the next batch reads the new store from its start)."""
    planned_start: Offsets = {}
    planned_end: Offsets = {}
    for broker, keys in end.items():
        recorded = store_of(keys)
        what = "this batch reads nothing of it, the next reads its logs from their start"
        if broker in current and _replaced(broker, recorded, current[broker], fail, what):
            continue
        planned_end[broker] = without_store(keys)
        begun = start.get(broker)
        began_in = store_of(begun) if begun is not None else None
        if begun is not None and (began_in is None or recorded is None or began_in == recorded):
            planned_start[broker] = without_store(begun)
    for broker, keys in start.items():
        if broker not in end:
            planned_start[broker] = without_store(keys)
    return planned_start, planned_end


def answer_store_matches(broker: str, planned: str | None, answered: str | None, fail: bool) -> bool:
    """Whether a fetch answer came from the store its batch was planned on (unknown counts as the same).
    A store replaced between planning and reading raises when ``fail``, else the task reads no more of it:
    the next batch reads the new store from its start."""
    what = "this task reads no more of it, the next batch reads its logs from their start"
    return not _replaced(broker, planned, answered, fail, what)
