"""Devices registered for OTA without the telemetry pipeline: rows of the ``devices`` table written by hand.

The actions job targets a group through the ``devices`` table (``ota create --group``). The telemetry
pipeline fills it from what devices publish; a deployment that only does OTA, or devices that never send
telemetry, register them here (``timestone devices register``): one row per device with its group (and
tags), merged on ``device_id``, so registering again moves a device to another group and keeps what the
telemetry pipeline knows of it (its last sighting, broker, firmware). A device registered here and seen by
the telemetry pipeline later is the same row: the pipeline updates its sighting and keeps its group.

``last_seen`` of a device registered here and never seen is its registration time (the telemetry
pipeline's update of a row needs a sighting to compare with).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

import pyarrow as pa

from sinks.store import Matching, TableStore, command_write_id

__all__ = ["register_devices", "register_main"]

DEVICES = "devices"


def register_devices(
    store: TableStore,
    device_ids: Iterable[str],
    group: str,
    now: datetime,
    tags: Mapping[str, str] | None = None,
) -> tuple[int, int]:
    """Register ``device_ids`` in ``group`` (with ``tags``, when given); returns how many, and how many of
    them are new."""
    ids = sorted(set(device_ids))
    if not ids:
        return 0, 0
    known: set[str] = set()
    listed = (Matching("device_id", tuple(ids)),)
    if store.exists(DEVICES):
        registered = store.read_arrow(DEVICES, where=listed, columns=["device_id"])
        known = set(registered.column("device_id").to_pylist())
    rows = [
        {
            "device_id": device_id,
            "last_seen": now,
            "group": group,
            "tags": dict(tags) if tags else None,
            "updated_at": now,
        }
        for device_id in ids
    ]
    table = pa.Table.from_pylist(rows, schema=store.spec(DEVICES).arrow_schema)
    update_set = {"group": "s.group", "updated_at": "s.updated_at", "tags": "coalesce(s.tags, t.tags)"}
    app_id = command_write_id("devices/register")
    store.merge(DEVICES, table, app_id, 0, update_set=update_set, target_where=listed)
    return len(ids), len(set(ids) - known)


def register_main(args: argparse.Namespace) -> int:
    """``timestone devices register`` (its options: ``pipelines.fleet.cli``): the devices given, in their
    group, in the ``devices`` table."""
    from broker_edge.config import ConfigError
    from pipelines.actions.cli import listed_ids, load_actions_config, said_file_system_failure
    from pipelines.output_paths import (
        NotWritable,
        check_output_location,
        check_table_root,
        check_tables_writable,
    )
    from sinks.backends import open_table_store

    ids = list(args.devices)
    if args.from_file:
        try:
            ids += listed_ids(args.from_file)
        except ValueError as error:
            print(f"timestone devices register: --from-file: {error}", file=sys.stderr)
            return 2
    tags = dict(tag.partition("=")[::2] for tag in args.tag)
    problem, status = _command_line_problem(args, ids), 2
    try:
        config = load_actions_config(args.config)
        root = config.tables_root if args.tables_root is None else args.tables_root
        key = "--tables-root" if args.tables_root is not None else "tables_root"
        check_output_location(root, key)
        check_table_root(root, key)
        check_tables_writable(root, ["devices"], key)
    except ConfigError as error:  # a root it may not write is a failure of the table, not of the line
        if problem is None:
            problem, status = str(error), 1 if isinstance(error, NotWritable) else 2
    if problem is not None:
        print(f"timestone devices register: {problem}", file=sys.stderr)
        return status
    store = open_table_store(None, root, backend="delta-rs")
    try:
        registered, new = register_devices(store, ids, args.group, datetime.now(UTC), tags)
    except Exception as error:  # a full disk, a read-only file system: said in one line, else raised
        return said_file_system_failure("timestone devices register", root, error)
    print(f"registered {registered} devices in group {args.group!r} ({new} new) in {root}/devices")
    return 0


def _command_line_problem(args: argparse.Namespace, ids: list[str]) -> str | None:
    """What is wrong with the devices, group and tags given (every unusable device id at once), or None."""
    from pipelines.actions.checks import topic_level, unusable_ids

    if not ids:
        return "no device id given (as arguments or --from-file)"
    return (
        next((f"--tag {tag!r}: expected KEY=VALUE" for tag in args.tag if "=" not in tag[1:]), None)
        or next((f"--group: {why}" for why in [topic_level(args.group)] if why is not None), None)
        or unusable_ids(ids)
    )
