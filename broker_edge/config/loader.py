"""Build typed dataclasses from YAML documents, naming the offending field on every error.

Every config in Timestone (broker, pipelines) is a tree of dataclasses. This module turns a parsed YAML
mapping into that tree and rejects unknown keys and wrong types with the dotted path of the key, e.g.
``listeners[1].port: expected int, got str 'abc'``; a float field takes finite numbers only (no ``.nan``,
``.inf``). Defaults come from the dataclasses themselves, so an empty or missing file yields a usable
configuration.

A value may be written ``!env NAME``: the value of the environment variable ``NAME`` when the document is
loaded into dataclasses (a secret kept out of files and command lines; on Databricks, a cluster environment
variable filled from a secret scope): its text where a string goes, else the number, boolean or null YAML
reads in it (``port: !env MQTT_PORT``). A variable that is not set is an error naming the field.

A number written with an exponent (``1e3``, ``2.5E-3``) is a float, as YAML 1.2 and JSON read it (YAML 1.1
reads it as a string unless it has a dot and a signed exponent); quoted, it stays a string. An integer with
leading zeros is decimal (``010000`` is 10000, where YAML 1.1 reads octal 4096); digits joined by colons
are a string (``10:00``, where YAML 1.1 reads base 60: 600). A document that
is no YAML is refused in one line naming its line and column, and so is a value its tag cannot read
(``2026-13-45``, a date that does not exist; ``!!int abc``), naming its key and line. A path setting that
starts with ``~`` is in the home directory (``expand_home``).
"""

from __future__ import annotations

import codecs
import dataclasses
import enum
import functools
import math
import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")
"""A number with an exponent in any form YAML 1.2 takes; YAML 1.1's own pattern already reads the rest."""
_LEADING_ZERO_INT = re.compile(r"^[-+]?0[0-9_]+$")
"""An integer written with leading zeros, which YAML 1.1 reads as octal (``010000`` is 4096)."""
_DECIMAL_TAG = "tag:timestone,2026:decimal"
_COLON_NUMBER = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
"""Digits joined by colons (``10:00``), which YAML 1.1 reads as a base-60 number (600); YAML 1.2 a string."""


class ConfigError(ValueError):
    """A configuration value is missing, unknown or of the wrong type; ``path`` names the field, ``source``
    (when known) where it was set, said after the message: ``in FILE, line N`` or ``from --set KEY`` (see
    :func:`sourced`)."""

    def __init__(self, path: str, message: str, source: str = "") -> None:
        self.path = path
        self.detail = message
        self.source = source
        text = f"{path}: {message}" if path else message
        super().__init__(f"{text} ({source})" if source else text)


@dataclasses.dataclass(frozen=True)
class EnvironmentValue:
    """A value written ``!env NAME``: the environment variable's value, read by :func:`load_dataclass`."""

    name: str

    def __repr__(self) -> str:
        return f"!env {self.name}"

    def resolve(self, path: str) -> str:
        if not self.name or "=" in self.name or any(c.isspace() for c in self.name):
            raise ConfigError(path, f"!env needs the name of an environment variable, got {self.name!r}")
        value = os.environ.get(self.name)
        if value is None:
            raise ConfigError(path, f"the environment variable {self.name} (!env {self.name}) is not set")
        return value


class _UnreadableValue(Exception):
    """A value its YAML tag cannot read (``2026-13-45``, a date that does not exist; ``!!int abc``; an
    integer of more digits than Python converts): its node (with its line) and why."""

    def __init__(self, node: Any, error: Exception) -> None:
        self.node = node
        if isinstance(error, (ValueError, OverflowError)):  # less the digits' limit's advice to programmers
            reason = str(error).partition("; use sys.")[0]
        else:  # a constructor's own failure (``!!timestamp abc``) says nothing of the value
            tag = str(getattr(node, "tag", "")).replace("tag:yaml.org,2002:", "!!")
            reason = f"{str(getattr(node, 'value', ''))[:60]!r} is not a {tag}"
        super().__init__(" ".join(reason.split()))


