"""``timestone ota create``'s rollout options read into the row's columns; unreadable values are refused by
the option."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipelines.actions.cli import build_parser
from pipelines.actions.rollout_options import rollout_fields

BASE = ["create", "--group", "g", "--version", "2", "--url", "https://x.example/f", "--sha256", "0" * 64]


def test_options_become_the_rollout_columns():
    args = build_parser().parse_args(
        [
            *BASE,
            "--phase", "5%,wait=2d", "--phase", "40,success=90", "--phase", "rest",
            "--abort", "failed:10:20", "--abort", "any:30",
            "--retry", "timed_out:3:30s:2",
            "--window", "sat,sun 22:00 6h Europe/Berlin", "--window", "daily 02:00 90m",
            "--start-at", "2026-12-01T02:00", "--end-behavior", "cancel",
            "--base-per-minute", "10", "--increment-factor", "2", "--grow-every-notified", "100",
            "--continuous",
        ]
    )  # fmt: skip
    fields = rollout_fields(args)
    assert fields["phases"] == [{"percent": 5.0, "wait_s": 172_800}, {"devices": 40, "success_pct": 90.0}, {}]
    assert fields["abort_rules"] == [
        {"failure_kind": "failed", "threshold_pct": 10.0, "min_executed": 20},
        {"failure_kind": "any", "threshold_pct": 30.0},
    ]
    assert fields["retries"] == [
        {"failure_kind": "timed_out", "max_retries": 3, "backoff_s": 30, "backoff_factor": 2.0}
    ]
    assert fields["maintenance_windows"] == [
        {"days": ["sat", "sun"], "start": "22:00", "duration_min": 360, "time_zone": "Europe/Berlin"},
        {"days": None, "start": "02:00", "duration_min": 90, "time_zone": "UTC"},
    ]
    assert fields["start_at"] == datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
    assert fields["exponential_rate"] == {
        "base_per_minute": 10,
        "increment_factor": 2.0,
        "notified_devices": 100,
        "succeeded_devices": None,
    }
    assert fields["continuous"] and fields["rollback"] is None and fields["end_behavior"] == "cancel"


@pytest.mark.parametrize(
    ("option", "value"),
    [("--phase", "5x"), ("--phase", "5%,pause=1h"), ("--abort", "failed"), ("--retry", "failed:x"),
     ("--window", "daily 02:00"), ("--window", "daily 02:00 90s"), ("--start-at", "tomorrow")],
)  # fmt: skip
def test_unreadable_values_are_refused_by_their_option(option, value, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*BASE, option, value])
    assert exited.value.code == 2
    assert f"argument {option}:" in capsys.readouterr().err
