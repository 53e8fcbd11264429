"""A key given twice in one YAML mapping is a ``ConfigError`` naming its dotted key and both lines, at every
level (YAML alone keeps the last value silently); merge keys and aliases are not duplicates."""

from __future__ import annotations

import pytest

from broker_edge.config.loader import ConfigError, load_yaml_file, parse_yaml
from pipelines.overrides import apply_override


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        (
            "storage:\n  directory: /srv/data\nlogging: {level: INFO}\nstorage:\n  durability: group\n",
            "storage",
            (1, 4),
        ),
        ("limits:\n  max_connections: 5\n  max_connections: 50000\n", "limits.max_connections", (2, 3)),
        ("listeners:\n  - name: lan\n    port: 1883\n    port: 1884\n", "listeners[0].port", (3, 4)),
        ("acl:\n  rules:\n    - {topic: a, topic: b}\n", "acl.rules[0].topic", (3, 3)),
        ("a:\n  b:\n    - c:\n        - {d: 1}\n        - {d: 1, e: 2, d: 3}\n", "a.b[0].c[1].d", (5, 5)),
    ],
)
def test_a_key_given_twice_is_named_with_its_lines(tmp_path, text, key, lines) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_yaml_file(path)
    assert error.value.path == key
    assert error.value.detail == f"duplicate key: on line {lines[0]} and again on line {lines[1]}"
    assert error.value.source == f"in {path}"


def test_merge_keys_aliases_and_equal_keys_of_different_mappings_are_not_duplicates() -> None:
    text = (
        "base: &base {port: 1883, host: 127.0.0.1}\n"
        "lan: {<<: *base, port: 8883}\n"
        "again: *base\n"
        "list: [{port: 1}, {port: 2}]\n"
    )
    assert parse_yaml(text) == {
        "base": {"port": 1883, "host": "127.0.0.1"},
        "lan": {"port": 8883, "host": "127.0.0.1"},
        "again": {"port": 1883, "host": "127.0.0.1"},
        "list": [{"port": 1}, {"port": 2}],
    }


def test_a_nest_of_aliases_is_checked_once_per_node() -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 9)]
    document = parse_yaml("\n".join(levels) + "\n")  # 9**9 leaves if every alias were walked
    assert len(document) == 9


def test_an_override_names_the_key_under_its_own() -> None:
    document: dict = {}
    with pytest.raises(ConfigError) as error:
        apply_override(document, "options={authToken: a, authToken: b}")
    assert error.value.path == "options.authToken"
