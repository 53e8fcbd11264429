"""Digits joined by colons (``10:00``, ``1:30:00``) are a string, as YAML 1.2 reads them: YAML 1.1, which
the parser follows, reads them as a base-60 number, so ``max_connections: 10:00`` was 600 connections and a
retention of ``1:00:00`` was 3,600 without a word; an integer setting now refuses them naming the field."""

from __future__ import annotations

import pytest

from broker_edge.config.loader import ConfigError, load_dataclass, load_yaml_file, parse_yaml
from broker_edge.settings.broker import BrokerConfig
from pipelines.overrides import apply_override


@pytest.mark.parametrize("written", ["10:00", "1:30", "-1:00", "190:20:30", "1:30.5", "1_0:00", "+2:30"])
def test_digits_joined_by_colons_stay_a_string(written) -> None:
    assert parse_yaml(f"value: {written}\n") == {"value": written}


def test_an_integer_setting_written_with_colons_is_refused_naming_it(tmp_path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("limits:\n  max_connections: 10:00\n")
    with pytest.raises(ConfigError, match=r"^limits\.max_connections: expected int, got str '10:00'$"):
        load_dataclass(BrokerConfig, load_yaml_file(path))


def test_an_override_written_with_colons_is_the_string_given() -> None:
    document: dict[str, object] = {}
    apply_override(document, "limits.connect_timeout_s=1:30")
    assert document == {"limits": {"connect_timeout_s": "1:30"}}


def test_other_numbers_and_times_read_as_before() -> None:
    assert parse_yaml("a: 10\nb: 1.5\nc: 0:00\nd: 12:30:00Z\n") == {
        "a": 10,
        "b": 1.5,
        "c": "0:00",
        "d": "12:30:00Z",
    }
