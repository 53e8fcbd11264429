"""YAML 1.1 reads unquoted ``yes``, ``no``, ``on``, ``off`` (any case) as booleans: a password ``no`` or a
listener named ``on`` was refused as ``expected a string, got bool False``, a value the user never wrote;
the error now says what YAML did and to quote the value. A boolean setting takes them as booleans."""

from __future__ import annotations

import pytest

from broker_edge.config.loader import ConfigError, load_dataclass, load_yaml_file
from broker_edge.settings.broker import BrokerConfig
from pipelines.actions.config import ActionsConfig

HINT = r"\(YAML reads yes, no, on, off, true and false unquoted as a boolean: quote the value\)$"


@pytest.mark.parametrize("written", ["no", "On", "YES", "off"])
def test_a_string_written_as_a_yaml_boolean_is_refused_saying_to_quote_it(tmp_path, written) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text(f"listeners:\n  - {{name: {written}, port: 0}}\n")
    with pytest.raises(ConfigError, match=r"^listeners\[0\]\.name: expected a string, got bool \w+ " + HINT):
        load_dataclass(BrokerConfig, load_yaml_file(path))
    path.write_text(f"listeners:\n  - {{name: '{written}', port: 0}}\n")
    assert load_dataclass(BrokerConfig, load_yaml_file(path)).listeners[0].name == written


def test_an_actions_password_written_no_names_the_key_and_says_to_quote_it(tmp_path) -> None:
    path = tmp_path / "actions.yaml"
    path.write_text(
        "brokers:\n  - {name: e1, mqtt_host: 127.0.0.1, offsets_api: 'http://127.0.0.1:1', password: no}\n"
    )
    expected = r"^brokers\[0\]\.password: expected a string, got bool False " + HINT
    with pytest.raises(ConfigError, match=expected):
        load_dataclass(ActionsConfig, load_yaml_file(path))


def test_a_boolean_setting_takes_yes_and_off(tmp_path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("auth:\n  allow_anonymous: yes\nstorage:\n  enabled: off\n")
    config = load_dataclass(BrokerConfig, load_yaml_file(path))
    assert config.auth.allow_anonymous is True and config.storage.enabled is False
