"""How a Delta writer spells what it records about a data file: partition values, directories, stats.

Follows the Delta protocol ("Partition Value Serialization", "Per-file Statistics") and the Hive directory
layout that Delta and Spark use:

- a partition value is a string (dates ``YYYY-MM-DD``, timestamps ``YYYY-MM-DD HH:MM:SS.ffffff`` in UTC,
  booleans ``true``/``false``, binary as one character per byte); null, and an empty string (which the
  protocol reads as null), are ``None``;
- the directory of a partition is ``col=value/``, with the characters Hive escapes written as ``%XX`` and a
  null value as ``__HIVE_DEFAULT_PARTITION__``; non-ASCII characters stay as they are, which is what Spark's
  partition discovery decodes correctly;
- stats are ``numRecords``, ``nullCount`` of every top-level column that is not nested, and
  ``minValues``/``maxValues`` of top-level integer, floating point, date and timestamp columns. Timestamps are
  ISO-8601 with milliseconds (UTC with ``Z``; without a zone for ``timestamp_ntz``), the minimum truncated
  down and the maximum rounded up to the millisecond so both still bound the data. No bounds are recorded for
  strings and binary (Delta truncates those to a prefix; leaving them out is always correct), booleans,
  decimals (JSON numbers would round them) or nested columns, nor for a floating point column holding NaN
  (Spark orders NaN above every number) or an infinite bound (not valid JSON). A missing bound only means a
  reader cannot skip the file on that column.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

# What Hive's FileUtils.escapePathName (and Spark's ExternalCatalogUtils) escape, plus NUL.
_ESCAPED = frozenset([chr(c) for c in range(0x20)] + list("\"#%'*/:=?\\\x7f{[]^"))
_NS_PER_UNIT = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
_EPOCH = datetime(1970, 1, 1)


def escape_path_name(text: str) -> str:
    """``text`` as one Hive path segment: the characters Hive escapes become ``%XX``."""
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in text)


def partition_value(value: Any) -> str | None:
    """A partition column's Python value as the Delta log records it (``None`` for null or empty)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return str(value) or None


def partition_path(values: dict[str, str | None]) -> str:
    """The relative directory ``col=value/...`` of a partition, in partition column order."""
    return "/".join(
        f"{escape_path_name(column)}={HIVE_DEFAULT_PARTITION if value is None else escape_path_name(value)}"
        for column, value in values.items()
    )


#: A string statistic is kept to this many characters: a longer minimum is cut (still a lower bound), a
#: longer maximum left out (cut, it would no longer be an upper bound).
STRING_STATS_CHARS = 64


def _bounded(data_type: pa.DataType, strings: bool) -> bool:
    return (
        (strings and (pa.types.is_string(data_type) or pa.types.is_large_string(data_type)))
        or pa.types.is_integer(data_type)
        or pa.types.is_floating(data_type)
        or pa.types.is_date(data_type)
        or pa.types.is_timestamp(data_type)
    )


class FileStats:
    """Delta statistics of one data file, gathered from the tables written to it, one at a time."""

    def __init__(self, schema: pa.Schema, *, strings: bool = False) -> None:
        """``strings``: bound string columns too (to :data:`STRING_STATS_CHARS`), as a file clustered by
        one needs (:mod:`sinks.clustering`)."""
        self.schema = schema
        self.rows = 0
        self.nulls = {f.name: 0 for f in schema if not pa.types.is_nested(f.type)}
        self.low: dict[str, Any] = {}
        self.high: dict[str, Any] = {}
        self._unbounded = {f.name for f in schema if not _bounded(f.type, strings)}

    def add(self, table: pa.Table) -> None:
        """Count ``table`` (columns as in the schema) into the file's stats."""
        self.rows += table.num_rows
        for name in self.nulls:
            self.nulls[name] += table.column(name).null_count
        for field in self.schema:
            if field.name not in self._unbounded:
                self._bound(field, table.column(field.name))

    def _bound(self, field: pa.Field, column: pa.ChunkedArray) -> None:
        if pa.types.is_floating(field.type) and pc.any(pc.is_nan(column)).as_py():
            self._unbounded.add(field.name)
            self.low.pop(field.name, None)
            self.high.pop(field.name, None)
            return
        extremes = pc.min_max(column)
        low, high = extremes["min"], extremes["max"]
        if not low.is_valid:
            return  # all null
        if pa.types.is_timestamp(field.type):
            low, high = low.value, high.value  # integers in the column's unit
        else:
            low, high = low.as_py(), high.as_py()
        name = field.name
        self.low[name] = low if name not in self.low else min(self.low[name], low)
        self.high[name] = high if name not in self.high else max(self.high[name], high)

    def to_json(self) -> str:
        """The ``stats`` string of the file's add action."""
        stats: dict[str, Any] = {"numRecords": self.rows}
        for key, bounds, up in (("minValues", self.low, False), ("maxValues", self.high, True)):
            encoded = {name: self._encode(name, value, up) for name, value in bounds.items()}
            stats[key] = {name: value for name, value in encoded.items() if value is not None}
        stats["nullCount"] = dict(self.nulls)
        return json.dumps(stats, separators=(",", ":"))

    def _encode(self, name: str, value: Any, up: bool) -> Any:
        data_type = self.schema.field(name).type
        if pa.types.is_timestamp(data_type):
            return _timestamp_ms(value * _NS_PER_UNIT[data_type.unit], up, utc=data_type.tz is not None)
        if isinstance(value, date):
            return value.isoformat()
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, str) and len(value) > STRING_STATS_CHARS:
            return None if up else value[:STRING_STATS_CHARS]
        return value


def _timestamp_ms(ns: int, up: bool, *, utc: bool) -> str:
    """``ns`` since the epoch as ISO-8601 with milliseconds, rounded down (or ``up``) to the millisecond."""
    ms = -(-ns // 10**6) if up else ns // 10**6
    moment = _EPOCH + timedelta(milliseconds=ms)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}" + ("Z" if utc else "")
