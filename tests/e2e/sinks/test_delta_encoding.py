"""Partition values, partition directories and file stats as the Delta protocol spells them."""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pyarrow as pa
import pytest

from sinks.delta_encoding import FileStats, escape_path_name, partition_path, partition_value
from sinks.parquet_files import split_by_partition


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (None, None),
        ("", None),
        ("a b", "a b"),
        (True, "true"),
        (7, "7"),
        (Decimal("1.50"), "1.50"),
        (date(2026, 3, 1), "2026-03-01"),
        (
            datetime(2026, 3, 1, 14, 0, 0, 5, tzinfo=timezone(timedelta(hours=2))),
            "2026-03-01 12:00:00.000005",
        ),
        (datetime(2026, 3, 1, 12, 0), "2026-03-01 12:00:00.000000"),
        (b"\x01\xff", "\x01\xff"),
    ],
)
def test_partition_values_follow_the_protocol(value, encoded):
    assert partition_value(value) == encoded


def test_partition_directories_escape_what_hive_escapes():
    assert escape_path_name("a b/c:d=e%f#g?h*i[j]k{l}^\\\"'\x01é") == (
        "a b%2Fc%3Ad%3De%25f%23g%3Fh%2Ai%5Bj%5Dk%7Bl}%5E%5C%22%27%01é"
    )
    assert (
        partition_path({"day": "2026-03-01", "site": None})
        == "day=2026-03-01/site=__HIVE_DEFAULT_PARTITION__"
    )


def test_split_by_partition_groups_rows_with_nulls_as_a_group():
    rows = pa.table({"d": [1, None, 1, 2, None], "v": [0, 1, 2, 3, 4]})
    groups = {key: part.column("v").to_pylist() for key, part in split_by_partition(rows, ["d"])}
    assert groups == {(1,): [0, 2], (None,): [1, 4], (2,): [3]}
    same = rows.take([0, 2])
    ((key, whole),) = split_by_partition(same, ["d"])
    assert key == (1,) and whole is same, "one partition value: the rows as they are"


def test_stats_bound_timestamps_to_the_millisecond_and_skip_what_they_cannot_bound():
    schema = pa.schema(
        [
            ("at", pa.timestamp("us", tz="UTC")),
            ("local", pa.timestamp("us")),
            ("n", pa.int32()),
            ("x", pa.float64()),
            ("y", pa.float64()),
            ("s", pa.string()),
            ("tags", pa.map_(pa.string(), pa.string())),
        ]
    )
    stats = FileStats(schema)
    first = datetime(2026, 3, 1, 12, 0, 0, 123_456, tzinfo=UTC)
    stats.add(
        pa.table(
            {
                "at": [first, None],
                "local": [datetime(2026, 3, 1, 12, 0, 0, 999_001), None],
                "n": [5, None],
                "x": [1.5, None],
                "y": [1.0, math.inf],
                "s": ["b", "a"],
                "tags": [None, [("k", "v")]],
            },
            schema=schema,
        )
    )
    stats.add(
        pa.table(
            {
                "at": [first + timedelta(microseconds=1_001)],
                "local": [None],
                "n": [-3],
                "x": [math.nan],
                "y": [0.5],
                "s": [None],
                "tags": [None],
            },
            schema=schema,
        )
    )
    assert json.loads(stats.to_json()) == {
        "numRecords": 3,
        "minValues": {
            "at": "2026-03-01T12:00:00.123Z",
            "local": "2026-03-01T12:00:00.999",
            "n": -3,
            "y": 0.5,
        },
        "maxValues": {"at": "2026-03-01T12:00:00.125Z", "local": "2026-03-01T12:00:01.000", "n": 5},
        "nullCount": {"at": 1, "local": 2, "n": 1, "x": 1, "y": 0, "s": 1},
    }


def test_string_statistics_are_kept_only_where_they_still_bound_the_values():
    schema = pa.schema([("id", pa.string()), ("long", pa.string())])
    stats = FileStats(schema, strings=True)
    stats.add(pa.table({"id": ["b", "a", None], "long": ["x" * 70, "y" * 70, "z"]}, schema=schema))
    written = json.loads(stats.to_json())
    assert written["minValues"] == {"id": "a", "long": "x" * 64}  # cut: still at most the smallest value
    assert written["maxValues"] == {"id": "b", "long": "z"}
    stats.add(pa.table({"id": ["c"], "long": ["z" * 65]}, schema=schema))
    assert json.loads(stats.to_json())["maxValues"] == {"id": "c"}  # a cut maximum would not bound "zzz…"
    plain = FileStats(schema)  # without strings=True, string columns get no bounds
    plain.add(pa.table({"id": ["b"], "long": ["z"]}, schema=schema))
    assert json.loads(plain.to_json())["minValues"] == {}
