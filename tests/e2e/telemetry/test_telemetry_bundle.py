"""databricks.yml, checked offline: job definitions load in databricks-bundles, variables are declared and
used, both targets exist, and the telemetry job's command line is one the runner accepts.

The Databricks CLI's ``bundle validate`` (a Go binary) is not available here; ``Job.from_dict`` rejects
unknown fields at every level, which catches the commonest mistakes.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from databricks.bundles.jobs import Job, Task

from broker_edge.config.loader import load_yaml_file
from pipelines.maintenance import cli as tables_cli
from pipelines.runner import apply_override, parse_args
from pipelines.telemetry.config import load_telemetry_config

REPO = Path(__file__).resolve().parents[3]
BUNDLE = yaml.safe_load((REPO / "databricks.yml").read_text())
REFERENCE = re.compile(r"\$\{([a-z_]+)\.([A-Za-z0-9_.]+)\}")


def strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for value in node.values() for s in strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in strings(value)]
    return [node] if isinstance(node, str) else []


def resolve(node: Any, target: str) -> Any:
    """Substitute ``${var.*}``, ``${bundle.*}``, ``${workspace.file_path}`` as the CLI does for ``target``."""
    values = {f"var.{name}": str(spec.get("default")) for name, spec in BUNDLE["variables"].items()}
    values.update({f"var.{k}": str(v) for k, v in BUNDLE["targets"][target].get("variables", {}).items()})
    values.update({"bundle.name": BUNDLE["bundle"]["name"], "bundle.target": target})
    values["workspace.file_path"] = str(REPO)
    if isinstance(node, dict):
        return {key: resolve(value, target) for key, value in node.items()}
    if isinstance(node, list):
        return [resolve(value, target) for value in node]
    if isinstance(node, str):
        return REFERENCE.sub(lambda m: values[f"{m.group(1)}.{m.group(2)}"], node)
    return node


def test_targets_dev_and_prod_with_dev_the_default():
    targets = BUNDLE["targets"]
    assert set(targets) == {"dev", "prod"}
    assert targets["dev"]["mode"] == "development" and targets["dev"].get("default") is True
    assert targets["prod"]["mode"] == "production" and not targets["prod"].get("default")


def test_every_variable_used_is_declared_and_every_declared_one_is_used():
    declared = set(BUNDLE["variables"])
    used = {m.group(2) for s in strings(BUNDLE) for m in REFERENCE.finditer(s) if m.group(1) == "var"}
    assert used <= declared, f"undeclared: {used - declared}"
    assert declared <= used, f"never used: {declared - used}"
    for target in BUNDLE["targets"].values():
        assert set(target.get("variables", {})) <= declared
    assert all("description" in spec and "default" in spec for spec in BUNDLE["variables"].values())
    for s in strings(BUNDLE):  # only references the CLI knows
        for m in REFERENCE.finditer(s):
            assert m.group(1) in {"var", "bundle", "workspace"}, s


@pytest.mark.parametrize("target", ["dev", "prod"])
def test_jobs_load_in_databricks_bundles_for_each_target(target):
    jobs = {name: job for name, job in BUNDLE["resources"]["jobs"].items() if name != "maintenance"}
    assert set(jobs) == {"telemetry", "actions"}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    scripts = project["scripts"]
    pipelines_extra = project["optional-dependencies"]["pipelines"]
    for name, definition in jobs.items():
        job = Job.from_dict(resolve(definition, target))
        assert job.continuous.pause_status.value == ("UNPAUSED" if target == "prod" else "PAUSED")
        assert isinstance(job.tasks, list)
        (task,) = job.tasks
        assert isinstance(task, Task)
        wheel = task.python_wheel_task
        assert (wheel.package_name, wheel.entry_point) == ("timestone", "timestone")
        assert wheel.entry_point in scripts  # the console script `timestone` routes `pipeline <name>`
        assert isinstance(wheel.parameters, list) and wheel.parameters[:2] == ["pipeline", name]
        assert [lib.whl for lib in task.libraries if lib.whl] == ["./dist/*.whl"]
        # a wheel library installs no extras: the job lists the `pipelines` extra itself, exactly
        assert [lib.pypi.package for lib in task.libraries if lib.pypi] == pipelines_extra
        assert task.job_cluster_key in {c.job_cluster_key for c in job.job_clusters}
    assert "--wheel-dir dist" in BUNDLE["artifacts"]["timestone_wheel"]["build"]


@pytest.mark.parametrize("target", ["dev", "prod"])
def test_telemetry_task_command_is_what_the_runner_runs(target):
    """The job's parameters parse, and the overridden config loads with the target's locations."""
    task = resolve(BUNDLE["resources"]["jobs"]["telemetry"], target)["tasks"][0]
    args = parse_args(task["python_wheel_task"]["parameters"][1:])
    assert args.name == "telemetry" and not args.available_now
    document = load_yaml_file(args.config)
    for assignment in args.overrides:
        apply_override(document, assignment)
    config = load_telemetry_config(document["telemetry"])
    variables = {
        **{k: v["default"] for k, v in BUNDLE["variables"].items()},
        **BUNDLE["targets"][target]["variables"],
    }
    assert config.tables.root == variables["table_root"]
    assert config.tables.namespace == variables["table_namespace"]
    assert config.tables.backend == "native"
    assert config.stream.checkpoint == f"{variables['checkpoint_root']}/telemetry"
    assert config.source.brokers == yaml.safe_load(variables["telemetry_brokers"])
    assert config.tables.maintenance.enabled is False  # the maintenance job maintains the tables


@pytest.mark.parametrize("target", ["dev", "prod"])
def test_maintenance_job_maintains_the_tables_each_streaming_job_writes(target):
    """A scheduled job runs `timestone tables maintain` for each pipeline with the very config file and
    overrides its streaming job runs with (so the same tables), and the streaming jobs leave their tables
    to it."""
    definition = resolve(BUNDLE["resources"]["jobs"]["maintenance"], target)
    job = Job.from_dict(definition)
    assert job.schedule is not None and job.continuous is None
    assert job.schedule.pause_status is not None
    assert job.schedule.pause_status.value == ("UNPAUSED" if target == "prod" else "PAUSED")
    assert job.schedule.timezone_id == "UTC"
    assert len(job.schedule.quartz_cron_expression.split()) == 6  # Quartz: seconds first
    jobs = resolve(BUNDLE["resources"]["jobs"], target)
    tasks = {task["task_key"]: task["python_wheel_task"]["parameters"] for task in definition["tasks"]}
    assert set(tasks) == {"telemetry_tables", "actions_tables"}
    for pipeline in ("telemetry", "actions"):
        args = tables_cli.parse_args(tasks[f"{pipeline}_tables"][1:])  # after `timestone tables`
        assert (args.command, args.pipelines) == ("maintain", [pipeline])
        streaming = parse_args(jobs[pipeline]["tasks"][0]["python_wheel_task"]["parameters"][1:])
        assert args.config == streaming.config
        switch = [o for o in streaming.overrides if o.partition("=")[0].endswith("maintenance.enabled")]
        assert switch and yaml.safe_load(switch[0].partition("=")[2]) is False
        assert args.overrides == [o for o in streaming.overrides if o not in switch]
