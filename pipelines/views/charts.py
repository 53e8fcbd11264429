"""The charts a fleet operator looks at first, drawn from the frames of :mod:`pipelines.views.queries`.

Each function returns a pyplot figure, which a notebook (Jupyter or Databricks) shows at the end of the cell.
Times are drawn in UTC.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from pipelines.views.queries import MINUTE
from sinks.tables import EXECUTION_STATES

STATE_COLOURS = {
    "QUEUED": "#c7c7c7",
    "IN_PROGRESS": "#1f77b4",
    "SUCCEEDED": "#2ca02c",
    "FAILED": "#d62728",
    "TIMED_OUT": "#9467bd",
    "REJECTED": "#ff7f0e",
    "CANCELED": "#7f7f7f",
    "EXPIRED": "#bcbd22",
}
FINAL_STATES = [state for state in EXECUTION_STATES if state not in ("QUEUED", "IN_PROGRESS")]
DESIRED_COLOUR = "#2ca02c"
OTHER_VERSION_COLOURS = ["#c7c7c7", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]
"""Installed versions other than the desired one."""


FIRST_DRAWN = pd.Timestamp(datetime(1, 1, 1))
LAST_DRAWN = pd.Timestamp(datetime(9999, 12, 31, 23, 59, 59))
"""The times matplotlib's date axis draws (the years 0001 to 9999, as the tables); one past them, a margin
its autoscaling adds included, fails the whole figure."""


def _utc(times: pd.Series) -> pd.Series:
    """Naive UTC timestamps in microseconds: what matplotlib's date axis draws without converting to local
    time (nanoseconds would end in the year 2262)."""
    times = pd.to_datetime(times, utc=True).dt.as_unit("us")
    return times.dt.tz_convert("UTC").dt.tz_localize(None)


def _time_axis(ax: Axes, *times: pd.Series) -> None:
    """Limit ``ax``'s date axis to the times drawn, with a margin, within :data:`FIRST_DRAWN` and
    :data:`LAST_DRAWN`: a reading in the year 0001 or in the last minute of 9999 is drawn like any other."""
    drawn = pd.concat([t.dropna() for t in times])
    if drawn.empty:
        return
    low, high = drawn.min(), drawn.max()
    margin = max((high - low) * 0.05, MINUTE)
    ax.set_xlim(max(low - margin, FIRST_DRAWN), min(high + margin, LAST_DRAWN))


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, in the plural but for one: ``1 minute``, ``2 minutes``, ``3 batches``."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun}{'es' if noun.endswith(('s', 'sh', 'ch', 'x')) else 's'}"


def _legend(ax: Axes, **where: Any) -> None:
    """The axes' legend, when something drawn has a label: none for a table with no rows yet (matplotlib
    would warn, a red box under the notebook's cell)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**where)


