"""A Spark application's event log read back: its jobs, their stages and their tasks, with their times.

Spark writes the log when ``spark.eventLog.enabled`` is on (:func:`event_log_conf`); it is what the
history server shows, and it works with the UI off. The benches read it after the driver stopped to say
where a micro-batch's time went: how many Spark jobs, stages and tasks it ran, how long its tasks waited
for a core (launch after the stage's submission) and ran, and on which executor.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def event_log_conf(directory: Path) -> dict[str, str]:
    """Spark settings that write the application's event log under ``directory`` (created here)."""
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": directory.as_uri(),
        "spark.eventLog.rolling.enabled": "false",  # one plain JSON-lines file, read by read_event_log
        "spark.eventLog.compress": "false",
    }


@dataclass
class SparkTask:
    stage_id: int
    executor: str
    locality: str
    launched_ms: int
    finished_ms: int
    run_ms: int
    deserialize_ms: int


@dataclass
class SparkStage:
    stage_id: int
    name: str
    tasks: int
    submitted_ms: int = 0
    completed_ms: int = 0


@dataclass
class SparkJob:
    job_id: int
    description: str
    submitted_ms: int
    completed_ms: int = 0
    stage_ids: list[int] = field(default_factory=list)

    @property
    def ms(self) -> int:
        return self.completed_ms - self.submitted_ms


@dataclass
class EventLog:
    jobs: dict[int, SparkJob] = field(default_factory=dict)
    stages: dict[int, SparkStage] = field(default_factory=dict)
    tasks: list[SparkTask] = field(default_factory=list)

    def run_stages(self, job: SparkJob) -> list[SparkStage]:
        """The stages of ``job`` that ran (a stage whose shuffle output exists is skipped: not submitted)."""
        return [self.stages[s] for s in job.stage_ids if s in self.stages and self.stages[s].submitted_ms]

    def job_tasks(self, job: SparkJob) -> list[SparkTask]:
        ids = set(job.stage_ids)
        return [t for t in self.tasks if t.stage_id in ids]


def read_event_log(directory: Path) -> EventLog:
    """The one application's log under ``directory`` (a plain file: rolling and compression are off)."""
    files = [p for p in directory.iterdir() if p.is_file()]
    if len(files) != 1:
        raise ValueError(f"{directory}: {len(files)} event logs, one expected")
    return parse_events(json.loads(line) for line in files[0].read_text().splitlines() if line)


def parse_events(events: Iterable[dict[str, Any]]) -> EventLog:
    log = EventLog()
    for event in events:
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            properties = event.get("Properties") or {}
            log.jobs[event["Job ID"]] = SparkJob(
                event["Job ID"],
                properties.get("spark.job.description") or "",
                event["Submission Time"],
                stage_ids=list(event["Stage IDs"]),
            )
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in log.jobs:
            log.jobs[event["Job ID"]].completed_ms = event["Completion Time"]
        elif kind in ("SparkListenerStageSubmitted", "SparkListenerStageCompleted"):
            info = event["Stage Info"]
            stage = log.stages.setdefault(
                info["Stage ID"], SparkStage(info["Stage ID"], info["Stage Name"], info["Number of Tasks"])
            )
            stage.submitted_ms = info.get("Submission Time") or stage.submitted_ms
            stage.completed_ms = info.get("Completion Time") or stage.completed_ms
        elif kind == "SparkListenerTaskEnd":
            info, metrics = event["Task Info"], event.get("Task Metrics") or {}
            log.tasks.append(
                SparkTask(
                    event["Stage ID"],
                    info["Executor ID"],
                    info["Locality"],
                    info["Launch Time"],
                    info["Finish Time"],
                    metrics.get("Executor Run Time", 0),
                    metrics.get("Executor Deserialize Time", 0),
                )
            )
    return log


@dataclass
class StepJobs:
    """What one step of a batch ran on Spark: jobs, stages and tasks, their wall time (first submission to
    last completion), the tasks' summed run time and how long the stages waited for their first task."""

    jobs: int = 0
    stages: int = 0
    tasks: int = 0
    wall_ms: int = 0
    task_run_ms: int = 0
    first_task_wait_ms: int = 0


def step_jobs(log: EventLog, batch_id: int) -> dict[str, StepJobs]:
    """The jobs of batch ``batch_id`` by step: jobs described ``trace <batch> <step>``
    (``bench.telemetry_bench.StepTrace`` labels them so)."""
    found: dict[str, list[SparkJob]] = {}
    for job in log.jobs.values():
        parts = job.description.split(" ", 2)
        if len(parts) == 3 and parts[0] == "trace" and parts[1] == str(batch_id):
            found.setdefault(parts[2], []).append(job)
    steps = {}
    for name, jobs in found.items():
        stages = [s for job in jobs for s in log.run_stages(job)]
        tasks = [t for job in jobs for t in log.job_tasks(job)]
        waits = []
        for stage in stages:
            launches = [t.launched_ms for t in tasks if t.stage_id == stage.stage_id]
            if launches:
                waits.append(min(launches) - stage.submitted_ms)
        steps[name] = StepJobs(
            jobs=len(jobs),
            stages=len(stages),
            tasks=len(tasks),
            wall_ms=max(j.completed_ms for j in jobs) - min(j.submitted_ms for j in jobs),
            task_run_ms=sum(t.run_ms for t in tasks),
            first_task_wait_ms=sum(waits),
        )
    return steps


def median_step_jobs(log: EventLog, batch_ids: Iterable[int]) -> dict[str, dict[str, float]]:
    """For each step, the median over ``batch_ids`` of each :class:`StepJobs` figure."""
    per_batch = [step_jobs(log, b) for b in batch_ids]
    names = sorted({name for steps in per_batch for name in steps})
    medians: dict[str, dict[str, float]] = {}
    for name in names:
        found = [steps[name] for steps in per_batch if name in steps]
        figures = StepJobs.__annotations__
        medians[name] = {f: statistics.median(getattr(s, f) for s in found) for f in figures}
    return medians


def jobs_between(log: EventLog, began_ms: float, ended_ms: float) -> list[SparkJob]:
    """The jobs submitted from ``began_ms`` to ``ended_ms`` (epoch ms), e.g. within one micro-batch."""
    return [j for j in log.jobs.values() if began_ms <= j.submitted_ms <= ended_ms]


def batch_totals(log: EventLog, jobs: list[SparkJob]) -> dict[str, int]:
    """Jobs, stages that ran, tasks, and the tasks' summed run time of ``jobs``."""
    stages = [s for job in jobs for s in log.run_stages(job)]
    tasks = [t for job in jobs for t in log.job_tasks(job)]
    return {
        "jobs": len(jobs),
        "stages": len(stages),
        "tasks": len(tasks),
        "task_run_ms": sum(t.run_ms for t in tasks),
    }
