"""What aiohttp answers for a request its parser refuses (a malformed request line or header, a body that
breaks its framing), made to speak like every other answer of the broker's endpoints: JSON, and one line
in the log rather than an ERROR traceback per stranger.

aiohttp answers those itself (``RequestHandler.handle_error``) with a text/plain 400 and logs the exception
with its traceback, before any middleware runs. ``answer_errors_in_json`` turns the handler of one
connection into ``JsonErrorHandler``, which answers ``{"error": "bad_request", "message": ...}`` (or
``internal_error`` for a 500) and logs a WARNING without a traceback, limited per reason
(``observe.refusal_log``); a request target over the parser's bound answers 414 (``uri_too_long``), a
header over it or too many headers 431 (``request_header_fields_too_large``). A handler's own unexpected
exception still logs its traceback: that is a bug. A client that closed its connection before its answer
could be written (a WebSocket client gone during its upgrade, a reader gone before a listing's first bytes)
is no error of the broker's: said at DEBUG (``client_gone``), where it logged an ERROR traceback per client.
``refuse`` answers and logs the same way a request that ``http.guard`` refuses (a body in a
Content-Encoding). A body whose framing breaks while aiohttp reads what no handler read, after the answer,
is said the same way too, rather than as an "Unhandled exception" with its traceback. An app's own error
statuses (no route, another method) leave in JSON as well (``http_errors_in_json``). A refused request's
connection closes only once its answer has reached the client (``lingering_close``).
"""

from __future__ import annotations

import json
import logging
import time
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from broker_edge.http.lingering_close import linger_on_close
from broker_edge.observe.refusal_log import RefusalLog

__all__ = [
    "BODY_ERRORS",
    "JsonErrorHandler",
    "answer_errors_in_json",
    "body_error_text",
    "client_gone",
    "http_error_answer",
    "http_errors_in_json",
    "refuse",
]

log = logging.getLogger("broker_edge.http")

_refusals = RefusalLog()

_HEADERS_TOO_LARGE = "request_header_fields_too_large"

BODY_ERRORS = (RequestPayloadError, HttpProcessingError)
"""What reading a request body whose framing is broken raises."""


class JsonErrorHandler(RequestHandler):
    """aiohttp's request handler, whose own error answers are JSON (see the module docstring)."""

    __slots__ = ()

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if status == HTTPStatus.INTERNAL_SERVER_ERROR and client_gone(request, exc):
            log.debug("a client closed its connection before its answer was written (%s)", exc)
            raise ConnectionError("the client closed its connection") from exc  # aiohttp ends it quietly
        if status == HTTPStatus.INTERNAL_SERVER_ERROR:
            log.error("HTTP request from %s failed", request.remote, exc_info=exc)
            error, text = "internal_error", "the request failed; the broker's log says why"
        else:
            why = _first_line(message or str(exc or HTTPStatus(status).phrase))
            status, error, text = _oversized(exc) or (status, "bad_request", why)
            _log_refusal(request.remote, text)
        if request.writer.output_size > 0:  # an answer was on its way: the connection is broken
            raise ConnectionError("response already sent, cannot send the error")
        if status != HTTPStatus.INTERNAL_SERVER_ERROR:
            linger_on_close(self)  # the rest of the refused request unread must not reset the answer
        return _answer(status, error, text)

    def log_exception(self, *args: Any, **kw: Any) -> None:
        error = kw.get("exc_info")
        if isinstance(error, BODY_ERRORS):  # the rest of a body no handler read, read after the answer
            peer = self.transport.get_extra_info("peername") if self.transport is not None else None
            _log_refusal(peer[0] if peer else None, f"the body cannot be read: {body_error_text(error)}")
            return
        super().log_exception(*args, **kw)


def client_gone(request: web.BaseRequest, error: BaseException | None) -> bool:
    """Whether ``error`` is the client's connection closing under its answer (its transport closed or
    closing), not a connection of the broker's own failing (a member it asked, refusing)."""
    if not isinstance(error, ConnectionError):
        return False
    transport = request.transport
    return transport is None or transport.is_closing()


def _oversized(error: BaseException | None) -> tuple[int, str, str] | None:
    """414 for a request target over the parser's bound, 431 for a header over it or too many headers, each
    with a message naming the bound rather than echoing the bytes; None for any other error. (aiohttp's
    parser keeps the target it reads in a ``bytearray``, header names and values in ``bytes``.)"""
    if isinstance(error, LineTooLong):
        limit = error.args[1] if len(error.args) > 1 else "its"
        if isinstance(error.args[0], bytearray):
            return 414, "uri_too_long", f"the request target is over {limit} bytes"
        return 431, _HEADERS_TOO_LARGE, f"a request header is over {limit} bytes"
    if isinstance(error, BadHttpMessage) and "too many headers" in error.message.lower():
        return 431, _HEADERS_TOO_LARGE, "the request has too many headers"
    return None


def body_error_text(error: BaseException) -> str:
    """What is wrong with a body, from what reading it raised (one of ``BODY_ERRORS``)."""
    lines = str(error).strip().splitlines()  # aiohttp's "400, message:\n  <why>"
    return f"{type(error).__name__}: {lines[-1].strip() if lines else 'broken framing'}"


def _log_refusal(peer: str | None, text: str) -> None:
    """Say in one WARNING (limited per 10 s) that a request from ``peer`` was refused, and why."""
    _refusals.write(log, time.monotonic(), "http_bad_request", f"HTTP request refused: {text}", peer=peer)


def refuse(
    request: web.BaseRequest, text: str, status: int = HTTPStatus.BAD_REQUEST, error: str = "bad_request"
) -> web.Response:
    """The ``status`` answer (400 ``bad_request`` by default) to ``request``, which HTTP refuses, logged as
    the parser's refusals are; the connection is closed after it."""
    text = _first_line(text)
    _log_refusal(request.remote, text)
    if request.protocol is not None:
        linger_on_close(request.protocol)
    return _answer(status, error, text)


def _answer(status: int, error: str, text: str) -> web.Response:
    answer = web.Response(
        status=status, text=json.dumps({"error": error, "message": text}), content_type="application/json"
    )
    answer.force_close()
    return answer


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:200] if text.strip() else "bad request"


def answer_errors_in_json(handler: RequestHandler) -> RequestHandler:
    """The handler aiohttp made for one connection, answering its errors as ``JsonErrorHandler`` does (the
    subclass adds no field, so the object changes class in place)."""
    handler.__class__ = JsonErrorHandler
    return handler


def http_error_answer(error: web.HTTPException) -> web.Response:
    """An error status aiohttp raised itself (no route: 404; another method: 405, its ``Allow`` kept) as the
    JSON every endpoint answers: ``{"error": "not_found", "message": "Not Found"}``."""
    code = error.reason.lower().replace(" ", "_")
    answer = web.json_response({"error": code, "message": error.reason}, status=error.status)
    if "Allow" in error.headers:  # a 405 names the methods the path takes
        answer.headers["Allow"] = error.headers["Allow"]
    return answer


@web.middleware
async def http_errors_in_json(request: web.Request, handler: Any) -> web.StreamResponse:
    """The error statuses (400 and above) aiohttp raised for an app, answered in JSON."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return http_error_answer(error)
