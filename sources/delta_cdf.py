"""``delta_cdf``: a Spark streaming source over a Delta table's change data feed, read with delta-rs.

Spark without the Delta jars cannot stream a Delta table, yet the OTA fanout must follow ``actions`` and the
summaries must follow ``action_executions``. This source reads the change data feed through delta-rs
(``DeltaTable.load_cdf``); the table needs ``delta.enableChangeDataFeed=true`` from the version it starts at.

Options (mirroring Delta's own streaming source):

- ``path`` (required): the table's location.
- ``startingVersion``: ``latest`` (default: changes committed after the version current when the query first
  started), ``earliest`` (version 0), or a version number (that version and later).
- ``maxVersionsPerTrigger``: at most this many table versions per micro-batch (Spark receives it as a
  ``ReadMaxFiles`` limit, one version counting as one file, so ``Trigger.AvailableNow`` honours it).
- ``versionsPerPartition`` (default 16): versions read by one Spark task.

Offsets are ``{"version": n}``: the next version to read. A batch ``[start, end)`` has one partition per
range of versions; rows come sorted by commit version. Output: the table's columns, then ``_change_type``
(``insert``, ``update_preimage``, ``update_postimage``, ``delete``), ``_commit_version`` (long) and
``_commit_timestamp`` (timestamp). The schema is the table's when the query starts; columns added later are
not returned until the query restarts.

Register once per session with :func:`register` (``spark.dataSource.register(DeltaCdfDataSource)``), then
``spark.readStream.format("delta_cdf").option("path", p).load()``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from sinks.arrow_conform import conform
from sinks.spark_arrow import to_arrow, to_spark
from sinks.store import TableStoreError

from .stream_api import BatchStarts, ReadAllAvailable, ReadLimit, ReadMaxFiles, SupportsTriggerAvailableNow

CDF_COLUMNS = [
    StructField("_change_type", StringType(), False),
    StructField("_commit_version", LongType(), False),
    StructField("_commit_timestamp", TimestampType(), False),
]
DEFAULT_VERSIONS_PER_PARTITION = 16


def cdf_schema(path: str, storage_options: dict[str, str] | None = None) -> StructType:
    """The stream's schema: the table's columns as Spark types, then the change columns.

    A column-mapped table is refused here, when the query is made: delta-rs reads no change feed of it."""
    table = DeltaTable(path, storage_options=storage_options)
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise TableStoreError(
            f"delta_cdf: the table at {path} uses column mapping (delta.columnMapping.mode={mode}), whose "
            "change data feed delta-rs cannot read: stream it with Delta's own readChangeFeed on a session "
            "with Delta"
        )
    arrow = pa.schema(table.schema().to_arrow())
    table_fields = [f for f in to_spark(arrow).fields if f.name not in {c.name for c in CDF_COLUMNS}]
    return StructType([*table_fields, *CDF_COLUMNS])


def read_changes(
    path: str,
    first_version: int,
    last_version: int,
    schema: pa.Schema,
    storage_options: dict[str, str] | None = None,
) -> pa.Table:
    """Changes of versions ``first_version..last_version`` (inclusive) cast to ``schema``, by version.

    ``load_cdf`` returns ``string_view``/``binary_view`` columns, a ``uint64`` version, naive millisecond
    timestamps and partition columns last; Spark wants exactly the declared schema.
    """
    try:
        table = DeltaTable(path, storage_options=storage_options)
        changes = pa.table(table.load_cdf(starting_version=first_version, ending_version=last_version))
    except (DeltaError, pa.ArrowException, OSError) as exc:
        raise ChangesUnavailable(path, first_version, last_version, exc) from exc
    changes = conform(changes, schema, f"delta_cdf({path})", allow_missing_nullable=True, drop_extra=True)
    return changes.sort_by([("_commit_version", "ascending")])


class ChangesUnavailable(ValueError):
    """Versions of a table's change feed that cannot be read any more (vacuumed, or their log cleaned up)."""

    def __init__(self, path: str, first: int, last: int, cause: Exception) -> None:
        super().__init__(
            f"delta_cdf: versions {first}..{last} of the table at {path} cannot be read ({cause}); the "
            "files of older versions are kept for delta.deletedFileRetentionDuration (maintenance "
            "retention_hours) and their log entries for delta.logRetentionDuration (maintenance "
            "log_retention_hours): a stream must not lag further behind, or restart it from a later version"
        )


