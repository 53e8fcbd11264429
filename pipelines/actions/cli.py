"""``timestone ota``: create, cancel and follow actions (each only reads or writes the Delta tables).

Exit status: 0 done; 1 the tables say no (an unknown action, an id taken by another action, an action that
has ended) or cannot be written (a full disk, no write permission); 2 the command line or the config is
wrong (a value the rules of a valid action refuse, a group without devices); 130 ``status --watch`` stopped
with Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
from datetime import UTC, datetime

from broker_edge.config import ConfigError, load_dataclass, load_yaml_file
from broker_edge.config.loader import sourced
from pipelines.actions.config import ActionsConfig
from pipelines.actions.heartbeat import read_heartbeat
from pipelines.actions.operator import (
    ActionRefused,
    NewAction,
    UnknownAction,
    cancel_action,
    create_action,
    device_groups,
    end_action,
)
from pipelines.actions.rollout_options import OPTION_OF_FIELD as ROLLOUT_OPTIONS
from pipelines.actions.rollout_options import add_rollout_options, instant, rollout_fields
from pipelines.actions.status import ActionStatus, describe, describe_job, describe_list, read_statuses
from pipelines.actions.validation import InvalidAction, problems
from pipelines.output_paths import (
    NotWritable,
    check_input_location,
    check_output_location,
    check_table_root,
    check_tables_writable,
    file_system_failure,
)
from sinks.arrow_conform import SchemaMismatch
from sinks.backends import open_table_store
from sinks.store import TableStore

OPTION_OF_FIELD = {
    "id": "--id",
    "kind": "--kind",
    "target": "--devices, --group or --all",
    "target.device_ids": "--devices",
    "target.group": "--group",
    "payload.version": "--version",
    "payload.url": "--url",
    "payload.sha256": "--sha256",
    "payload.size": "--size",
    "payload.command": "--command",
    "payload.args": "--arg",
    "rollout.max_per_minute": "--max-per-minute",
    "abort_criteria.failure_pct": "--abort-failure-pct",
    "abort_criteria.min_executed": "--abort-min-executed",
    "in_progress_timeout_s": "--timeout",
    **ROLLOUT_OPTIONS,
}
"""The option that sets each field of the row (an error names both)."""

REFUSED, INVALID, INTERRUPTED = 1, 2, 130
MAX_INTERVAL_S = 86_400
"""Longest ``status --watch --interval``: a day (a longer sleep is no watch, and past ~1e9 s none can run)."""


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _add_table_options(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "--config",
        "-c",
        default=default,
        help="actions YAML (default: conf/actions.yaml if present, else defaults)",
    )
    parser.add_argument("--tables-root", default=default, help="override the config's tables_root")


EXIT_STATUS = (
    "exit status: 0 done; 1 the tables say no (unknown action, id taken by other content, cancel or end of "
    "an ended action, an actions table in a layout of its own) or cannot be written (a full disk, no write "
    "permission); 2 a wrong command line or config; 130 status --watch stopped by Ctrl-C"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timestone ota",
        description="Create, cancel and follow OTA / command actions (docs/ota.md).",
        epilog=EXIT_STATUS,
    )
    _add_table_options(parser, default=None)
    # the same options after the verb too (`timestone ota status --tables-root DIR`, as the demo prints it)
    after_verb = argparse.ArgumentParser(add_help=False)
    _add_table_options(after_verb, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="verb", required=True)

    create = sub.add_parser("create", help="write a new action row", parents=[after_verb], epilog=EXIT_STATUS)
    create.add_argument("--id", dest="action_id", help="action id (default: generated)")
    create.add_argument(
        "--kind",
        choices=("ota", "command"),
        default="ota",
        help="a firmware update (--version, --url, --sha256) or a command (--command, --arg); default ota",
    )
    target = create.add_mutually_exclusive_group(required=True)
    target.add_argument("--devices", help="comma-separated device ids")
    target.add_argument(
        "--devices-from-file",
        metavar="FILE",
        help="device ids one a line ('-': stdin; '#' lines skipped), for lists too long for one argument",
    )
    target.add_argument("--group", help="a device group")
    target.add_argument("--all", action="store_true", help="every device")
    create.add_argument("--version", help="firmware version (ota)")
    create.add_argument("--url", help="firmware URL (ota)")
    create.add_argument("--sha256", help="firmware SHA-256 (ota)")
    create.add_argument("--size", type=int, help="firmware size in bytes (ota)")
    create.add_argument("--command", help="command name (command)")
    create.add_argument(
        "--arg", type=_key_value, action="append", default=[], help="command argument KEY=VALUE"
    )
    create.add_argument("--max-per-minute", type=int, help="paced rollout rate (default: one broadcast)")
    create.add_argument(
        "--abort-failure-pct", type=float, help="abort when this %% of finished devices failed"
    )
    create.add_argument(
        "--abort-min-executed",
        type=int,
        help="...after at least this many finished (default 1; only with --abort-failure-pct)",
    )
    create.add_argument("--timeout", type=int, help="in-progress timeout per device, seconds")
    add_rollout_options(create)
    create.add_argument("--created-by", default="cli", help="who writes it, kept in the row (default cli)")
    create.add_argument(
        "--allow-unknown-group",
        action="store_true",
        help="write a group action even when no registered device is in the group yet",
    )

    cancel = sub.add_parser(
        "cancel", help="cancel an action that has not ended", parents=[after_verb], epilog=EXIT_STATUS
    )
    cancel.add_argument("action_id")

    end = sub.add_parser(
        "end",
        help="end an action (a continuous one, say): nothing new is sent, devices not sent it are canceled",
        parents=[after_verb],
        epilog=EXIT_STATUS,
    )
    end.add_argument("action_id")
    end.add_argument("--at", type=instant, help="when it ends (ISO time; default now)")

    status = sub.add_parser(
        "status",
        help="every action, or one in full (target, state, reason, devices not done)",
        parents=[after_verb],
        epilog=EXIT_STATUS,
    )
    status.add_argument("action_id", nargs="?")
    status.add_argument("--watch", action="store_true", help="follow the action until it ends (Ctrl-C stops)")
    status.add_argument("--interval", type=float, default=2.0, help="seconds between looks with --watch")
    status.add_argument("--show", type=int, default=10, help="devices not done to list (default 10)")
    return parser


def load_actions_config(path: str | None) -> ActionsConfig:
    """The actions config from ``path``, else ``conf/actions.yaml`` when present, else defaults."""
    if path is None and os.path.exists("conf/actions.yaml"):
        path = "conf/actions.yaml"
    data = load_yaml_file(path) if path else {}
    try:
        return load_dataclass(ActionsConfig, data)
    except ConfigError as error:  # said with the file and line of its key
        raise sourced(error, path) from None


def ota_main(argv: list[str]) -> int:
    """Entry point of ``timestone ota``."""
    args = build_parser().parse_args(argv)
    try:
        config = load_actions_config(args.config)
    except ConfigError as exc:
        print(f"timestone ota: bad config: {exc}", file=sys.stderr)
        return INVALID
    root = config.tables_root if args.tables_root is None else args.tables_root
    check = check_output_location if args.verb in ("create", "cancel", "end") else check_input_location
    try:
        key = "--tables-root" if args.tables_root is not None else "tables_root"
        check(root, key)
        check_table_root(root, key)
        if check is check_output_location:
            check_tables_writable(root, ["actions"], key)
    except ConfigError as exc:  # a root it may not write is a failure of the tables, not of the line
        print(f"timestone ota {args.verb}: {exc}", file=sys.stderr)
        return REFUSED if isinstance(exc, NotWritable) else INVALID
    store = open_table_store(None, root, backend="delta-rs")
    try:
        if args.verb == "create":
            return _create(store, args)
        if args.verb == "cancel":
            requested = cancel_action(store, args.action_id)
            print(
                ("cancel requested for " if requested else "cancel already requested for ") + args.action_id
            )
            return 0
        if args.verb == "end":
            return _end(store, args)
        return _status(store, args, root)
    except ActionRefused as refused:
        print(f"timestone ota {args.verb}: {refused}", file=sys.stderr)
        return REFUSED
    except SchemaMismatch as mismatch:  # a table written by hand or by another tool, in its own layout
        print(
            f"timestone ota {args.verb}: the actions table at {store.location('actions')} is not the layout "
            f"the actions job reads and writes ({mismatch}); nothing written (docs/tables.md lists its "
            "columns)",
            file=sys.stderr,
        )
        return REFUSED
    except Exception as error:  # a full disk, a read-only file system: said in one line, else raised
        writes = args.verb != "status"
        return said_file_system_failure(f"timestone ota {args.verb}", root, error, writes=writes)


def said_file_system_failure(command: str, root: str, error: Exception, writes: bool = True) -> int:
    """Say in one line that the tables under ``root`` could not be written (read) for a reason of the file
    system (``REFUSED``); raise ``error`` again when it is not one."""
    why = file_system_failure(error)
    if why is None:
        raise error
    said = f"writing the tables under {root} failed: {why}; nothing was committed"
    said = said if writes else f"reading the tables under {root} failed: {why}"
    print(f"{command}: {said}", file=sys.stderr)
    return REFUSED


def _create(store: TableStore, args: argparse.Namespace) -> int:
    wrong = _wrong_options(args)
    if wrong is not None:
        print(f"timestone ota create: {wrong}", file=sys.stderr)
        return INVALID
    from_file = args.devices_from_file is not None
    try:
        devices = listed_ids(args.devices_from_file) if from_file else _comma_list(args.devices)
    except ValueError as error:
        print(f"timestone ota create: --devices-from-file: {error}", file=sys.stderr)
        return INVALID
    action = NewAction(
        kind=args.kind,
        device_ids=devices,
        group=args.group,
        all_devices=args.all,
        version=args.version,
        url=args.url,
        sha256=args.sha256,
        size=args.size,
        command=args.command,
        args=dict(args.arg),
        max_per_minute=args.max_per_minute,
        failure_pct=args.abort_failure_pct,
        min_executed=1 if args.abort_min_executed is None else args.abort_min_executed,
        in_progress_timeout_s=args.timeout,
        created_by=args.created_by,
        **rollout_fields(args),
    )
    if args.action_id is not None:
        action.action_id = args.action_id
    listed_with = "--devices-from-file" if from_file else "--devices"
    if (args.devices is not None or from_file) and not devices:
        return _invalid([InvalidAction("target.device_ids", "no device id given")], listed_with)
    found = problems(action.row(datetime.now(UTC)))
    if found:
        return _invalid(found, listed_with)
    if action.group is not None and not args.allow_unknown_group:
        groups = device_groups(store)
        if action.group not in groups:
            known = ", ".join(sorted(groups)) or "none: no device is registered yet"
            problem = (
                f"no registered device is in group {action.group!r} (groups in the devices table: {known}); "
                "--allow-unknown-group writes it anyway, for devices that join the group later"
            )
            return _invalid([InvalidAction("target.group", problem)])
    print(create_action(store, action))
    return 0


def _wrong_options(args: argparse.Namespace) -> str | None:
    """What is wrong with the options of ``create`` taken together, or None: a key given twice (the last
    one was kept without a word), a setting that means nothing without another."""
    keys = [key for key, _ in args.arg]
    twice = next((key for key in keys if keys.count(key) > 1), None)
    if twice is not None:
        return f"--arg: {twice!r} given twice"
    if args.abort_min_executed is not None and args.abort_failure_pct is None:
        return (
            "--abort-min-executed needs --abort-failure-pct: it is how many devices must have finished "
            "before their share of failures aborts the action"
        )
    return None


def _comma_list(devices: str | None) -> list[str]:
    return [d.strip() for d in (devices or "").split(",") if d.strip()]


def listed_ids(path: str) -> list[str]:
    """The device ids of a file, one a line (``-``: standard input), as an editor saved it: UTF-8, a byte
    order mark first or not, lines ended by LF or CRLF, ``#`` lines skipped; ``ValueError`` says why a file
    cannot be read."""
    try:
        with open(path if path != "-" else "/dev/stdin", encoding="utf-8-sig") as lines:
            stripped = (line.strip() for line in lines)
            return [line for line in stripped if line and not line.startswith("#")]  # "  # note" too
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text: {error}") from None


def _invalid(found: list[InvalidAction], listed_with: str = "--devices") -> int:
    """Every problem of the action, each naming its option (``listed_with`` for the device list) and the
    field of the row."""
    for invalid in found:
        option = listed_with if invalid.field.startswith("target.device_ids") else option_of(invalid.field)
        where = f"{option} ({invalid.field})" if option else invalid.field
        print(f"timestone ota create: {where}: {invalid.problem}", file=sys.stderr)
    return INVALID


def option_of(field: str) -> str | None:
    """The option of a field, or of the nearest field above it (``phases[1].wait_s`` → ``--phase``)."""
    path = re.sub(r"\[\d+\]", "", field)
    while path:
        if path in OPTION_OF_FIELD:
            return OPTION_OF_FIELD[path]
        path = path.rpartition(".")[0]
    return None


def _end(store: TableStore, args: argparse.Namespace) -> int:
    """``ota end``: an end the rules refuse (before the action was created) is a wrong ``--at``."""
    try:
        end = end_action(store, args.action_id, args.at)
    except InvalidAction as invalid:
        if invalid.field != "schedule.end_at":
            raise ActionRefused(f"action {args.action_id} cannot be ended: {invalid}") from None
        print(f"timestone ota end: --at ({invalid.field}): {invalid.problem}", file=sys.stderr)
        return INVALID
    print(f"{args.action_id} ends at {end.isoformat()}")
    return 0


def _status(store: TableStore, args: argparse.Namespace, root: str) -> int:
    if args.watch and args.action_id is None:
        print("timestone ota status: --watch follows one action: give its id", file=sys.stderr)
        return INVALID
    if not 0 < args.interval <= MAX_INTERVAL_S or args.show < 0:  # NaN included: no clock waits for it
        print(
            f"timestone ota status: --interval must be above 0 and at most {MAX_INTERVAL_S} seconds, and "
            "--show at least 0",
            file=sys.stderr,
        )
        return INVALID
    if args.action_id is None:
        job = describe_job(read_heartbeat(root), _now_ms(), root, _start_job(args))
        statuses = read_statuses(store)
        print(describe_list(statuses, job) if statuses else f"no actions yet\n{job}")
        return 0
    if not args.watch:
        status, now = _one(store, args.action_id, args.show), _now_ms()
        print(describe(status, describe_job(read_heartbeat(root), now, root, _start_job(args)), now))
        return 0
    try:
        return _watch(store, args, root)
    except KeyboardInterrupt:
        print()
        return INTERRUPTED


def _start_job(args: argparse.Namespace) -> str:
    """The command that starts an actions job on the tables (and config) this command read."""
    words = ["timestone", "pipeline", "actions"]
    if args.config:
        words += ["--config", args.config]
    if args.tables_root:
        words += ["--set", f"tables_root={args.tables_root}"]
    return shlex.join(words)


def _one(store: TableStore, action_id: str, show: int) -> ActionStatus:
    statuses = read_statuses(store, action_id, show)
    if not statuses:
        raise UnknownAction(f"no action {action_id!r} in the actions table or its summaries")
    return statuses[0]


def _watch(store: TableStore, args: argparse.Namespace, root: str) -> int:
    """Print the action whenever it changes (or the job starts or stops, or holds every action or no longer
    does) until it ends."""
    action_id, show, interval_s = args.action_id, args.show, args.interval
    shown = None
    while True:
        status, beat, now = _one(store, action_id, show), read_heartbeat(root), _now_ms()
        held = beat.reports_wait_since_ms if beat is not None else None
        seen = (describe(status, "", now), beat is not None and beat.running(now), held)
        if seen != shown:
            stamp = time.strftime("%H:%M:%S", time.gmtime(now / 1000))
            job = describe_job(beat, now, root, _start_job(args))
            print(f"-- {stamp} UTC\n{describe(status, job, now)}\n", flush=True)
            shown = seen
        if status.ended:
            return 0
        time.sleep(interval_s)


def _now_ms() -> int:
    return int(time.time() * 1000)