def fleet_metric_chart(metric: str, fleet: pd.DataFrame) -> Figure:
    """One metric across the fleet, minute by minute: the median of the devices' minute averages as a line,
    the band from the 10th to the 90th percentile around it, and how many devices reported each minute."""
    fig, (ax, count_ax) = plt.subplots(
        2, 1, figsize=(10, 5), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    if not fleet.empty:
        minutes = _utc(fleet["minute"])
        ax.fill_between(
            minutes, fleet["p10"], fleet["p90"], color="#1f77b4", alpha=0.2, label="10th-90th percentile"
        )
        ax.plot(minutes, fleet["median"], "-", color="#1f77b4", linewidth=2, label="median")
        count_ax.step(minutes, fleet["devices"], where="post", color="#7f7f7f")
        _time_axis(ax, minutes)
    reporting = int(fleet["devices"].max()) if not fleet.empty else 0
    ax.set_title(
        f"Fleet: {metric} of up to {counted(reporting, 'device')} over {counted(len(fleet), 'minute')}"
    )
    ax.set_ylabel(f"{metric} (minute average)")
    _legend(ax, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    count_ax.set_ylabel("devices")
    count_ax.set_xlabel("event time (UTC)")
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def device_chart(device_id: str, metric: str, readings: pd.DataFrame, minutes: pd.DataFrame) -> Figure:
    """One device's readings (dots) over its per-minute band: min-max as a bar, the average as a line.

    Each minute is drawn across its own width, so one minute of data is as visible as an hour of it.
    """
    fig, ax = plt.subplots(figsize=(10, 4))
    drawn = [_utc(readings["event_time"])]
    if not minutes.empty:
        start = _utc(minutes["minute"])
        end = (start + MINUTE).clip(upper=LAST_DRAWN)
        low, high = minutes[f"{metric}_min"], minutes[f"{metric}_max"]
        ax.bar(
            start,
            high - low,
            width=(end - start) / pd.Timedelta(days=1),  # matplotlib dates are in days
            bottom=low,
            align="edge",
            color="#1f77b4",
            alpha=0.18,
            edgecolor="#1f77b4",
            linewidth=0.5,
            label="minute min-max",
        )
        ax.hlines(
            minutes[f"{metric}_avg"],
            start,
            end,
            colors="#1f77b4",
            linewidth=2,
            label="minute average",
        )
        drawn += [start, end]
    if not readings.empty:
        ax.plot(drawn[0], readings[metric], ".", color="#d62728", label=f"{metric} readings")
    _time_axis(ax, *drawn)
    ax.set_title(
        f"{device_id}: {metric}, {counted(len(readings), 'reading')} in {counted(len(minutes), 'minute')}"
    )
    ax.set_xlabel("event time (UTC)")
    ax.set_ylabel(metric)
    _legend(ax, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the plot: never over the readings
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def fleet_chart(counts: pd.DataFrame) -> Figure:
    """Devices per firmware version, stacked by group (the frame of ``fleet_by_firmware_and_group``)."""
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = pd.Series(0, index=counts.index)
    for group in counts.columns:
        bars = ax.bar(counts.index.astype(str), counts[group], bottom=bottom, label=f"group {group}")
        ax.bar_label(bars, labels=[str(n) if n else "" for n in counts[group]], label_type="center")
        bottom = bottom + counts[group]
    total = int(counts.to_numpy().sum())
    ax.set_title(f"Fleet: {counted(total, 'device')} by firmware version and group")
    ax.set_xlabel("firmware version")
    ax.set_ylabel("devices")
    _legend(ax)
    return fig


def quality_chart(batches: pd.DataFrame) -> Figure:
    """Rows validated and unexpected rows per micro-batch; batches with a failed expectation are marked."""
    fig, ax = plt.subplots(figsize=(10, 4))
    times = _utc(batches["observed_at"]) if not batches.empty else batches["observed_at"]
    ax.plot(times, batches["rows"], "o-", color="#1f77b4", label="rows validated")
    ax.plot(times, batches["unexpected"], "o-", color="#ff7f0e", label="unexpected rows")
    failed = batches["failed"] > 0
    if failed.any():
        ax.plot(
            times[failed],
            batches["rows"][failed],
            "x",
            color="#d62728",
            markersize=10,
            label="batch with a failed expectation",
        )
    if not batches.empty:
        _time_axis(ax, times)
    ax.set_title(
        f"Data quality: {counted(len(batches), 'batch')} validated, {int(failed.sum())} with a failed "
        "expectation"
    )
    ax.set_xlabel("validated at (UTC)")
    ax.set_ylabel("rows")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def rollout_chart(
    action_id: str,
    states: pd.DataFrame,
    summary: dict[str, Any] | None,
    phases: pd.Series | None = None,
) -> Figure:
    """An action's devices per state over time (left; when each phase started, dashed) and its final counts
    from ``action_summary`` (right); an aborted action's rule that fired is in the title."""
    fig, (timeline, totals) = plt.subplots(
        1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 1]}, layout="constrained"
    )
    if not states.empty:
        seconds = list((states.index - states.index[0]).total_seconds())
        # Hold the last counts a little past the last change, so the final states have a width to show.
        seconds.append(seconds[-1] + max(1.0, 0.05 * seconds[-1]))
        states = pd.concat([states, states.iloc[[-1]]])
        drawn = [state for state in states.columns if states[state].any()]
        timeline.stackplot(
            seconds,
            *(states[state] for state in drawn),
            step="post",
            labels=drawn,
            colors=[STATE_COLOURS[state] for state in drawn],
        )
        for number, started in (phases if phases is not None else pd.Series(dtype=object)).items():
            at = (pd.Timestamp(started) - states.index[0]).total_seconds()
            timeline.axvline(at, color="black", linestyle="--", linewidth=1)
            timeline.annotate(
                f"phase {number}", (at, 0), xytext=(3, 3), textcoords="offset points", fontsize="small"
            )
        timeline.legend(loc="upper left", fontsize="small")
    timeline.set_xlabel("seconds since the first device was queued")
    timeline.set_ylabel("devices")
    timeline.set_title("states over time (action_executions)")
    counts = {state: _state_count(summary, state) for state in EXECUTION_STATES} if summary else {}
    shown = [state for state in EXECUTION_STATES if counts.get(state)]
    bars = totals.barh(shown, [counts[s] for s in shown], color=[STATE_COLOURS[s] for s in shown])
    totals.bar_label(bars)
    totals.invert_yaxis()
    totals.set_xlabel("devices")
    totals.set_title("final counts (action_summary)")
    outcome = summary["action_state"] if summary else "no summary yet"
    total = int(summary["total_count"]) if summary else 0
    fired = f" by {summary['aborted_by']}" if summary and summary.get("aborted_by") else ""
    fig.suptitle(f"Rollout of {action_id}: {outcome}{fired}, {counted(total, 'device')}")
    return fig


def _state_count(summary: dict, state: str) -> int:
    """A summary's count of ``state``: 0 where its column is missing or null (a state added after the row
    was written, ``sinks.tables.LATER_STATES``)."""
    value = summary.get(f"{state.lower()}_count")
    return 0 if value is None or pd.isna(value) else int(value)


def compliance_chart(counts: pd.DataFrame) -> Figure:
    """Each group's devices by installed version (the frame of ``queries.compliance``): the desired
    version first, in green, every other version stacked after it in a colour of its own."""
    fig, ax = plt.subplots(figsize=(10, 2 + 0.5 * max(1, len(counts))))
    versions = [c for c in counts.columns if c != "desired"]
    total = int(counts[versions].to_numpy().sum()) if versions else 0
    widest = max([int(counts[versions].loc[g].sum()) for g in counts.index] or [0])
    on_desired = 0
    legend: dict[str, BarContainer] = {}
    for position, (_, row) in enumerate(counts.iterrows()):
        desired = row["desired"]
        left = 0
        for version in sorted(versions, key=lambda v: (v != desired, v)):
            number = int(row[version])
            if not number:
                continue
            colour = DESIRED_COLOUR if version == desired else _version_colour(versions, version)
            bar = ax.barh(position, number, left=left, color=colour, edgecolor="white")
            legend.setdefault("desired version" if version == desired else version, bar)
            wide = number >= 0.08 * widest
            ax.bar_label(
                bar, labels=[f"{version}: {number}" if wide else ""], label_type="center", fontsize="small"
            )
            left += number
            on_desired += number if version == desired else 0
        wanted = f"  desired {desired}" if isinstance(desired, str) else "  nothing desired"
        ax.text(left, position, wanted, va="center", fontsize="small")
    ax.set_yticks(range(len(counts)), [str(group) or "(no group)" for group in counts.index])
    ax.set_xlim(0, widest * 1.25 or 1)
    ax.invert_yaxis()
    ax.set_xlabel("devices")
    ax.legend(
        list(legend.values()),
        list(legend.keys()),
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize="small",
    )
    ax.set_title(f"Compliance: {on_desired} of {total} devices on their group's desired version")
    fig.tight_layout()
    return fig


def _version_colour(versions: list[str], version: str) -> str:
    return OTHER_VERSION_COLOURS[versions.index(version) % len(OTHER_VERSION_COLOURS)]
