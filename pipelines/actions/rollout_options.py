"""``timestone ota create``'s options that shape a rollout: rate growth, phases, abort rules, rollback,
retries, schedule, maintenance windows, continuous; parsed into the columns of the ``actions`` row.

A value that cannot be read at all (``--phase 5x``) is refused by the option itself (argparse, exit 2); a
value that reads but breaks a rule of a valid action (a fourth phase after one that took 100 %) is refused by
``validation.py``, as the job would refuse the row, naming the option and the field.
"""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime
from typing import Any

__all__ = ["OPTION_OF_FIELD", "add_rollout_options", "duration_s", "rollout_fields"]

_DURATION = re.compile(r"^(\d+)([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

OPTION_OF_FIELD = {
    "exponential_rate": "--base-per-minute, --increment-factor, --grow-every-*",
    "exponential_rate.base_per_minute": "--base-per-minute",
    "exponential_rate.increment_factor": "--increment-factor",
    "exponential_rate.notified_devices": "--grow-every-notified",
    "exponential_rate.succeeded_devices": "--grow-every-succeeded",
    "phases": "--phase",
    "abort_rules": "--abort",
    "rollback": "--rollback-version, --rollback-url or --rollback-sha256",
    "rollback.version": "--rollback-version",
    "rollback.url": "--rollback-url",
    "rollback.sha256": "--rollback-sha256",
    "rollback.size": "--rollback-size",
    "retries": "--retry",
    "schedule": "--start-at or --end-at",
    "schedule.start_at": "--start-at",
    "schedule.end_at": "--end-at",
    "schedule.end_behavior": "--end-behavior",
    "maintenance_windows": "--window",
    "continuous": "--continuous",
}
"""The option that sets each rollout field (an item of an array is looked up by the array's name)."""


def duration_s(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``2h``, ``3d``: seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"expected a duration such as 90s, 15m, 2h or 3d, got {text!r}")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def _number(text: str, what: str) -> float:
    try:
        return float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def _integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def phase(text: str) -> dict[str, Any]:
    """``SHARE[,wait=DURATION][,success=PCT]``: SHARE is ``5%``, a device count, or ``rest``."""
    share, *settings = [part.strip() for part in text.split(",")]
    item: dict[str, Any] = {}
    if share.endswith("%"):
        item["percent"] = _number(share, "a percentage such as 5%")
    elif share != "rest":
        item["devices"] = _integer(share, "a share: 5%, a device count or rest")
    given: set[str] = set()
    for setting in settings:
        key, _, value = setting.partition("=")
        if key in given:
            raise argparse.ArgumentTypeError(f"phase setting {key!r} given twice in {text!r}")
        if key == "wait":
            item["wait_s"] = duration_s(value)
        elif key == "success":
            item["success_pct"] = _number(value, "a success percentage such as 90")
        else:
            raise argparse.ArgumentTypeError(f"unknown phase setting {key!r}: wait=DURATION or success=PCT")
        given.add(key)
    return item


def abort_rule(text: str) -> dict[str, Any]:
    """``KIND:PCT[:MIN]``: abort when PCT % of at least MIN finished devices ended as KIND."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise argparse.ArgumentTypeError(f"expected KIND:PCT[:MIN] such as failed:10:50, got {text!r}")
    item: dict[str, Any] = {"failure_kind": parts[0], "threshold_pct": _number(parts[1], "a percentage")}
    if len(parts) == 3:
        item["min_executed"] = _integer(parts[2], "a minimum number of finished devices")
    return item


def retry_rule(text: str) -> dict[str, Any]:
    """``KIND:RETRIES[:BACKOFF[:FACTOR]]``, e.g. ``failed:3:30s:2``."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 4:
        raise argparse.ArgumentTypeError(f"expected KIND:RETRIES[:BACKOFF[:FACTOR]], got {text!r}")
    item: dict[str, Any] = {
        "failure_kind": parts[0],
        "max_retries": _integer(parts[1], "a number of retries"),
    }
    if len(parts) > 2:
        item["backoff_s"] = duration_s(parts[2])
    if len(parts) > 3:
        item["backoff_factor"] = _number(parts[3], "a backoff factor such as 2")
    return item


def window(text: str) -> dict[str, Any]:
    """``DAYS HH:MM DURATION [ZONE]``: DAYS is ``daily`` or ``sat,sun``; DURATION in whole minutes."""
    parts = text.split()
    if len(parts) not in (3, 4):
        raise argparse.ArgumentTypeError(f"expected 'DAYS HH:MM DURATION [ZONE]', got {text!r}")
    seconds = duration_s(parts[2])
    if seconds % 60:
        raise argparse.ArgumentTypeError(f"a window lasts whole minutes, got {parts[2]!r}")
    return {
        "days": None if parts[0] == "daily" else parts[0].split(","),
        "start": parts[1],
        "duration_min": seconds // 60,
        "time_zone": parts[3] if len(parts) == 4 else "UTC",
    }


def instant(text: str) -> datetime:
    """An ISO 8601 time; without an offset, UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO time such as 2026-12-01T02:00Z, got {text!r}"
        ) from None
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    try:  # a time whose UTC falls outside the years 1 to 9999 no table or job reads back
        value.astimezone(UTC)
    except OverflowError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is outside the years 1 to 9999 once in UTC (the actions job rejects such a row)"
        ) from None
    return value


def add_rollout_options(create: argparse.ArgumentParser) -> None:
    growth = create.add_argument_group("exponential rate (up to --max-per-minute)")
    growth.add_argument("--base-per-minute", type=int, help="the rate to start from")
    growth.add_argument("--increment-factor", type=float, help="multiply the rate by this each time...")
    growth.add_argument("--grow-every-notified", type=int, help="...this many more devices were sent it")
    growth.add_argument("--grow-every-succeeded", type=int, help="...or this many more devices succeeded")
    staging = create.add_argument_group("phases, aborts, retries")
    staging.add_argument(
        "--phase",
        type=phase,
        action="append",
        default=[],
        help="SHARE[,wait=DURATION][,success=PCT], in order (SHARE 5%%, a count, or rest for the last)",
    )
    staging.add_argument(
        "--abort",
        type=abort_rule,
        action="append",
        default=[],
        help="KIND:PCT[:MIN] (failed, rejected, timed_out, any)",
    )
    staging.add_argument(
        "--retry",
        type=retry_rule,
        action="append",
        default=[],
        help="KIND:RETRIES[:BACKOFF[:FACTOR]] (failed, timed_out, any)",
    )
    staging.add_argument(
        "--rollback-version", help="on abort, send this version back to the devices that installed"
    )
    staging.add_argument("--rollback-url", help="its URL")
    staging.add_argument("--rollback-sha256", help="its SHA-256")
    staging.add_argument("--rollback-size", type=int, help="its size in bytes")
    timing = create.add_argument_group("time")
    timing.add_argument(
        "--start-at", type=instant, help="send nothing before (ISO time; UTC without an offset)"
    )
    timing.add_argument("--end-at", type=instant, help="send nothing new after")
    timing.add_argument(
        "--end-behavior", help="at --end-at: stop (default) or cancel (devices working stop too)"
    )
    timing.add_argument(
        "--window",
        type=window,
        action="append",
        default=[],
        help="'DAYS HH:MM DURATION [ZONE]', e.g. 'daily 02:00 3h Europe/Berlin'",
    )
    timing.add_argument(
        "--continuous", action="store_true", help="devices joining the group later get it too"
    )


def rollout_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The ``NewAction`` fields of the options above."""
    growth = {
        "base_per_minute": args.base_per_minute,
        "increment_factor": args.increment_factor,
        "notified_devices": args.grow_every_notified,
        "succeeded_devices": args.grow_every_succeeded,
    }
    rollback = {
        "version": args.rollback_version,
        "url": args.rollback_url,
        "sha256": args.rollback_sha256,
        "size": args.rollback_size,
    }
    return {
        "exponential_rate": growth if any(v is not None for v in growth.values()) else None,
        "phases": args.phase,
        "abort_rules": args.abort,
        "rollback": rollback if any(v is not None for v in rollback.values()) else None,
        "retries": args.retry,
        "start_at": args.start_at,
        "end_at": args.end_at,
        "end_behavior": args.end_behavior,
        "maintenance_windows": args.window,
        "continuous": args.continuous,
    }