@functools.cache
def _yaml_loader() -> type:
    import yaml  # here: a broker started without a file never needs it

    class ConfigLoader(yaml.SafeLoader):
        """YAML's safe loader, plus ``!env NAME``; a value its tag cannot read is an ``_UnreadableValue``."""

        def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep)
            except (ValueError, TypeError, AttributeError, OverflowError) as exc:
                raise _UnreadableValue(node, exc) from None

    def environment_value(loader: yaml.SafeLoader, node: yaml.Node) -> EnvironmentValue:
        name = loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else ""
        return EnvironmentValue(str(name).strip())

    def decimal(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
        return int(str(loader.construct_scalar(node)).replace("_", ""), 10)

    ConfigLoader.add_constructor("!env", environment_value)
    ConfigLoader.add_constructor(_DECIMAL_TAG, decimal)
    ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))
    ConfigLoader.add_implicit_resolver(_DECIMAL_TAG, _LEADING_ZERO_INT, list("-+0"))
    for first in "-+0":  # checked before YAML 1.1's octal: the number is the one written
        resolvers = ConfigLoader.yaml_implicit_resolvers[first]
        resolvers.insert(0, resolvers.pop())
    ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:str", _COLON_NUMBER, list("-+0123456789"))
    for first in "-+0123456789":  # checked before YAML 1.1's base 60: ``10:00`` is the string written
        resolvers = ConfigLoader.yaml_implicit_resolvers[first]
        resolvers.insert(0, resolvers.pop())
    return ConfigLoader


