"""``!env NAME`` values: the environment variable's value where a config is loaded, or an error naming the
field (what the Databricks bundle's jobs use for the secrets a cluster takes from its secret scope)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from broker_edge.config.endpoints import BrokerEndpoint
from broker_edge.config.loader import ConfigError, load_dataclass, load_yaml_file, parse_yaml
from pipelines.overrides import apply_override


@dataclass
class Reader:
    brokers: list[BrokerEndpoint] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)


def test_a_file_and_an_override_take_values_from_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("READER_TOKEN", "s3cret token")
    monkeypatch.setenv("READER_PASSWORD", "pw")
    path = tmp_path / "reader.yaml"
    path.write_text(
        "brokers:\n  - {name: edge1, token: !env READER_TOKEN, password: !env  READER_PASSWORD }\n"
    )
    document = load_yaml_file(path)
    apply_override(document, "options.authToken=!env READER_TOKEN")
    reader = load_dataclass(Reader, document)
    assert (reader.brokers[0].token, reader.brokers[0].password) == ("s3cret token", "pw")
    assert reader.options == {"authToken": "s3cret token"}
    assert "s3cret" not in repr(reader.brokers[0])  # the endpoint keeps its secrets out of logs


def test_a_variable_that_is_not_set_is_an_error_naming_the_field(monkeypatch) -> None:
    monkeypatch.delenv("READER_TOKEN", raising=False)
    document = parse_yaml("brokers: [{name: edge1, token: !env READER_TOKEN}]")
    with pytest.raises(ConfigError) as error:
        load_dataclass(Reader, document)
    assert (
        str(error.value)
        == "brokers[0].token: the environment variable READER_TOKEN (!env READER_TOKEN) is not set"
    )
    with pytest.raises(
        ConfigError, match=r"^options.authToken: !env needs the name of an environment variable"
    ):
        load_dataclass(Reader, parse_yaml("options: {authToken: !env }"))


def test_the_value_is_read_when_the_config_is_loaded_not_when_the_yaml_is(monkeypatch) -> None:
    document = parse_yaml("options: {authToken: !env READER_TOKEN}")
    assert repr(document["options"]["authToken"]) == "!env READER_TOKEN"
    monkeypatch.setenv("READER_TOKEN", "later")
    assert load_dataclass(Reader, document).options == {"authToken": "later"}


def test_a_number_or_boolean_setting_takes_an_env_value_as_yaml_reads_it(tmp_path, monkeypatch) -> None:
    """``port: !env MQTT_PORT`` with MQTT_PORT=1883 was refused, 'expected int, got str '1883'': a container's
    port, timeout or switch could not come from its environment. Where no string goes, the variable's value
    is read as YAML reads a number, a boolean or null; where a string goes it stays the text it is."""
    from broker_edge.settings.broker import load_broker_config

    for name, value in [("PORT", "0"), ("ANON", "true"), ("TIMEOUT", "2.5"), ("RETENTION", "null")]:
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NAME", "0")
    monkeypatch.setenv("BAD_PORT", "eighteen")
    monkeypatch.setenv("EMPTY", "")
    path = tmp_path / "broker.yaml"
    path.write_text(
        "listeners:\n  - {name: !env NAME, port: !env PORT, allow_anonymous: !env ANON}\n"
        "limits: {connect_timeout_s: !env TIMEOUT}\n"
        "storage: {retention_bytes: !env RETENTION, directory: data}\n"
    )
    config = load_broker_config(path)
    assert (config.listeners[0].name, config.listeners[0].port) == ("0", 0)
    assert config.listeners[0].allow_anonymous is True
    assert config.limits.connect_timeout_s == 2.5 and config.storage.retention_bytes is None
    for variable, refusal in [("BAD_PORT", "got str 'eighteen'"), ("EMPTY", "got str ''")]:
        path.write_text(f"listeners:\n  - port: !env {variable}\n")
        with pytest.raises(ConfigError) as error:
            load_broker_config(path)
        assert error.value.path == "listeners[0].port" and refusal in error.value.detail
