"""The notebooks' queries: small pandas frames from the Delta tables, on either backend.

A store opened with a SparkSession (Databricks, native Delta) filters in Spark before anything reaches pandas;
a store without one (local, delta-rs) reads the snapshot with Arrow and filters there. Both give the declared
Arrow schema, so everything after :func:`read_frame` is one code path.

A row of ``actions`` may be written by hand with a timestamp the actions job rejects (after the year 9999:
nanoseconds written as microseconds); :func:`read_frame` reads it through the job's own check
(``pipelines/actions/arrow_rows.py``): the column holding it is null in that row and ``out_of_range`` says
why, as the job's rejection does, so no such row is shown with a time nor taken for the latest action.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.actions.arrow_rows import out_of_range_rows
from pipelines.actions.rollback import CREATED_BY as ROLLBACK_CREATED_BY
from sinks.tables import EXECUTION_STATES

if TYPE_CHECKING:
    from sinks import TableStore

#: The span of one ``device_minute`` row, in microseconds as the tables' times are: a nanosecond span would
#: move a time to nanoseconds, where the years past 2262 do not fit.
MINUTE = pd.Timedelta(minutes=1).as_unit("us")


#: The tables' times as pandas holds them: microseconds (every year to 9999), UTC.
_TIME = "datetime64[us, UTC]"
_EXECUTION_TIMES = ("queued_at", "updated_at", "published_at", "started_at", "finished_at")

OUT_OF_RANGE = "out_of_range"
"""The column :func:`read_frame` adds to ``actions``: why the actions job rejects the row for a timestamp no
time holds (``created_at: a timestamp after the year 9999 ...``), null for every other row."""


def read_frame(store: TableStore, name: str, where: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """A table's current rows where every ``column == value`` of ``where`` holds (none yet: no rows); for
    ``actions``, with the column :data:`OUT_OF_RANGE`."""
    spec = store.spec(name)
    if not store.exists(name):
        return _checked(spec.arrow_schema.empty_table(), name).to_pandas()
    spark = getattr(store, "spark", None)
    if spark is not None:
        from pyspark.sql import functions as F

        frame = store.read(name)
        for column, value in (where or {}).items():
            frame = frame.where(F.col(f"`{column}`") == F.lit(value))
        table = _declared(frame.toArrow(), spec.arrow_schema)
    else:
        table = _declared(store.read_arrow(name), spec.arrow_schema)
        for column, value in (where or {}).items():
            table = table.filter(pc.equal(table[column], pa.scalar(value, table.schema.field(column).type)))
    return _checked(table, name).to_pandas()


def _declared(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with the declared columns, in their order and types: one the table lacks is null (a table
    another tool wrote), one it holds besides is left out (a payload field this catalog does not declare)."""
    columns = [
        table.column(field.name).cast(field.type)
        if field.name in table.column_names
        else pa.nulls(table.num_rows, field.type)
        for field in schema
    ]
    return pa.Table.from_arrays(columns, schema=pa.schema([field.with_nullable(True) for field in schema]))


def _checked(table: pa.Table, name: str) -> pa.Table:
    """``actions`` read as the actions job reads it: a column holding a timestamp out of range is null in
    that row, and :data:`OUT_OF_RANGE` names it; other tables as they are (the job writes them)."""
    if name != "actions":
        return table
    found = out_of_range_rows(table)
    for column in sorted({column for columns in found.values() for column in columns}):
        mask = pa.array([column in found.get(index, {}) for index in range(table.num_rows)])
        index = table.schema.get_field_index(column)
        values = table.column(index)
        nulled = pc.if_else(mask, pa.scalar(None, values.type), values)
        table = table.set_column(index, table.schema.field(index), nulled)
    reasons = [
        "; ".join(str(problem) for problem in found[index].values()) if index in found else None
        for index in range(table.num_rows)
    ]
    return table.append_column(OUT_OF_RANGE, pa.array(reasons, pa.string()))


