"""The ``maintenance`` section: a vacuum retention shorter than the log retention is refused, naming both.

The log keeps versions for ``log_retention_hours`` (history and time travel go back this far); a vacuum
deleting their files sooner left a time-travel read or a lagging change feed of such a version failing
with a file not found, although the docs promised it could go back that far."""

from __future__ import annotations

import pytest

from broker_edge.config.loader import ConfigError
from pipelines.maintenance.config import MaintenanceConfig
from pipelines.telemetry.config import load_telemetry_config


def test_a_retention_shorter_than_the_log_retention_is_refused_naming_both() -> None:
    section = {"tables": {"maintenance": {"retention_hours": 24, "log_retention_hours": 48}}}
    with pytest.raises(ConfigError) as raised:
        load_telemetry_config(section)
    assert raised.value.path == "telemetry.tables.maintenance.retention_hours"
    assert "log_retention_hours (48" in str(raised.value)


def test_equal_retentions_and_the_defaults_are_taken() -> None:
    assert MaintenanceConfig(retention_hours=2, log_retention_hours=2).retention_hours == 2
    assert MaintenanceConfig().retention_hours >= MaintenanceConfig().log_retention_hours


def test_a_retention_past_a_hundred_years_is_refused_naming_the_key() -> None:
    """delta-rs holds a retention as a duration of milliseconds: past its bound its vacuum panicked."""
    with pytest.raises(ConfigError, match=r"^retention_hours: must be at most 876000 \(a hundred years\)"):
        MaintenanceConfig(retention_hours=1e15)
