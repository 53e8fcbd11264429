"""JSON payloads read in Python: what the telemetry job says of a JSON payload Spark could not parse.

Spark's ``from_json`` parses JSON payloads on the executors (the fastest way), but only flags a payload that
fails. For the payloads it flags, :func:`read_json` says why: the character offset of a syntax error (the byte
offset of text that is not UTF-8), or the field whose value has the wrong type (``fields.decode_payloads``
with this reader).
"""

from __future__ import annotations

import codecs
import json
from typing import Any

from .fields import PayloadError


def read_json(payload: bytes) -> dict[str, Any]:
    """The object a JSON payload holds (a ``fields.Reader``)."""
    if payload.startswith(codecs.BOM_UTF8):  # json.loads skips it, Spark's from_json does not
        raise PayloadError("json: byte 0: a UTF-8 byte order mark before the JSON text")
    try:
        value = json.loads(payload.decode("utf-8"))  # UTF-8 only, as from_json (no UTF-16 or -32 guessed)
    except UnicodeDecodeError as exc:
        raise PayloadError(f"json: byte {exc.start}: not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise PayloadError(f"json: character {exc.pos}: {exc.msg}") from None
    if not isinstance(value, dict):
        raise PayloadError(f"json: byte 0: the payload is a {type(value).__name__}, not an object")
    return value
