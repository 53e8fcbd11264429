"""pipelines.views: where the tables are found, the queries on either read path, and what each chart draws."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import matplotlib
import pandas as pd
import pyarrow as pa
import pytest

from pipelines.views import charts, queries
from pipelines.views.location import DEMO_TABLES, TABLES_ENV, notebooks_hint, open_tables, tables_root
from sinks import open_table_store
from sinks.tables import EXECUTION_STATES
from tests.e2e.notebooks.notebook_harness import describe

matplotlib.use("Agg")
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# -- where the tables are --------------------------------------------------------------------------------


def test_the_setting_wins_else_the_demo_tables_are_found_from_below_the_repository(tmp_path):
    (tmp_path / DEMO_TABLES).mkdir(parents=True)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    assert tables_root({TABLES_ENV: "/lake"}, start=notebooks) == "/lake"
    assert tables_root({}, start=notebooks) == str(tmp_path / DEMO_TABLES)
    assert tables_root({TABLES_ENV: "  "}, start=tmp_path) == str(tmp_path / DEMO_TABLES)


def test_no_tables_is_an_error_naming_the_root_and_the_setting(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tables_root({})
    assert root == str(DEMO_TABLES)
    with pytest.raises(FileNotFoundError, match=rf"no tables at {root}: run `make demo`.*{TABLES_ENV}"):
        open_tables(None, root)


def test_the_printed_hint_is_an_absolute_setting_that_opens_the_tables(tmp_path, monkeypatch):
    store = open_table_store(None, str(tmp_path / "lake"), backend="delta-rs")
    store.ensure("devices")
    monkeypatch.chdir(tmp_path)
    hint = notebooks_hint("lake")
    assert "notebooks/telemetry.ipynb and notebooks/ota_rollout.ipynb" in hint
    value = hint.split(f"{TABLES_ENV}=")[1]
    assert value == str(tmp_path / "lake")
    assert open_tables(None, tables_root({TABLES_ENV: value})).exists("devices")
    assert notebooks_hint("s3://bucket/lake").endswith(f"{TABLES_ENV}=s3://bucket/lake")


# -- queries ---------------------------------------------------------------------------------------------


def execution(device: str, state: str, queued: float, started: float | None, finished: float | None) -> dict:
    return {
        "action_id": "act-1",
        "device_id": device,
        "state": state,
        "version": 1,
        "report_seq": 1,
        "status_details": "",
        "queued_at": at(queued),
        "updated_at": at(finished or started or queued),
        "published_at": at(queued),
        "started_at": at(started) if started is not None else None,
        "finished_at": at(finished) if finished is not None else None,
    }


EXECUTIONS = [
    execution("d1", "SUCCEEDED", 0, 1, 3),
    execution("d2", "REJECTED", 0, None, 2),
    execution("d3", "IN_PROGRESS", 0, 2, None),
]


def test_rollout_states_count_devices_per_state_at_every_change():
    states = queries.rollout_states(pd.DataFrame(EXECUTIONS))
    assert list(states.columns) == list(EXECUTION_STATES)
    seen = {t.to_pydatetime(): {s: n for s, n in row.items() if n} for t, row in states.iterrows()}
    assert seen == {
        at(0): {"QUEUED": 3},
        at(1): {"QUEUED": 2, "IN_PROGRESS": 1},
        at(2): {"IN_PROGRESS": 2, "REJECTED": 1},
        at(3): {"IN_PROGRESS": 1, "SUCCEEDED": 1, "REJECTED": 1},
    }
    assert (states.sum(axis=1) == 3).all()
    assert queries.rollout_states(pd.DataFrame(columns=list(EXECUTIONS[0]))).empty


def write(store, name: str, rows: list[dict]) -> None:
    store.append(name, pa.Table.from_pylist(rows, schema=store.spec(name).arrow_schema), "views-test", 0)


@pytest.mark.spark
def test_spark_and_arrow_read_paths_give_the_same_frames(spark, tmp_path):
    local = open_tables(None, str(tmp_path))  # creates nothing: the directory exists, tables do not yet
    assert queries.read_frame(local, "action_executions").empty
    assert queries.latest_action_id(local) is None
    write(
        local,
        "action_executions",
        [*EXECUTIONS, {**execution("d9", "FAILED", 0, 1, 2), "action_id": "act-2"}],
    )
    with_spark = open_table_store(spark, str(tmp_path), backend="delta-rs", catalog=local.catalog)
    arrow = queries.read_frame(local, "action_executions", {"action_id": "act-1"})
    through_spark = queries.read_frame(with_spark, "action_executions", {"action_id": "act-1"})
    assert sorted(arrow["device_id"]) == ["d1", "d2", "d3"]
    key = ["device_id"]
    pd.testing.assert_frame_equal(
        arrow.sort_values(key).reset_index(drop=True), through_spark.sort_values(key).reset_index(drop=True)
    )
    pd.testing.assert_frame_equal(
        queries.rollout_states(arrow), queries.rollout_states(through_spark), check_freq=False
    )


def test_fleet_counts_devices_by_firmware_and_group(tmp_path):
    store = open_tables(None, str(tmp_path))
    rows = [
        ("d1", "1.0.0", "canary"),
        ("d2", "2.0.0", "canary"),
        ("d3", "1.0.0", "fleet"),
        ("d4", None, "fleet"),
    ]
    write(store, "devices", [{"device_id": d, "firmware_version": f, "group": g} for d, f, g in rows])
    counts = queries.fleet_by_firmware_and_group(store)
    assert counts.to_dict() == {
        "canary": {"1.0.0": 1, "2.0.0": 1, "unknown": 0},
        "fleet": {"1.0.0": 1, "2.0.0": 0, "unknown": 1},
    }
    chart = describe(charts.fleet_chart(counts))
    assert chart.title == "Fleet: 4 devices by firmware version and group"
    assert chart.bars == 4


def test_one_metric_across_the_fleet_per_minute_and_its_chart(tmp_path):
    store = open_tables(None, str(tmp_path))
    averages: dict[str, list[float | None]] = {
        "d1": [20.0, 21.0, 22.0],
        "d2": [30.0, 31.0],
        "d3": [10.0, None, 12.0],
    }
    rows = [
        {"device_id": d, "minute": at(60 * m), "event_date": at(0).date(), "count": 1, "temperature_avg": v}
        for d, values in averages.items()
        for m, v in enumerate(values)
    ]
    write(store, "device_minute", rows)
    fleet = queries.metric_across_fleet(store, "temperature")
    assert fleet["devices"].tolist() == [3, 2, 2]  # a minute without the metric does not count the device
    assert fleet["median"].tolist() == [20.0, 26.0, 17.0]
    assert fleet["p10"].iloc[0] == pytest.approx(12.0) and fleet["p90"].iloc[0] == pytest.approx(28.0)
    chart = describe(charts.fleet_metric_chart("temperature", fleet))
    assert chart.title == "Fleet: temperature of up to 3 devices over 3 minutes"
    assert chart.points == 3 + 3  # the median's minutes, and the count of devices per minute
    assert chart.areas == 1
    assert queries.metric_across_fleet(store, "pressure").empty


# -- charts ----------------------------------------------------------------------------------------------


def minute_rows(device: str, minutes: int, low: float, high: float) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "device_id": device,
            "minute": [at(60 * m) for m in range(minutes)],
            "temperature_min": low,
            "temperature_max": high,
            "temperature_avg": (low + high) / 2,
        }
    )


def test_one_minute_of_data_draws_its_band_average_and_readings():
    readings = pd.DataFrame({"event_time": [at(5), at(25), at(45)], "temperature": [20.0, 22.0, 21.0]})
    chart = describe(
        charts.device_chart("dev-1", "temperature", readings, minute_rows("dev-1", 1, 20.0, 22.0))
    )
    assert chart.title == "dev-1: temperature, 3 readings in 1 minute"
    assert (chart.points, chart.bars, chart.segments) == (3, 1, 1)


def test_a_minute_with_one_reading_still_draws_its_average():
    readings = pd.DataFrame({"event_time": [at(5)], "temperature": [20.0]})
    chart = describe(
        charts.device_chart("dev-1", "temperature", readings, minute_rows("dev-1", 1, 20.0, 20.0))
    )
    assert (chart.points, chart.bars, chart.segments) == (1, 0, 1)
    assert chart.title == "dev-1: temperature, 1 reading in 1 minute"  # was '1 readings in 1 minutes'


def test_many_minutes_draw_one_band_and_one_average_each():
    readings = pd.DataFrame({"event_time": [at(30 * i) for i in range(120)], "temperature": 21.0})
    chart = describe(
        charts.device_chart("dev-1", "temperature", readings, minute_rows("dev-1", 60, 19.0, 23.0))
    )
    assert (chart.points, chart.bars, chart.segments) == (120, 60, 60)


def test_rollout_chart_stacks_states_over_time_next_to_the_final_counts():
    states = queries.rollout_states(pd.DataFrame(EXECUTIONS))
    summary = {f"{s.lower()}_count": 0 for s in charts.STATE_COLOURS} | {
        "succeeded_count": 1,
        "rejected_count": 1,
        "in_progress_count": 1,
        "total_count": 3,
        "action_state": "IN_PROGRESS",
    }
    chart = describe(charts.rollout_chart("act-1", states, summary))
    assert chart.title == "Rollout of act-1: IN_PROGRESS, 3 devices"
    assert chart.areas == 4  # QUEUED, IN_PROGRESS, SUCCEEDED, REJECTED each hold devices for a while
    assert chart.bars == 3


@pytest.mark.parametrize("expired", [None, float("nan"), "missing"])
def test_a_summary_written_before_expired_count_existed_draws_its_counts(expired):
    """``action_summary`` rows written before the EXPIRED state hold a null ``expired_count`` (NaN in
    pandas), or no such column at all where no job of this version opened the table: 0 expired."""
    states = queries.rollout_states(pd.DataFrame(EXECUTIONS))
    summary = {f"{s.lower()}_count": 0 for s in EXECUTION_STATES if s != "EXPIRED"} | {
        "succeeded_count": 2,
        "total_count": 2,
        "action_state": "COMPLETED",
    }
    if expired != "missing":
        summary["expired_count"] = expired
    chart = describe(charts.rollout_chart("act-1", states, summary))
    assert chart.title == "Rollout of act-1: COMPLETED, 2 devices"
    assert chart.bars == 1


def test_quality_chart_draws_every_batch_and_marks_failed_ones():
    batches = pd.DataFrame(
        {
            "run_id": "r",
            "batch_id": [0, 1, 2],
            "observed_at": [at(0), at(10), at(20)],
            "rows": [100, 120, 90],
            "unexpected": [0, 3, 0],
            "failed": [0, 1, 0],
        }
    )
    chart = describe(charts.quality_chart(batches))
    assert chart.title == "Data quality: 3 batches validated, 1 with a failed expectation"
    assert chart.points == 3 + 3 + 1


def test_titles_count_one_thing_in_the_singular():
    """After a short run the charts said '1 minutes', '1 batches validated', 'up to 1 devices'."""
    batch = pd.DataFrame(
        {
            "run_id": "r",
            "batch_id": [0],
            "observed_at": [at(0)],
            "rows": [10],
            "unexpected": [0],
            "failed": [0],
        }
    )
    assert describe(charts.quality_chart(batch)).title.startswith("Data quality: 1 batch validated, ")
    assert [charts.counted(n, "minute") for n in (0, 1, 2)] == ["0 minutes", "1 minute", "2 minutes"]


def test_a_phased_rollout_chart_marks_when_each_phase_started_and_the_rule_that_fired():
    executions = pd.DataFrame(
        [
            {
                "queued_at": at(0),
                "published_at": at(p * 60),
                "started_at": None,
                "finished_at": at(p * 60 + 5),
                "updated_at": at(p * 60 + 5),
                "state": "FAILED" if p == 2 else "SUCCEEDED",
                "phase": p,
            }
            for p in (1, 1, 2)
        ]
        + [
            {
                "queued_at": at(0),
                "published_at": None,
                "started_at": None,
                "finished_at": at(130),
                "updated_at": at(130),
                "state": "CANCELED",
                "phase": 3,
            }
        ]
    )
    phases = queries.phase_starts(executions)
    assert phases.to_dict() == {1: at(60), 2: at(120)}
    summary = {f"{s.lower()}_count": 0 for s in charts.STATE_COLOURS} | {
        "succeeded_count": 2,
        "failed_count": 1,
        "canceled_count": 1,
        "total_count": 4,
        "action_state": "ABORTED",
        "aborted_by": "abort_rules[0]",
    }
    chart = describe(charts.rollout_chart("act-9", queries.rollout_states(executions), summary, phases))
    assert chart.title == "Rollout of act-9: ABORTED by abort_rules[0], 4 devices"
    assert chart.points == 4  # two dashed lines, one per phase started
    assert queries.phase_starts(executions.drop(columns="phase")).empty


def test_compliance_frame_and_chart_put_each_groups_desired_version_first(tmp_path):
    store = open_table_store(None, str(tmp_path), backend="delta-rs")
    store.ensure("fleet_compliance")
    rows = [
        {
            "group": "canary",
            "installed_version": "2.0.0",
            "devices": 90,
            "desired_version": "2.0.0",
            "on_desired": True,
        },
        {
            "group": "canary",
            "installed_version": "1.0.0",
            "devices": 10,
            "desired_version": "2.0.0",
            "on_desired": False,
        },
        {
            "group": "fleet",
            "installed_version": "1.0.0",
            "devices": 100,
            "desired_version": None,
            "on_desired": False,
        },
    ]
    table = pa.Table.from_pylist(
        [row | {"updated_at": T0} for row in rows], schema=store.spec("fleet_compliance").arrow_schema
    )
    store.append("fleet_compliance", table, "tests", 0)
    frame = queries.compliance(store)
    assert frame.to_dict("index") == {
        "canary": {"1.0.0": 10, "2.0.0": 90, "desired": "2.0.0"},
        "fleet": {"1.0.0": 100, "2.0.0": 0, "desired": None},
    }
    chart = describe(charts.compliance_chart(frame))
    assert chart.title == "Compliance: 90 of 200 devices on their group's desired version"
    assert chart.bars == 3


def test_the_latest_action_is_the_operators_not_the_rollback_the_job_wrote(tmp_path):
    from pipelines.actions.operator import NewAction, create_action

    store = open_table_store(None, str(tmp_path), backend="delta-rs")
    store.ensure("action_summary")
    firmware: dict[str, Any] = {"version": "2.0.0", "url": "https://fw.example/f", "sha256": "0" * 64}
    create_action(store, NewAction(action_id="bad", group="g", **firmware))
    create_action(store, NewAction(action_id="bad-rollback", device_ids=["d1"], **firmware))
    assert queries.latest_action_id(store) == "bad-rollback"
    summary = {f"{s.lower()}_count": 0 for s in EXECUTION_STATES} | {
        "action_id": "bad",
        "total_count": 0,
        "action_state": "ABORTED",
        "updated_at": T0,
        "rollback_action_id": "bad-rollback",
    }
    store.append(
        "action_summary",
        pa.Table.from_pylist([summary], schema=store.spec("action_summary").arrow_schema),
        "t",
        0,
    )
    assert queries.latest_action_id(store) == "bad"


@pytest.mark.spark
def test_an_actions_row_past_the_year_9999_is_shown_rejected_and_breaks_no_query(spark, tmp_path):
    """A row whose created_at is a time in nanoseconds written as microseconds (about the year 58,900), which
    the job rejects: the notebook's queries read every other row as it is and show that one as rejected."""
    from deltalake import write_deltalake

    from pipelines.actions.operator import NewAction, create_action

    store = open_table_store(None, str(tmp_path), backend="delta-rs")
    store.ensure("action_summary")
    firmware: dict[str, Any] = {"version": "2.0.0", "url": "https://fw.example/f", "sha256": "0" * 64}
    create_action(store, NewAction(action_id="fine", group="g", **firmware))
    fine = store.read_arrow("actions")
    ticks = fine.column("created_at").cast(pa.int64()).to_pylist()
    far = fine.set_column(
        fine.schema.get_field_index("created_at"),
        fine.schema.field("created_at"),
        pa.array([t * 1000 for t in ticks], pa.timestamp("us", tz="UTC")),
    ).set_column(fine.schema.get_field_index("id"), "id", pa.array(["far"]))
    write_deltalake(store.location("actions"), far, mode="append")

    actions = queries.read_frame(store, "actions")
    by_id = actions.set_index("id")
    assert set(by_id.index) == {"fine", "far"}
    assert by_id.loc["fine", "created_at"] == fine.column("created_at")[0].as_py()
    assert pd.isna(by_id.loc["far", "created_at"])  # no time pandas holds
    assert by_id.loc["far", "out_of_range"].startswith("created_at: a timestamp after the year 9999")
    assert pd.isna(by_id.loc["fine", "out_of_range"])
    assert queries.read_frame(store, "actions", {"id": "far"})["id"].tolist() == ["far"]
    assert queries.latest_action_id(store) == "fine"  # a row no time can order is not the latest

    with_spark = open_table_store(spark, str(tmp_path), backend="delta-rs", catalog=store.catalog)
    through_spark = queries.read_frame(with_spark, "actions").set_index("id")
    assert through_spark.loc["far", "out_of_range"] == by_id.loc["far", "out_of_range"]
    assert pd.isna(through_spark.loc["far", "created_at"]) and pd.isna(
        through_spark.loc["fine", "out_of_range"]
    )
    assert queries.latest_action_id(with_spark) == "fine"
