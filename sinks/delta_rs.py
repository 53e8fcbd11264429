"""The embedded table store: delta-rs writes and merges, Spark reads the live files of a snapshot.

No Delta jars are needed, which is what lets the pipelines run on a laptop and in CI. Spark DataFrames cross
into delta-rs through ``DataFrame.toArrow()`` (fine for micro-batches; it collects to the driver) and come
back out by reading exactly the parquet files of the current snapshot (``DeltaTable.file_uris()``): reading
the table directory instead would also return files that an overwrite or merge has removed.

Concurrent writers (two streaming queries appending to one table, or merging) are normal: a commit that
loses the race raises ``CommitFailedError``; the store reloads the table, checks again whether its batch is
already in (another attempt of the same query may have won), and retries with a growing, jittered pause.
"""

from __future__ import annotations

import os
import random
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Field, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError
from pyspark.sql.pandas.types import from_arrow_schema

from sinks.arrow_conform import SchemaMismatch, conform, to_arrow_table
from sinks.store import TableData, TableStore, TableStoreError, check_batch, merge_condition
from sinks.tables import DEFAULT_CATALOG, TableCatalog, TableSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_UNREADABLE_AS_PARQUET = ("deletionVectors", "columnMapping")


class DeltaRsTableStore(TableStore):
    """:class:`~sinks.store.TableStore` over delta-rs; ``spark`` is needed only by :meth:`read`."""

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
        self.spark = spark
        # delta-rs reports local files by absolute path; Spark's basePath must be spelt the same way.
        self.root = root if "://" in root else os.path.abspath(root)
        self.storage_options = storage_options
        self.max_commit_attempts = max_commit_attempts
        self._ensured: set[str] = set()

    # -- locations and lifecycle -------------------------------------------------------------------------

    def location(self, name: str) -> str:
        return self.spec(name).location(self.root)

    def exists(self, name: str) -> bool:
        return DeltaTable.is_deltatable(self.location(name), storage_options=self.storage_options)

    def ensure(self, name: str) -> None:
        spec = self.spec(name)
        path = self.location(name)
        if not self.exists(name):
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
        self._evolve(spec, self._open(name))
        self._ensured.add(name)

    def _evolve(self, spec: TableSpec, table: DeltaTable) -> None:
        """Bring an existing table up to its spec: add missing columns and properties, reject conflicts."""
        metadata = table.metadata()
        if list(metadata.partition_columns) != list(spec.partition_by):
            raise SchemaMismatch(
                f"{spec.name}: table is partitioned by {list(metadata.partition_columns)}, "
                f"spec says {list(spec.partition_by)}"
            )
        existing = {f.name: f for f in from_arrow_schema(_arrow_schema(table)).fields}
        missing = []
        for declared in spec.schema.fields:
            found = existing.get(declared.name)
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

    def _open(self, name: str) -> DeltaTable:
        try:
            return DeltaTable(self.location(name), storage_options=self.storage_options)
        except Exception as exc:  # TableNotFoundError, or a storage error worth the same message
            raise TableStoreError(f"{name}: no Delta table at {self.location(name)} ({exc})") from exc

    def _open_for_write(self, name: str) -> DeltaTable:
        if name not in self._ensured:
            self.ensure(name)
        return self._open(name)

    # -- writes ------------------------------------------------------------------------------------------

    def append(self, name: str, data: TableData, app_id: str, batch_id: int) -> bool:
        check_batch(app_id, batch_id)
        rows = _as_arrow(data)

        def attempt(table: DeltaTable) -> bool:
            batch = conform(rows, _arrow_schema(table), name)
            if batch.num_rows == 0:
                return True
            write_deltalake(
                table,
                batch,
                mode="append",
                commit_properties=_txn(app_id, batch_id),
            )
            return True

        return self._idempotent(name, app_id, batch_id, attempt)

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
    ) -> bool:
        check_batch(app_id, batch_id)
        condition = merge_condition(tuple(keys or self.spec(name).merge_keys), quote="")
        rows = _as_arrow(data)

        def attempt(table: DeltaTable) -> bool:
            source = conform(rows, _arrow_schema(table), name)
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
            done = table.transaction_version(app_id)
            if done is not None and done >= batch_id:
                return False
            try:
                return write(table)
            except CommitFailedError:
                if attempt + 1 == self.max_commit_attempts:
                    raise
                time.sleep(min(2.0, 0.02 * 2**attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    # -- reads -------------------------------------------------------------------------------------------

    def read(self, name: str) -> DataFrame:
        if self.spark is None:
            raise TableStoreError("read() needs the SparkSession the store was opened with")
        spec = self.spec(name)
        table = self._open(name)
        _check_plain_parquet(name, table)
        files = [_spark_path(uri) for uri in table.file_uris()]
        if not files:
            return self.spark.createDataFrame([], spec.read_schema)
        frame = (
            self.spark.read.schema(spec.read_schema)
            .option("basePath", self.location(name))  # partition values come from the directory names
            .parquet(*files)
        )
        return frame.to(spec.read_schema)  # declared column order (partition columns come last otherwise)

    def read_arrow(self, name: str) -> pa.Table:
        spec = self.spec(name)
        snapshot = pa.table(self._open(name).to_pyarrow_table())
        return conform(snapshot, spec.arrow_schema, name, drop_extra=True)

    def version(self, name: str) -> int:
        return self._open(name).version()

    def committed_batch(self, name: str, app_id: str) -> int | None:
        return self._open(name).transaction_version(app_id)


def _spark_path(uri: str) -> str:
    """delta-rs percent-encodes local paths (a space becomes %20); Spark wants the path as it is on disk."""
    return uri if "://" in uri else urllib.parse.unquote(uri)


def _txn(app_id: str, batch_id: int) -> CommitProperties:
    return CommitProperties(app_transactions=[Transaction(app_id, batch_id)])


def _arrow_schema(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


def _as_arrow(data: TableData) -> pa.Table:
    if hasattr(data, "toArrow") and hasattr(data, "sparkSession"):
        return data.toArrow()
    return to_arrow_table(data)


def _check_plain_parquet(name: str, table: DeltaTable) -> None:
    """Refuse tables whose files are not the whole truth (deletion vectors, column mapping)."""
    features = set(table.protocol().reader_features or []) & set(_UNREADABLE_AS_PARQUET)
    if table.metadata().configuration.get("delta.columnMapping.mode", "none") != "none":
        features.add("columnMapping")
    if features:
        raise TableStoreError(
            f"{name}: uses {sorted(features)}, which plain parquet reads cannot honour; "
            "read it with the native Delta backend"
        )
