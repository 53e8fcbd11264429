"""Rows of ``actions`` from Arrow to Python, whatever a writer put in their timestamps.

Delta stores a timestamp as 64-bit microseconds since 1970, so any writer (delta-rs, a notebook, SQL) can
store one after the year 9999 (nanoseconds written as microseconds) or before the year 1, which Python's
``datetime`` cannot hold: converting the row would raise ``OverflowError``, and a job that converts every row
of a batch would fail on that one row again and again. Every timestamp of a row, nested ones included
(``schedule.end_at``), is compared with those bounds in Arrow first; a row that holds one out of range gets
an :class:`OutOfRange` in place of the column holding it, which ``validation.problems`` rejects naming the
column, and every other row and column is converted as it is. The job, ``timestone ota`` and its status
read ``actions`` rows through :func:`python_rows` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.timestamps import first_tick, last_tick

_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


@dataclass(frozen=True)
class OutOfRange:
    """In place of a column's value that holds a timestamp no ``datetime`` can hold."""

    field: str
    """Where it is: the column, or the column and the field within it (``schedule.end_at``)."""

    problem = "a timestamp after the year 9999 or before the year 1 (nanoseconds written as microseconds?)"

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}"


def out_of_range(row: Mapping[str, Any]) -> list[OutOfRange]:
    """The columns of ``row`` (from :func:`python_rows`) that hold a timestamp out of range."""
    return [value for value in row.values() if isinstance(value, OutOfRange)]


def out_of_range_rows(table: pa.Table) -> dict[int, dict[str, OutOfRange]]:
    """The rows of ``table`` (by index) holding a timestamp out of ``datetime``'s range: for each, the
    columns holding one (a column once, named by its first such timestamp)."""
    found: dict[int, dict[str, OutOfRange]] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        if not _holds_timestamps(column.type):
            continue
        for where, mask in _out_of_range(column.combine_chunks(), name):
            for flagged in np.flatnonzero(mask).tolist():
                found.setdefault(flagged, {}).setdefault(name, OutOfRange(where))
    return found


def python_rows(table: pa.Table) -> list[dict[str, Any]]:
    """``table.to_pylist()``, but a column holding a timestamp out of ``datetime``'s range is an
    :class:`OutOfRange` naming it, in that row only; rows keep their order."""
    found = out_of_range_rows(table)
    if not found:
        return table.to_pylist()
    keep = np.ones(table.num_rows, dtype=bool)
    keep[list(found)] = False
    readable = iter(table.filter(pa.array(keep)).to_pylist())
    rows = []
    for index in range(table.num_rows):
        unreadable = found.get(index)
        if unreadable is None:
            rows.append(next(readable))
            continue
        row = table.slice(index, 1)
        rows.append(
            {
                name: unreadable[name] if name in unreadable else row.column(name)[0].as_py()
                for name in table.column_names
            }
        )
    return rows


def _holds_timestamps(kind: pa.DataType) -> bool:
    if pa.types.is_timestamp(kind):
        return True
    if pa.types.is_struct(kind):
        return any(_holds_timestamps(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _holds_timestamps(kind.value_type)
    return False  # a map's timestamps are not looked into: no operator-written table has one


def _out_of_range(values: pa.Array, where: str) -> list[tuple[str, np.ndarray]]:
    """For each timestamp in ``values`` (itself, a struct's fields, a list's items): where it is, and per
    item of ``values`` whether it holds one out of range."""
    kind = values.type
    if pa.types.is_timestamp(kind):
        per_second = _PER_SECOND[kind.unit]
        ticks = values.cast(pa.int64())
        outside = pc.or_(
            pc.less(ticks, first_tick(per_second)),
            pc.greater(ticks, last_tick(per_second)),
        )
        return [(where, pc.fill_null(outside, False).to_numpy(zero_copy_only=False))]
    if pa.types.is_struct(kind):
        found = []
        for i in range(kind.num_fields):
            if _holds_timestamps(kind.field(i).type):  # struct_field: a null struct's fields are null
                child = pc.struct_field(values, [i])
                found += _out_of_range(child, f"{where}.{kind.field(i).name}")
        return found
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        parents = pc.list_parent_indices(values).to_numpy(zero_copy_only=False)
        found = []
        for inner, mask in _out_of_range(pc.list_flatten(values), f"{where}[]"):
            rows = np.zeros(len(values), dtype=bool)
            rows[parents[mask]] = True
            found.append((inner, rows))
        return found
    return []
