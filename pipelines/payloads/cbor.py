"""CBOR payloads (RFC 8949): one map per payload, its keys the declared fields' names.

``cbor2`` does the decoding; a payload that is cut off, malformed, followed by stray bytes or not a map is an
error naming the byte offset where reading stopped. Tagged dates and times (tags 0, 1, 100, 1004) arrive as
dates and datetimes and fill ``date`` and ``timestamp`` columns. A map behind the self-described CBOR tag
(55799, which changes nothing) is read as any map.
"""

from __future__ import annotations

import io
from collections.abc import Collection, Mapping
from functools import partial
from typing import Any

import cbor2

from .fields import PayloadError, Reader

#: The self-described CBOR tag (55799) as it precedes an item.
_SELF_DESCRIBED = b"\xd9\xd9\xf7"
#: The bytes of a map's length after its initial byte, by the initial byte's additional information.
_LENGTH_BYTES = {24: 1, 25: 2, 26: 4, 27: 8}


def cbor_reader(fields: Collection[str]) -> Reader:
    """The reader of CBOR payloads into ``fields``: :func:`read_cbor`, refusing a field given twice."""
    return partial(read_cbor, declared=frozenset(fields))


def read_cbor(payload: bytes, declared: Collection[str] = ()) -> dict[Any, Any]:
    """The map a CBOR payload holds (a ``fields.Reader``); a ``declared`` field's key given twice in it is
    refused (cbor2 keeps the last value; RFC 8949 calls such a map invalid)."""
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
    if declared:
        _refuse_twice(payload, len(value), declared)
    return dict(value)


def _refuse_twice(payload: bytes, distinct: int, declared: Collection[str]) -> None:
    """Raise PayloadError when the payload's map (well formed, of ``distinct`` keys) gives a declared key
    twice. A map whose header counts as many pairs as it has keys gives none twice: its pairs are not read
    again."""
    start = len(_SELF_DESCRIBED) if payload.startswith(_SELF_DESCRIBED) else 0
    info = payload[start] & 0x1F
    size = _LENGTH_BYTES.get(info, 0)
    length = int.from_bytes(payload[start + 1 : start + 1 + size]) if size else info
    pairs = None if info == 31 else length
    if pairs == distinct:
        return
    stream = io.BytesIO(payload)
    stream.seek(start + 1 + size)
    decoder = cbor2.CBORDecoder(stream)
    given: dict[str, int] = {}
    read = 0
    while (payload[stream.tell()] != 0xFF) if pairs is None else (read < pairs):
        key = decoder.decode()
        decoder.decode()
        read += 1
        if isinstance(key, str) and key in declared:
            given[key] = given.get(key, 0) + 1
    for key, count in given.items():
        if count > 1:
            raise PayloadError(f"field {key}: given {count} times in the map")
