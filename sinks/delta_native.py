"""The table store for Spark sessions that have Delta built in (Databricks, or delta-spark with its jars).

Kept deliberately thin: Delta itself does the idempotency, conflict detection and schema enforcement.

- Appends (``format("delta")``, the executors writing the files) use the DataFrame writer options
  ``txnAppId``/``txnVersion``: Delta skips a write whose version is not above the last one recorded for the
  app id.
- Merges (``DeltaTable.merge``) take the same pair from the session confs
  ``spark.databricks.delta.write.txnAppId``/``txnVersion`` (Delta >= 2.3, "idempotent DML"). A job merges
  into several tables at once, so each merge runs on a session of its own (:func:`session_with`): its
  marker is set before it starts and no other write, concurrent or later, can commit with it or without
  its own. OPTIMIZE and VACUUM take their bounds the same way.
- Whether a write happened (the ``bool`` result), and the last batch a writer committed, are read back from
  the newest commits of the table history: every write tags its commit with
  ``userMetadata = "timestone:<app_id>:<batch_id>"``.

This module cannot run on machines without the Delta jars; docs/tables.md lists what is tested where.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sinks.arrow_conform import SchemaMismatch
from sinks.store import (
    MARKER_PREFIX,
    Matching,
    TableData,
    TableStore,
    TimeRange,
    check_batch,
    commit_marker,
    merge_condition,
)
from sinks.tables import DEFAULT_CATALOG, TableCatalog, TableSpec

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
#: Delta's bound on the size of the files OPTIMIZE writes.
OPTIMIZE_MAX_FILE_SIZE_CONF = "spark.databricks.delta.optimize.maxFileSize"
#: Files below this size are what OPTIMIZE compacts.
OPTIMIZE_MIN_FILE_SIZE_CONF = "spark.databricks.delta.optimize.minFileSize"
#: Delta's refusal of a VACUUM retention below the table's ``delta.deletedFileRetentionDuration``.
RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"

__all__ = ["MARKER_PREFIX", "DeltaNativeTableStore", "commit_marker", "latest_marked_batch", "session_with"]


def session_with(spark: SparkSession, conf: Mapping[str, str]) -> SparkSession:
    """A new session of the same Spark application with ``conf`` set: the settings one Delta operation reads
    from its session (a merge's transaction ids, OPTIMIZE's and VACUUM's bounds), which no other operation,
    concurrent or later, may inherit. It shares the application's cache and catalog, not its settings."""
    session = spark.newSession()
    for key, value in conf.items():
        session.conf.set(key, value)
    return session


#: How many of a table's newest commits :meth:`DeltaNativeTableStore.committed_batch` reads at first, and
#: by how much it widens the window while it finds no commit of the writer.
HISTORY_WINDOW = 64
HISTORY_GROWTH = 16


def latest_marked_batch(history: Callable[[int | None], list[Any]], app_id: str) -> int | None:
    """The batch id of the newest commit marked by ``app_id`` (:func:`sinks.store.commit_marker`), reading
    the history newest first in growing windows: ``history(n)`` gives the newest ``n`` commits (each with
    ``userMetadata``), ``history(None)`` all that the log keeps.

    A writer's batches are committed in order, so its newest marked commit holds its highest batch id; a
    job that writes a table every batch finds it among the first commits, whatever the table's age.
    """
    prefix = f"{MARKER_PREFIX}{app_id}:"
    limit: int | None = HISTORY_WINDOW
    while True:
        commits = history(limit)
        for commit in commits:
            marker = commit["userMetadata"]
            if isinstance(marker, str) and marker.startswith(prefix) and marker[len(prefix) :].isdigit():
                return int(marker[len(prefix) :])
        if limit is None or len(commits) < limit:
            return None
        limit = limit * HISTORY_GROWTH if limit < HISTORY_WINDOW * HISTORY_GROWTH**2 else None


class DeltaNativeTableStore(TableStore):
    """:class:`~sinks.store.TableStore` over Spark's Delta data source and ``delta.tables.DeltaTable``."""

    backend = "native"

    def __init__(
        self,
        spark: SparkSession,
        root: str | None,
        catalog: TableCatalog = DEFAULT_CATALOG,
        *,
        namespace: str | None = None,
        max_commit_attempts: int = 8,
    ) -> None:
        super().__init__(catalog)
        if not root and not namespace:
            raise ValueError("give a root path, a namespace (catalog.schema), or both")
        self.spark = spark
        self.root = root
        self.namespace = namespace
        self.max_commit_attempts = max_commit_attempts
        self._ensured: set[str] = set()

    # -- addressing --------------------------------------------------------------------------------------

    def location(self, name: str) -> str:
        spec = self.spec(name)
        return spec.qualified_name(self.namespace) if self.namespace else spec.location(self.root or "")

    def _identifier(self, name: str) -> str:
        """The SQL identifier: ``catalog.schema.table`` or ``delta.`/path```."""
        if self.namespace:
            return ".".join(f"`{part}`" for part in self.location(name).split("."))
        return f"delta.`{self.location(name)}`"

    def _delta_table(self, name: str, session: SparkSession | None = None) -> Any:
        from delta.tables import DeltaTable

        if self.namespace:
            return DeltaTable.forName(session or self.spark, self.location(name))
        return DeltaTable.forPath(session or self.spark, self.location(name))

    # -- lifecycle ---------------------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        from delta.tables import DeltaTable

        if self.namespace:
            return bool(self.spark.catalog.tableExists(self.location(name)))
        return bool(DeltaTable.isDeltaTable(self.spark, self.location(name)))

    def ensure(self, name: str) -> None:
        from delta.tables import DeltaTable

        spec = self.spec(name)
        builder = DeltaTable.createIfNotExists(self.spark)
        if self.namespace:
            builder = builder.tableName(self.location(name))
            if self.root:  # external table at a known location
                builder = builder.location(spec.location(self.root))
        else:
            builder = builder.location(self.location(name))
        builder = builder.addColumns(spec.schema).comment(spec.description)
        if spec.partition_by:
            builder = builder.partitionedBy(*spec.partition_by)
        for key, value in spec.properties.items():
            builder = builder.property(key, value)
        builder.execute()
        self._evolve(spec)
        self._ensured.add(name)

    def _evolve(self, spec: TableSpec) -> None:
        detail = self._delta_table(spec.name).detail().select("partitionColumns", "properties").first()
        partitions = list(detail["partitionColumns"] or [])
        if partitions != list(spec.partition_by):
            raise SchemaMismatch(
                f"{spec.name}: table is partitioned by {partitions}, spec says {spec.partition_by}"
            )
        existing = {f.name: f for f in self._load(spec.name).schema.fields}
        missing = []
        for declared in spec.schema.fields:
            found = existing.get(declared.name)
            if found is None:
                missing.append(f"`{declared.name}` {declared.dataType.simpleString()}")
            elif found.dataType.simpleString() != declared.dataType.simpleString():
                raise SchemaMismatch(
                    f"{spec.name}.{declared.name}: table has {found.dataType.simpleString()}, "
                    f"spec says {declared.dataType.simpleString()}"
                )
        if missing:
            self.spark.sql(f"ALTER TABLE {self._identifier(spec.name)} ADD COLUMNS ({', '.join(missing)})")
        properties = dict(detail["properties"] or {})
        absent = {k: v for k, v in spec.properties.items() if properties.get(k) != v}
        if absent:
            assignments = ", ".join(f"'{k}' = '{v}'" for k, v in absent.items())
            self.spark.sql(f"ALTER TABLE {self._identifier(spec.name)} SET TBLPROPERTIES ({assignments})")

    def _ensure_once(self, name: str) -> None:
        if name not in self._ensured:
            self.ensure(name)

    # -- writes ------------------------------------------------------------------------------------------

    def append(self, name: str, data: TableData, app_id: str, batch_id: int) -> bool:
        check_batch(app_id, batch_id)
        self._ensure_once(name)
        frame = self._frame(name, data)
        before = self.version(name)
        writer = (
            frame.write.format("delta")
            .mode("append")
            .option("txnAppId", app_id)
            .option("txnVersion", batch_id)
            .option("userMetadata", commit_marker(app_id, batch_id))
        )
        self._with_retries(
            lambda: (
                writer.saveAsTable(self.location(name))
                if self.namespace
                else writer.save(self.location(name))
            )
        )
        return self._committed_since(name, before, app_id, batch_id)

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
        from pyspark.sql import functions as F

        check_batch(app_id, batch_id)
        self._ensure_once(name)
        condition = F.expr(merge_condition(tuple(keys or self.spec(name).merge_keys), quote="`"))
        for matching in target_where:  # Delta's data skipping reads only the files that may hold these
            condition = condition & F.col(f"t.`{matching.column}`").isin(list(matching.values))
        source = self._frame(name, data)
        before = self.version(name)
        # this merge's own session: its batch marker cannot leak into another write, nor another's into it
        session = session_with(
            self.spark,
            {
                TXN_APP_ID_CONF: app_id,
                TXN_VERSION_CONF: str(batch_id),
                USER_METADATA_CONF: commit_marker(app_id, batch_id),
            },
        )

        def run() -> None:
            builder = self._delta_table(name, session).alias("t").merge(source.alias("s"), condition)
            if delete_when is not None:
                builder = builder.whenMatchedDelete(condition=delete_when)
            if update and update_set:
                builder = builder.whenMatchedUpdate(condition=update_when, set=dict(update_set))
            elif update:
                builder = builder.whenMatchedUpdateAll(condition=update_when)
            if insert:
                builder = builder.whenNotMatchedInsertAll(condition=insert_when)
            builder.execute()

        self._with_retries(run)
        return self._committed_since(name, before, app_id, batch_id)

    def _frame(self, name: str, data: TableData) -> DataFrame:
        """A DataFrame with exactly the table's declared columns, in order (Arrow input is converted)."""
        spec = self.spec(name)
        if not (hasattr(data, "sparkSession") and hasattr(data, "toArrow")):
            from sinks.arrow_conform import conform, to_arrow_table

            data = self.spark.createDataFrame(conform(to_arrow_table(data), spec.arrow_schema, name))
        from pyspark.sql import functions as F

        extra = [c for c in data.columns if c not in spec.column_names]
        if extra:
            raise SchemaMismatch(f"{name}: columns not in the table: {extra}")
        columns = []
        for field in spec.schema.fields:
            if field.name in data.columns:
                columns.append(F.col(f"`{field.name}`"))
            elif field.nullable:  # same rule as the delta-rs backend: absent nullable columns are null
                columns.append(F.lit(None).cast(field.dataType).alias(field.name))
            else:
                raise SchemaMismatch(
                    f"{name}.{field.name}: column missing (type {field.dataType.simpleString()})"
                )
        return data.select(*columns)

    def _with_retries(self, write: Any) -> None:
        """Retry Delta's optimistic-concurrency conflicts; Delta's txn check keeps retries idempotent."""
        from delta.exceptions import DeltaConcurrentModificationException

        for attempt in range(self.max_commit_attempts):
            try:
                write()
                return
            except DeltaConcurrentModificationException:
                if attempt + 1 == self.max_commit_attempts:
                    raise
                time.sleep(min(2.0, 0.05 * 2**attempt))

    def _committed_since(self, name: str, before: int, app_id: str, batch_id: int) -> bool:
        """Whether a commit after ``before`` carries this write's marker (Delta skips replays silently):
        only the commits since are read."""
        newer = self.version(name) - before
        if newer <= 0:
            return False
        marker = commit_marker(app_id, batch_id)
        commits = self._delta_table(name).history(newer).select("userMetadata").collect()
        return any(commit["userMetadata"] == marker for commit in commits)

    # -- reads -------------------------------------------------------------------------------------------

    def _load(self, name: str) -> DataFrame:
        if self.namespace:
            return self.spark.read.table(self.location(name))
        return self.spark.read.format("delta").load(self.location(name))

    def read(self, name: str, within: TimeRange | None = None) -> DataFrame:
        """The snapshot as of this call, pinned to its version (a plain Delta read would re-resolve the
        latest one whenever it runs, unlike the delta-rs store's fixed file list). Delta's own data
        skipping reads only the files ``within`` may need."""
        version = self.version(name)
        frame = self.spark.sql(f"SELECT * FROM {self._identifier(name)} VERSION AS OF {version}")
        return frame if within is None else within.rows(frame)  # the table's own columns, as written

    def compact(self, name: str, target_bytes: int, min_files: int = 2, *, settle_s: float = 600.0) -> int:
        """Delta's ``OPTIMIZE`` (bin-packing) of the files under ``target_bytes`` into files of up to that
        size. Delta has no setting for ``min_files``: it compacts any partition with two such files, nor
        for ``settle_s``; a ``cluster_by`` table is not clustered here (docs/ota.md, "Table layout")."""
        size = str(target_bytes)
        session = session_with(
            self.spark, {OPTIMIZE_MAX_FILE_SIZE_CONF: size, OPTIMIZE_MIN_FILE_SIZE_CONF: size}
        )
        metrics = self._delta_table(name, session).optimize().executeCompaction().first()
        return int(metrics["metrics"]["numFilesRemoved"]) if metrics is not None else 0

    def vacuum(self, name: str, retention_hours: float) -> int | None:
        """Delta's ``VACUUM ... RETAIN n HOURS`` (which does not say how many files it deleted)."""
        session = session_with(self.spark, {RETENTION_CHECK_CONF: "false"})
        self._delta_table(name, session).vacuum(float(retention_hours))
        return None

    def tidy_log(self, name: str) -> int | None:
        """Nothing to do: native Delta checkpoints its log itself (every ``delta.checkpointInterval``
        commits) and deletes the entries older than ``delta.logRetentionDuration`` when it does."""
        return None

    def set_properties(self, name: str, properties: Mapping[str, str]) -> bool:
        self._ensure_once(name)
        detail = self._delta_table(name).detail().select("properties").first()
        current = dict(detail["properties"] or {}) if detail is not None else {}
        changed = {k: v for k, v in properties.items() if current.get(k) != v}
        if changed:
            assignments = ", ".join(f"'{k}' = '{v}'" for k, v in changed.items())
            self.spark.sql(f"ALTER TABLE {self._identifier(name)} SET TBLPROPERTIES ({assignments})")
        return bool(changed)

    def data_files(self, name: str) -> int:
        detail = self._delta_table(name).detail().select("numFiles").first()
        return int(detail["numFiles"]) if detail is not None else 0

    def read_arrow(
        self,
        name: str,
        within: TimeRange | None = None,
        *,
        where: Sequence[Matching] = (),
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Spark's Delta read with the filters and the projection pushed down to it (Delta's data skipping
        opens only the files whose statistics allow the values)."""
        from sinks.arrow_conform import conform
        from sinks.spark_arrow import to_arrow

        frame = self.read(name, within)
        for matching in where:
            frame = matching.rows(frame)
        if columns is not None:
            frame = frame.select(*columns)
        return conform(frame.toArrow(), to_arrow(frame.schema), name)

    def version(self, name: str) -> int:
        return int(self._delta_table(name).history(1).select("version").first()[0])

    def committed_batch(self, name: str, app_id: str) -> int | None:
        """From the commit markers of the newest commits (:func:`latest_marked_batch`)."""
        table = self._delta_table(name)

        def history(limit: int | None) -> list[Any]:
            commits = table.history(limit) if limit is not None else table.history()
            return commits.select("userMetadata").collect()

        return latest_marked_batch(history, app_id)