def busiest_device(store: TableStore, metric: str | None = None) -> str | None:
    """The device with the most messages in ``device_minute`` (counted per minute), with ``metric`` those of
    the minutes it has a value of the metric in (a device sending none of it has nothing to plot), or None."""
    minutes = read_frame(store, "device_minute")
    if metric is not None and f"{metric}_avg" in minutes:
        minutes = minutes[minutes[f"{metric}_avg"].notna()]
    if minutes.empty:
        return None
    return str(minutes.groupby("device_id")["count"].sum().idxmax())


def device_readings(store: TableStore, device_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One device's silver rows by event time, and its ``device_minute`` rows by minute."""
    readings = read_frame(store, "silver_telemetry", {"device_id": device_id}).sort_values("event_time")
    minutes = read_frame(store, "device_minute", {"device_id": device_id}).sort_values("minute")
    return readings.reset_index(drop=True), minutes.reset_index(drop=True)


def metric_across_fleet(store: TableStore, metric: str) -> pd.DataFrame:
    """Per minute of event time, one metric across the fleet: how many devices reported it, and the 10th
    percentile, median and 90th percentile of their minute averages (``device_minute``)."""
    minutes = read_frame(store, "device_minute")
    column = f"{metric}_avg"
    if minutes.empty or column not in minutes:
        return pd.DataFrame(columns=["minute", "devices", "p10", "median", "p90"])
    grouped = minutes.dropna(subset=[column]).groupby("minute")[column]
    frame = pd.DataFrame(
        {
            "devices": grouped.size(),
            "p10": grouped.quantile(0.1),
            "median": grouped.median(),
            "p90": grouped.quantile(0.9),
        }
    )
    return frame.reset_index().sort_values("minute").reset_index(drop=True)


def fleet_by_firmware_and_group(store: TableStore) -> pd.DataFrame:
    """Devices counted per firmware version (rows) and group (columns), from the ``devices`` registry."""
    devices = read_frame(store, "devices")
    devices = devices.fillna({"firmware_version": "unknown", "group": "none"})
    counts = devices.groupby(["firmware_version", "group"]).size().unstack("group", fill_value=0)
    return counts.sort_index()


def quality_by_batch(store: TableStore) -> pd.DataFrame:
    """Per validated micro-batch (by time): rows validated, unexpected rows and failed expectations."""
    dq = read_frame(store, "dq_results")
    if dq.empty:
        return pd.DataFrame(columns=["run_id", "batch_id", "observed_at", "rows", "unexpected", "failed"])
    dq["failed"] = ~dq["success"].astype(bool)
    batches = dq.groupby(["run_id", "batch_id"], as_index=False).agg(
        observed_at=("observed_at", "min"),
        rows=("element_count", "max"),
        unexpected=("unexpected_count", "sum"),
        failed=("failed", "sum"),
    )
    return batches.sort_values("observed_at").reset_index(drop=True)


def latest_action_id(store: TableStore) -> str | None:
    """The action written most recently to ``actions`` (by ``created_at``), not counting the rollbacks the
    actions job writes when an action is aborted nor a row holding a timestamp no time holds (rejected);
    None when there is none."""
    actions = read_frame(store, "actions")
    actions = actions[actions[OUT_OF_RANGE].isna()]
    summaries = read_frame(store, "action_summary")
    if "rollback_action_id" in summaries:
        actions = actions[~actions["id"].isin(summaries["rollback_action_id"].dropna())]
    written_by_job = actions["created_by"].fillna("").str.startswith(ROLLBACK_CREATED_BY)
    actions = actions[~written_by_job]  # every part of a rollback of more devices than one action lists
    if actions.empty:
        return None
    return str(actions.sort_values(["created_at", "id"]).iloc[-1]["id"])


def action_summary(store: TableStore, action_id: str) -> dict[str, Any] | None:
    """The action's ``action_summary`` row (final counts per state), or None before the job wrote one."""
    rows = read_frame(store, "action_summary", {"action_id": action_id})
    return rows.iloc[0].to_dict() if not rows.empty else None


def rollout_states(executions: pd.DataFrame) -> pd.DataFrame:
    """Devices per execution state over time, from ``action_executions`` rows of one action.

    Each row is QUEUED from ``queued_at``, IN_PROGRESS from ``started_at`` and in its final state from
    ``finished_at`` (rows still open stay in their current state). The result has one row per moment a count
    changed (index: UTC time) and one column per state, in :data:`EXECUTION_STATES` order.
    """
    if executions.empty:
        return pd.DataFrame(columns=list(EXECUTION_STATES), index=pd.DatetimeIndex([], tz="UTC"))
    executions = _in_utc(executions)
    changes = []
    for row in executions.itertuples(index=False):
        steps = [("QUEUED", row.queued_at if pd.notna(row.queued_at) else row.updated_at)]
        if pd.notna(row.started_at):
            steps.append(("IN_PROGRESS", row.started_at))
        if pd.notna(row.finished_at):
            steps.append((row.state, row.finished_at))
        elif row.state != steps[-1][0]:  # open row whose state has no timestamp of its own
            steps.append((row.state, row.updated_at))
        for (state, at), following in zip(steps, [*steps[1:], None], strict=True):
            changes.append((at, state, 1))
            if following is not None:
                changes.append((following[1], state, -1))
    deltas = pd.DataFrame(changes, columns=["at", "state", "delta"])
    deltas["at"] = pd.Series([at for at, _, _ in changes], dtype=_TIME)  # inferred, a year past 2262 fails
    counts = deltas.pivot_table(index="at", columns="state", values="delta", aggfunc="sum", fill_value=0)
    counts = counts.reindex(columns=list(EXECUTION_STATES), fill_value=0).sort_index().cumsum()
    return counts.astype(int)


def phase_starts(executions: pd.DataFrame) -> pd.Series:
    """When each phase of a phased rollout was first sent (index: phase number), from ``action_executions``
    rows of one action; empty when it has no phases."""
    if executions.empty or "phase" not in executions or executions["phase"].isna().all():
        return pd.Series(dtype="datetime64[ns, UTC]")
    sent = _in_utc(executions).dropna(subset=["phase", "published_at"])
    return sent.groupby(sent["phase"].astype(int))["published_at"].min().sort_index()


def _in_utc(executions: pd.DataFrame) -> pd.DataFrame:
    """``action_executions`` rows with their times in microseconds, UTC: as the job writes them, or naive
    (a table another tool wrote) taken as UTC. Microseconds hold any year to 9999, nanoseconds end in 2262."""
    times = [column for column in _EXECUTION_TIMES if column in executions]
    return executions.assign(
        **{column: pd.to_datetime(executions[column], utc=True).dt.as_unit("us") for column in times}
    )


def compliance(store: TableStore) -> pd.DataFrame:
    """``fleet_compliance``: per group (rows) devices by installed version (columns), and each group's
    desired version (column ``desired``; None when no OTA action asks for one)."""
    rows = read_frame(store, "fleet_compliance")
    if rows.empty:
        return pd.DataFrame(columns=["desired"])
    counts = rows.pivot_table(
        index="group", columns="installed_version", values="devices", aggfunc="sum", fill_value=0
    )
    desired = rows.groupby("group")["desired_version"].first()
    counts.columns = [str(c) for c in counts.columns]
    counts["desired"] = desired.reindex(counts.index)
    return counts.sort_index()


def rollout(store: TableStore, action_id: str) -> tuple[pd.DataFrame, dict[str, Any] | None]:
    """An action's states over time (from ``action_executions``) and its summary row (``action_summary``)."""
    executions = read_frame(store, "action_executions", {"action_id": action_id})
    return rollout_states(executions), action_summary(store, action_id)
