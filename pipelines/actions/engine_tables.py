"""The actions engine's view of its Delta tables: the executions of the actions in flight kept in memory
between the engine's own commits, small snapshots read again only when a table moved, and versioned merges.

The engine holds the executions of the actions it works on, never the table: an action's rows are read
(filtered on its id as the table's files are read) the first time a batch touches it, kept up to date by
the engine's own merges, and dropped once the action has ended (:meth:`EngineTables.forget`). Each batch
(actions, reports or tick) looks up the table's Delta version and reads the held actions again only after
a commit the engine did not make (another writer, a restart); after its own merge it takes the next version
as the one it holds, which a commit by anyone else in between can never match, so that case is read again
too. Rows are filtered and converted in Arrow before any Python object is made: a report batch touches a
few thousand rows of an action that may have a hundred thousand.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.actions.checks import usable_as_topic_level
from pipelines.actions.states import Execution
from pipelines.actions.summary import FINAL_ACTION_STATES, state_counts
from sinks.store import Matching, TableStore

__all__ = [
    "ACTIONS",
    "COMPLIANCE",
    "DEVICES",
    "EXECUTIONS",
    "SUMMARY",
    "EngineTables",
    "counts_after",
    "epoch_ms",
]

EXECUTIONS = "action_executions"
SUMMARY = "action_summary"
ACTIONS = "actions"
DEVICES = "devices"
COMPLIANCE = "fleet_compliance"
_INT64 = pa.int64()
log = logging.getLogger(__name__)
TIME_COLUMNS = (
    "queued_at",
    "published_at",
    "updated_at",
    "started_at",
    "finished_at",
    "retry_at",
    "expires_at",
    "sending_at",
)


class EngineTables:
    """The tables of one engine; not thread-safe (the engine's lock serialises its callers)."""

    def __init__(self, store: TableStore) -> None:
        self.store = store
        self._cached: pa.Table | None = None
        """The executions of the actions in ``_held`` as of Delta version ``_cached_version`` (timestamps as
        epoch ms), or None."""
        self._held: set[str] = set()
        """The actions whose executions ``_cached`` holds, each with all its rows."""
        self._cached_version = -1
        self._unusable: set[str | None] = set()
        """Device ids of ``devices`` that are no topic level, warned about."""
        self._accepted: tuple[pa.Table, dict[str, str]] | None = None
        """The summary snapshot last read for :meth:`accepted_payloads`, and what they were in it."""
        self._snapshots: dict[str, tuple[int, pa.Table]] = {}
        """The small tables (a row per action, or per group and version) as last read, by name: (Delta
        version, rows)."""
        for name in (ACTIONS, EXECUTIONS, SUMMARY, DEVICES, COMPLIANCE):
            store.ensure(name)

    def read(self, name: str) -> pa.Table:
        """The table ``name`` as of now, read again only when its version moved (the ticker looks every
        second at ``actions`` and ``action_summary``, which change far less often). For the tables with a
        row per action or fewer: ``action_executions`` and ``devices`` are read filtered."""
        if name in (EXECUTIONS, DEVICES):
            raise ValueError(f"{name} is read filtered, never whole")
        version = self.store.version(name)  # before the read: a commit after it is read next time
        snapshot = self._snapshots.get(name)
        if snapshot is None or snapshot[0] != version:
            snapshot = self._snapshots[name] = (version, self.store.read_arrow(name))
        return snapshot[1]

    def rows_under(self, action_id: str) -> int:
        """How many rows of ``actions`` have the id ``action_id`` (more than one: rows were appended)."""
        table = self.read(ACTIONS)
        return int(pc.sum(pc.equal(table["id"], action_id)).as_py() or 0)

    def targets(self, group: str | None) -> list[str]:
        """The ids of ``group``'s devices (None: every device), read with the group pushed down to the
        table and only the id column. An id that cannot be one topic level (a row another tool wrote) is
        no target: sent on its own topic, it would make the broker close the job's connection; each such id
        is named in a WARNING once."""
        where = () if group is None else (Matching("group", (group,)),)
        devices = self.store.read_arrow(DEVICES, where=where, columns=["device_id"])
        ids = set(devices["device_id"].to_pylist())
        unusable = sorted((i for i in ids if not usable_as_topic_level(i)), key=repr)
        new = [i for i in unusable if i not in self._unusable]
        if new:
            self._unusable.update(new)
            shown = ", ".join(repr(i) for i in new[:5]) + (
                f" and {len(new) - 5} more" if len(new) > 5 else ""
            )
            log.warning("devices: ids that are no topic level left out of every target: %s", shown)
        return sorted(ids.difference(unusable))

    def groups_of(self, device_ids: Iterable[str]) -> dict[str, str | None]:
        """The registered group of each of ``device_ids`` that the ``devices`` table holds (read with the
        ids pushed down; a device it does not hold is not in the result)."""
        ids = tuple(sorted(set(device_ids)))
        if not ids:
            return {}
        devices = self.store.read_arrow(
            DEVICES, where=(Matching("device_id", ids),), columns=["device_id", "group"]
        )
        return dict(zip(devices["device_id"].to_pylist(), devices["group"].to_pylist(), strict=True))

    def version(self, name: str) -> int:
        return self.store.version(name)

    def unended_without_row(self) -> list[str]:
        """The summarised actions that have not ended and have no row in ``actions`` (deleted by hand)."""
        summary = self.read(SUMMARY)
        unended = pc.invert(
            pc.is_in(summary["action_state"], value_set=pa.array(sorted(FINAL_ACTION_STATES), pa.string()))
        )
        gone = pc.invert(pc.is_in(summary["action_id"], value_set=self.read(ACTIONS)["id"]))
        return sorted(summary.filter(pc.and_(unended, gone))["action_id"].to_pylist())

    def accepted_payloads(self) -> dict[str, str]:
        """Each summarised action's ``accepted_payload`` (the kind and payload it was taken in with)."""
        table = self.read(SUMMARY)
        if self._accepted is None or self._accepted[0] is not table:
            ids, builds = table["action_id"].to_pylist(), table["accepted_payload"].to_pylist()
            self._accepted = (table, {a: b for a, b in zip(ids, builds, strict=True) if b is not None})
        return self._accepted[1]

    def summary_rows(self, action_ids: list[str]) -> dict[str, dict]:
        """Each summarised action's ``action_summary`` row."""
        table = self.read(SUMMARY)
        table = table.filter(pc.is_in(table["action_id"], pa.array(action_ids, pa.string())))
        return {row["action_id"]: row for row in table.to_pylist()}

    def merge_summary(self, rows: pa.Table, app_id: str, batch_id: int) -> None:
        if self.store.merge(SUMMARY, rows, app_id, batch_id):
            self._replace_rows(SUMMARY, rows, "action_id")

    def _replace_rows(self, name: str, rows: pa.Table, key: str) -> None:
        """After a merge of ``rows`` (keyed by ``key``) that committed: the snapshot of ``name`` with them in
        place, as of the version after the snapshot's (see :meth:`write_executions` for why that guess is
        safe)."""
        snapshot = self._snapshots.get(name)
        if snapshot is None:
            return
        version, table = snapshot
        kept = table.filter(pc.invert(pc.is_in(table[key], value_set=rows[key])))
        self._snapshots[name] = (version + 1, pa.concat_tables([kept, in_order_of(rows, table.schema)]))

    # -- executions -----------------------------------------------------------------------------------------

    @property
    def held(self) -> pa.Table | None:
        """The executions held in memory: those of the actions not yet ended that a batch touched."""
        return self._cached

    @property
    def held_actions(self) -> frozenset[str]:
        """The actions whose executions are held in memory."""
        return frozenset(self._held)

    def forget(self, action_ids: Iterable[str]) -> None:
        """Drop the executions of ``action_ids`` (actions that ended) from memory; a later batch that
        touches one reads its rows again."""
        gone = self._held & set(action_ids)
        self._held -= gone
        if gone and self._cached is not None:
            self._cached = self._cached.filter(pc.invert(pc.is_in(self._cached["action_id"], _ids(gone))))

    def execution_table(self, action_ids: Iterable[str]) -> pa.Table:
        """The executions of ``action_ids`` with their timestamps as epoch ms, held from then on: an action
        not held is read (only its rows) and kept up to date by :meth:`write_executions` as long as the
        engine's commits are the only ones (all held actions are read again after any other: only the
        table's version is looked up per batch, not its data). A row written before retries existed is its
        first attempt."""
        wanted = set(action_ids)
        version = self.store.version(EXECUTIONS)  # before a read: a commit after it is seen as foreign
        if self._cached is None or version != self._cached_version:
            held = self._held | wanted
            self._cached, self._held, self._cached_version = self._read_executions(held), held, version
        elif wanted - self._held:
            missing = wanted - self._held
            self._cached = pa.concat_tables([self._cached, self._read_executions(missing)])
            self._held |= missing
        return self._cached.filter(pc.is_in(self._cached["action_id"], _ids(wanted)))

    def _read_executions(self, action_ids: set[str]) -> pa.Table:
        """The rows of ``action_ids``, filtered as the table is read, timestamps as epoch ms."""
        where = (Matching("action_id", tuple(sorted(action_ids))),)
        table = self.store.read_arrow(EXECUTIONS, where=where)
        for column in TIME_COLUMNS:  # the table's timestamps → epoch ms, without a datetime per value
            table = table.set_column(table.schema.get_field_index(column), column, epoch_ms(table[column]))
        attempts = pc.fill_null(table["attempt"], 1)
        return table.set_column(table.schema.get_field_index("attempt"), "attempt", attempts)

    def executions_and_counts(
        self, action_ids: list[str], device_ids: Iterable[str] | None = None
    ) -> tuple[dict[str, dict[str, Execution]], dict[str, Counter]]:
        """Execution rows of ``action_ids`` (only those of ``device_ids`` when given), by action and device,
        and every execution of those actions counted per state: from one read of the table."""
        table = self.execution_table(action_ids)
        counts = _group_counts(table)
        if device_ids is not None:
            table = table.filter(pc.is_in(table["device_id"], pa.array(list(device_ids), pa.string())))
        out: dict[str, dict[str, Execution]] = {}
        for row in table.to_pylist():
            out.setdefault(row["action_id"], {})[row["device_id"]] = Execution(**row)
        return out, counts

    def executions(self, action_ids: list[str]) -> dict[str, dict[str, Execution]]:
        return self.executions_and_counts(action_ids)[0]

    def state_counts(self, action_ids: list[str]) -> dict[str, Counter]:
        """Executions per state of each action, counted in Arrow (no Python object per row)."""
        return _group_counts(self.execution_table(action_ids))

    def retries(self, action_ids: list[str]) -> dict[str, int]:
        """Retries of each action so far, over its devices (their attempts beyond the first)."""
        table = self.execution_table(action_ids)
        grouped = table.group_by("action_id").aggregate([("attempt", "sum"), ("attempt", "count")])
        return {
            action_id: int(total - count)
            for action_id, total, count in zip(
                grouped["action_id"].to_pylist(),
                grouped["attempt_sum"].to_pylist(),
                grouped["attempt_count"].to_pylist(),
                strict=True,
            )
        }

    def write_executions(self, rows: list[Execution], app_id: str, batch_id: int) -> None:
        """One merge of ``rows`` keyed by (action, device), each replacing an older version of its row; the
        store reads only the files that may hold rows of the actions written."""
        if not rows:
            return
        cached, self._cached = self._cached, None  # forgotten unless the merge is known to be the next commit
        schema = self.store.spec(EXECUTIONS).arrow_schema
        epoch_ms = pa.table(
            {
                name: pa.array([getattr(row, name) for row in rows], _INT64 if name in TIME_COLUMNS else None)
                for name in schema.names
            }
        )
        table = epoch_ms
        for column in TIME_COLUMNS:  # epoch ms → the table's timestamp type, without a datetime per value
            stamps = epoch_ms[column].cast(pa.timestamp("ms", tz="UTC"))
            table = table.set_column(table.schema.get_field_index(column), column, stamps)
        table = table.cast(schema)
        touched = (Matching("action_id", tuple(sorted(set(epoch_ms["action_id"].to_pylist())))),)
        written = self.store.merge(
            EXECUTIONS, table, app_id, batch_id, update_when="s.version > t.version", target_where=touched
        )
        if cached is None or not written:
            return
        # The cache becomes "version + 1" without asking the table: if another writer committed in between,
        # this merge is a later version, no version ever equals the guess again, and the next batch, seeing
        # the table's version differ, reads it. Only when this merge was the next commit does the guess hold.
        keys = pc.binary_join_element_wise(cached["action_id"], cached["device_id"], "\x00")
        replaced = pc.binary_join_element_wise(epoch_ms["action_id"], epoch_ms["device_id"], "\x00")
        kept = cached.filter(pc.invert(pc.is_in(keys, value_set=replaced)))
        of_held = epoch_ms.filter(pc.is_in(epoch_ms["action_id"], _ids(self._held)))  # held: all or none
        self._cached = pa.concat_tables([kept, in_order_of(of_held, cached.schema)])
        self._cached_version += 1


def in_order_of(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` (written in the catalog's column order) as a table read back has its columns: a table that
    gained columns, or one another tool made, may hold them in another order."""
    return rows.select(schema.names).cast(schema)


def epoch_ms(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A table's timestamps as epoch milliseconds, truncated: a row another writer wrote to the microsecond
    is read, not refused."""
    return column.cast(pa.timestamp("ms", tz="UTC"), safe=False).cast(pa.int64())


def _ids(action_ids: Iterable[str]) -> pa.Array:
    return pa.array(sorted(action_ids), pa.string())


def _group_counts(table: pa.Table) -> dict[str, Counter]:
    """Executions per state of each action in ``table``, counted in Arrow (no Python object per row)."""
    grouped = table.group_by(["action_id", "state"]).aggregate([("device_id", "count")])
    out: dict[str, Counter] = {}
    for action_id, state, count in zip(
        grouped["action_id"].to_pylist(),
        grouped["state"].to_pylist(),
        grouped["device_id_count"].to_pylist(),
        strict=True,
    ):
        out.setdefault(action_id, state_counts([]))[state] = count
    return out


def counts_after(
    counts: dict[str, Counter], known: dict[str, dict[str, Execution]], changed: Iterable[Execution]
) -> dict[str, Counter]:
    """``counts`` (read with ``known``) once ``changed`` replaced the rows they update (or were added)."""
    out = {action_id: Counter(counted) for action_id, counted in counts.items()}
    for row in changed:
        counted = out.setdefault(row.action_id, state_counts([]))
        before = known.get(row.action_id, {}).get(row.device_id)
        if before is not None:
            counted[before.state] -= 1
        counted[row.state] += 1
    return out