def yaml_error_line(error: Exception) -> str:
    """A YAML parser's error in one line: where it is (line and column, counted from 1) and what is wrong,
    where the parser's own message spans lines with an excerpt of the text."""
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None)
    if problem is None:  # a reader's error (a character YAML refuses) or one with no place
        return " ".join(str(error).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = getattr(error, "context", None)
    return f"{where}{problem}" + (f" ({context})" if context else "")


def parse_yaml(text: str, path: str = "") -> Any:
    """One YAML document as configuration reads it: safe, with ``!env NAME`` values; a key given twice in
    one mapping is a ``ConfigError`` naming it (YAML would keep the last silently). ``path``: the dotted key
    the document is the value of, prefixed to the keys that errors name. A value its tag cannot read
    (``2026-13-45``, ``!!int abc``) is a ``ConfigError`` naming its key, or none (a key itself), and its
    line as its source."""
    loader = _yaml_loader()(text)  # the safe loader, with one more tag
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        paths: dict[int, str] = {}
        _check_duplicate_keys(node, path, paths)
        try:
            return loader.construct_document(node)
        except _UnreadableValue as exc:
            line = exc.node.start_mark.line + 1
            raise ConfigError(
                paths.get(id(exc.node), ""), f"not a valid value: {exc}", f"line {line}"
            ) from None
    finally:
        loader.dispose()


def _check_duplicate_keys(node: Any, path: str, visited: dict[int, str]) -> None:
    """Raise ``ConfigError`` naming the first key given twice in a mapping under ``node``; a node reached
    again through an alias is checked once. ``visited``: the key path of each node checked, by its id."""
    import yaml

    if id(node) in visited:
        return
    visited[id(node)] = path
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _check_duplicate_keys(item, f"{path}[{index}]", visited)
    elif isinstance(node, yaml.MappingNode):
        lines: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue
            dotted = _join(path, key.value)
            line = key.start_mark.line + 1
            if (key.tag, key.value) in lines:
                first = lines[key.tag, key.value]
                raise ConfigError(dotted, f"duplicate key: on line {first} and again on line {line}")
            lines[key.tag, key.value] = line
            _check_duplicate_keys(value, dotted, visited)


def sourced(error: ConfigError, file: str | Path | None, overrides: Sequence[str] = ()) -> ConfigError:
    """``error`` naming where its key was set: the last ``--set KEY=VALUE`` (``overrides``) whose KEY is the
    key or holds it, else ``file`` and the line of the key there (or of the nearest key above it that the
    file writes; a value written ``!env NAME`` says so). ``error`` itself when it names its source already,
    names no key, or names none the file writes (a file another setting names: the error names it)."""
    if error.source or not error.path or (file is not None and error.path == str(file)):
        return error
    for assignment in reversed(overrides):
        key = assignment.partition("=")[0].strip()
        if _holds(key, error.path):
            return ConfigError(error.path, error.detail, f"from --set {key}")
    if file is None:
        return error
    line, variable = _place_in_file(Path(file), error.path)
    if line is None:
        return error
    named = f", !env {variable}" if variable and f"!env {variable}" not in error.detail else ""
    return ConfigError(error.path, error.detail, f"in {file}, line {line}{named}")


def _holds(key: str, path: str) -> bool:
    """Whether the dotted ``path`` is ``key`` or inside it."""
    return path == key or path.startswith((f"{key}.", f"{key}["))


def _place_in_file(file: Path, path: str) -> tuple[int | None, str]:
    """The line where ``file`` writes ``path`` or the nearest key above it (None: none of them), and the
    variable its value names when it is written ``!env NAME``."""
    import yaml

    if not file.is_file():  # a FIFO opened again waits for a writer: its lines are not looked up
        return None, ""
    try:
        node = yaml.compose(read_yaml_text(file), Loader=_yaml_loader())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None, ""
    line, variable = None, ""
    rest = path
    while rest and node is not None:
        found = _step(node, rest)
        if found is None:
            break
        node, rest, line = found
        if not rest and getattr(node, "tag", "") == "!env":
            variable = str(node.value).strip()
    return line, variable


def _step(node: Any, rest: str) -> tuple[Any, str, int] | None:
    """The node one key or index of ``rest`` down from ``node``, what is left of ``rest``, and its line."""
    import yaml

    if isinstance(node, yaml.SequenceNode):
        index = re.match(r"\[(\d+)\]\.?", rest)
        if index is None or int(index.group(1)) >= len(node.value):
            return None
        item = node.value[int(index.group(1))]
        return item, rest[index.end() :], item.start_mark.line + 1
    if not isinstance(node, yaml.MappingNode):
        return None
    keys = [
        (key, value)
        for key, value in node.value
        if isinstance(key, yaml.ScalarNode) and _holds(key.value, rest)
    ]
    if not keys:
        return None
    key, value = max(keys, key=lambda pair: len(pair[0].value))  # a key with dots before its parts
    left = rest[len(key.value) :]
    return value, left[1:] if left.startswith(".") else left, key.start_mark.line + 1


def expand_home(settings: object, *names: str) -> None:
    """Give each named path setting of ``settings`` that starts with ``~`` the home directory it names (as a
    shell would), so ``~/data`` is never a directory named ``~`` in the working directory."""
    for name in names:
        value = getattr(settings, name)
        if isinstance(value, str) and value.startswith("~"):
            setattr(settings, name, os.path.expanduser(value))


_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
"""The byte order marks of the encodings besides UTF-8 a YAML stream may have (YAML 1.2, 5.2); UTF-32's
first, as UTF-32 LE's starts with UTF-16 LE's."""


def read_yaml_text(path: Path) -> str:
    """The text of a YAML file: UTF-16 or UTF-32 when it starts with their byte order mark (what Windows
    PowerShell's ``>`` writes), else UTF-8 (a BOM of its own dropped); ``UnicodeDecodeError`` otherwise."""
    return decode_text(path.read_bytes())


def decode_text(data: bytes) -> str:
    """The text of a file's bytes, as ``read_yaml_text`` reads them (also the ACL and password files)."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return data.decode(encoding).lstrip("\ufeff")
    return data.decode("utf-8-sig")


def undecodable(error: UnicodeDecodeError) -> tuple[int, str]:
    """The line (from 1) of the first byte ``decode_text`` could not read, and what is wrong there."""
    line = error.object[: error.start].count(b"\n") + 1
    byte = error.object[error.start : error.start + 1].hex()
    return line, (
        f"not UTF-8 text (byte 0x{byte}), nor UTF-16 or UTF-32 with a byte order mark: save it as UTF-8"
    )


def nul_line(text: str) -> int | None:
    """The line (from 1) of the first NUL character of ``text``, or None: a file saved as UTF-16 or UTF-32
    without a byte order mark, read as UTF-8, has one beside every ASCII character."""
    at = text.find("\0")
    return None if at < 0 else text.count("\n", 0, at) + 1


NUL_TEXT = (
    "holds NUL characters: UTF-16 or UTF-32 text without a byte order mark? save it as UTF-8 (or with its "
    "byte order mark)"
)


TOO_DEEP = "nested deeper than it can be read (lists or mappings inside each other hundreds of times)"
"""Why a text YAML or JSON nests past what its parser follows (a ``RecursionError``) is refused."""


def load_yaml_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML file whose top level must be a mapping (an empty file is an empty mapping)."""
    import yaml  # here: a broker started without a file never needs it

    if not str(path):  # Path("") is the working directory: "Is a directory", naming nothing
        raise ConfigError("", "the configuration file's name is empty")
    try:
        text = read_yaml_text(Path(path))
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), f"not UTF-8 text: {exc}") from None
    try:
        document = parse_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), f"not valid YAML: {yaml_error_line(exc)}") from None
    except RecursionError:  # the parser follows each nesting with a call of its own
        raise ConfigError(str(path), f"not valid YAML: {TOO_DEEP}") from None
    except ConfigError as exc:  # a key given twice, or a value its tag cannot read: its lines are this file's
        line = f", {exc.source}" if exc.source else ""
        raise ConfigError(exc.path, exc.detail, f"in {path}{line}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(str(path), f"top level must be a mapping, got {type(document).__name__}")
    return document


def load_dataclass(cls: type[T], data: Any, path: str = "") -> T:
    """Build ``cls`` (a dataclass) from ``data``, validating every field recursively."""
    result: T = _convert(cls, data, path)
    return result


def _describe(value: Any) -> str:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{type(value).__name__} {shown}"


def _quote_hint(value: Any) -> str:
    """What to do where YAML made a boolean of a string written ``no`` or ``on``."""
    if isinstance(value, bool):
        return " (YAML reads yes, no, on, off, true and false unquoted as a boolean: quote the value)"
    return ""


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _takes_string(annotation: Any) -> bool:
    """Whether a string is one of the values ``annotation`` takes."""
    if annotation in (str, Path, Any) or (isinstance(annotation, type) and issubclass(annotation, enum.Enum)):
        return True
    if typing.get_origin(annotation) is typing.Literal:
        return any(isinstance(option, str) for option in typing.get_args(annotation))
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_takes_string(option) for option in typing.get_args(annotation))
    return False


