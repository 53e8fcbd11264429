"""The embedded table store: delta-rs commits and merges, Spark reads the live files of a snapshot.

No Delta jars are needed, which is what lets the pipelines run on a laptop and in CI.

An append of a Spark DataFrame never brings rows to the driver: the Spark tasks write the Parquet files
themselves (:mod:`sinks.parquet_files`, to a local path or an S3 bucket with the table's storage options),
return one small row per file (path, size, partition values, stats), and the driver commits all of them as
one Delta commit with delta-rs (``DeltaTable.create_write_transaction``). Arrow input (a few rows built in
the driver) is written by ``write_deltalake``; a merge collects its source (``DataFrame.toArrow()``), so its
callers hand it aggregates, not a batch's rows, and delta-rs merges them into the target in the driver.
Data comes back out by reading exactly the parquet files of the current snapshot: reading the table
directory instead would also return files that an overwrite or merge has removed.

Concurrent writers (two streaming queries appending to one table, or merging) are normal: a commit that
loses the race raises ``CommitFailedError``; the store reloads the table, checks again whether its batch is
already in (another attempt of the same query may have won), and retries with a growing, jittered pause.
An executor-side append writes its files once and retries only the commit, with the same files; it commits
exactly the files its one Spark job returned (a task attempt that failed or lost to another returned
nothing). Files of an append that does not commit (a replay found in the log, a failed job or commit) are
deleted where that is cheap, and files left by a crash between writing and committing are referenced by no
commit: ``DeltaTable.vacuum`` removes them once they are older than its retention period.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, Field, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction
from pyspark.sql.types import StructField, StructType

from sinks.arrow_conform import SchemaMismatch, conform, to_arrow_table
from sinks.clustering import Clustering, admitted, is_clustered
from sinks.object_store import FileLocation, UnsupportedLocation, check_root, local_directory
from sinks.parquet_files import FileWriter, WrittenFile, remove_files, write_files
from sinks.spark_arrow import to_arrow, to_spark
from sinks.store import (
    COMMIT_MARKER_KEY,
    DELETED_FILE_RETENTION,
    Matching,
    TableData,
    TableStore,
    TableStoreError,
    TimeRange,
    check_batch,
    commit_marker,
    merge_condition,
    retention_interval,
    target_condition,
)
from sinks.tables import DEFAULT_CATALOG, TableCatalog, TableSpec, as_nullable
from sinks.writer_rules import (
    BROKEN,
    refuse_column_mapping,
    refuse_foreign_files,
    refuse_unsupported_features,
    rules_of,
    with_rules,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_UNREADABLE_AS_PARQUET = ("deletionVectors", "columnMapping")
_LISTING_THRESHOLD_CONF = "spark.sql.sources.parallelPartitionDiscovery.threshold"
_SERIAL_LISTING_FILES = 10_000

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppendReport:
    """What one append that committed rows did (for logs and benchmarks)."""

    table: str
    #: whether the Spark tasks wrote the files (a Spark DataFrame; else Arrow rows written by the driver)
    on_executors: bool
    rows: int
    #: files written by the tasks (None for Arrow input, where delta-rs decides)
    files: int | None
    #: the Spark job: computing the DataFrame (source reads included) and writing its files in the tasks
    #: (0 for Arrow input)
    spark_s: float
    #: on the driver: the Delta commit of the tasks' files, or writing and committing the Arrow rows
    driver_s: float


class DeltaRsTableStore(TableStore):
    """:class:`~sinks.store.TableStore` over delta-rs; ``spark`` is needed by :meth:`read` and by appends
    of Spark DataFrames.

    Tables live on a local path (which every executor must see at the same path: local mode, or a shared
    mount) or in an S3 bucket (``s3://``; ``storage_options`` as delta-rs takes them, which the tasks'
    pyarrow writers read too). ``on_append``, when set, is called with an :class:`AppendReport` after each
    append that committed rows.
    """

    backend = "delta-rs"

    def __init__(
        self,
        spark: SparkSession | None,
        root: str,
        catalog: TableCatalog = DEFAULT_CATALOG,
        *,
        storage_options: dict[str, str] | None = None,
        max_commit_attempts: int = 12,
    ) -> None:
        super().__init__(catalog)
        check_root(root)
        self.spark = spark
        # delta-rs reports local files by absolute path; Spark's basePath must be spelt the same way.
        self.root = root if "://" in root else os.path.abspath(root)
        self.storage_options = storage_options
        self.max_commit_attempts = max_commit_attempts
        self.on_append: Callable[[AppendReport], None] | None = None
        self._ensured: set[str] = set()
        self._serial_listing = False
        self._opened = threading.local()  # each thread's open tables, by name (see _open)

    # -- locations and lifecycle -------------------------------------------------------------------------

    def location(self, name: str) -> str:
        return self.spec(name).location(self.root)

    def exists(self, name: str) -> bool:
        return DeltaTable.is_deltatable(self.location(name), storage_options=self.storage_options)

    def ensure(self, name: str) -> None:
        spec = self.spec(name)
        path = self.location(name)
        if not self.exists(name):
            refuse_foreign_files(name, path)
            try:
                DeltaTable.create(
                    path,
                    spec.arrow_schema,
                    mode="ignore",
                    partition_by=list(spec.partition_by) or None,
                    name=spec.name,
                    description=spec.description,
                    configuration=dict(spec.properties),
                    storage_options=self.storage_options,
                )
            except CommitFailedError:
                if not self.exists(name):  # lost the race to another creator: fine; anything else is not
                    raise
        try:
            self._evolve(spec, self._open(name))
        except CommitFailedError as exc:
            refuse_unsupported_features(name, exc)
            raise
        self._ensured.add(name)

    def _evolve(self, spec: TableSpec, table: DeltaTable) -> None:
        """Bring an existing table up to its spec: add missing columns and properties, reject conflicts."""
        metadata = table.metadata()
        refuse_column_mapping(spec.name, table)
        if list(metadata.partition_columns) != list(spec.partition_by):
            raise SchemaMismatch(
                f"{spec.name}: table is partitioned by {list(metadata.partition_columns)}, "
                f"spec says {list(spec.partition_by)}"
            )
        existing = {f.name: f for f in to_spark(_arrow_schema(table)).fields}
        spelt = {name.lower(): name for name in existing}
        missing = []
        for declared in spec.schema.fields:
            found = existing.get(declared.name)
            other = spelt.get(declared.name.lower())
            if found is None and other is not None:  # Delta's names are case-insensitive: no second one
                raise SchemaMismatch(f"{spec.name}.{declared.name}: the table has it as {other!r}")
            if found is None:
                if not declared.nullable:
                    raise SchemaMismatch(f"{spec.name}.{declared.name}: cannot add a NOT NULL column")
                missing.append(declared.name)
            elif found.dataType.simpleString() != declared.dataType.simpleString():
                raise SchemaMismatch(
                    f"{spec.name}.{declared.name}: table has {found.dataType.simpleString()}, "
                    f"spec says {declared.dataType.simpleString()}"
                )
        if missing:
            table.alter.add_columns([Field.from_arrow(spec.arrow_schema.field(n)) for n in missing])
        configuration = metadata.configuration
        absent = {k: v for k, v in spec.properties.items() if configuration.get(k) != v}
        if absent:
            self._open(spec.name).alter.set_table_properties(absent, raise_if_not_exists=False)

    def _open(self, name: str, *, fresh: bool = False) -> DeltaTable:
        """The table at its latest version.

        Each thread keeps the tables it opened and brings them up to date with the commits made since
        (``update_incremental``, a fraction of the cost of loading the log again); a table object is never
        shared between threads. ``fresh``: a new object, for a caller that moves it to an older version.
        """
        opened: dict[str, DeltaTable] = self._opened.__dict__
        table = None if fresh else opened.get(name)
        if table is not None:
            try:
                table.update_incremental()
                return table
            except Exception:  # the table is gone or unreadable: load it again, which says why
                del opened[name]
        try:
            table = DeltaTable(self.location(name), storage_options=self.storage_options)
        except Exception as exc:  # TableNotFoundError, or a storage error worth the same message
            raise TableStoreError(f"{name}: no Delta table at {self.location(name)} ({exc})") from exc
        if not fresh:
            opened[name] = table
        return table

    def _open_for_write(self, name: str) -> DeltaTable:
        if name not in self._ensured:
            self.ensure(name)
        return self._open(name)

    # -- writes ------------------------------------------------------------------------------------------

    def append(self, name: str, data: TableData, app_id: str, batch_id: int) -> bool:
        check_batch(app_id, batch_id)
        if _is_spark_frame(data):
            return self._append_from_executors(name, data, self.file_location(name), app_id, batch_id)
        rows = to_arrow_table(data)
        written: list[AppendReport] = []

        def attempt(table: DeltaTable) -> bool:
            batch = self._clustered(name, conform(rows, _arrow_schema(table), name))
            computed = [column for column, _ in rules_of(table).generated if column not in rows.column_names]
            batch = batch.drop_columns(computed)  # delta-rs computes a generated column the rows lack
            if batch.num_rows == 0:
                return True
            began = time.perf_counter()
            write_deltalake(
                table,
                batch,
                mode="append",
                commit_properties=_txn(app_id, batch_id),
            )
            written.append(AppendReport(name, False, batch.num_rows, None, 0.0, time.perf_counter() - began))
            return True

        done = self._idempotent(name, app_id, batch_id, attempt)
        if written:
            self._report(written[-1])
        return done

    def file_location(self, name: str) -> FileLocation:
        """Where the tasks write the table's data files; an error for a location they cannot write to."""
        try:
            return FileLocation(self.location(name), dict(self.storage_options or {}))
        except UnsupportedLocation as exc:
            raise TableStoreError(f"{name}: {exc}") from None

    def _append_from_executors(
        self, name: str, frame: DataFrame, location: FileLocation, app_id: str, batch_id: int
    ) -> bool:
        """The Spark tasks write the files once; their add actions are committed (and retried) together.

        Column errors (unknown, missing NOT NULL, uncastable) raise :class:`SchemaMismatch` here before any
        file is written; a null in a NOT NULL column is found by the task holding it and fails the Spark job.
        """
        writer: FileWriter | None = None
        written: list[WrittenFile] | None = None
        timing = [0.0, 0.0]

        def attempt(table: DeltaTable) -> bool:
            nonlocal writer, written
            began = time.perf_counter()
            if writer is None:
                schema = _arrow_schema(table)
                rules = rules_of(table)
                checked = with_rules(frame, rules) if rules else frame  # evaluated by Spark in the tasks
                conform(to_arrow(checked.drop(BROKEN).schema).empty_table(), schema, name)
                writer = FileWriter(location, schema, tuple(table.metadata().partition_columns), name)
                column = self.spec(name).cluster_by
                sorted_rows = checked if column is None else checked.sortWithinPartitions(column)
                written = write_files(sorted_rows, writer)
                timing[0] = time.perf_counter() - began
                began = time.perf_counter()
            if written:
                try:
                    table.create_write_transaction(
                        [_add_action(f) for f in written],
                        mode="append",
                        schema=table.schema(),
                        partition_by=list(table.metadata().partition_columns) or None,
                        commit_properties=_txn(app_id, batch_id),
                    )
                finally:
                    timing[1] += time.perf_counter() - began
            return True

        try:
            done = self._idempotent(name, app_id, batch_id, attempt)
        except BaseException:
            if writer is not None and not self._committed_now(name, app_id, batch_id):
                remove_files(location, writer.write_id, written)
            raise
        if not done:
            if writer is not None:  # another attempt committed this batch meanwhile
                remove_files(location, writer.write_id, written)
            return False
        if written:
            rows = sum(f.rows for f in written)
            self._report(AppendReport(name, True, rows, len(written), timing[0], timing[1]))
        return True

    def _clustered(self, name: str, rows: pa.Table) -> pa.Table:
        """``rows`` sorted by the table's ``cluster_by`` column, if it has one: a file written from them
        holds each value's rows together (row groups with tight statistics)."""
        column = self.spec(name).cluster_by
        return rows if column is None or rows.num_rows < 2 else rows.sort_by(column)

    def _report(self, report: AppendReport) -> None:
        log.debug("append: %s", report)
        if self.on_append is not None:
            self.on_append(report)

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
        check_batch(app_id, batch_id)
        condition = merge_condition(tuple(keys or self.spec(name).merge_keys), quote="")
        condition += target_condition(target_where)  # delta-rs skips the files whose statistics rule it out
        collected: list[pa.Table] = []  # the source, collected once, by the first attempt (not for a replay)

        def attempt(table: DeltaTable) -> bool:
            if not collected:
                collected.append(_as_arrow(data))
            source = self._clustered(name, conform(collected[0], _arrow_schema(table), name))
            if source.num_rows == 0:
                return True
            merger = table.merge(
                source,
                condition,
                source_alias="s",
                target_alias="t",
                commit_properties=_txn(app_id, batch_id),
            )
            if delete_when is not None:
                merger = merger.when_matched_delete(predicate=delete_when)
            if update and update_set:
                merger = merger.when_matched_update(updates=dict(update_set), predicate=update_when)
            elif update:
                merger = merger.when_matched_update_all(predicate=update_when)
            if insert:
                merger = merger.when_not_matched_insert_all(predicate=insert_when)
            merger.execute()
            return True

        return self._idempotent(name, app_id, batch_id, attempt)

    def _idempotent(self, name: str, app_id: str, batch_id: int, write: Callable[[DeltaTable], bool]) -> bool:
        """Run ``write`` unless the batch is in; on a lost commit race, look again and retry."""
        for attempt in range(self.max_commit_attempts):
            table = self._open_for_write(name)
            if _committed(table, app_id, batch_id):
                return False
            try:
                return write(table)
            except CommitFailedError as exc:
                refuse_unsupported_features(name, exc)
                if attempt + 1 == self.max_commit_attempts:
                    raise
                time.sleep(min(2.0, 0.02 * 2**attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    def _committed_now(self, name: str, app_id: str, batch_id: int) -> bool:
        """Whether the batch is in the table as of now; True if that cannot be read (keep its files)."""
        try:
            return _committed(self._open(name), app_id, batch_id)
        except Exception:
            return True

    # -- reads -------------------------------------------------------------------------------------------

    def read(self, name: str, within: TimeRange | None = None) -> DataFrame:
        table = self._open(name)
        _check_plain_parquet(name, table)
        frame = self._read_files(name, _files_within(table, self.location(name), within), table)
        return frame if within is None else within.rows(frame)

    def compact(self, name: str, target_bytes: int, min_files: int = 2, *, settle_s: float = 600.0) -> int:
        """delta-rs' bin-packing, one call per crowded partition; a commit lost to a concurrent write
        leaves that partition to the next call. A table with ``cluster_by`` is clustered instead
        (:mod:`sinks.clustering`: bin-packing would mix its values again)."""
        table = self._open_for_write(name)
        column = self.spec(name).cluster_by
        if column is not None:
            _check_plain_parquet(name, table)
            clustering = Clustering(table, self.file_location(name), _arrow_schema(table), column, name)
            return clustering.run(target_bytes, min_files, round(settle_s * 1000))
        removed = 0
        for filters in _crowded_partitions(table, target_bytes, min_files):
            try:
                metrics = table.optimize.compact(partition_filters=filters, target_size=target_bytes)
            except CommitFailedError:
                log.debug("compaction of %s lost its commit to a concurrent write", name)
                table = self._open(name, fresh=True)
                continue
            removed += int(metrics.get("numFilesRemoved", 0))
        return removed

    def vacuum(self, name: str, retention_hours: float) -> int | None:
        """delta-rs' full vacuum (files never committed too: those of a write that failed or lost to another
        attempt). On a local path, the files it deleted are counted on disk (delta-rs lists every file it
        found unreferenced, deleted before or not)."""
        table = self._open_for_write(name)
        directory = local_directory(self.location(name))
        before = _files_on_disk(directory) if directory is not None else None
        if float(retention_hours).is_integer():
            period: dict[str, Any] = {
                "retention_hours": int(retention_hours),
                "enforce_retention_duration": False,
            }
        else:  # delta-rs takes whole hours, or any period from the table's property
            self.set_properties(name, {DELETED_FILE_RETENTION: retention_interval(retention_hours)})
            table = self._open(name)
            period = {"retention_hours": None, "enforce_retention_duration": True}
        listed = table.vacuum(dry_run=False, full=True, **period)
        if before is None or directory is None:
            return len(listed)
        return len(before - _files_on_disk(directory))

    def tidy_log(self, name: str) -> int | None:
        table = self._open_for_write(name)
        directory = local_directory(self.location(name))
        before = _log_entries(directory) if directory is not None else None
        table.create_checkpoint()
        table.cleanup_metadata()
        if before is None or directory is None:
            return None
        return len(before - _log_entries(directory))  # the checkpoint written is no deleted entry

    def set_properties(self, name: str, properties: Mapping[str, str]) -> bool:
        """Set the properties that differ; a commit lost to another change of the table's metadata (a
        second maintainer setting the same ones) is tried again on the table as it is now."""
        table = self._open_for_write(name)
        for attempt in range(1, self.max_commit_attempts + 1):
            configuration = table.metadata().configuration
            changed = {k: v for k, v in properties.items() if configuration.get(k) != v}
            if not changed:
                return False
            try:
                table.alter.set_table_properties(changed, raise_if_not_exists=False)
                return True
            except CommitFailedError:
                if attempt == self.max_commit_attempts:
                    raise
                table = self._open(name, fresh=True)
        return False

    def data_files(self, name: str) -> int:
        return int(self._open(name).get_add_actions().num_rows)

    def _read_files(self, name: str, files: list[str], table: DeltaTable) -> DataFrame:
        """Some data files of the table as a Spark DataFrame, in the schema of ``table`` (as loaded): the
        columns as written, whatever this store's catalog declares."""
        if self.spark is None:
            raise TableStoreError("reading into Spark needs the SparkSession the store was opened with")
        schema = _read_schema(table)
        if not files:
            return self.spark.createDataFrame([], schema)
        if not self._serial_listing and local_directory(self.location(name)) is not None:
            # Above its threshold (32 paths by default) Spark lists the given files in a Spark job of its
            # own, on every read: a table passes it after 32 appends. Local files are listed in the driver.
            self.spark.conf.set(_LISTING_THRESHOLD_CONF, str(_SERIAL_LISTING_FILES))
            self._serial_listing = True
        frame = (
            self.spark.read.schema(schema)
            .option("basePath", self.location(name))  # partition values come from the directory names
            .parquet(*files)
        )
        return frame.to(schema)  # the table's column order (partition columns come last otherwise)

    def read_arrow(
        self,
        name: str,
        within: TimeRange | None = None,
        *,
        where: Sequence[Matching] = (),
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """The snapshot as Arrow, in the table's own schema. A local table's files are read with Arrow's own
        file system: delta-rs' ``to_pyarrow_table`` leaves Arrow's I/O threads calling back into its Python
        file handler, and a process that exits after it may abort ("terminate called without an active
        exception", exit status 134) after its work is done."""
        scans, schema = self._scan(name, within, where, columns)
        parts = [conform(scan.to_table(), schema, name, drop_extra=True) for scan in scans]
        snapshot = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        return snapshot if within is None else within.arrow_rows(snapshot)

    def scan_arrow(
        self, name: str, *, where: Sequence[Matching] = (), columns: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The matching rows file by file, one record batch at a time."""
        scans, schema = self._scan(name, None, where, columns)
        for batch in (batch for scan in scans for batch in scan.to_batches()):
            if batch.num_rows:
                yield from conform(pa.Table.from_batches([batch]), schema, name, drop_extra=True).to_batches()

    def _scan(
        self, name: str, within: TimeRange | None, where: Sequence[Matching], columns: Sequence[str] | None
    ) -> tuple[list[ds.Scanner], pa.Schema]:
        """Scanners of the snapshot's files (those ``within`` and ``where`` may need), the filter and
        projection pushed into them, and the schema their rows are conformed to.

        A local table's files written by clustering get a scanner of their own, whose filter is on the bare
        column: they hold no string views, so Arrow can skip their row groups by statistics (a file holding
        string views, as delta-rs' merges write, needs the filter cast, which rules no row group out)."""
        table = self._open(name)
        refuse_column_mapping(name, table)  # delta-rs reads its files' values as nulls
        table_schema = _arrow_schema(table)
        schema = table_schema
        if columns is not None:
            schema = pa.schema([table_schema.field(column) for column in columns])
        location = self.location(name)
        directory = local_directory(location)
        if directory is not None and not _unreadable_as_parquet(table):
            partition_by = list(table.metadata().partition_columns)
            files = _files_within(table, location, within, where)
            clustered = [f for f in files if is_clustered(f)]
            others = [f for f in files if not is_clustered(f)]
            scans = [_scanner(_local_dataset(others, directory, table_schema, partition_by), schema, where)]
            if clustered:
                dataset = _local_dataset(clustered, directory, table_schema, partition_by)
                scans.append(_scanner(dataset, schema, where, bare=True))
            return scans, schema
        dataset = _fragments_within(table.to_pyarrow_dataset(), where)
        return [_scanner(dataset, schema, where)], schema

    def files_read(self, name: str, where: Sequence[Matching] = ()) -> list[str]:
        """The data files a read of a local table filtered by ``where`` opens (the others' statistics rule
        them out), relative to the table directory."""
        location = self.location(name)
        directory = local_directory(location)
        if directory is None:
            raise TableStoreError(f"{name}: files_read needs a local table")
        paths = (
            _files_within(self._open(name), location, None, where)
            if where
            else _live_files(self._open(name), location)
        )
        return [os.path.relpath(path, directory) for path in paths]

    def version(self, name: str) -> int:
        return self._open(name).version()

    def committed_batch(self, name: str, app_id: str) -> int | None:
        return self._open(name).transaction_version(app_id)


def _live_files(table: DeltaTable, location: str) -> list[str]:
    """The snapshot's data files as Spark should open them: local files by their path on disk.

    The log holds each path URI-encoded (``p=a%253A`` for the directory ``p=a%3A``), so it is decoded once;
    ``file_uris()`` cannot be used for that, as it encodes the table root but not the rest.
    """
    directory = local_directory(location)
    if directory is None:
        return table.file_uris()
    paths = table.get_add_actions().column("path").to_pylist()
    return [_local_file(directory, path) for path in paths]


def _files_within(
    table: DeltaTable, location: str, within: TimeRange | None, where: Sequence[Matching] = ()
) -> list[str]:
    """:func:`_live_files` that may hold rows in ``within`` (None: all of them) and matching every one of
    ``where``, by each file's min/max statistics.

    Delta keeps timestamp statistics to the millisecond, truncated: a file's true maximum may be up to
    999 µs above its recorded one. A file without statistics for the column is kept, and so is every file
    of a table not on a local path (its file URIs are not matched to the statistics).
    """
    directory = local_directory(location)
    if (within is None and not where) or directory is None:
        return _live_files(table, location)
    actions = pa.table(table.get_add_actions(flatten=True))
    keep = pa.array([True] * actions.num_rows, pa.bool_())
    if within is not None:
        keep = pc.and_(keep, _overlapping(actions, within))
    for matching in where:
        columns = (f"min.{matching.column}", f"max.{matching.column}")
        if all(name in actions.column_names for name in columns):
            lows, highs = (actions.column(name).to_pylist() for name in columns)
            keep = pc.and_(keep, pa.array(admitted(lows, highs, matching.values), pa.bool_()))
    paths = actions.column("path").filter(keep).to_pylist()
    return [_local_file(directory, path) for path in paths]


def _overlapping(actions: pa.Table, within: TimeRange) -> pa.Array:
    """Whether each file of ``actions`` (flattened add actions) may hold rows in ``within``."""
    columns = (f"min.{within.column}", f"max.{within.column}")
    if not all(name in actions.column_names for name in columns):
        return pa.array([True] * actions.num_rows, pa.bool_())
    low, high = (actions.column(name).cast(pa.timestamp("us", "UTC")).cast(pa.int64()) for name in columns)
    overlaps = pc.and_kleene(
        pc.less_equal(low, within.high_us), pc.greater_equal(pc.add(high, 999), within.low_us)
    )
    return pc.fill_null(overlaps, True).combine_chunks()  # no statistics: the file may hold anything


def _crowded_partitions(
    table: DeltaTable, target_bytes: int, min_files: int
) -> list[list[tuple[str, str, str]] | None]:
    """The partition filters of the partitions holding at least ``min_files`` files under
    ``target_bytes`` (None: the whole table, unpartitioned or with a null partition value, which
    delta-rs cannot filter on)."""
    columns = list(table.metadata().partition_columns)
    actions = pa.table(table.get_add_actions(flatten=True))
    small = actions.filter(pc.less(actions.column("size_bytes"), target_bytes))
    if not columns:
        return [None] if small.num_rows >= min_files else []
    keys = [f"partition.{c}" for c in columns]
    counts = small.group_by(keys, use_threads=False).aggregate([("path", "count")])
    crowded = counts.filter(pc.greater_equal(counts.column("path_count"), min_files)).select(keys)
    filters: list[list[tuple[str, str, str]] | None] = []
    for values in crowded.to_pylist():
        if any(value is None for value in values.values()):
            return [None]
        filters.append([(c, "=", str(values[f"partition.{c}"])) for c in columns])
    return filters


def _files_on_disk(directory: str) -> set[str]:
    """The data files under a local table directory (its log excluded)."""
    found: set[str] = set()
    for folder, subfolders, names in os.walk(directory):
        subfolders[:] = [d for d in subfolders if not d.startswith("_")]
        found.update(os.path.join(folder, n) for n in names if n.endswith(".parquet"))
    return found


def _log_entries(directory: str) -> set[str]:
    """Commit and checkpoint files in a local table's ``_delta_log``."""
    try:
        names = os.listdir(os.path.join(directory, "_delta_log"))
    except OSError:
        return set()
    return {n for n in names if n.endswith((".json", ".parquet"))}


def _local_file(directory: str, path: str) -> str:
    """An add action's path (relative and URI-encoded, or an absolute URI) as a path on disk."""
    if "://" in path:
        return local_directory(path) or path
    return os.path.join(directory, urllib.parse.unquote(path))


def _committed(table: DeltaTable, app_id: str, batch_id: int) -> bool:
    done = table.transaction_version(app_id)
    return done is not None and done >= batch_id


def _add_action(f: WrittenFile) -> AddAction:
    return AddAction(f.path, f.size, f.partition_values, f.modification_time, data_change=True, stats=f.stats)


def _txn(app_id: str, batch_id: int) -> CommitProperties:
    """The batch's ``txn`` action, and its marker in the commit info (the commit of a batch, by name)."""
    return CommitProperties(
        app_transactions=[Transaction(app_id, batch_id)],
        custom_metadata={COMMIT_MARKER_KEY: commit_marker(app_id, batch_id)},
    )


def _arrow_schema(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


def _read_schema(table: DeltaTable) -> StructType:
    """The table's own schema as Spark file reads produce it: every field nullable, comments kept."""
    arrow = _arrow_schema(table)
    fields = []
    for spark_field, arrow_field in zip(to_spark(arrow).fields, arrow, strict=True):
        comment = (arrow_field.metadata or {}).get(b"comment")
        metadata = {"comment": comment.decode()} if comment else {}
        fields.append(StructField(spark_field.name, as_nullable(spark_field.dataType), True, metadata))
    return StructType(fields)


def _is_spark_frame(data: TableData) -> bool:
    return hasattr(data, "toArrow") and hasattr(data, "sparkSession")


def _as_arrow(data: TableData) -> pa.Table:
    return data.toArrow() if _is_spark_frame(data) else to_arrow_table(data)


def _unreadable_as_parquet(table: DeltaTable) -> list[str]:
    """The table's features that plain parquet reads cannot honour (deletion vectors, column mapping)."""
    features = set(table.protocol().reader_features or []) & set(_UNREADABLE_AS_PARQUET)
    if table.metadata().configuration.get("delta.columnMapping.mode", "none") != "none":
        features.add("columnMapping")
    return sorted(features)


def _local_dataset(
    files: list[str], directory: str, schema: pa.Schema, partition_by: list[str]
) -> ds.Dataset:
    """A local table's data files as one dataset, partition values from the directory names."""
    if not files:
        return ds.dataset(schema.empty_table())
    partition_fields = [schema.field(column) for column in partition_by]
    partitioning = ds.partitioning(pa.schema(partition_fields), flavor="hive") if partition_fields else None
    dataset = ds.dataset(files, format="parquet", partitioning=partitioning, partition_base_dir=directory)
    plain = _without_views(dataset.schema)
    if plain == dataset.schema:
        return dataset
    return ds.dataset(
        files, schema=plain, format="parquet", partitioning=partitioning, partition_base_dir=directory
    )


_VIEWS = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}


def _without_views(schema: pa.Schema) -> pa.Schema:
    """``schema`` with string and binary views (what delta-rs' merges write) read as plain strings and
    binaries, which filters such as ``is_in`` take."""
    return pa.schema([f.with_type(_VIEWS.get(f.type, f.type)) for f in schema], metadata=schema.metadata)


def _fragments_within(dataset: ds.FileSystemDataset, where: Sequence[Matching]) -> ds.Dataset:
    """``dataset`` (delta-rs', each fragment carrying its file's statistics) without the fragments whose
    statistics rule out one of ``where``."""
    present = set(dataset.schema.names)
    condition = _condition(dataset.schema, [m for m in where if m.column in present], bare=True)
    if condition is None:
        return dataset
    fragments = list(dataset.get_fragments(filter=condition))
    return ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)


def _scanner(
    dataset: ds.Dataset, schema: pa.Schema, where: Sequence[Matching], *, bare: bool = False
) -> ds.Scanner:
    """``dataset``'s rows matching every one of ``where``, in the columns of ``schema`` it has (a column
    its files lack is added as nulls afterwards; a filter on such a column matches nothing). ``bare``: the
    filter on the columns as they are (files without string views), which row group statistics prune."""
    present = set(dataset.schema.names)
    if any(matching.column not in present for matching in where):
        return ds.dataset(schema.empty_table()).scanner()
    projected = [name for name in schema.names if name in present]
    return dataset.scanner(columns=projected, filter=_condition(dataset.schema, where, bare))


def _condition(schema: pa.Schema, where: Sequence[Matching], bare: bool) -> pc.Expression | None:
    """Every one of ``where`` (columns of ``schema``) as one dataset expression, None for no filter;
    ``bare``: on the columns as they are (:meth:`Matching.statistics_expression`), else cast."""
    condition = None
    for matching in where:
        value_type = schema.field(matching.column).type
        expression = (matching.statistics_expression if bare else matching.expression)(value_type)
        condition = expression if condition is None else condition & expression
    return condition


def _check_plain_parquet(name: str, table: DeltaTable) -> None:
    """Refuse tables whose files are not the whole truth (deletion vectors, column mapping)."""
    features = _unreadable_as_parquet(table)
    if features:
        raise TableStoreError(
            f"{name}: uses {features}, which plain parquet reads cannot honour; "
            "read it with the native Delta backend"
        )
