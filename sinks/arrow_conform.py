"""Make an Arrow table match a declared schema exactly, or fail naming the column.

Arrow data reaches the stores from several producers whose types differ in harmless ways: Spark's
``toArrow()`` (map entries named ``entries``, timestamps in the session time zone), delta-rs change data
feeds (``string_view``, ``binary_view``, ``uint64`` commit versions, naive millisecond timestamps) and hand
built tables in tests. Writers and the CDF source cast everything to one schema here, so a real mismatch (a
misspelt column, a null in a key) surfaces as a :class:`SchemaMismatch` that names the table and column
instead of an opaque Delta error after the fact.

pyspark 4.0 also hands over empty string and binary arrays (the keys and values of a batch of empty maps)
without their one offset; delta-rs, partitioning such rows, read past the buffer and panicked. Such
arrays are rebuilt here (:func:`with_offsets`), which copies nothing else.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa


class SchemaMismatch(ValueError):
    """Data cannot be written to (or read as) a table's schema; the message names table and column."""


def to_arrow_table(data: Any) -> pa.Table:
    """Accept a pyarrow Table or RecordBatch, or anything exporting the Arrow C stream (delta-rs readers)."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    if hasattr(data, "__arrow_c_stream__"):
        return pa.table(data)
    raise TypeError(f"expected Arrow data or a Spark DataFrame, got {type(data).__name__}")


def conform(
    data: pa.Table,
    target: pa.Schema,
    table: str,
    *,
    allow_missing_nullable: bool = True,
    drop_extra: bool = False,
) -> pa.Table:
    """Return ``data`` with exactly the columns, order and types of ``target``.

    Missing nullable columns become nulls (a table that gained a configured column still accepts rows from a
    writer that does not know it) unless ``allow_missing_nullable`` is false; extra columns are an error
    unless ``drop_extra``, because a column the table does not have is almost always a misspelling.
    """
    present = set(data.column_names)
    wanted = set(target.names)
    extra = [name for name in data.column_names if name not in wanted]
    if extra and not drop_extra:
        raise SchemaMismatch(f"{table}: columns not in the table: {extra} (table columns: {target.names})")
    columns = []
    for target_field in target:
        name = target_field.name
        if name not in present:
            if target_field.nullable and allow_missing_nullable:
                columns.append(pa.nulls(data.num_rows, target_field.type))
                continue
            raise SchemaMismatch(f"{table}.{name}: column missing (type {target_field.type})")
        column = with_offsets(data.column(name))
        if column.type != target_field.type:
            try:
                column = column.cast(target_field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise SchemaMismatch(
                    f"{table}.{name}: cannot cast {column.type} to {target_field.type}: {exc}"
                ) from exc
        if not target_field.nullable and column.null_count:
            raise SchemaMismatch(f"{table}.{name}: {column.null_count} null value(s) in a NOT NULL column")
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=target)


def with_offsets(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """``column`` with every chunk that holds a variable-size array without its offsets rebuilt (Arrow's
    concatenation writes them); the other chunks as they are."""
    if not any(_lacks_offsets(chunk) for chunk in column.chunks):
        return column
    chunks = [pa.concat_arrays([chunk]) if _lacks_offsets(chunk) else chunk for chunk in column.chunks]
    return pa.chunked_array(chunks, column.type)


_VARIABLE_SIZE = (pa.types.is_string, pa.types.is_binary, pa.types.is_large_string, pa.types.is_large_binary)
_LISTS = (pa.types.is_list, pa.types.is_large_list, pa.types.is_map)


def _lacks_offsets(array: pa.Array) -> bool:
    """Whether ``array`` or an array inside it has an offsets buffer too small for its length + 1 offsets."""
    kind = array.type
    if any(check(kind) for check in _VARIABLE_SIZE + _LISTS):
        offsets = array.buffers()[1]
        width = 8 if pa.types.is_large_string(kind) or pa.types.is_large_binary(kind) else 4
        if pa.types.is_large_list(kind):
            width = 8
        if offsets is None or offsets.size < (array.offset + len(array) + 1) * width:
            return True
    if pa.types.is_map(kind):
        return _lacks_offsets(array.keys) or _lacks_offsets(array.items)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _lacks_offsets(array.values)
    if pa.types.is_struct(kind):
        return any(_lacks_offsets(array.field(index)) for index in range(kind.num_fields))
    return False
