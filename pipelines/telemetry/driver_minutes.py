"""device_minute rows of a small micro-batch, computed in the driver with Arrow.

The same result as :func:`pipelines.telemetry.transforms.touched_minute_aggregates` (a test holds the two
to it): for every device and minute the batch's silver rows touch, the message count and min/max/avg of
each metric over the stored rows of that minute plus the batch's. A batch of a few hundred rows is done in
milliseconds here, where the Spark query (a scan of silver's files, a shuffle, a collect) is most of the
batch's gold part.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

KEY = ("broker", "topic", "offset")


def without_records_of(stored: pa.Table, batch: pa.Table) -> pa.Table:
    """``stored`` rows that are not one of ``batch``'s records (by broker, topic and offset)."""
    if stored.num_rows == 0 or batch.num_rows == 0:
        return stored
    theirs = set(zip(*(batch.column(name).to_pylist() for name in KEY), strict=True))
    ours = zip(*(stored.column(name).to_pylist() for name in KEY), strict=True)
    return stored.filter(pa.array([key not in theirs for key in ours], pa.bool_()))


def touched_minute_aggregates(
    stored: pa.Table, silver_rows: pa.Table, metrics: Sequence[str], updated_at: datetime
) -> pa.Table:
    """device_minute rows (its columns, in order) for the minutes ``silver_rows`` touch.

    ``stored`` is silver before the batch, narrowed to at least the whole minutes of the batch's rows.
    """
    columns = ["device_id", "event_time", *metrics]
    tagged = pa.concat_tables(
        [
            _tagged(stored.select(columns), False),
            _tagged(silver_rows.select(columns), True),
        ]
    )
    minute = pc.floor_temporal(tagged.column("event_time"), unit="minute")
    tagged = tagged.append_column("minute", minute)
    stats: list[tuple[str, str]] = [("event_time", "count"), ("_new", "max")]
    for metric in metrics:
        stats += [(metric, "min"), (metric, "max"), (metric, "mean"), (f"_nan_{metric}", "max")]
        tagged = tagged.append_column(f"_nan_{metric}", pc.fill_null(pc.is_nan(tagged.column(metric)), False))
    grouped = tagged.group_by(["device_id", "minute"], use_threads=False).aggregate(stats)
    grouped = grouped.filter(grouped.column("_new_max"))
    minutes = grouped.column("minute")
    out: dict[str, pa.Array | pa.ChunkedArray] = {
        "device_id": grouped.column("device_id"),
        "minute": minutes,
        "event_date": pc.cast(minutes, pa.date32()),
        "count": grouped.column("event_time_count"),
    }
    for metric in metrics:
        for stat, arrow_stat in (("min", "min"), ("max", "max"), ("avg", "mean")):
            out[f"{metric}_{stat}"] = grouped.column(f"{metric}_{arrow_stat}")
        # Spark orders NaN above every number (Arrow's max skips it unless all are NaN)
        nan = grouped.column(f"_nan_{metric}_max")
        out[f"{metric}_max"] = pc.if_else(nan, math.nan, out[f"{metric}_max"])
    out["updated_at"] = pa.array([updated_at] * grouped.num_rows, pa.timestamp("us", "UTC"))
    return pa.table(out)


def _tagged(rows: pa.Table, new: bool) -> pa.Table:
    """``rows`` with its metrics as doubles (as the Spark query casts them), one type for each of the
    other columns whatever the source, and a ``_new`` flag."""
    types = {"device_id": pa.string(), "event_time": pa.timestamp("us", "UTC")}
    cast = [pc.cast(rows.column(name), types.get(name, pa.float64())) for name in rows.column_names]
    flags = pa.array([new] * rows.num_rows, pa.bool_())
    return pa.table([*cast, flags], names=[*rows.column_names, "_new"])
