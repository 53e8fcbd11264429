"""The rollout columns of an ``actions`` row (rates, phases, aborts, rollback, retries, schedule, windows,
continuous) are checked by the one definition of a valid action: each problem names its field, and the
command line names its option with it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pipelines.actions.cli import option_of
from pipelines.actions.operator import NewAction
from pipelines.actions.validation import LIST_RULES, problems

SHA = "9f2c" + "0" * 60
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def row(**fields) -> dict:
    """A valid group OTA with the given ``NewAction`` fields, as it would be written."""
    base = {
        "action_id": "a-1",
        "group": "canary",
        "version": "2.0.0",
        "url": "https://fw.example/f",
        "sha256": SHA,
    }
    return NewAction(**(base | fields)).row(NOW)


ROLLBACK = {"version": "1.0.0", "url": "https://fw.example/1", "sha256": SHA}
ABORT = [{"failure_kind": "failed", "threshold_pct": 10.0}]


def test_every_rollout_column_together_is_valid():
    full = row(
        max_per_minute=1000,
        exponential_rate={"base_per_minute": 10, "increment_factor": 2.0, "notified_devices": 100},
        phases=[{"percent": 5.0, "wait_s": 86_400}, {"devices": 500, "success_pct": 90.0}, {}],
        abort_rules=[*ABORT, {"failure_kind": "any", "threshold_pct": 30.0, "min_executed": 50}],
        rollback=ROLLBACK,
        retries=[{"failure_kind": "failed", "max_retries": 3, "backoff_s": 60, "backoff_factor": 2.0}],
        start_at=NOW + timedelta(days=1),
        end_at=NOW + timedelta(days=30),
        end_behavior="cancel",
        maintenance_windows=[
            {"days": ["sat", "sun"], "start": "22:00", "duration_min": 360, "time_zone": "Europe/Berlin"}
        ],
        continuous=True,
    )
    assert problems(full) == []
    assert problems(row(phases=[{"percent": 20.0}, {"percent": 80.0}])) == []  # every phase a percentage


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        (
            {"exponential_rate": {"base_per_minute": 10, "increment_factor": 2.0}},
            "exponential_rate",
            "exactly one of",
        ),
        (
            {"exponential_rate": {"increment_factor": 2.0, "notified_devices": 5}},
            "exponential_rate.base_per_minute",
            "required",
        ),
        (
            {"exponential_rate": {"base_per_minute": 10, "increment_factor": 1.0, "notified_devices": 5}},
            "exponential_rate.increment_factor",
            "above 1",
        ),
        (
            {"exponential_rate": {"base_per_minute": 10, "increment_factor": 6.0, "notified_devices": 5}},
            "exponential_rate.increment_factor",
            "at most 5",
        ),
        (
            {
                "max_per_minute": 5,
                "exponential_rate": {"base_per_minute": 10, "increment_factor": 2.0, "notified_devices": 5},
            },
            "exponential_rate.base_per_minute",
            "above rollout.max_per_minute",
        ),
        ({"phases": [{"percent": 5.0, "devices": 3}, {}]}, "phases[0]", "exactly one of percent and devices"),
        ({"phases": [{"wait_s": 60}, {}]}, "phases[0]", "exactly one of percent and devices"),
        ({"phases": [{"percent": 60.0}, {"percent": 40.0}, {}]}, "phases", "leave some for the last"),
        ({"phases": [{"percent": 5.0}, {"percent": 50.0}]}, "phases[1].percent", "adding up to 100"),
        ({"phases": [{"percent": 5.0}, {"devices": 10}]}, "phases[1].devices", "every device left"),
        ({"phases": [{"percent": 5.0}, {"wait_s": 60}]}, "phases[1].wait_s", "no next phase"),
        ({"phases": [{"percent": 0.0}, {}]}, "phases[0].percent", "above 0"),
        ({"phases": [{"percent": 5.0, "wait_s": -1}, {}]}, "phases[0].wait_s", "from 0"),
        ({"phases": [{"percent": 5.0, "success_pct": 101.0}, {}]}, "phases[0].success_pct", "at most 100"),
        (
            {"abort_rules": [{"failure_kind": "crashed", "threshold_pct": 5.0}]},
            "abort_rules[0].failure_kind",
            "one of failed, rejected, timed_out, any",
        ),
        ({"abort_rules": [{"failure_kind": "failed"}]}, "abort_rules[0].threshold_pct", "required"),
        (
            {"abort_rules": [{"failure_kind": "failed", "threshold_pct": 5.0, "min_executed": 0}]},
            "abort_rules[0].min_executed",
            "from 1",
        ),
        ({"rollback": ROLLBACK}, "rollback", "happens on abort"),
        (
            {"rollback": {**ROLLBACK, "url": None}, "abort_rules": ABORT},
            "rollback.url",
            "required to roll back",
        ),
        (
            {"rollback": {**ROLLBACK, "version": "2.0.0"}, "abort_rules": ABORT},
            "rollback.version",
            "the version this action installs",
        ),
        (
            {"rollback": {**ROLLBACK, "sha256": "x"}, "abort_rules": ABORT},
            "rollback.sha256",
            "64 hexadecimal",
        ),
        (
            {"retries": [{"failure_kind": "rejected", "max_retries": 1}]},
            "retries[0].failure_kind",
            "one of failed, timed_out, any",
        ),
        (
            {"retries": [{"failure_kind": "failed", "max_retries": 11}]},
            "retries[0].max_retries",
            "from 1 to 10",
        ),
        ({"retries": [{"failure_kind": "failed"}]}, "retries[0].max_retries", "required"),
        (
            {
                "retries": [
                    {"failure_kind": "failed", "max_retries": 1},
                    {"failure_kind": "failed", "max_retries": 2},
                ]
            },
            "retries",
            "given twice",
        ),
        (
            {
                "retries": [
                    {"failure_kind": "any", "max_retries": 1},
                    {"failure_kind": "failed", "max_retries": 2},
                ]
            },
            "retries",
            "give it alone",
        ),
        (
            {"start_at": NOW + timedelta(days=2), "end_at": NOW + timedelta(days=1)},
            "schedule.end_at",
            "not after schedule.start_at",
        ),
        ({"end_at": NOW - timedelta(days=1)}, "schedule.end_at", "not after the action's created_at"),
        (
            {"end_at": NOW + timedelta(days=1), "end_behavior": "pause"},
            "schedule.end_behavior",
            "one of stop, cancel",
        ),
        ({"start_at": datetime(2026, 12, 1)}, "schedule.start_at", "without a time zone"),
        (
            {"maintenance_windows": [{"start": "2:00", "duration_min": 60}]},
            "maintenance_windows[0].start",
            "HH:MM",
        ),
        (
            {"maintenance_windows": [{"start": "02:00", "duration_min": 60, "time_zone": "Mars/Olympus"}]},
            "maintenance_windows[0].time_zone",
            "unknown time zone",
        ),
        (  # a directory of the zone database, not a zone (IsADirectoryError on opening it)
            {"maintenance_windows": [{"start": "02:00", "duration_min": 60, "time_zone": "Europe"}]},
            "maintenance_windows[0].time_zone",
            "unknown time zone 'Europe'",
        ),
        (  # longer than a file name may be (OSError on opening it)
            {"maintenance_windows": [{"start": "02:00", "duration_min": 60, "time_zone": "Z" * 300}]},
            "maintenance_windows[0].time_zone",
            "unknown time zone",
        ),
        (
            {"maintenance_windows": [{"start": "02:00", "duration_min": 1500}]},
            "maintenance_windows[0].duration_min",
            "a daily window lasts at most 1440",
        ),
        (
            {"maintenance_windows": [{"days": ["monday"], "start": "02:00", "duration_min": 60}]},
            "maintenance_windows[0].days",
            "unknown day 'monday'",
        ),
        ({"maintenance_windows": [{"start": "02:00"}]}, "maintenance_windows[0].duration_min", "required"),
        (
            {"continuous": True, "group": None, "device_ids": ["d1"]},
            "continuous",
            "a list of devices does not grow",
        ),
    ],
)
def test_each_rollout_problem_names_its_field_and_option(fields, field, words):
    found = problems(row(**fields))
    assert found, fields
    assert (found[0].field, words in found[0].problem) == (field, True), found
    assert option_of(field) is not None


def test_a_broadcast_flag_that_contradicts_an_exponential_rate():
    contradicted = row(
        exponential_rate={"base_per_minute": 10, "increment_factor": 2.0, "notified_devices": 5}
    )
    contradicted["rollout"]["broadcast"] = True
    assert [str(p) for p in problems(contradicted)] == [
        "rollout: broadcast is true but exponential_rate is set: a broadcast has no rate"
    ]


def test_a_struct_of_nulls_written_by_sql_is_no_setting():
    written = row()
    written["exponential_rate"] = {
        "base_per_minute": None,
        "increment_factor": None,
        "notified_devices": None,
        "succeeded_devices": None,
    }
    written["rollback"] = {"version": None, "url": None, "sha256": None, "size": None}
    assert problems(written) == []


def test_every_array_column_is_checked_item_by_item_and_has_an_option():
    assert {rule.field for rule in LIST_RULES} == {"phases", "abort_rules", "retries", "maintenance_windows"}
    assert option_of("phases[3].wait_s") == "--phase"
    assert option_of("maintenance_windows[0].time_zone") == "--window"
    assert option_of("payload.url") == "--url"
