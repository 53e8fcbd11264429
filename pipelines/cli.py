"""The ``timestone`` command: one entry point, each subcommand imported only when used.

Imports are lazy so that ``timestone broker`` loads nothing but the broker (no Spark, pandas or Arrow) and
``timestone passwd`` starts instantly. Each subcommand's own module parses its arguments; this file only
routes, and says which optional dependencies (``pip install 'timestone[...]'``) a subcommand lacks.
"""

from __future__ import annotations

import importlib
import os
import sys

# subcommand -> (module, function taking argv and returning an exit code, one-line help, extras it needs)
COMMANDS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "broker": (
        "broker_edge.runtime.main",
        "main",
        "run an edge broker: timestone broker [--config FILE] [--workers N]",
        (),
    ),
    "passwd": (
        "broker_edge.security.auth",
        "passwd_main",
        "add, change or delete a user in a password file",
        (),
    ),
    "pki": (
        "broker_edge.pki.cli",
        "pki_main",
        "a CA, its certificates and CRL: timestone pki ca | issue | renew | show | revoke | crl",
        (),
    ),
    "cluster": (
        "broker_edge.cluster.coordination.status",
        "cluster_main",
        "inspect a broker cluster: timestone cluster status --etcd URL",
        ("cluster",),
    ),
    "uplink": (
        "broker_edge.uplink.status_cli",
        "uplink_main",
        "the edge uplink: timestone uplink status [--broker URL]",
        (),
    ),
    "pipeline": (
        "pipelines.runner",
        "pipeline_main",
        "run a streaming pipeline (telemetry, actions)",
        ("pipelines", "spark"),
    ),
    "tables": (
        "pipelines.maintenance.cli",
        "tables_main",
        "maintain the Delta tables: timestone tables maintain [telemetry|actions]",
        ("pipelines",),
    ),
    "devices": (
        "pipelines.fleet.cli",
        "devices_main",
        "simulated fleets, devices in OTA groups: timestone devices register | simulate",
        (),
    ),
    "sparkplug-host": (
        "pipelines.sparkplug_host.cli",
        "sparkplug_host_main",
        "the Sparkplug B host application: its STATE, rebirth requests",
        ("pipelines",),
    ),
    "ota": (
        "pipelines.actions.cli",
        "ota_main",
        "OTA / command actions: timestone ota create | cancel | end | status [--watch]",
        ("pipelines",),
    ),
    "demo": (
        "pipelines.demo",
        "demo_main",
        "run the end-to-end demo on embedded defaults",
        ("pipelines", "spark"),
    ),
}

OPTIONAL_MODULES = {
    "pyspark": "spark",
    "deltalake": "pipelines",
    "great_expectations": "pipelines",
    "pandas": "pipelines",
    "pyarrow": "pipelines",
    "numpy": "pipelines",
    "paho": "pipelines",
    "cbor2": "pipelines",
    "google": "pipelines",
    "aetcd": "cluster",
    "grpc": "cluster",
}
"""Top-level modules that only the extras install, and the extra that brings each."""

MISSING_EXTRA_STATUS = 3
"""Exit status of a subcommand whose optional dependencies are not installed."""


def missing_extras_message(command: str, module: str) -> str | None:
    """What to tell a user whose ``command`` failed to import ``module``; None if no extra provides it."""
    top = module.partition(".")[0]
    if top not in OPTIONAL_MODULES:
        return None
    extras = COMMANDS[command][3]
    if OPTIONAL_MODULES[top] not in extras:  # installed already, or not bringing it: add the one that does
        extras = (*extras, OPTIONAL_MODULES[top])
    return (
        f"timestone {command}: this command needs the optional dependencies of "
        f"timestone[{','.join(extras)}] ({top} is not installed). Install them with:\n"
        f"    pip install 'timestone[{','.join(extras)}]'"
    )


def _usage() -> str:
    lines = ["usage: timestone [--version] <command> [options]", "", "commands:"]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}} {entry[2]}" for name, entry in COMMANDS.items()]
    lines.append("\nRun 'timestone <command> --help' for the options of a command.")
    lines.append(
        "\nexit status: 0 done; 2 an unknown command or a wrong command line; "
        f"{MISSING_EXTRA_STATUS} the command's optional dependencies are not installed (the message names "
        f"the extra); {BROKEN_PIPE_STATUS} the reader of its output went away (| head); each command's "
        "others in its --help."
    )
    return "\n".join(lines)


def version() -> str:
    """The installed distribution's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("timestone")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


BROKEN_PIPE_STATUS = 141
"""The status of a command whose reader went away (``timestone ota status | head``), as a shell gives a
command SIGPIPE ended (128 + 13)."""


def main(argv: list[str] | None = None) -> int:
    """Route ``argv`` (default ``sys.argv[1:]``) to a subcommand and return its exit code; a reader of its
    output that went away ends it quietly (``BROKEN_PIPE_STATUS``), not in a traceback."""
    try:
        status = _route(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()  # what is left to write goes now, where a broken pipe is still caught
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more for the exit's flush
        return BROKEN_PIPE_STATUS
    return status


def _route(args: list[str]) -> int:
    """Run the subcommand ``args`` names; its exit code."""
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("--version", "-V"):
        print(f"timestone {version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"timestone: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, function_name, _, _ = COMMANDS[name]
    if name == "broker":  # a Ctrl-C while the broker's modules load is a clean stop, not a traceback
        from broker_edge.runtime.stop_signals import catch_early_stops

        catch_early_stops()
    if name == "pipeline":  # a reload while the job's modules load changes nothing, as once it runs
        from pipelines.reload_signal import say_nothing_to_reload

        say_nothing_to_reload(" ".join(["timestone", name, *rest[:1]]))
    try:
        function = getattr(importlib.import_module(module_name), function_name)
        return int(function(rest) or 0)
    except ModuleNotFoundError as exc:
        message = missing_extras_message(name, exc.name or "")
        if message is None:
            raise
        print(message, file=sys.stderr)
        return MISSING_EXTRA_STATUS


if __name__ == "__main__":
    sys.exit(main())