def _environment_scalar(annotation: Any, variable: EnvironmentValue, path: str) -> Any:
    """The value at ``path`` written ``!env NAME`` (``variable``): the variable's text where a string goes,
    else the number, boolean or null YAML reads in it (``1883``, ``true``, ``2.5``), or the text when it
    holds none (the error then shows it). A text nested past what YAML's parser follows is refused naming
    the variable, as a file nested so is."""
    text = variable.resolve(path)
    if _takes_string(annotation) or not text.strip():
        return text
    import yaml

    try:
        value = parse_yaml(text)
    except (yaml.YAMLError, ConfigError):
        return text
    except RecursionError:  # the parser follows each nesting with a call of its own
        name = variable.name
        raise ConfigError(
            path, f"the environment variable {name} (!env {name}) is not valid YAML: {TOO_DEEP}"
        ) from None
    return value if value is None or isinstance(value, (bool, int, float)) else text


def _convert(annotation: Any, value: Any, path: str) -> Any:
    if isinstance(value, EnvironmentValue):
        value = _environment_scalar(annotation, value, path)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)

    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [option for option in args if option is not type(None)]
        if len(options) == 1:  # an optional section: its own errors name its own fields
            return _convert(options[0], value, path)
        errors = []
        for option in args:
            if option is type(None):
                continue
            try:
                return _convert(option, value, path)
            except ConfigError as exc:
                errors.append(exc.detail)
        raise ConfigError(path, " or ".join(errors))
    if origin is typing.Literal:
        if value in args:
            return value
        raise ConfigError(path, f"expected one of {', '.join(repr(a) for a in args)}, got {_describe(value)}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(path, f"expected a list, got {_describe(value)}")
        item_type = args[0] if args else Any
        items = [_convert(item_type, item, f"{path}[{i}]") for i, item in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {_describe(value)}")
        key_type, value_type = args if args else (Any, Any)
        return {
            _convert(key_type, k, path): _convert(value_type, v, _join(path, str(k)))
            for k, v in value.items()
        }
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _convert_dataclass(annotation, value, path)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        try:
            return annotation(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in annotation)
            raise ConfigError(path, f"expected one of {choices}, got {_describe(value)}") from None
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # YAML's .nan / .inf would switch a timeout or a rate off
                raise ConfigError(path, f"expected a finite number, got {value!r}")
            return float(value)
        raise ConfigError(path, f"expected a number, got {_describe(value)}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(path, f"expected int, got {_describe(value)}")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, f"expected true or false, got {_describe(value)}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(path, f"expected a string, got {_describe(value)}{_quote_hint(value)}")
    if annotation is Path:
        if isinstance(value, str):
            return Path(value)
        raise ConfigError(path, f"expected a path string, got {_describe(value)}{_quote_hint(value)}")
    raise ConfigError(path, f"unsupported field type {annotation!r}")


def _convert_dataclass(cls: type, value: Any, path: str) -> Any:
    if isinstance(value, cls):
        return value
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(path, f"expected a mapping, got {_describe(value)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in value if k not in fields]
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(_join(path, str(unknown[0])), f"unknown key (known keys: {known})")
    kwargs = {}
    for name, field in fields.items():
        if name in value:
            kwargs[name] = _convert(hints[name], value[name], _join(path, name))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(_join(path, name), "required key is missing")
    try:
        return cls(**kwargs)
    except ConfigError as exc:  # raised by __post_init__ checks, relative to this dataclass
        raise ConfigError(_join(path, exc.path), exc.detail) from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(path, str(exc)) from exc
