"""A number written with an exponent (``1e3``, ``2.5E-3``) is a number, as YAML 1.2 and JSON read it: YAML
1.1, which the parser follows, reads it as a string unless it has a dot and a signed exponent, so a timeout
written ``1e3`` was refused as ``expected a number, got str '1e3'``. Quoted, it stays a string."""

from __future__ import annotations

import pytest

from broker_edge.config.loader import ConfigError, load_dataclass, load_yaml_file, parse_yaml
from broker_edge.settings.broker import BrokerConfig
from pipelines.overrides import apply_override


@pytest.mark.parametrize(
    ("written", "value"),
    [
        ("1e3", 1000.0),
        ("1E3", 1000.0),
        ("2.5e-3", 0.0025),
        ("-4e+2", -400.0),
        ("+1.0e300", 1.0e300),
        (".5e1", 5.0),
        ("7.e1", 70.0),
    ],
)
def test_a_number_with_an_exponent_is_a_float(written, value) -> None:
    document = parse_yaml(f"limits: {{connect_timeout_s: {written}}}\n")
    assert document == {"limits": {"connect_timeout_s": value}}


@pytest.mark.parametrize("written", ["'1e3'", '"1e3"', "e3", "1e", "1e3.5", "1.2e3.4", "1_000e3x", "v1e3"])
def test_what_is_no_number_or_is_quoted_stays_a_string(written) -> None:
    document = parse_yaml(f"value: {written}\n")
    assert isinstance(document["value"], str)


def test_plain_numbers_read_as_before() -> None:
    assert parse_yaml("a: 1000\nb: 2.5\nc: .inf\nd: 0x10\ne: 1.0e+3\nf: true\n") == {
        "a": 1000,
        "b": 2.5,
        "c": float("inf"),
        "d": 16,
        "e": 1000.0,
        "f": True,
    }


def test_a_broker_file_takes_a_timeout_written_with_an_exponent(tmp_path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("limits:\n  connect_timeout_s: 1e1\n  slow_subscriber_hold_s: 2.5e0\n")
    config = load_dataclass(BrokerConfig, load_yaml_file(path))
    assert config.limits.connect_timeout_s == 10.0
    assert config.limits.slow_subscriber_hold_s == 2.5


def test_an_exponent_where_an_integer_goes_is_refused_naming_the_field(tmp_path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("limits:\n  max_connections: 1e4\n")
    with pytest.raises(ConfigError, match=r"^limits\.max_connections: expected int, got float 10000\.0$"):
        load_dataclass(BrokerConfig, load_yaml_file(path))
    path.write_text("limits:\n  connect_timeout_s: '1e1'\n")
    with pytest.raises(ConfigError, match=r"^limits\.connect_timeout_s: expected a number, got str '1e1'$"):
        load_dataclass(BrokerConfig, load_yaml_file(path))


def test_an_override_value_that_is_no_yaml_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as error:
        apply_override({}, "telemetry.trigger_seconds=[5")
    assert error.value.path == "telemetry.trigger_seconds"
    assert "\n" not in error.value.detail
    assert error.value.detail.startswith("value is not valid YAML: line 1, column 3: expected ',' or ']'")


def test_an_override_takes_a_number_with_an_exponent() -> None:
    document: dict[str, object] = {}
    apply_override(document, "limits.connect_timeout_s=1e1")
    assert document == {"limits": {"connect_timeout_s": 10.0}}


@pytest.mark.parametrize(
    ("written", "value"),
    [("010000", 10000), ("01234", 1234), ("-0100", -100), ("+007", 7), ("0", 0), ("00", 0), ("0x1F", 31)],
)
def test_a_number_with_leading_zeros_is_decimal_as_written(written, value) -> None:
    """YAML 1.1 reads ``010000`` as octal (4096) and ``01234`` as 668: a port or a bound written with a
    leading zero is the number it shows, as YAML 1.2 reads it; hexadecimal stays hexadecimal."""
    assert parse_yaml(f"value: {written}\n") == {"value": value}


def test_a_listener_port_written_with_a_leading_zero_is_that_port(tmp_path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("listeners:\n  - {name: lan, port: 01234}\nlimits:\n  max_connections: 010000\n")
    config = load_dataclass(BrokerConfig, load_yaml_file(path))
    assert config.listeners[0].port == 1234 and config.limits.max_connections == 10000
