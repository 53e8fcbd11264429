"""databricks.yml, checked offline: job definitions load in databricks-bundles, variables are declared and
used, both targets exist, each task's command line is one the runner accepts and yields the target's config,
clusters are sized by variables and run a Databricks Runtime whose Spark the project supports, and every
credential comes from the secret scope through the cluster's environment.

The Databricks CLI's ``bundle validate`` (a Go binary) is not available here; ``Job.from_dict`` rejects
unknown fields at every level, which catches the commonest mistakes. What a workspace would do with the
bundle (deploy, secret resolution, the runtime itself) is not run here.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from databricks.bundles.jobs import Job, Task

from broker_edge.config.loader import load_dataclass, load_yaml_file
from pipelines.actions.config import ActionsConfig
from pipelines.maintenance import cli as tables_cli
from pipelines.runner import apply_override, parse_args, pipeline_main
from pipelines.telemetry.config import load_telemetry_config
from sources.stream_api import admission_control

REPO = Path(__file__).resolve().parents[3]
BUNDLE = yaml.safe_load((REPO / "databricks.yml").read_text())
REFERENCE = re.compile(r"\$\{([a-z_]+)\.([A-Za-z0-9_.]+)\}")
SECRET = re.compile(r"^\{\{secrets/([^/{}]+)/([^/{}]+)\}\}$")
ENV_VALUE = re.compile(r"!env\s+([A-Za-z_][A-Za-z0-9_]*)")

#: Databricks Runtime -> the Apache Spark it ships (Databricks' release notes): what the bundle may name.
RUNTIME_SPARK = {"17.3": "4.0.0", "18.0": "4.1.0"}
#: The Spark versions the project's tests run on: 4.3 (`make test`'s first run) and 4.0 (its second).
TESTED_SPARK = ("4.0", "4.3")


def strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for value in node.values() for s in strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in strings(value)]
    return [node] if isinstance(node, str) else []


def variables(target: str) -> dict[str, Any]:
    """Every variable's value for ``target``: its default, or the target's own."""
    values = {name: spec.get("default") for name, spec in BUNDLE["variables"].items()}
    values.update(BUNDLE["targets"][target].get("variables", {}))
    return values


def resolve(node: Any, target: str) -> Any:
    """Substitute ``${var.*}``, ``${bundle.*}``, ``${workspace.file_path}`` as the CLI does for ``target``; a
    string that is one reference takes the variable's own type (``num_workers: ${var.x}`` is a number)."""
    values = {f"var.{name}": value for name, value in variables(target).items()}
    values.update({"bundle.name": BUNDLE["bundle"]["name"], "bundle.target": target})
    values["workspace.file_path"] = str(REPO)
    if isinstance(node, dict):
        return {key: resolve(value, target) for key, value in node.items()}
    if isinstance(node, list):
        return [resolve(value, target) for value in node]
    if isinstance(node, str):
        whole = REFERENCE.fullmatch(node)
        if whole:
            return values[f"{whole.group(1)}.{whole.group(2)}"]
        return REFERENCE.sub(lambda m: str(values[f"{m.group(1)}.{m.group(2)}"]), node)
    return node


def job(name: str, target: str) -> Any:
    """The job ``name`` as the CLI sends it for ``target``."""
    return resolve(BUNDLE["resources"]["jobs"][name], target)


def config_document(parameters: list[str]) -> dict[str, Any]:
    """The config document a `timestone pipeline ...` command line loads (file, then overrides)."""
    args = parse_args(parameters[1:])
    document = load_yaml_file(args.config)
    for assignment in args.overrides:
        apply_override(document, assignment)
    return document