@dataclass(frozen=True)
class VersionRange(InputPartition):
    """Versions ``first..last`` (inclusive) of the table: all a read task needs, since it runs elsewhere."""

    path: str
    first: int
    last: int


class DeltaCdfStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans version ranges on the driver side and reads them with delta-rs in the executors."""

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        # ``options`` is Spark's case-insensitive mapping: keep it, a plain dict copy would lose that.
        self.schema = schema
        self.path = options["path"]
        self.starting_version = str(options.get("startingVersion", "latest")).strip().lower()
        max_versions = options.get("maxVersionsPerTrigger")
        self.max_versions = int(max_versions) if max_versions else None
        if self.max_versions is not None and self.max_versions < 1:
            raise ValueError("maxVersionsPerTrigger must be at least 1")
        self.versions_per_partition = int(options.get("versionsPerPartition", DEFAULT_VERSIONS_PER_PARTITION))
        self.available_now_end: int | None = None
        self._initial: dict | None = None
        self._starts = BatchStarts()

    def _next_version(self) -> int:
        """One past the table's current version: the exclusive end of what can be read now."""
        return DeltaTable(self.path).version() + 1

    def initialOffset(self) -> dict:
        """The first version to read, computed once (Spark may ask again: ``latest`` must not move)."""
        if self._initial is None:
            self._initial = self._initial_version()
        return self._initial

    def _initial_version(self) -> dict:
        if self.starting_version == "earliest":
            return {"version": 0}
        if self.starting_version == "latest":
            return {"version": self._next_version()}
        try:
            version = int(self.starting_version)
        except ValueError:
            raise ValueError(
                "startingVersion must be 'latest', 'earliest' or a version number, "
                f"got {self.starting_version!r}"
            ) from None
        if version < 0:
            raise ValueError(f"startingVersion must not be negative, got {version}")
        return {"version": version}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxFiles(self.max_versions) if self.max_versions else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now_end = self._next_version()

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        if start is None:  # Spark 4.0 and 4.1 give neither (sources/stream_api.py)
            start, limit = self._starts.start(self.initialOffset), self.getDefaultReadLimit()
        end = self._next_version()
        if self.available_now_end is not None:
            end = min(end, self.available_now_end)
        if isinstance(limit, ReadMaxFiles):
            end = min(end, start["version"] + limit.max_files)
        offset = {"version": max(end, start["version"])}
        self._starts.ended(offset)
        return offset

    def reportLatestOffset(self) -> dict:
        return {"version": self._next_version()}

    def partitions(self, start: dict, end: dict) -> list[VersionRange]:
        self._starts.ended(end)
        first, stop = start["version"], end["version"]
        step = max(1, self.versions_per_partition)
        return [VersionRange(self.path, v, min(v + step, stop) - 1) for v in range(first, stop, step)]

    def read(self, partition: VersionRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]  # Spark passes back a partition made above
        arrow_schema = to_arrow(self.schema)
        changes = read_changes(partition.path, partition.first, partition.last, arrow_schema)
        yield from changes.to_batches()

    def commit(self, end: dict) -> None:
        """Nothing to acknowledge: the table keeps its log, and the checkpoint holds the offset."""


class DeltaCdfDataSource(DataSource):
    """The ``delta_cdf`` format; see the module docstring for options."""

    @classmethod
    def name(cls) -> str:
        return "delta_cdf"

    def schema(self) -> StructType:
        if "path" not in self.options:
            raise ValueError("delta_cdf needs the 'path' option")
        return cdf_schema(self.options["path"])

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DeltaCdfStreamReader(schema, self.options)


def register(spark: SparkSession) -> None:
    """Make ``format("delta_cdf")`` available in ``spark`` (once per session)."""
    spark.dataSource.register(DeltaCdfDataSource)
