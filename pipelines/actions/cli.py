"""``timestone ota``: create, cancel and inspect actions (each only reads or writes the Delta tables)."""

from __future__ import annotations

import argparse
import sys

from broker_edge.config import ConfigError, load_dataclass, load_yaml_file
from pipelines.actions.config import ActionsConfig
from pipelines.actions.operator import NewAction, cancel_action, create_action, summaries
from sinks.backends import open_table_store

STATE_COLUMNS = ("queued", "in_progress", "succeeded", "failed", "timed_out", "rejected", "canceled")


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _add_table_options(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "--config",
        default=default,
        help="actions YAML (default: conf/actions.yaml if present, else defaults)",
    )
    parser.add_argument("--tables-root", default=default, help="override the config's tables_root")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timestone ota", description="Create and follow OTA/command actions."
    )
    _add_table_options(parser, default=None)
    # the same options after the verb too (`timestone ota status --tables-root DIR`, as the demo prints it)
    after_verb = argparse.ArgumentParser(add_help=False)
    _add_table_options(after_verb, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="verb", required=True)

    create = sub.add_parser("create", help="write a new action row", parents=[after_verb])
    create.add_argument("--id", dest="action_id", help="action id (default: generated)")
    create.add_argument("--kind", choices=("ota", "command"), default="ota")
    target = create.add_mutually_exclusive_group(required=True)
    target.add_argument("--devices", help="comma-separated device ids")
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
        "--abort-min-executed", type=int, default=1, help="...after at least this many finished"
    )
    create.add_argument("--timeout", type=int, help="in-progress timeout per device, seconds")
    create.add_argument("--created-by", default="cli")

    cancel = sub.add_parser("cancel", help="cancel an action", parents=[after_verb])
    cancel.add_argument("action_id")

    status = sub.add_parser("status", help="print action summaries", parents=[after_verb])
    status.add_argument("action_id", nargs="?")
    return parser


def load_actions_config(path: str | None) -> ActionsConfig:
    """The actions config from ``path``, else ``conf/actions.yaml`` when present, else defaults."""
    import os

    if path is None and os.path.exists("conf/actions.yaml"):
        path = "conf/actions.yaml"
    data = load_yaml_file(path) if path else {}
    return load_dataclass(ActionsConfig, data)


def ota_main(argv: list[str]) -> int:
    """Entry point of ``timestone ota``."""
    args = build_parser().parse_args(argv)
    try:
        config = load_actions_config(args.config)
    except ConfigError as exc:
        print(f"timestone ota: bad config: {exc}", file=sys.stderr)
        return 2
    store = open_table_store(None, args.tables_root or config.tables_root, backend="delta-rs")
    if args.verb == "create":
        action = NewAction(
            kind=args.kind,
            device_ids=[d for d in (args.devices or "").split(",") if d],
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
            min_executed=args.abort_min_executed,
            in_progress_timeout_s=args.timeout,
            created_by=args.created_by,
        )
        if args.action_id:
            action.action_id = args.action_id
        try:
            print(create_action(store, action))
        except ValueError as exc:
            print(f"timestone ota create: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.verb == "cancel":
        if not cancel_action(store, args.action_id):
            print(f"timestone ota cancel: no action {args.action_id!r}", file=sys.stderr)
            return 1
        print(f"cancel requested for {args.action_id}")
        return 0
    rows = summaries(store, args.action_id)
    if not rows:
        print("no action summaries yet" if args.action_id is None else f"no summary for {args.action_id!r}")
        return 1 if args.action_id else 0
    header = f"{'action':<20} {'state':<12} " + " ".join(f"{c:>11}" for c in STATE_COLUMNS) + f" {'total':>7}"
    print(header)
    for row in rows:
        counts = " ".join(f"{row[f'{c}_count']:>11}" for c in STATE_COLUMNS)
        print(f"{row['action_id']:<20} {row['action_state']:<12} {counts} {row['total_count']:>7}")
    return 0
