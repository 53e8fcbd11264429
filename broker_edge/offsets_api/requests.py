"""What every offsets API endpoint shares about one request: its bounds, its error answer, its access and
its parameters, apart from the endpoints so that each group of them (topics in ``server``, partitions in
``partitions``) builds on them without importing the others."""

from __future__ import annotations

import importlib.util
import json
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import HttpVersion11, web

from broker_edge.security.access import EVERYONE, Access
from broker_edge.storage.persistence import check_filter

from . import errors as codes
from .formats import FORMATS

__all__ = [
    "ACCESS",
    "ANSWER_OVERHEAD",
    "MAX_JSON_BODY",
    "ApiError",
    "ApiLimits",
    "ExpectHandler",
    "access_of",
    "check_body_length",
    "check_escapes",
    "expect_handler",
    "format_param",
    "int_param",
    "is_number",
    "json_body",
    "pattern_param",
    "request_line_for",
]

ACCESS: web.RequestKey[Access] = web.RequestKey("access", Access)
"""Where a request's ``Access`` is kept (``request[ACCESS]``)."""
MAX_JSON_BODY = 1024 * 1024
"""aiohttp's bound on a body read whole (``/v1/fetch``)."""
ANSWER_OVERHEAD = 64 * 1024
"""What an answer holds beyond its records (headers, an Arrow schema, results)."""


@dataclass(frozen=True, slots=True)
class ApiLimits:
    """Bounds on what one request may ask for (larger values are refused with 400)."""

    default_records: int = 1000
    max_records: int = 100_000
    default_bytes: int = 1024 * 1024
    max_bytes: int = 64 * 1024 * 1024
    default_batch_bytes: int = 4 * 1024 * 1024
    max_wait_ms: int = 60_000
    max_fetches: int = 10_000
    max_connections: int = 256
    """Open connections; more are answered 503 and closed."""
    max_connections_per_reader: int | None = None
    """Open connections one reader's token may hold (None: no bound of its own)."""
    request_timeout_s: float = 10.0
    """Seconds for a request's headers, and for its body, to arrive."""
    send_timeout_s: float = 30.0
    """Seconds a reader may take none of its answer before its connection is aborted (and what the answer
    held of the memory budget freed)."""
    min_read_bytes_per_s: int = 65_536
    """Slowest rate a reader may take an answer at (after ``request_timeout_s``), else it is abandoned and
    its connection closed; 0: no minimum."""
    max_request_line: int = 8190
    """Bytes of a request line (``request_line_for``: what the longest topic a path may name needs)."""


class ApiError(Exception):
    """An error answer: HTTP status, machine-readable code, message and extra JSON fields. ``close``: close
    the connection once it is sent (always for 401: a stranger keeps nothing open)."""

    def __init__(self, status: int, code: str, message: str, close: bool = False, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.close = close or status in (401, 408)  # 408: the rest of that body is not waited for
        self.extra = extra

    def response(self) -> web.Response:
        headers = {"WWW-Authenticate": 'Bearer realm="timestone"'} if self.status == 401 else None
        body = {"error": self.code, "message": self.message, **self.extra}
        response = web.json_response(body, status=self.status, headers=headers)
        if self.close:
            response.force_close()
        return response


ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]
"""What answers a request's ``Expect`` header before its handler runs (a response ends the request)."""


def expect_handler(authenticate: Callable[[web.Request], Access]) -> ExpectHandler:
    """Answers ``Expect: 100-continue`` only once ``authenticate`` admits the request (a stranger gets its
    401 at once and is never invited to send its body, RFC 9110 10.1.1), and any other expectation with
    417 in JSON, where aiohttp answered it in plain text."""

    async def expect(request: web.Request) -> web.StreamResponse | None:
        if request.version != HttpVersion11:
            return None  # (HTTP/1.0 has no interim answers: the body just follows)
        expectation = request.headers.get("Expect", "")
        if expectation.strip().lower() != "100-continue":
            shown = expectation if len(expectation) <= 40 else expectation[:40] + "..."
            message = f"Expect {shown!r} cannot be met: only 100-continue is"
            return ApiError(417, codes.EXPECTATION_FAILED, message, close=True).response()
        try:
            authenticate(request)
            check_body_length(request)
        except ApiError as refusal:
            return refusal.response()
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # (as aiohttp's own: the answer itself has not started)
        return None

    return expect


def request_line_for(max_topic_length: int) -> int:
    """The longest request line a topic of ``max_topic_length`` bytes of UTF-8 makes in a path (each byte
    ``%XX`` at worst, with the endpoint and a query around it), never less than aiohttp's 8,190."""
    return max(8190, 3 * max_topic_length + 1024)


