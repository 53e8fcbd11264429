"""JSON payloads read in Python: what the telemetry job says of a JSON payload Spark could not parse.

Spark's ``from_json`` parses JSON payloads on the executors (the fastest way), but only flags a payload that
fails. For the payloads it flags, :func:`read_json` says why: the character offset of a syntax error (the byte
offset of text that is not UTF-8), or the field whose value has the wrong type (``fields.decode_payloads``
with this reader).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Collection
from functools import partial
from typing import Any

from .fields import HugeInteger, PayloadError, Reader

#: The most digits Python reads into an integer (``sys.get_int_max_str_digits``'s default).
_MOST_DIGITS = 4300


def json_reader(fields: Collection[str]) -> Reader:
    """The reader of JSON payloads into ``fields``: :func:`read_json`, refusing a field given twice."""
    return partial(read_json, declared=frozenset(fields))


def read_json(payload: bytes, declared: Collection[str] = ()) -> dict[str, Any]:
    """The object a JSON payload holds (a ``fields.Reader``); a ``declared`` field's name given twice in it
    is refused (JSON readers keep the last value: which one the sender meant is unknown)."""
    if payload.startswith(codecs.BOM_UTF8):  # json.loads skips it, Spark's from_json does not
        raise PayloadError("json: byte 0: a UTF-8 byte order mark before the JSON text")
    try:
        # UTF-8 only, as from_json (no UTF-16 or -32 guessed)
        counted = _NamesCounted()
        value = json.loads(payload.decode("utf-8"), parse_int=_integer, object_pairs_hook=counted)
    except UnicodeDecodeError as exc:
        raise PayloadError(f"json: byte {exc.start}: not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise PayloadError(f"json: character {exc.pos}: {exc.msg}") from None
    if not isinstance(value, dict):
        raise PayloadError(f"json: byte 0: the payload is a {type(value).__name__}, not an object")
    for name in declared:  # the payload's object is the last one read: its names are counted
        if counted.given.get(name, 1) > 1:
            raise PayloadError(f"field {name}: given {counted.given[name]} times in the object")
    return value


class _NamesCounted:
    """A JSON object hook: the object as a dict, and of the last object read, the names it gave twice or
    more with their counts."""

    def __init__(self) -> None:
        self.given: dict[str, int] = {}

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        value = dict(pairs)
        self.given = {}
        if len(value) < len(pairs):
            for name, _ in pairs:
                self.given[name] = self.given.get(name, 0) + 1
        return value


def _integer(text: str) -> int | HugeInteger:
    """A JSON integer; one of more digits than Python reads is kept as how many it has (``int()`` would
    raise ValueError and fail the batch whose payloads are read)."""
    digits = len(text.lstrip("-"))
    return HugeInteger(digits) if digits > _MOST_DIGITS else int(text)
