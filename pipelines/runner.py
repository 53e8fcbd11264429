"""``timestone pipeline <name>``: start one streaming pipeline, locally or on a cluster, from one config file.

A pipeline is a module with

- ``validate(config: Any) -> object`` (optional): build and check its configuration, every value the job
  will use, raising ``broker_edge.config.loader.ConfigError`` naming the field; called before Spark starts;
- ``preflight(validated: object, options: RunOptions) -> None`` (optional): what must hold of the world
  before Spark starts (``pipelines.preflight``: the brokers answer), raising ``BrokersUnreachable``, or
  ``TokenRefused`` for a broker that refuses the token (exit status 5, as a running query failing on it);
- ``run(spark, config: Any, options: RunOptions) -> int``: run the pipeline, return the exit code.

``config`` is the parsed YAML of the pipeline's file, or one top-level section of it. Adding a pipeline is
one entry in :data:`PIPELINES`. The same command is what the Databricks bundle runs, so the code path on a
cluster is the one tested here; only the SparkSession differs.

Exit status: 0 the pipeline caught up (``--available-now``) or was stopped (Ctrl-C, SIGTERM); 1 it failed
while running; 2 a wrong command line or configuration (the message names the dotted key); 3 missing
optional dependencies (``pipelines.cli``); 4 with ``--available-now``, the brokers to read did not answer;
5 a query failed, or could not start, in a way no restart fixes (``pipelines.supervisor.NOT_RESTARTABLE``),
a token the brokers refuse included, with ``--available-now`` too.
No user error ends in a traceback: each is one line (``--log-level DEBUG`` logs the details).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker_edge.config.loader import ConfigError, load_yaml_file, sourced
from pipelines.graceful_stop import StopRequest, stop_on_signals
from pipelines.metrics import PipelineMetrics
from pipelines.overrides import apply_override, key_steps, split_assignment
from pipelines.pipeline_logs import configure_pipeline_logging, failure_summary, quiet_spark
from pipelines.preflight import BrokersUnreachable, TokenRefused
from pipelines.reload_signal import say_nothing_to_reload
from pipelines.run_options import RunOptions
from pipelines.supervisor import NOT_RESTARTABLE, unrecoverable_failure
from pipelines.views.location import notebooks_hint

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

FAILED, CONFIG_ERROR, UNREACHABLE = 1, 2, 4


@dataclass(frozen=True)
class Pipeline:
    """Where a pipeline's code and configuration are: its module, default file, and section in that file."""

    module: str
    default_config: str
    summary: str
    """One line for ``timestone pipeline --help``."""
    description: str
    """What ``timestone pipeline <name> --help`` says the pipeline does."""
    section: str | None = None  # None: the whole file is the pipeline's config
    tables_root: str | None = None
    """Dotted attribute of the validated config holding the tables root (printed for the notebooks)."""


#: Every pipeline ``timestone pipeline`` can run.
PIPELINES: dict[str, Pipeline] = {
    "telemetry": Pipeline(
        "pipelines.telemetry.job",
        "conf/pipeline.yaml",
        summary="the brokers' logs → bronze → silver (data-quality checked) → gold Delta tables",
        description=(
            "Reads the brokers' commitlogs with the timestone Spark source and writes bronze_telemetry, "
            "silver_telemetry (parsed, deduplicated, checked by Great Expectations; rejects in "
            "telemetry_quarantine, results in dq_results), device_minute and devices "
            "(docs/telemetry-pipeline.md). Its configuration is the `telemetry` section of the file."
        ),
        section="telemetry",
        tables_root="tables.root",
    ),
    "actions": Pipeline(
        "pipelines.actions.job",
        "conf/actions.yaml",
        summary="the OTA / command fanout: actions rows → devices, status reports → action tables",
        description=(
            "Streams the `actions` table's change feed, checks every row, publishes each valid action to "
            "its devices through the brokers, folds the devices' status reports into action_executions "
            "and action_summary, paces rollouts and aborts them at their thresholds (docs/ota.md). Its "
            "configuration is the whole file."
        ),
        tables_root="tables_root",
    ),
}

EXIT_STATUS = f"""exit status: 0 caught up (--available-now) or stopped (Ctrl-C, SIGTERM);
1 failed while running (a query's restarts used up or off), or --metrics-port could not be served;
2 a wrong command line or configuration (naming the dotted key);
3 optional dependencies missing; 4 with --available-now, the brokers to read did not answer
(a broker that refuses the token is {NOT_RESTARTABLE}, as in a continuous run);
{NOT_RESTARTABLE} a query failed, or could not start, in a way no restart fixes (data loss, a refused token,
checkpoint offsets edited by hand, a table that does not match): starting the job again fails the same way,
so a service manager should not (conf/systemd/timestone-pipeline@.service)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timestone pipeline",
        description="Run a streaming pipeline ('timestone pipeline <name> --help': one pipeline's options).",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="name", required=True, metavar="PIPELINE")
    for name, pipeline in PIPELINES.items():
        where = f"the `{pipeline.section}` section of " if pipeline.section else ""
        one = sub.add_parser(
            name,
            help=pipeline.summary,
            description=textwrap.fill(pipeline.description, width=100),
            epilog=EXIT_STATUS,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        one.add_argument(
            "--config",
            "-c",
            default=None,
            help=f"YAML config: {where}this file (default: {pipeline.default_config})",
        )
        one.add_argument(
            "--available-now",
            action="store_true",
            help="process everything available now, then stop (instead of running continuously)",
        )
        one.add_argument(
            "--spark-master",
            default=None,
            help="Spark master of a local session (default: local[*]; on Databricks the cluster's session)",
        )
        example = (
            f"{pipeline.section}.tables.root=/data/lake" if pipeline.section else "tables_root=/data/lake"
        )
        one.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"override a config key by its dotted path, lists indexed as key[0] (e.g. {example}); "
            "VALUE is read as YAML (repeatable)",
        )
        one.add_argument(
            "--metrics-port",
            type=_port,
            default=None,
            metavar="PORT",
            help="serve the job's Prometheus metrics (query restarts) at http://127.0.0.1:PORT/metrics",
        )
        one.add_argument("--log-format", choices=("text", "json"), default="text", help="text, or JSON lines")
        one.add_argument(
            "--log-level",
            type=str.upper,
            choices=("DEBUG", "INFO", "WARNING", "ERROR"),
            default="INFO",
            help="lowest level logged (default INFO; DEBUG also shows Spark's, py4j's and GX's own logs)",
        )
    return parser


def _port(text: str) -> int:
    """A TCP port, 0 to 65535 (0: one the system picks), for ``--metrics-port``."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port, 0 to 65535, got {text!r}")
    return port


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def sections_of(pipeline: Pipeline) -> set[str]:
    """The top-level sections a pipeline's file may hold: those of every pipeline sharing that file."""
    shared = [p.section for p in PIPELINES.values() if p.default_config == pipeline.default_config]
    return {section for section in shared if section}