def cluster_secrets(definition: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each environment variable a job's cluster takes from a secret: name -> (scope, key)."""
    (cluster,) = definition["job_clusters"]
    found = {}
    for name, value in cluster["new_cluster"].get("spark_env_vars", {}).items():
        match = SECRET.match(value)
        if match:
            found[name] = (match.group(1), match.group(2))
    return found


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
        loaded = Job.from_dict(resolve(definition, target))
        assert loaded.continuous.pause_status.value == ("UNPAUSED" if target == "prod" else "PAUSED")
        assert isinstance(loaded.tasks, list)
        (task,) = loaded.tasks
        assert isinstance(task, Task)
        wheel = task.python_wheel_task
        assert (wheel.package_name, wheel.entry_point) == ("timestone", "timestone")
        assert wheel.entry_point in scripts  # the console script `timestone` routes `pipeline <name>`
        assert isinstance(wheel.parameters, list) and wheel.parameters[:2] == ["pipeline", name]
        assert [lib.whl for lib in task.libraries if lib.whl] == ["./dist/*.whl"]
        # a wheel library installs no extras: the job lists the `pipelines` extra itself, exactly
        assert [lib.pypi.package for lib in task.libraries if lib.pypi] == pipelines_extra
        assert task.job_cluster_key in {c.job_cluster_key for c in loaded.job_clusters}
    assert "--wheel-dir dist" in BUNDLE["artifacts"]["timestone_wheel"]["build"]


def test_the_runtime_ships_a_spark_the_tests_run_on():
    """The default runtime's Spark is one `make test` runs the sources and jobs on (docs/spark-source.md)."""
    runtime = BUNDLE["variables"]["spark_version"]["default"]
    release = re.match(r"^(\d+\.\d+)\.x-scala2\.13$", runtime)
    assert release, runtime
    spark = RUNTIME_SPARK[release.group(1)]
    assert spark.rsplit(".", 1)[0] in TESTED_SPARK
    assert not admission_control(spark)  # the sources' older path (sources/stream_api.py) is the one used
    for target in ("dev", "prod"):
        for name in BUNDLE["resources"]["jobs"]:
            (cluster,) = job(name, target)["job_clusters"]
            assert cluster["new_cluster"]["spark_version"] == runtime


@pytest.mark.parametrize("target", ["dev", "prod"])
def test_each_jobs_workers_are_a_variable_of_its_own(target):
    for name in BUNDLE["resources"]["jobs"]:
        (cluster,) = BUNDLE["resources"]["jobs"][name]["job_clusters"]
        assert cluster["new_cluster"]["num_workers"] == f"${{var.{name}_workers}}"
        workers = job(name, target)["job_clusters"][0]["new_cluster"]["num_workers"]
        assert isinstance(workers, int) and workers >= 1
        loaded: Any = Job.from_dict(job(name, target)).as_dict()
        assert loaded["job_clusters"][0]["new_cluster"]["num_workers"] == workers
    assert variables(target)["telemetry_workers"] >= 2  # executors share the rows: more than one by default


@pytest.mark.parametrize("target", ["dev", "prod"])
def test_telemetry_task_command_is_what_the_runner_runs(target, monkeypatch):
    """The job's parameters parse, and the overridden config loads with the target's locations and the
    offsets API token from the environment the cluster fills from the secret scope."""
    definition = job("telemetry", target)
    for name, (scope, key) in cluster_secrets(definition).items():
        monkeypatch.setenv(name, f"secret {scope}/{key}")
    args = parse_args(definition["tasks"][0]["python_wheel_task"]["parameters"][1:])
    assert args.name == "telemetry" and not args.available_now
    document = config_document(definition["tasks"][0]["python_wheel_task"]["parameters"])
    config = load_telemetry_config(document["telemetry"])
    values = variables(target)
    assert config.tables.root == values["table_root"]
    assert config.tables.namespace == values["table_namespace"]
    assert config.tables.backend == "native"
    assert config.stream.checkpoint == f"{values['checkpoint_root']}/telemetry"
    assert config.source.brokers == yaml.safe_load(values["telemetry_brokers"])
    assert config.tables.maintenance.enabled is False  # the maintenance job maintains the tables
    scope = values["secret_scope"]
    assert config.source_options()["authToken"] == f"secret {scope}/offsets-api-token"


@pytest.mark.parametrize("target", ["dev", "prod"])
def test_actions_task_takes_every_brokers_credentials_from_the_secret_scope(target, monkeypatch):
    definition = job("actions", target)
    secrets = cluster_secrets(definition)
    scope = variables(target)["secret_scope"]
    assert set(secrets.values()) == {
        (scope, "offsets-api-token"),
        (scope, "mqtt-username"),
        (scope, "mqtt-password"),
    }
    for name, (scope, key) in secrets.items():
        monkeypatch.setenv(name, f"secret {scope}/{key}")
    document = config_document(definition["tasks"][0]["python_wheel_task"]["parameters"])
    config = load_dataclass(ActionsConfig, document)
    values = variables(target)
    assert (config.tables_root, config.backend) == (values["table_root"], "native")
    assert config.checkpoint_root == f"{values['checkpoint_root']}/actions"
    assert [b.name for b in config.brokers] == ["edge1"]
    for broker in config.brokers:
        assert broker.token == f"secret {scope}/offsets-api-token"
        assert (broker.username, broker.password) == (
            f"secret {scope}/mqtt-username",
            f"secret {scope}/mqtt-password",
        )


@pytest.mark.parametrize("name", ["telemetry", "actions"])
def test_a_task_reads_only_credentials_its_cluster_sets_and_none_is_written_in_the_bundle(name):
    definition = job(name, "prod")
    task_text = " ".join(strings(definition["tasks"]))
    assert set(ENV_VALUE.findall(task_text)) == set(cluster_secrets(definition))
    (cluster,) = definition["job_clusters"]
    for variable, value in cluster["new_cluster"].get("spark_env_vars", {}).items():
        assert SECRET.match(value) or variable == "GX_ANALYTICS_ENABLED", f"{variable} is not a secret"
    for text in strings(BUNDLE):
        assert not re.search(r"(token|password|username)\s*[:=]\s*(?!!env)[^\s,}]+", text, re.IGNORECASE), (
            text
        )


def test_without_the_secret_the_job_stops_before_spark_naming_the_key_and_the_variable(monkeypatch, capsys):
    parameters = job("telemetry", "prod")["tasks"][0]["python_wheel_task"]["parameters"]
    monkeypatch.delenv("TIMESTONE_OFFSETS_API_TOKEN", raising=False)
    assert pipeline_main(parameters[1:]) == 2
    assert capsys.readouterr().err.strip() == (
        "timestone pipeline telemetry: telemetry.source.options.authToken: the environment variable "
        "TIMESTONE_OFFSETS_API_TOKEN (!env TIMESTONE_OFFSETS_API_TOKEN) is not set "
        "(from --set telemetry.source.options.authToken)"
    )


@pytest.mark.parametrize("target", ["dev", "prod"])
def test_maintenance_job_maintains_the_tables_each_streaming_job_writes(target):
    """A scheduled job runs `timestone tables maintain` for each pipeline with the very config file and the
    overrides that place its streaming job's tables, and the streaming jobs leave their tables to it; it is
    given no credentials (it reads no broker)."""
    definition = job("maintenance", target)
    loaded = Job.from_dict(definition)
    assert loaded.schedule is not None and loaded.continuous is None
    assert loaded.schedule.pause_status is not None
    assert loaded.schedule.pause_status.value == ("UNPAUSED" if target == "prod" else "PAUSED")
    assert loaded.schedule.timezone_id == "UTC"
    assert len(loaded.schedule.quartz_cron_expression.split()) == 6  # Quartz: seconds first
    assert cluster_secrets(definition) == {}
    tasks = {task["task_key"]: task["python_wheel_task"]["parameters"] for task in definition["tasks"]}
    assert set(tasks) == {"telemetry_tables", "actions_tables"}
    placing = re.compile(r"(tables|checkpoint|backend|root|namespace)")
    for pipeline in ("telemetry", "actions"):
        args = tables_cli.parse_args(tasks[f"{pipeline}_tables"][1:])  # after `timestone tables`
        assert (args.command, args.pipelines) == ("maintain", [pipeline])
        streaming = parse_args(job(pipeline, target)["tasks"][0]["python_wheel_task"]["parameters"][1:])
        assert args.config == streaming.config
        switch = [o for o in streaming.overrides if o.partition("=")[0].endswith("maintenance.enabled")]
        assert switch and yaml.safe_load(switch[0].partition("=")[2]) is False
        places = [o for o in streaming.overrides if placing.search(o.partition("=")[0]) and o not in switch]
        assert places and set(places) <= set(args.overrides)
        assert not any("!env" in o for o in args.overrides)
