"""What aiohttp answers for a request its parser refuses (a malformed request line or header, a body that
breaks its framing), made to speak like every other answer of the broker's endpoints: JSON, and one line
in the log rather than an ERROR traceback per stranger.

aiohttp answers those itself (``RequestHandler.handle_error``) with a text/plain 400 and logs the exception
with its traceback, before any middleware runs. ``answer_errors_in_json`` turns the handler of one
connection into ``JsonErrorHandler``, which answers ``{"error": "bad_request", "message": ...}`` (or
``internal_error`` for a 500) and logs a WARNING without a traceback, limited per reason
(``observe.refusal_log``). A handler's own unexpected exception still logs its traceback: that is a bug.
"""

from __future__ import annotations

import json
import logging
import time
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from broker_edge.observe.refusal_log import RefusalLog

__all__ = ["JsonErrorHandler", "answer_errors_in_json"]

log = logging.getLogger("broker_edge.http")

_refusals = RefusalLog()


class JsonErrorHandler(RequestHandler):
    """aiohttp's request handler, whose own error answers are JSON (see the module docstring)."""

    __slots__ = ()

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if status == HTTPStatus.INTERNAL_SERVER_ERROR:
            log.error("HTTP request from %s failed", request.remote, exc_info=exc)
            error, text = "internal_error", "the request failed; the broker's log says why"
        else:
            error, text = "bad_request", _first_line(message or str(exc or HTTPStatus(status).phrase))
            _refusals.write(
                log,
                time.monotonic(),
                "http_bad_request",
                f"HTTP request refused: {text}",
                peer=request.remote,
            )
        if request.writer.output_size > 0:  # an answer was on its way: the connection is broken
            raise ConnectionError("response already sent, cannot send the error")
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