def load_config_document(
    path: str | None, default: str, overrides: Sequence[str], sections: set[str] | None = None
) -> dict[str, Any]:
    """The config file as a mapping with overrides applied.

    Without ``--config`` the pipeline's default file is read when it exists (running from the repository),
    else every key takes its default (an installed wheel run from anywhere). With ``sections`` (a file of
    one section per pipeline), any other top-level key, in the file or an override, is refused by name: a
    misspelt section would otherwise be ignored and the job run on defaults.
    """
    file = config_file(path, default)
    document = load_yaml_file(file) if file is not None else {}
    for assignment in overrides:
        try:
            if sections:
                _check_section(assignment, sections)
            apply_override(document, assignment)
        except ConfigError as error:
            raise sourced(error, None, [assignment]) from None
    unknown = [key for key in document if sections and key not in sections]
    if unknown:
        known = ", ".join(sorted(sections or ()))
        raise ConfigError(str(unknown[0]), f"unknown section (known sections: {known})")
    return document


def config_file(path: str | None, default: str) -> str | None:
    """The file a pipeline's config is read from: ``path``, else ``default`` when it exists, else none."""
    if path is not None:
        return path
    return default if Path(default).is_file() else None


def config_error(error: ConfigError, args: argparse.Namespace, default: str) -> ConfigError:
    """``error`` naming where its key was set: the ``--set`` of ``args`` that set it, or the file's line."""
    return sourced(error, config_file(args.config, default), args.overrides)


def _check_section(assignment: str, sections: set[str]) -> None:
    key, _ = split_assignment(assignment)
    first = key_steps(key)[0]
    if first not in sections:
        hint = " or ".join(f"'{section}.{key}'" for section in sorted(sections))
        raise ConfigError(
            key, f"unknown key: keys of this file start with a section name (did you mean {hint}?)"
        )


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
    prefix = f"timestone pipeline {args.name}"
    say_nothing_to_reload(prefix)
    configure_pipeline_logging(args.log_level, args.log_format)
    module = importlib.import_module(pipeline.module)
    options = RunOptions(args.available_now, args.spark_master, args.config, PipelineMetrics())
    try:
        document = load_config_document(
            args.config, pipeline.default_config, args.overrides, sections_of(pipeline)
        )
        config = document.get(pipeline.section) if pipeline.section else document
        validate = getattr(module, "validate", None)
        validated = validate(config) if validate is not None else None
        preflight = getattr(module, "preflight", None)
        if preflight is not None:
            preflight(validated, options)
    except ConfigError as exc:
        print(f"{prefix}: {config_error(exc, args, pipeline.default_config)}", file=sys.stderr)
        return CONFIG_ERROR
    except BrokersUnreachable as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return UNREACHABLE
    except TokenRefused as exc:  # said and ended as a running query that fails on it
        print(f"{prefix}: failed, not restarted: broker refused the token: {exc}", file=sys.stderr)
        return NOT_RESTARTABLE
    if validated is not None and pipeline.tables_root:
        print(notebooks_hint(str(attrgetter(pipeline.tables_root)(validated))), flush=True)
    if args.metrics_port is not None and options.metrics is not None:
        try:
            options.metrics.serve(args.metrics_port)
        except OSError as exc:  # the port taken, or not ours to bind
            where = f"127.0.0.1:{args.metrics_port}"
            print(
                f"{prefix}: --metrics-port {args.metrics_port}: cannot serve /metrics on {where}: {exc}",
                file=sys.stderr,
            )
            return FAILED
    request: StopRequest | None = None
    try:
        spark = spark_session(args.spark_master, app_name=f"timestone-{args.name}")
        quiet_spark(spark, args.log_level)
        request = stop_on_signals(spark, prefix)
        status = int(module.run(spark, config, options) or 0)
        if request.asked.is_set():
            print(f"{prefix}: stopped", file=sys.stderr)
        return status
    except KeyboardInterrupt:  # before the handlers were installed
        print(f"{prefix}: stopped", file=sys.stderr)
        return 0
    except ConfigError as exc:  # found only once Spark runs (e.g. the actions job asking the brokers)
        print(f"{prefix}: {config_error(exc, args, pipeline.default_config)}", file=sys.stderr)
        return CONFIG_ERROR
    except Exception as exc:
        log.debug("%s failed", prefix, exc_info=True)
        print(f"{prefix}: failed: {failure_summary(exc)}", file=sys.stderr)
        return NOT_RESTARTABLE if unrecoverable_failure(exc) is not None else FAILED
    finally:
        if request is not None:
            request.finished()
