"""A value its YAML tag cannot read is a ``ConfigError`` naming its key (or its line), not a traceback: a
plain ``2026-13-45`` (YAML 1.1 resolves it to a date that does not exist), ``!!int abc``, ``!!float abc``,
``!!timestamp abc``, an integer of more digits than Python converts, and the same through ``!env NAME``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from broker_edge.config.loader import ConfigError, load_dataclass, load_yaml_file
from broker_edge.settings.broker import BrokerConfig


def _refused(tmp_path, text: str) -> tuple[str, ConfigError]:
    path = tmp_path / "broker.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_dataclass(BrokerConfig, load_yaml_file(path))
    return str(path), error.value


def test_an_impossible_date_as_a_mapping_value_names_its_key_and_line(tmp_path) -> None:
    path, error = _refused(tmp_path, "listeners:\n  - port: 1883\nname: 2026-13-45\n")
    assert str(error) == f"name: not a valid value: month must be in 1..12 (in {path}, line 3)"


def test_an_impossible_date_in_a_list_names_its_item(tmp_path) -> None:
    path, error = _refused(tmp_path, "uplink_hub: {sites: [2024-02-30]}\n")
    assert str(error) == (
        f"uplink_hub.sites[0]: not a valid value: day is out of range for month (in {path}, line 1)"
    )


@pytest.mark.parametrize(
    ("tag", "reason"),
    [
        ("!!int", "invalid literal for int"),
        ("!!float", "could not convert string to float"),
        ("!!timestamp", "'abc' is not a !!timestamp"),
    ],
)
def test_an_explicit_tag_its_text_is_not_names_the_key(tmp_path, tag: str, reason: str) -> None:
    path, error = _refused(tmp_path, f"listeners:\n  - port: {tag} abc\n")
    assert error.path == "listeners[0].port"
    assert error.detail.startswith(f"not a valid value: {reason}")
    assert error.source == f"in {path}, line 2"


def test_an_integer_of_5000_digits_names_the_key(tmp_path) -> None:
    path, error = _refused(tmp_path, f"limits:\n  max_connections: {'7' * 5000}\n")
    assert error.path == "limits.max_connections"
    assert error.detail.startswith("not a valid value: Exceeds the limit (4300 digits)")
    assert error.source == f"in {path}, line 2"


def test_a_key_that_is_an_impossible_date_names_the_line(tmp_path) -> None:
    path, error = _refused(tmp_path, "listeners:\n  - port: 1883\n2026-13-45: x\n")
    assert str(error) == f"not a valid value: month must be in 1..12 (in {path}, line 3)"


def test_an_env_value_that_is_an_impossible_date_is_its_text(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TIMESTONE_TEST_PORT", "2026-13-45")
    _, error = _refused(tmp_path, "listeners:\n  - port: !env TIMESTONE_TEST_PORT\n")
    assert str(error) == "listeners[0].port: expected int, got str '2026-13-45'"


def test_the_broker_check_refuses_it_in_one_line_with_status_2(tmp_path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("listeners:\n  - port: 1883\nname: 2026-13-45\n")
    command = [sys.executable, "-m", "pipelines.cli", "broker", "--check", "--config", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"name: not a valid value: month must be in 1..12 (in {path}, line 3)" in done.stderr
