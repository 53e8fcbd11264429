"""The ``timestone`` command: one entry point, each subcommand imported only when used.

Imports are lazy so that ``timestone broker`` never loads Spark and ``timestone passwd`` starts instantly.
Each subcommand's own module parses its arguments; this file only routes.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, function taking argv and returning an exit code, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "broker": ("pipelines.cli", "broker_main", "run an edge broker: timestone broker [--config FILE]"),
    "passwd": ("broker_edge.auth", "passwd_main", "add, change or delete a user in a password file"),
    "pipeline": ("pipelines.runner", "pipeline_main", "run a streaming pipeline (telemetry, actions)"),
    "devices": ("pipelines.fleet.cli", "devices_main", "simulate a fleet of devices"),
    "ota": ("pipelines.actions.cli", "ota_main", "create or cancel an OTA / command action"),
    "demo": ("pipelines.demo", "demo_main", "run the end-to-end demo on embedded defaults"),
}


def broker_main(argv: list[str]) -> int:
    """``timestone broker [--config FILE]``: without a file the defaults serve 127.0.0.1:1883."""
    import argparse

    from broker_edge.main import run_broker

    parser = argparse.ArgumentParser(prog="timestone broker", description="Run a Timestone edge broker.")
    parser.add_argument("--config", "-c", help="broker YAML config (default: embedded defaults)")
    args = parser.parse_args(argv)
    return run_broker(args.config)


def _usage() -> str:
    lines = ["usage: timestone <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_text}" for name, (_, _, help_text) in COMMANDS.items()]
    lines.append("\nRun 'timestone <command> --help' for the options of a command.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Route ``argv`` (default ``sys.argv[1:]``) to a subcommand and return its exit code."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"timestone: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, function_name, _ = COMMANDS[name]
    function = getattr(importlib.import_module(module_name), function_name)
    return int(function(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
