"""Data files of a Delta table written by Spark tasks, reported to the driver as small rows.

:func:`write_files` runs a :class:`FileWriter` in every task of a DataFrame (``mapInArrow``). Each task
conforms its Arrow batches to the table's schema (:func:`sinks.arrow_conform.conform`), splits them by
partition value and streams them into one snappy Parquet file per partition value it sees, under Hive-style
directories (:mod:`sinks.delta_encoding`), without the partition columns. Batches are buffered up to
:data:`ROW_GROUP_BYTES` per file and written as one row group, so a task holds at most that much per open
file, never its whole partition. Each task returns one row per file: its path relative to the table
directory, size, partition values, modification time and Delta stats, which is all a Delta commit needs.

File names are ``part-<task partition>-<write id>-<task attempt id>-c<nnn>.snappy.parquet``: unique, and the
write id (one per call of :func:`write_files`) lets :func:`remove_files` find the files of a failed write.
The files go to a local directory or an object store (:class:`sinks.object_store.FileLocation`, opened in
the task). Nothing here commits: until the driver commits the add actions, the files are invisible to
readers, and files of a write that never commits are left for ``vacuum``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from glob import escape, glob
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sinks.arrow_conform import conform
from sinks.delta_encoding import FileStats, partition_path, partition_value
from sinks.object_store import FileLocation, local_directory
from sinks.writer_rules import check_rules

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: What each task returns per file written (the ``mapInArrow`` output schema).
FILES_SCHEMA = "path string, size bigint, partition_values string, modification_time bigint, stats string"
#: Arrow data buffered per open file before it is written as a row group.
ROW_GROUP_BYTES = 64 << 20

_FILES_ARROW = pa.schema(
    [
        ("path", pa.string()),
        ("size", pa.int64()),
        ("partition_values", pa.string()),
        ("modification_time", pa.int64()),
        ("stats", pa.string()),
    ]
)
_ROW = "__row"


@dataclass(frozen=True)
class WrittenFile:
    """One data file a task wrote; ``path`` is relative to the table directory, as on disk."""

    path: str
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    stats: str

    @property
    def rows(self) -> int:
        return int(json.loads(self.stats)["numRecords"])


@dataclass(frozen=True)
class FileWriter:
    """The ``mapInArrow`` function writing a table's data files (pickled into the Spark tasks).

    ``schema`` is the table's whole Arrow schema, partition columns included; ``table`` names it in errors.
    """

    location: FileLocation
    schema: pa.Schema
    partition_by: tuple[str, ...]
    table: str
    write_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition, attempt = _task_ids()
        data_schema = pa.schema([f for f in self.schema if f.name not in self.partition_by])
        filesystem, directory = self.location.open()
        files: dict[tuple[Any, ...], _DataFile] = {}
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                batch = check_rules(batch, self.table)  # (a table with rules for its writers)
                rows = conform(pa.Table.from_batches([batch]), self.schema, self.table)
                for key, part in split_by_partition(rows, self.partition_by):
                    if key not in files:
                        values = dict(zip(self.partition_by, map(partition_value, key), strict=True))
                        name = f"part-{partition:05d}-{self.write_id}-{attempt}-c{len(files):03d}"
                        files[key] = _DataFile(
                            filesystem, directory, values, f"{name}.snappy.parquet", data_schema
                        )
                    files[key].write(part.drop_columns(list(self.partition_by)))
            written = [f.close() for f in files.values()]
        except BaseException:
            for data_file in files.values():
                data_file.abort()
            raise
        if written:
            yield pa.RecordBatch.from_pylist(written, schema=_FILES_ARROW)


def split_by_partition(rows: pa.Table, columns: Sequence[str]) -> Iterator[tuple[tuple[Any, ...], pa.Table]]:
    """``rows`` grouped by the values of ``columns``: (values as Python objects, the rows having them)."""
    if not columns:
        yield (), rows
        return
    index = pa.array(np.arange(rows.num_rows, dtype=np.int64))
    groups = (
        rows.select(list(columns))
        .append_column(_ROW, index)
        .group_by(list(columns), use_threads=False)
        .aggregate([(_ROW, "list")])
    )
    keys = zip(*(groups.column(c).to_pylist() for c in columns), strict=True)
    if groups.num_rows == 1:
        yield next(keys), rows
        return
    for key, taken in zip(keys, groups.column(f"{_ROW}_list"), strict=True):
        yield key, rows.take(taken.values)


class _DataFile:
    """One Parquet file being written by a task, with its stats."""

    def __init__(
        self,
        filesystem: pafs.FileSystem,
        directory: str,
        values: dict[str, str | None],
        name: str,
        schema: pa.Schema,
        row_group_rows: int | None = None,
        string_stats: bool = False,
    ) -> None:
        self.row_group_rows = row_group_rows
        self.relative = f"{partition_path(values)}/{name}" if values else name
        self.values = values
        self.filesystem = filesystem
        self.path = f"{directory}/{self.relative}"
        if isinstance(filesystem, pafs.LocalFileSystem):  # object stores have no directories to make
            filesystem.create_dir(self.path.rsplit("/", 1)[0], recursive=True)
        self.stream = filesystem.open_output_stream(self.path)
        self.writer = pq.ParquetWriter(self.stream, schema, compression="snappy")
        self.stats = FileStats(schema, strings=string_stats)
        self.pending: list[pa.Table] = []
        self.pending_bytes = 0

    def write(self, table: pa.Table) -> None:
        self.stats.add(table)
        self.pending.append(table)
        self.pending_bytes += table.nbytes
        if self.pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            self.writer.write_table(pa.concat_tables(self.pending), row_group_size=self.row_group_rows)
        self.pending, self.pending_bytes = [], 0

    def close(self) -> dict[str, Any]:
        """Finish the file; its row of :data:`FILES_SCHEMA`."""
        self._flush()
        self.writer.close()
        size = self.stream.tell()
        self.stream.close()  # an object store's upload completes here
        return {
            "path": self.relative,
            "size": size,
            "partition_values": json.dumps(self.values),
            "modification_time": time.time_ns() // 10**6,
            "stats": self.stats.to_json(),
        }

    def abort(self) -> None:
        with suppress(Exception):
            self.writer.close()
        with suppress(Exception):
            self.stream.close()
        with suppress(Exception):
            self.filesystem.delete_file(self.path)


def write_file(
    location: FileLocation, name: str, rows: pa.Table, row_group_rows: int | None = None
) -> WrittenFile:
    """``rows`` (an unpartitioned table's, in its schema) as one data file ``name`` in the table directory,
    in row groups of ``row_group_rows`` (so that readers skip the groups whose statistics rule a filter out),
    with statistics of its string columns too; not committed."""
    filesystem, directory = location.open()
    data_file = _DataFile(filesystem, directory, {}, name, rows.schema, row_group_rows, string_stats=True)
    try:
        data_file.write(rows)
        written = data_file.close()
    except BaseException:
        data_file.abort()
        raise
    return WrittenFile(written["path"], written["size"], {}, written["modification_time"], written["stats"])


def _task_ids() -> tuple[int, int]:
    """(partition id, task attempt id) of the running Spark task; outside Spark, 0 and a random id."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return 0, uuid.uuid4().int % 10**12
    return context.partitionId(), context.taskAttemptId()


def write_files(frame: DataFrame, writer: FileWriter) -> list[WrittenFile]:
    """Write ``frame``'s rows with ``writer`` in its Spark tasks; the files written (none for no rows)."""
    return [
        WrittenFile(
            path=row.path,
            size=row.size,
            partition_values=json.loads(row.partition_values),
            modification_time=row.modification_time,
            stats=row.stats,
        )
        for row in frame.mapInArrow(writer, FILES_SCHEMA).collect()
    ]


def remove_files(location: FileLocation, write_id: str, files: Iterable[WrittenFile] | None = None) -> None:
    """Best effort: delete ``files``, or when they are unknown (the job failed) every file of ``write_id``
    in a local table directory (on an object store such files are left to ``vacuum``: finding them would
    list the whole table)."""
    if files is not None:
        filesystem, directory = location.open()
        for written in files:
            with suppress(Exception):
                filesystem.delete_file(f"{directory}/{written.path}")
        return
    local = local_directory(location.uri)
    if local is None:
        return
    for path in glob(os.path.join(escape(local), "**", f"part-*-{write_id}-*.parquet"), recursive=True):
        with suppress(OSError):
            os.remove(path)
