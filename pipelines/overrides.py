"""``--set KEY=VALUE``: one value of a parsed YAML config document, addressed as errors name it.

A key is the dotted path a configuration error prints, list items included: ``telemetry.tables.root``,
``telemetry.quality.suites[0].expectations[1].column``. The value is read as YAML, so ``[a, b]`` is a list,
``null`` is None and ``!env NAME`` the value of that environment variable (read when the config is loaded,
``broker_edge.config.loader``); a value YAML would cut short at a comment (``/data/lake #2``) is refused,
and so is one nested past what the YAML parser follows (``[`` a few hundred times), naming the key.
Mappings missing on the way are created; a list item is replaced, or
appended when its index is the list's length; a list the file does not hold cannot be indexed (its default
is not in the file to change), and the error says to set the whole list instead.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from broker_edge.config.loader import TOO_DEEP, ConfigError, parse_yaml, yaml_error_line

__all__ = ["apply_override", "key_steps", "split_assignment"]

_KEY = re.compile(r"^[^.\[\]=\s]+(\[\d+\])*(\.[^.\[\]=\s]+(\[\d+\])*)*$")
_STEP = re.compile(r"[^.\[\]]+|\[(\d+)\]")

Step = str | int


def key_steps(key: str) -> list[Step]:
    """``a.b[0].c`` as ``["a", "b", 0, "c"]``; ConfigError for anything else."""
    if not _KEY.match(key):
        raise ConfigError(
            key, "expected a dotted key such as telemetry.tables.root, lists indexed as suites[0]"
        )
    return [int(m.group(1)) if m.group(1) is not None else m.group(0) for m in _STEP.finditer(key)]


def _path(steps: list[Step]) -> str:
    text = ""
    for step in steps:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def _child(node: Any, steps: list[Step], index: int) -> Any:
    """The container at ``steps[index]`` inside ``node``, created when it is a missing mapping."""
    step, where, following = steps[index], _path(steps[: index + 1]), steps[index + 1]
    _check_container(node, steps, index)
    if isinstance(step, int):
        if step == len(node):
            node.append({})
        child = node[step]
    else:
        child = node.get(step)
        if child is None:
            if isinstance(following, int):
                raise ConfigError(
                    where,
                    f"is not in the file (its default applies), so it has no item [{following}] to set: "
                    f"set the whole list, e.g. --set '{where}=[...]'",
                )
            child = node[step] = {}
    if not isinstance(child, dict | list):
        raise ConfigError(
            where, f"is {type(child).__name__} {child!r}, not a mapping or a list: cannot set inside it"
        )
    return child


def _check_container(node: Any, steps: list[Step], index: int) -> None:
    step, parent = steps[index], _path(steps[:index])
    if isinstance(step, int):
        if not isinstance(node, list):
            raise ConfigError(parent, "is a mapping, not a list: name its keys, not an index")
        if step > len(node):
            raise ConfigError(
                _path(steps[: index + 1]),
                f"index out of range: {parent} has {len(node)} items ([{len(node)}] adds one)",
            )
    elif isinstance(node, list):
        example = f"{parent}[{step}]" if step.isdigit() else f"{parent}[0].{step}"
        raise ConfigError(parent, f"is a list: index its items, as {example}")


def _refuse_comment(raw: str, key: str) -> None:
    """``ConfigError`` when YAML would drop the end of ``raw`` as a comment (``/data/lake #2``)."""
    tokens = [token for token in yaml.scan(raw) if not isinstance(token, yaml.StreamEndToken)]
    end = max((token.end_mark.index for token in tokens), default=0)
    if "#" in raw[end:]:
        example = f"--set '{key}=\"...\"'"
        raise ConfigError(
            key, f"the value holds a YAML comment, which would be dropped: quote it, e.g. {example}"
        )


def split_assignment(assignment: str) -> tuple[str, str]:
    """``KEY=VALUE`` as its KEY (stripped) and its VALUE as written; ConfigError without ``=`` or a KEY."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(assignment, "expected KEY=VALUE with a dotted KEY")
    return key.strip(), raw


def apply_override(document: dict[str, Any], assignment: str) -> None:
    """Set ``KEY=VALUE`` in ``document`` (see the module docstring for what KEY may be)."""
    key, raw = split_assignment(assignment)
    steps = key_steps(key)
    node: Any = document
    for index in range(len(steps) - 1):
        node = _child(node, steps, index)
    _check_container(node, steps, len(steps) - 1)
    try:
        value = parse_yaml(raw, key) if raw.strip() else None
        _refuse_comment(raw, key)
    except yaml.YAMLError as exc:
        raise ConfigError(key, f"value is not valid YAML: {yaml_error_line(exc)}") from None
    except RecursionError:  # the parser follows each nesting with a call of its own
        raise ConfigError(key, f"value is not valid YAML: {TOO_DEEP}") from None
    last = steps[-1]
    if isinstance(last, int) and last == len(node):
        node.append(value)
    else:
        node[last] = value
