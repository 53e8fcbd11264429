"""Every key of the broker configuration is documented: a docstring in code, a row in
docs/configuration.md, and an entry in the commented conf/broker.yaml."""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path

from broker_edge.settings.broker import BrokerConfig

REPO = Path(__file__).resolve().parents[4]


def _dataclass_in(annotation: object) -> tuple[type | None, bool]:
    """(dataclass inside ``annotation``, whether it is a list of them), or (None, False)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            found = _dataclass_in(option)
            if found[0] is not None:
                return found
        return None, False
    if origin is list:
        inner, _ = _dataclass_in(typing.get_args(annotation)[0])
        return inner, inner is not None
    return (
        (annotation, False)
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation)
        else (None, False)
    )


def config_keys(cls: type = BrokerConfig, prefix: str = "") -> Iterator[tuple[str, type, str]]:
    """(dotted path as the docs write it, owning dataclass, field name) of every leaf key."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        path = f"{prefix}{field.name}"
        inner, is_list = _dataclass_in(hints[field.name])
        if inner is None:
            yield path, cls, field.name
        else:
            yield from config_keys(inner, f"{path}[]." if is_list else f"{path}.")


def field_docstring(cls: type, name: str) -> str | None:
    """The string literal right after ``name: ...`` in the class body (searching base classes too)."""
    for klass in cls.__mro__:
        if not dataclasses.is_dataclass(klass):
            continue
        match = re.search(
            rf"^    {name}: [^\n]*\n    \"\"\"(.+?)\"\"\"", inspect.getsource(klass), re.M | re.S
        )
        if match:
            return " ".join(match.group(1).split())
    return None


KEYS = list(config_keys())


def test_the_tree_is_walked():
    paths = {path for path, _, _ in KEYS}
    assert {
        "listeners[].tls.certfile",
        "acl.rules[].topic",
        "storage.persist[].qos",
        "limits.max_connections",
    }
    assert len(paths) == len(KEYS) > 60


def test_every_key_has_a_docstring():
    missing = [path for path, cls, name in KEYS if not field_docstring(cls, name)]
    assert missing == []


def test_every_key_has_a_row_in_docs_configuration_md_saying_what_the_code_says():
    text = (REPO / "docs" / "configuration.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+)` \| [^|]* \| (.*) \|$", text, re.M))
    missing = [path for path, _, _ in KEYS if path not in rows]
    assert missing == []
    different = [path for path, cls, name in KEYS if rows[path] != field_docstring(cls, name)]
    assert different == []


def test_every_key_is_in_conf_broker_yaml():
    text = (REPO / "conf" / "broker.yaml").read_text()
    missing = [path for path, _, name in KEYS if not re.search(rf"^\s*(#\s*)?(- )?{name}:", text, re.M)]
    assert missing == []
