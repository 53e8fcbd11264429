"""``timestone pipeline <name>``: start one streaming pipeline, locally or on a cluster, from one config file.

A pipeline is a module with

- ``validate(config: Any) -> object`` (optional): build and check its configuration, raising
  ``broker_edge.config.loader.ConfigError`` naming the field; called before Spark starts;
- ``run(spark, config: Any, options: RunOptions) -> int``: run the pipeline, return the exit code.

``config`` is the parsed YAML of the pipeline's file, or one top-level section of it. Adding a pipeline is
one line in :data:`PIPELINES`. The same command is what the Databricks bundle runs, so the code path on a
cluster is the one tested here; only the SparkSession differs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from broker_edge.config.loader import ConfigError, load_yaml_file
from pipelines.metrics import PipelineMetrics
from pipelines.views.location import notebooks_hint

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class Pipeline:
    """Where a pipeline's code and configuration are: its module, default file, and section in that file."""

    module: str
    default_config: str
    section: str | None = None  # None: the whole file is the pipeline's config
    tables_root: str | None = None
    """Dotted attribute of the validated config holding the tables root (printed for the notebooks)."""


#: Every pipeline ``timestone pipeline`` can run.
PIPELINES: dict[str, Pipeline] = {
    "telemetry": Pipeline(
        "pipelines.telemetry.job", "conf/pipeline.yaml", section="telemetry", tables_root="tables.root"
    ),
    "actions": Pipeline("pipelines.actions.job", "conf/actions.yaml", tables_root="tables_root"),
}


@dataclass(frozen=True)
class RunOptions:
    """What the command line decides for any pipeline, beyond its configuration."""

    available_now: bool = False
    spark_master: str | None = None
    config_path: str | None = None
    metrics: PipelineMetrics | None = None
    """Where the job counts what it reports as metrics (its query restarts); served with --metrics-port."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="timestone pipeline", description="Run a streaming pipeline.")
    parser.add_argument("name", choices=sorted(PIPELINES), help="the pipeline to run")
    defaults = ", ".join(f"{name}: {p.default_config}" for name, p in sorted(PIPELINES.items()))
    parser.add_argument("--config", "-c", default=None, help=f"YAML config (default: {defaults})")
    parser.add_argument(
        "--available-now",
        action="store_true",
        help="process everything available now, then stop (instead of running continuously)",
    )
    parser.add_argument(
        "--spark-master",
        default=None,
        help="Spark master of a local session (default: local[*]; on Databricks the cluster's session)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the job's Prometheus metrics (query restarts) at http://127.0.0.1:PORT/metrics",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key by its dotted path in the file; VALUE is read as YAML (repeatable)",
    )
    return parser.parse_args(list(argv))


def apply_override(document: dict[str, Any], assignment: str) -> None:
    """Set ``a.b.c=value`` in ``document`` (creating mappings on the way); the value is parsed as YAML."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(assignment, "expected KEY=VALUE with a dotted KEY")
    parts = key.strip().split(".")
    node = document
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), "is not a mapping, cannot set a key inside it")
        node = child
    try:
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(key, f"value is not valid YAML: {exc}") from None


def load_config_document(path: str | None, default: str, overrides: Sequence[str]) -> dict[str, Any]:
    """The config file as a mapping with overrides applied.

    Without ``--config`` the pipeline's default file is read when it exists (running from the repository),
    else every key takes its default (an installed wheel run from anywhere).
    """
    if path is not None:
        document = load_yaml_file(path)
    elif Path(default).is_file():
        document = load_yaml_file(default)
    else:
        document = {}
    for assignment in overrides:
        apply_override(document, assignment)
    return document


def spark_session(master: str | None, app_name: str) -> SparkSession:
    """The cluster's session where there is one (Databricks), else a local one on ``master``."""
    if master is None and os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        from pyspark.sql import SparkSession

        return SparkSession.builder.appName(app_name).getOrCreate()
    from pipelines.spark_session import local_spark_session

    return local_spark_session(app_name=app_name, master=master or "local[*]")


def pipeline_main(argv: list[str]) -> int:
    """Entry point of ``timestone pipeline``: parse, load config, start Spark, run until done or stopped."""
    args = parse_args(argv)
    pipeline = PIPELINES[args.name]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    module = importlib.import_module(pipeline.module)
    try:
        document = load_config_document(args.config, pipeline.default_config, args.overrides)
        config = document.get(pipeline.section) if pipeline.section else document
        validate = getattr(module, "validate", None)
        validated = validate(config) if validate is not None else None
    except ConfigError as exc:
        print(f"timestone pipeline {args.name}: {exc}", file=sys.stderr)
        return 2
    if validated is not None and pipeline.tables_root:
        print(notebooks_hint(str(attrgetter(pipeline.tables_root)(validated))), flush=True)
    metrics = PipelineMetrics()
    if args.metrics_port is not None:
        metrics.serve(args.metrics_port)
    options = RunOptions(args.available_now, args.spark_master, args.config, metrics)
    spark = spark_session(args.spark_master, app_name=f"timestone-{args.name}")
    return int(module.run(spark, config, options) or 0)
