"""The one interface pipelines use for Delta tables, and the choice of backend.

Two backends implement :class:`TableStore`: ``delta_rs`` (embedded, no Delta jars, what runs locally and in
CI) and ``delta_native`` (Spark's own Delta, on a cluster that ships it). Pipelines never import either;
they call :func:`open_table_store` and code against this interface.

Exactly-once writes: every ``append``/``merge`` carries ``(app_id, batch_id)``. The store records it in the
same Delta commit as the data (a Delta ``txn`` action) and skips a batch whose id is not above the last one
recorded for that app id, returning ``False``. A streaming query passes its query id (stable across restarts
from one checkpoint) and the micro-batch id, so a batch replayed after a crash writes nothing twice.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sinks.tables import TableCatalog, TableSpec

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import DataFrame

#: Arrow data or a Spark DataFrame: what ``append`` and ``merge`` accept.
TableData = Any

#: How a write names its batch in its commit's metadata (``userMetadata`` natively, a commitInfo key with
#: delta-rs), so the commit of a batch can be found in a table's history.
MARKER_PREFIX = "timestone:"
COMMIT_MARKER_KEY = "timestone.batch"


@dataclass(frozen=True)
class TimeRange:
    """Rows whose timestamp ``column`` lies in [``low_us``, ``high_us``] (epoch microseconds, inclusive).

    Given to :meth:`TableStore.read`, it lets a store open only the files that may hold such rows (by the
    files' Delta statistics): the cost of a read then follows the rows in the range, not the table's size.
    """

    column: str
    low_us: int
    high_us: int

    def __post_init__(self) -> None:
        if self.low_us > self.high_us:
            raise ValueError(f"an empty time range: {self.low_us} > {self.high_us}")

    def rows(self, frame: DataFrame) -> DataFrame:
        """``frame``'s rows in the range."""
        from pyspark.sql import functions as F

        low, high = (F.timestamp_micros(F.lit(bound)) for bound in (self.low_us, self.high_us))
        return frame.where(F.col(self.column).between(low, high))

    def arrow_rows(self, table: pa.Table) -> pa.Table:
        """``table``'s rows in the range."""
        import pyarrow as pa
        import pyarrow.compute as pc

        micros = table.column(self.column).cast(pa.timestamp("us", "UTC")).cast(pa.int64())
        inside = pc.and_(pc.greater_equal(micros, self.low_us), pc.less_equal(micros, self.high_us))
        return table.filter(inside)


@dataclass(frozen=True)
class Matching:
    """Rows whose ``column`` holds one of ``values``.

    Given to :meth:`TableStore.read_arrow` or :meth:`TableStore.scan_arrow`, it is applied while the files
    are read, each record batch filtered before it is kept, so the rows materialised are the rows asked
    for, not the table.
    """

    column: str
    values: tuple[Any, ...]

    def rows(self, frame: DataFrame) -> DataFrame:
        """``frame``'s matching rows."""
        from pyspark.sql import functions as F

        return frame.where(F.col(self.column).isin(list(self.values)))

    def expression(self, value_type: pa.DataType) -> pc.Expression:
        """The filter as a pyarrow dataset expression on a column of ``value_type`` (cast: a file may hold
        the column as another type, string views for strings)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        return pc.field(self.column).cast(value_type).isin(pa.array(list(self.values), value_type))

    def statistics_expression(self, value_type: pa.DataType) -> pc.Expression:
        """The filter on the bare column, which a dataset whose fragments carry their files' statistics as
        expressions (delta-rs' ``to_pyarrow_dataset``) can rule fragments out with."""
        import pyarrow as pa
        import pyarrow.compute as pc

        return pc.field(self.column).isin(pa.array(list(self.values), value_type))


#: The table property bounding how long removed files stay (what ``vacuum`` keeps by default).
DELETED_FILE_RETENTION = "delta.deletedFileRetentionDuration"
#: The table property bounding how long log entries stay.
LOG_RETENTION = "delta.logRetentionDuration"


def retention_interval(hours: float) -> str:
    """A retention period as a Delta table property value, to the second (``interval 3600 seconds``)."""
    return f"interval {round(hours * 3600)} seconds"


def commit_marker(app_id: str, batch_id: int) -> str:
    return f"{MARKER_PREFIX}{app_id}:{batch_id}"


class TableStoreError(RuntimeError):
    """A table operation failed for a reason the caller should see (missing table, unsupported feature)."""


class TableStore(ABC):
    """Delta tables of one deployment, addressed by their spec name.

    Every method takes the table *name* as declared in the catalog; locations come from the catalog and the
    store's root, never from the caller.
    """

    backend: str

    def __init__(self, catalog: TableCatalog) -> None:
        self.catalog = catalog

    def spec(self, name: str) -> TableSpec:
        return self.catalog[name]

    @abstractmethod
    def location(self, name: str) -> str:
        """Path or URI of the table (or its qualified name when the store addresses tables by name)."""

    @abstractmethod
    def exists(self, name: str) -> bool: ...

    @abstractmethod
    def ensure(self, name: str) -> None:
        """Create the table as declared if missing; add declared columns and properties it lacks.

        Existing columns are never changed: a type or partitioning that differs from the spec is an error.
        """

    def ensure_all(self) -> None:
        for name in self.catalog:
            self.ensure(name)

    @abstractmethod
    def append(self, name: str, data: TableData, app_id: str, batch_id: int) -> bool:
        """Append rows once per ``(app_id, batch_id)``; ``False`` when that batch was already committed."""

    @abstractmethod
    def merge(
        self,
        name: str,
        data: TableData,
        app_id: str,
        batch_id: int,
        keys: tuple[str, ...] | list[str] | None = None,
        update_when: str | None = None,
        insert_when: str | None = None,
        delete_when: str | None = None,
        *,
        update: bool = True,
        insert: bool = True,
        update_set: Mapping[str, str] | None = None,
        target_where: Sequence[Matching] = (),
    ) -> bool:
        """Upsert rows once per ``(app_id, batch_id)``; ``False`` when that batch was already committed.

        Rows match on ``keys`` (default: the spec's merge keys), which must be unique in ``data``. The
        predicates are SQL over the source alias ``s`` and the target alias ``t``, e.g.
        ``"s.version > t.version"``; keep them to plain comparisons and boolean logic so that both backends
        (DataFusion in delta-rs, Spark SQL natively) read them the same way. Matched rows are deleted when
        ``delete_when`` holds, else updated when ``update`` and ``update_when`` (if any) hold; unmatched rows
        are inserted (all columns) when ``insert`` and ``insert_when`` (if any) hold. An update sets every
        column from the source, or, with ``update_set`` (column -> SQL expression), only those columns, e.g.
        ``{"firmware_version": "coalesce(s.firmware_version, t.firmware_version)"}`` to keep stored values
        the batch does not know.

        ``target_where``: stored rows outside it are never matched, so the store reads only the target's
        files that may hold rows within it (Delta's file statistics), not the whole table. Give it when every
        source row's keys fall within it (the ids of the rows merged): it then changes nothing but the cost.
        """

    @abstractmethod
    def read(self, name: str, within: TimeRange | None = None) -> DataFrame:
        """The current snapshot as a Spark DataFrame in the table's own schema (empty table: no rows).

        The columns are the table's, as written: a column the catalog does not declare is read too, and one
        it declares that the table lacks is not made up as nulls (``ensure`` adds declared columns).

        The snapshot is the one current when ``read`` is called: commits made after it, even before the
        DataFrame runs, are not in it (pipelines rely on this to read a table "as it was before" a write).
        With ``within``, only the rows in that range, read from the files whose statistics allow them.
        """

    @abstractmethod
    def compact(self, name: str, target_bytes: int, min_files: int = 2, *, settle_s: float = 600.0) -> int:
        """Rewrite the table's data files smaller than ``target_bytes`` into fewer, larger ones.

        Files are bin-packed within their partition; a partition is left alone until it holds at least
        ``min_files`` such files (so a growing file is not rewritten for every new one). The rows and the
        batch markers do not change (a commit without data change: appends and readers carry on, and
        streams of the table's changes see nothing); files removed stay on disk until :meth:`vacuum`.
        Returns the number of files removed (0: nothing to do).

        A table declared with ``cluster_by`` is clustered by that column instead, so that each file holds
        few of its values (:mod:`sinks.clustering`): a value's own file is packed with others once it has
        not been written for ``settle_s`` seconds, and runs of packed files follow ``min_files`` as above.
        """

    @abstractmethod
    def vacuum(self, name: str, retention_hours: float) -> int | None:
        """Delete the table's data files that no snapshot of the last ``retention_hours`` references:
        files compaction, merges or overwrites removed, and files of writes that never committed.

        A reader of a snapshot younger than that still finds its files. Returns the number of files
        deleted (None when the backend does not say).
        """

    @abstractmethod
    def tidy_log(self, name: str) -> int | None:
        """Checkpoint the table's Delta log and delete the log entries older than its
        ``delta.logRetentionDuration`` that the checkpoint makes unnecessary.

        The batch markers (``txn``) live on in the checkpoint. Returns the number of log entries deleted
        (None when the backend does not say, or does this itself).
        """

    @abstractmethod
    def set_properties(self, name: str, properties: Mapping[str, str]) -> bool:
        """Set table properties whose value differs (one commit); False when all already had it."""

    @abstractmethod
    def data_files(self, name: str) -> int:
        """How many data files the current snapshot holds."""

    @abstractmethod
    def read_arrow(
        self,
        name: str,
        within: TimeRange | None = None,
        *,
        where: Sequence[Matching] = (),
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """The current snapshot as Arrow in the table's own schema, as :meth:`read` (for small tables, small
        ranges, tests); with ``within``, as :meth:`read` narrows it. With ``where``, only the rows matching
        every one of them, filtered as the files are read; with ``columns``, only those columns."""

    def scan_arrow(
        self, name: str, *, where: Sequence[Matching] = (), columns: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """:meth:`read_arrow`'s rows in record batches, for a caller that folds a table into something
        smaller. A store that reads its files batch by batch holds one batch at a time; this default reads
        the matching rows and columns at once."""
        yield from self.read_arrow(name, where=where, columns=columns).to_batches()

    @abstractmethod
    def version(self, name: str) -> int:
        """The table's current Delta version."""

    @abstractmethod
    def committed_batch(self, name: str, app_id: str) -> int | None:
        """The last batch id committed to the table under ``app_id``, or None."""


def merge_condition(keys: tuple[str, ...] | list[str], quote: str) -> str:
    """``t.k = s.k AND ...`` with identifiers quoted for the backend's SQL dialect."""
    if not keys:
        raise ValueError("merge needs at least one key column")
    return " AND ".join(f"t.{quote}{k}{quote} = s.{quote}{k}{quote}" for k in keys)


def target_condition(where: Sequence[Matching]) -> str:
    """`` AND t.c IN (...)`` for each of ``where``, as DataFusion's SQL reads it (strings quoted with ``'``,
    a quote in them doubled; integers as they are)."""
    out = ""
    for matching in where:
        if not matching.values:
            raise ValueError(f"target_where on {matching.column} with no values")
        out += f" AND t.`{matching.column}` IN ({', '.join(_sql_literal(v) for v in matching.values)})"
    return out


def _sql_literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise TypeError(f"a target filter takes strings and integers, not {type(value).__name__}")


def command_write_id(name: str) -> str:
    """The app id of one run of a command's write (``timestone ota create``, ``devices register``), batch 0:
    ``name`` and a uuid of its own. What such a write merges is idempotent by its keys; under one fixed app
    id the table's transaction marked it done for ever, and the same write made again (after another tool
    deleted its row, or from a host whose clock is behind, where the batch was the time) was skipped and
    said done."""
    return f"{name}/{uuid.uuid4().hex}"


def check_batch(app_id: str, batch_id: int) -> None:
    if not app_id:
        raise ValueError("app_id must be a non-empty string (the streaming query id or a stable name)")
    if not isinstance(batch_id, int) or isinstance(batch_id, bool) or batch_id < 0:
        raise ValueError(f"batch_id must be a non-negative int, got {batch_id!r}")
