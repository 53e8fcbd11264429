"""``actions`` rows reach Python whatever their timestamps hold: one that no ``datetime`` can hold (after the
year 9999, before the year 1) makes its row rejected naming the column, and every other row is read."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from pipelines.actions.arrow_rows import OutOfRange, python_rows
from pipelines.actions.operator import NewAction
from pipelines.actions.validation import problems
from pipelines.timestamps import FIRST_SECOND, LAST_SECOND
from sinks.tables import DEFAULT_CATALOG

SCHEMA = DEFAULT_CATALOG["actions"].arrow_schema
NOW = datetime(2026, 11, 30, 7, 0, tzinfo=UTC)
NANOSECONDS_AS_MICROSECONDS = int(NOW.timestamp() * 1e6) * 1000  # about the year 58,900


def _row(action_id: str) -> dict:
    sha = "9f2c" + "0" * 60
    action = NewAction(
        action_id=action_id, group="g", version="2.0.0", url="https://fw.example/f", sha256=sha
    )
    return action.row(NOW)


def _with_ticks(table: pa.Table, column: str, index: int, ticks: int) -> pa.Table:
    """``table`` with row ``index``'s ``column`` set to ``ticks`` microseconds since 1970."""
    at = table.schema.get_field_index(column)
    values = table.column(at).cast(pa.int64()).to_pylist()
    values[index] = ticks
    return table.set_column(at, table.field(at), pa.array(values, pa.timestamp("us", tz="UTC")))


def test_a_created_at_after_the_year_9999_rejects_its_row_only_naming_the_column():
    table = pa.Table.from_pylist([_row("before"), _row("far"), _row("after")], schema=SCHEMA)
    table = _with_ticks(table, "created_at", 1, NANOSECONDS_AS_MICROSECONDS)
    with pytest.raises(OverflowError):
        table.to_pylist()  # what the job did
    rows = python_rows(table)
    assert [row["id"] for row in rows] == ["before", "far", "after"]  # in order, each read
    assert rows[1]["created_at"] == OutOfRange("created_at")
    assert rows[1]["payload"]["version"] == "2.0.0"  # its other columns as they are
    assert [str(p) for p in problems(rows[1])] == [
        "created_at: a timestamp after the year 9999 or before the year 1"
        " (nanoseconds written as microseconds?)"
    ]
    assert problems(rows[0]) == [] and problems(rows[2]) == []
    assert rows[2] == table.slice(2, 1).to_pylist()[0]


def test_a_nested_timestamp_out_of_range_is_named_by_its_field():
    row = _row("ends-never") | {"schedule": {"start_at": None, "end_at": NOW, "end_behavior": None}}
    table = pa.Table.from_pylist([row], schema=SCHEMA)
    at = table.schema.get_field_index("schedule")
    schedule = table.column(at).combine_chunks()
    kind = schedule.type
    end_at = pa.array([-(10**18)], pa.int64()).cast(kind.field("end_at").type)  # before the year 1
    fields = [schedule.field(i) if kind.field(i).name != "end_at" else end_at for i in range(kind.num_fields)]
    table = table.set_column(at, table.field(at), pa.StructArray.from_arrays(fields, fields=list(kind)))
    (read,) = python_rows(table)
    assert read["schedule"] == OutOfRange("schedule.end_at")
    assert [p.field for p in problems(read)] == ["schedule.end_at"]


def test_the_first_and_last_second_a_datetime_holds_are_read():
    rows = [_row("first"), _row("last"), _row("one-after"), _row("one-before")]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    table = _with_ticks(table, "created_at", 0, FIRST_SECOND * 1_000_000)
    table = _with_ticks(table, "created_at", 1, (LAST_SECOND + 1) * 1_000_000 - 1)
    table = _with_ticks(table, "updated_at", 2, (LAST_SECOND + 1) * 1_000_000)
    table = _with_ticks(table, "updated_at", 3, FIRST_SECOND * 1_000_000 - 1)
    first, last, after, before = python_rows(table)
    assert first["created_at"] == datetime(1, 1, 1, tzinfo=UTC)
    assert last["created_at"] == datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert after["updated_at"] == before["updated_at"] == OutOfRange("updated_at")
    assert [p.field for p in problems(after)] == ["updated_at"]
