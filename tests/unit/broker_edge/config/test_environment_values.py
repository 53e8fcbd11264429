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
