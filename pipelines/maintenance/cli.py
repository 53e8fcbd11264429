"""``timestone tables maintain``: compact, vacuum and tidy the logs of a pipeline's tables, once, now.

What the jobs do on their schedule (:mod:`.scheduler`), for a job that runs with ``maintenance.enabled:
false``, a cron or a Databricks task (``databricks.yml``), or tables whose job is stopped. Each pipeline
module names its tables and maintenance settings (``maintenance_target``); the configuration is read as
``timestone pipeline`` reads it (``--config``, ``--set``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from broker_edge.config.loader import ConfigError
from sinks.maintenance import Upkeep, maintenance_pass

from .config import MAX_RETENTION_HOURS, MaintenanceTarget

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


EXIT_STATUS = (
    "exit status: 0 every operation succeeded; 1 one failed (FAILED on its line); 2 a wrong command line or "
    "configuration; 3 optional dependencies missing"
)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    from pipelines.runner import PIPELINES

    parser = argparse.ArgumentParser(
        prog="timestone tables",
        description="Maintain the pipelines' Delta tables: compact small files, vacuum, tidy the logs.",
        epilog=EXIT_STATUS,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    maintain = commands.add_parser(
        "maintain", help="compact, vacuum and tidy the logs of the tables, now", epilog=EXIT_STATUS
    )
    maintain.add_argument(
        "pipelines", nargs="*", metavar="PIPELINE", help=f"{', '.join(sorted(PIPELINES))} (default: all)"
    )
    maintain.add_argument("--config", "-c", default=None, help="the pipeline's YAML config (one pipeline)")
    maintain.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="as for pipeline"
    )
    maintain.add_argument("--no-vacuum", action="store_true", help="compact only: no vacuum, no log clean-up")
    maintain.add_argument(
        "--retention-hours",
        type=float,
        default=None,
        help="delete removed files older than this (default: the config's maintenance.retention_hours); "
        "0 deletes every file no snapshot needs, so only while no job writes the tables",
    )
    return parser.parse_args(list(argv))


def tables_main(argv: list[str]) -> int:
    """Entry point of ``timestone tables``: 0 when every operation succeeded, 1 if one failed, 2 bad input."""
    from pipelines.runner import PIPELINES, config_error, load_config_document

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    names = args.pipelines or sorted(PIPELINES)
    unknown = [name for name in names if name not in PIPELINES]
    if unknown:
        print(f"timestone tables maintain: unknown pipeline {unknown[0]!r}", file=sys.stderr)
        return 2
    if args.config is not None and len(names) != 1:
        print("timestone tables maintain: --config needs exactly one pipeline", file=sys.stderr)
        return 2
    if args.retention_hours is not None and not 0 <= args.retention_hours <= MAX_RETENTION_HOURS:  # nan too
        print(
            f"timestone tables maintain: --retention-hours must be a number from 0 to {MAX_RETENTION_HOURS} "
            "(a hundred years)",
            file=sys.stderr,
        )
        return 2
    spark: SparkSession | None = None
    done: list[Upkeep] = []
    for name in names:
        pipeline = PIPELINES[name]
        module = importlib.import_module(pipeline.module)
        try:
            document = load_config_document(args.config, pipeline.default_config, args.overrides)
            config = module.validate(document.get(pipeline.section) if pipeline.section else document)
        except ConfigError as exc:
            error = config_error(exc, args, pipeline.default_config)
            print(f"timestone tables maintain {name}: {error}", file=sys.stderr)
            return 2
        if spark is None and _needs_spark(config):
            from pipelines.runner import spark_session

            spark = spark_session(None, "timestone-tables")
        try:
            target: MaintenanceTarget = module.maintenance_target(spark, config)
        except ValueError as exc:  # a root the backend cannot address
            print(f"timestone tables maintain {name}: {exc}", file=sys.stderr)
            return 2
        if not any(target.store.exists(table) for table in target.tables):
            where = getattr(target.store, "root", None) or "its tables' place"
            print(f"{name}: no table of it under {where} yet: nothing to maintain")
            continue
        done += maintain(target, vacuum=not args.no_vacuum, retention_hours=args.retention_hours)
    for upkeep in done:
        count = "-" if upkeep.count is None else f"{upkeep.count:,}"
        status = f"FAILED {upkeep.error}" if upkeep.error else ""
        print(f"{upkeep.table:<22} {upkeep.operation:<10} {count:>8} {upkeep.seconds:8.2f} s {status}")
    return 1 if any(u.error for u in done) else 0


def maintain(
    target: MaintenanceTarget, vacuum: bool = True, retention_hours: float | None = None
) -> list[Upkeep]:
    """One whole pass over the target's existing tables; ``retention_hours`` overrides the configured one
    for this vacuum (the tables' retention properties keep the configured one)."""
    tables = [name for name in target.tables if target.store.exists(name)]
    configured = target.config.policy()
    done = maintenance_pass(target.store, tables, configured, compact=False, vacuum=False)
    policy = configured if retention_hours is None else replace(configured, retention_hours=retention_hours)
    done += maintenance_pass(target.store, tables, policy, retention=False, vacuum=vacuum)
    if policy != configured and vacuum:  # a part of an hour is passed to delta-rs as the table's property
        restored = maintenance_pass(target.store, tables, configured, compact=False, vacuum=False)
        done += [upkeep for upkeep in restored if upkeep.error]
    return done


def _needs_spark(config: object) -> bool:
    """Only the native Delta backend needs a Spark session; delta-rs maintains tables on its own."""
    backend = getattr(getattr(config, "tables", config), "backend", "auto")
    return backend == "native" or (backend == "auto" and bool(os.environ.get("DATABRICKS_RUNTIME_VERSION")))
