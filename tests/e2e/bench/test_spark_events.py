"""bench/spark_events.py reads a Spark event log into each batch's jobs, stages and tasks by step."""

from __future__ import annotations

import json

import pytest

from bench.spark_events import (
    batch_totals,
    jobs_between,
    median_step_jobs,
    parse_events,
    read_event_log,
    step_jobs,
)


def job(job_id, description, submitted, completed, stages):
    return [
        {
            "Event": "SparkListenerJobStart",
            "Job ID": job_id,
            "Submission Time": submitted,
            "Stage IDs": stages,
            "Properties": {"spark.job.description": description},
        },
        {"Event": "SparkListenerJobEnd", "Job ID": job_id, "Completion Time": completed},
    ]


def stage(stage_id, tasks, submitted, completed):
    info = {
        "Stage ID": stage_id,
        "Stage Name": f"stage {stage_id}",
        "Number of Tasks": tasks,
        "Submission Time": submitted,
        "Completion Time": completed,
    }
    return [
        {"Event": "SparkListenerStageSubmitted", "Stage Info": {**info, "Completion Time": None}},
        {"Event": "SparkListenerStageCompleted", "Stage Info": info},
    ]


def task(stage_id, launched, finished, run_ms, executor="0"):
    return {
        "Event": "SparkListenerTaskEnd",
        "Stage ID": stage_id,
        "Task Info": {
            "Executor ID": executor,
            "Locality": "PROCESS_LOCAL",
            "Launch Time": launched,
            "Finish Time": finished,
        },
        "Task Metrics": {"Executor Run Time": run_ms, "Executor Deserialize Time": 1},
    }


def two_batches():
    events = [{"Event": "SparkListenerLogStart", "Spark Version": "4.1.0"}]
    # batch 7: profile (two stages; a third, skipped, never submitted) and bronze; batch 8: profile
    events += job(0, "trace 7 profile", 1000, 1400, [0, 1, 2])
    events += stage(0, 1, 1010, 1100) + stage(1, 2, 1150, 1390)
    events += [task(0, 1020, 1090, 60), task(1, 1200, 1300, 80), task(1, 1210, 1380, 150, "1")]
    events += job(1, "trace 7 bronze_telemetry", 1500, 1700, [3])
    events += [*stage(3, 1, 1500, 1700), task(3, 1600, 1690, 70)]
    events += job(2, "trace 8 profile", 3000, 3100, [4])
    events += [*stage(4, 1, 3000, 3100), task(4, 3010, 3090, 50)]
    events += job(3, "", 3200, 3300, [5])  # not labelled: another step's, or Spark's own
    return events


def test_a_batchs_jobs_by_step_count_only_the_stages_that_ran():
    log = parse_events(two_batches())

    steps = step_jobs(log, 7)

    profile = steps["profile"]
    assert (profile.jobs, profile.stages, profile.tasks) == (1, 2, 3)
    assert profile.wall_ms == 400
    assert profile.task_run_ms == 60 + 80 + 150
    assert profile.first_task_wait_ms == (1020 - 1010) + (1200 - 1150)
    assert (steps["bronze_telemetry"].tasks, steps["bronze_telemetry"].first_task_wait_ms) == (1, 100)
    assert set(step_jobs(log, 8)) == {"profile"}


def test_medians_over_batches_and_totals_within_a_window():
    log = parse_events(two_batches())

    medians = median_step_jobs(log, [7, 8])

    assert medians["profile"]["tasks"] == 2  # 3 in batch 7, 1 in batch 8
    assert medians["bronze_telemetry"]["jobs"] == 1  # only batch 7 has it
    unlabelled = jobs_between(log, 3000, 3500)
    assert [j.job_id for j in unlabelled] == [2, 3]
    assert batch_totals(log, unlabelled) == {"jobs": 2, "stages": 1, "tasks": 1, "task_run_ms": 50}


def test_read_event_log_wants_one_plain_log(tmp_path):
    (tmp_path / "app-1").write_text("\n".join(json.dumps(e) for e in two_batches()) + "\n")
    assert len(read_event_log(tmp_path).jobs) == 4
    (tmp_path / "app-2").write_text("")
    with pytest.raises(ValueError, match="2 event logs, one expected"):
        read_event_log(tmp_path)