def check_body_length(request: web.Request) -> None:
    """413 for a body whose ``Content-Length`` is over ``MAX_JSON_BODY``, refused before it is read (or
    invited: the client need not send it, nor wait for a 408)."""
    said = request.content_length or 0
    if said > MAX_JSON_BODY:
        message = f"the body is {said} bytes; a fetch's is at most {MAX_JSON_BODY}"
        raise ApiError(413, "request_entity_too_large", message, close=True, parameter="body")


def access_of(request: web.Request) -> Access:
    """What ``request`` may read (set by ``authentication``)."""
    return request.get(ACCESS, EVERYONE)


_MAX_DIGITS = 20
"""Longer numbers are refused before they are converted (every bound here fits in 19 digits)."""


def is_number(value: object) -> bool:
    """An int (not a bool), or a string of ASCII digits only (other Unicode digits are not numbers here)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and 0 < len(value) <= _MAX_DIGITS and value.isascii() and value.isdigit()


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def check_escapes(target: str) -> None:
    """400 for a request target (path and query, as sent) holding a ``%`` not followed by two hex digits,
    or escapes of bytes that are not UTF-8: taken as they come (aiohttp keeps them as they are), they name
    another topic or filter than the one meant (``a%b`` read the log ``a%b``, ``%FF`` the log ``%FF``)."""
    if _BAD_ESCAPE.search(target):
        raise ApiError(
            400,
            codes.BAD_REQUEST,
            "the request target has a '%' not followed by two hex digits: send '%' as %25",
        )
    try:
        urllib.parse.unquote_to_bytes(target).decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(
            400,
            codes.BAD_REQUEST,
            "the request target's %-escapes are not UTF-8: topics and filters are escaped from UTF-8",
        ) from None


class _NamedTwice(Exception):
    """A JSON object of a body names a field more than once."""

    def __init__(self, name: str, count: int) -> None:
        super().__init__(name)
        self.name = name
        self.count = count


def _object_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's fields (``object_pairs_hook``), each named once (``_NamedTwice`` otherwise)."""
    fields = dict(pairs)
    if len(fields) < len(pairs):
        names = [name for name, _ in pairs]
        name = next(name for name in names if names.count(name) > 1)
        raise _NamedTwice(name, names.count(name))
    return fields


def json_body(data: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object, every object of it naming each field once: as with a
    query parameter given twice, one value would be read and the other silently dropped (400 otherwise)."""
    try:
        body = json.loads(data, object_pairs_hook=_object_once)
    except _NamedTwice as twice:
        name = twice.name if len(twice.name) <= 40 else twice.name[:40] + "..."
        message = f"{name} is given {twice.count} times in one object; give it once"
        raise ApiError(400, codes.BAD_REQUEST, message, parameter="body") from None
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep, a number too long
        raise ApiError(400, codes.BAD_REQUEST, "the body must be a JSON object", parameter="body") from None
    if not isinstance(body, dict):
        raise ApiError(400, codes.BAD_REQUEST, "the body must be a JSON object")
    return body


def _shown(value: object) -> str:
    """``value`` as an error message quotes it: a string cut at 40 characters, a JSON list or object by
    its kind only."""
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "...")
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return repr(value)


def int_param(value: object, name: str, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if not is_number(value):
        raise ApiError(
            400, codes.BAD_REQUEST, f"{name} must be an integer, got {_shown(value)}", parameter=name
        )
    number = int(str(value))
    if not low <= number <= high:
        shown = str(number) if number.bit_length() < 64 else "a number that large"
        raise ApiError(
            400, codes.BAD_REQUEST, f"{name} must be within [{low}, {high}], got {shown}", parameter=name
        )
    return number


def format_param(value: object, allowed: Mapping[str, str] = FORMATS) -> str:
    """The format named by ``value`` (``arrow`` when None): 400 for anything but one of ``allowed``."""
    name = "arrow" if value is None else value
    if not isinstance(name, str) or name not in allowed:
        raise ApiError(
            400,
            codes.BAD_REQUEST,
            f"format must be one of {sorted(allowed)}, got {_shown(value)}",
            parameter="format",
        )
    if name == "arrow" and not _arrow_installed():
        raise ApiError(
            501,
            codes.FORMAT_UNAVAILABLE,
            "format arrow needs pyarrow and numpy on this broker (pip install 'timestone[arrow]'); "
            "format jsonl is served",
        )
    return name


def pattern_param(value: object) -> str | None:
    """The MQTT topic filter ``value`` (None when absent): 400 unless it is a well-formed one."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError(
            400, codes.BAD_REQUEST, f"pattern must be a string, got {_shown(value)}", parameter="pattern"
        )
    try:
        check_filter(value)
    except ValueError as error:
        raise ApiError(400, codes.BAD_REQUEST, f"bad pattern: {error}", parameter="pattern") from None
    return value


def _arrow_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("pyarrow", "numpy"))
