"""CBOR payloads (RFC 8949): one map per payload, its keys the declared fields' names.

``cbor2`` does the decoding; a payload that is cut off, malformed, followed by stray bytes or not a map is an
error naming the byte offset where reading stopped. Tagged dates and times (tags 0, 1, 100, 1004) arrive as
dates and datetimes and fill ``date`` and ``timestamp`` columns. A map behind the self-described CBOR tag
(55799, which changes nothing) is read as any map.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import cbor2

from .fields import PayloadError


def read_cbor(payload: bytes) -> dict[Any, Any]:
    """The map a CBOR payload holds (a ``fields.Reader``)."""
    stream = io.BytesIO(payload)
    try:
        value = cbor2.CBORDecoder(stream).decode()
    except cbor2.CBORDecodeError as exc:
        raise PayloadError(f"cbor: byte {stream.tell()}: {exc}") from None
    end = stream.tell()
    if end != len(payload):
        raise PayloadError(f"cbor: byte {end}: {len(payload) - end} more bytes after the payload's item")
    if not isinstance(value, Mapping):  # a map under a tag (55799, self-described CBOR) is a frozendict
        raise PayloadError(f"cbor: byte 0: the payload is a {type(value).__name__}, not a map")
    return dict(value)
