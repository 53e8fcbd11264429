"""Files that each hold few values of a column, so that a read or a merge filtered on it opens few files.

A table declared with ``cluster_by`` (``action_executions``, by ``action_id``) is laid out by its store's
compaction so that each data file's Delta statistics (the column's minimum and maximum) admit few values:
a filter on the column then selects the files by their statistics alone (:func:`admitted`), and the cost
of reading or merging an action follows its rows, not the table's history. Partitioning by the column
would give the same pruning with a directory and at least one small file per value, for ever; here the
values that have settled share files.

One pass, planned from the add actions' statistics alone (:func:`plan`):

- **split**: each *loose* file (several values, not written by a pack: what merges and appends leave, a
  file per batch of rows for several actions) is rewritten as one file per value;
- **pack**: the single-value files older than ``settle_ms`` (a value still being written keeps a file of
  its own, which a merge rewrites alone) and the files of earlier packs are taken in the order of their
  ranges, in runs of about ``target_bytes``; a run holding ``min_files`` files more than its bytes need is
  rewritten sorted by the column and cut at value boundaries into files of up to ``target_bytes``.

Every rewrite is one Delta commit that removes the files it read and adds the files it wrote, without a
data change (readers, change feeds and batch markers see nothing). A commit that loses to a concurrent
write of the same files (a merge rewrote one of them) fails and its files are deleted; the next pass plans
again from the table as it is.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from sinks.arrow_conform import conform
from sinks.object_store import FileLocation
from sinks.parquet_files import WrittenFile, remove_files, write_file

log = logging.getLogger(__name__)

#: The name of every file a pack writes starts so: such a file is settled, whatever its range.
PACKED_PREFIX = "packed-"
#: The name of every file a split writes starts so (one value each).
SPLIT_PREFIX = "split-"
#: Rows per row group of the files written: a reader of one value skips the groups of the others.
ROW_GROUP_ROWS = 8192


def is_clustered(path: str) -> bool:
    """Whether the data file at ``path`` was written by clustering (plain Parquet types, no string views)."""
    return _named(path, PACKED_PREFIX, SPLIT_PREFIX)


def _named(path: str, *prefixes: str) -> bool:
    """Whether the name of the file at ``path`` starts with one of ``prefixes``."""
    return path.rsplit("/", 1)[-1].startswith(prefixes)


@dataclass(frozen=True)
class DataFile:
    """A live data file as the add action's statistics describe it (``low``/``high``: the column's
    minimum and maximum, None when the file has none)."""

    path: str
    size: int
    rows: int
    low: Any
    high: Any
    modified_ms: int

    @property
    def packed(self) -> bool:
        return _named(self.path, PACKED_PREFIX)

    @property
    def single(self) -> bool:
        """Holds one value of the column."""
        return self.low is not None and self.low == self.high


def data_files(table: DeltaTable, column: str) -> list[DataFile]:
    """The live files of ``table`` with their statistics on ``column``."""
    actions = pa.table(table.get_add_actions(flatten=True))
    lows = _stat(actions, f"min.{column}")
    highs = _stat(actions, f"max.{column}")
    modified = actions.column("modification_time").cast(pa.timestamp("ms")).cast(pa.int64()).to_pylist()
    return [
        DataFile(path, size, rows, low, high, when)
        for path, size, rows, low, high, when in zip(
            actions.column("path").to_pylist(),
            actions.column("size_bytes").to_pylist(),
            actions.column("num_records").to_pylist(),
            lows,
            highs,
            modified,
            strict=True,
        )
    ]


def admitted(lows: Sequence[Any], highs: Sequence[Any], values: Sequence[Any]) -> list[bool]:
    """For each file (its minimum and maximum of a column, None: no statistics), whether it may hold one of
    ``values``: a value ``v`` with ``low <= v <= high``. A string maximum truncated by its writer (a prefix
    of the true one) admits the values it starts; values of another type than the statistics rule nothing
    out."""
    try:
        wanted = sorted(values)
        return [_admits(low, high, wanted) for low, high in zip(lows, highs, strict=True)]
    except TypeError:
        return [True] * len(lows)


def _admits(low: Any, high: Any, wanted: list[Any]) -> bool:
    if low is None or high is None:
        return True
    at = bisect.bisect_left(wanted, low)
    return at < len(wanted) and (
        wanted[at] <= high or (isinstance(high, str) and str(wanted[at]).startswith(high))
    )


@dataclass(frozen=True)
class Plan:
    """What one pass rewrites: the loose files (each split by value) and the runs to pack."""

    split: list[DataFile]
    packs: list[list[DataFile]]


def plan(files: Sequence[DataFile], target_bytes: int, min_files: int, settle_ms: int) -> Plan:
    """The rewrites that bring ``files`` to the layout (see the module); ``settle_ms``: the age of a
    single-value file before it may be packed with others."""
    loose = [f for f in files if f.low is None or not (f.packed or f.single)]
    settled_before = int(time.time() * 1000) - settle_ms
    packable = [
        f for f in files if f.low is not None and (f.packed or (f.single and f.modified_ms <= settled_before))
    ]
    packs = []
    for run in _runs(packable, target_bytes):
        needed = max(1, math.ceil(sum(f.size for f in run) / target_bytes))
        # a run of packs alone is as its pack left it (cut at values, it may hold one file more than needed)
        if len(run) - needed >= min_files - 1 and not all(f.packed for f in run):
            packs.append(run)
    return Plan(loose, packs)


def _runs(files: Sequence[DataFile], target_bytes: int) -> list[list[DataFile]]:
    """``files`` in the order of their ranges, grouped: overlapping ranges always in one group, and
    neighbouring groups together while they stay within ``target_bytes``."""
    ordered = sorted(files, key=lambda f: (f.low, f.high))
    overlapping: list[list[DataFile]] = []
    end: Any = None
    for f in ordered:
        if overlapping and f.low <= end:
            overlapping[-1].append(f)
            end = max(end, f.high)
        else:
            overlapping.append([f])
            end = f.high
    runs: list[list[DataFile]] = []
    size = 0
    for group in overlapping:
        group_size = sum(f.size for f in group)
        if runs and size + group_size <= target_bytes:
            runs[-1].extend(group)
            size += group_size
        else:
            runs.append(list(group))
            size = group_size
    return runs


class Clustering:
    """One pass over a delta-rs table (unpartitioned, plain Parquet) by ``column``."""

    def __init__(self, table: DeltaTable, location: FileLocation, schema: pa.Schema, column: str, name: str):
        self.table = table
        self.location = location
        self.schema = schema
        self.column = column
        self.name = name

    def run(self, target_bytes: int, min_files: int, settle_ms: int) -> int:
        """Split the loose files (a commit each), then pack the runs that need it (a commit each); the
        number of files removed."""
        removed = 0
        for loose in plan(data_files(self.table, self.column), target_bytes, min_files, settle_ms).split:
            removed += self._rewrite([loose], self._by_value(self._rows([loose])), SPLIT_PREFIX)
        self.table.update_incremental()
        for run in plan(data_files(self.table, self.column), target_bytes, min_files, settle_ms).packs:
            pieces = _cut(self._rows(run), self.column, run, target_bytes)
            removed += self._rewrite(run, pieces, PACKED_PREFIX)
        return removed

    def _rows(self, files: Sequence[DataFile]) -> pa.Table:
        filesystem, directory = self.location.open()
        tables = [
            conform(pq.read_table(f"{directory}/{f.path}", filesystem=filesystem), self.schema, self.name)
            for f in files
        ]
        rows = pa.concat_tables(tables)
        return rows.sort_by([(self.column, "ascending")])

    def _by_value(self, rows: pa.Table) -> list[pa.Table]:
        """Sorted ``rows`` cut where the column's value changes."""
        values = rows.column(self.column).combine_chunks()
        if rows.num_rows == 0:
            return []
        changes = pc.indices_nonzero(pc.not_equal(values[1:], values[:-1])).to_pylist()
        starts = [0, *(i + 1 for i in changes)]
        ends = [*starts[1:], rows.num_rows]
        return [rows.slice(start, end - start) for start, end in zip(starts, ends, strict=True)]

    def _rewrite(self, removed: Sequence[DataFile], pieces: Sequence[pa.Table], prefix: str) -> int:
        """Write ``pieces`` as files and commit them in place of ``removed``; 0 when a concurrent write
        replaced one of ``removed`` first (the files written are deleted)."""
        write_id = uuid.uuid4().hex
        written: list[WrittenFile] = []
        try:
            for i, piece in enumerate(pieces):
                name = f"{prefix}{write_id}-c{i:05d}.snappy.parquet"
                written.append(write_file(self.location, name, piece, ROW_GROUP_ROWS))
            self.table.update_incremental()  # a commit since the plan may have replaced a file read
            live = set(self.table.get_add_actions().column("path").to_pylist())
            if all(f.path in live for f in removed):
                now = int(time.time() * 1000)
                actions: list[AddAction | RemoveAction] = [
                    RemoveAction(f.path, False, now, f.size, {}) for f in removed
                ]
                actions += [
                    AddAction(w.path, w.size, {}, w.modification_time, False, w.stats) for w in written
                ]
                self.table.create_write_transaction(actions, mode="append", schema=self.table.schema())
                return len(removed)
        except CommitFailedError:
            self.table.update_incremental()
        except BaseException:
            remove_files(self.location, write_id, written)
            raise
        log.debug("clustering of %s lost to a concurrent write of its files", self.name)
        remove_files(self.location, write_id, written)
        return 0


def _cut(rows: pa.Table, column: str, files: Sequence[DataFile], target_bytes: int) -> list[pa.Table]:
    """Sorted ``rows`` in pieces of about ``target_bytes`` (as the ``files`` they came from weigh a row),
    each cut where the column's value changes unless one value alone outweighs the target."""
    total_rows = sum(f.rows for f in files) or 1
    per_piece = max(1, int(target_bytes / (sum(f.size for f in files) / total_rows)))
    values = rows.column(column)
    pieces = []
    start = 0
    while start < rows.num_rows:
        end = min(start + per_piece, rows.num_rows)
        if end < rows.num_rows:
            boundary = values[end].as_py()
            back = _first_index(values, boundary, start)
            if back > start:
                end = back  # the value at the cut starts the next piece
        pieces.append(rows.slice(start, end - start))
        start = end
    return pieces


def _first_index(values: pa.ChunkedArray, value: Any, start: int) -> int:
    """The first index at or after ``start`` of ``value`` in the sorted ``values``."""
    tail = values[start:]
    return start + int(pc.index(tail, value).as_py())


def _stat(actions: pa.Table, name: str) -> list[Any]:
    if name not in actions.column_names:
        return [None] * actions.num_rows
    return actions.column(name).to_pylist()
