"""Requests no handler of ours may see: a request line of an HTTP version HTTP/1.1 cannot serve, a body in a
transfer coding other than ``chunked`` or in a ``Content-Encoding``, refused in JSON before any handler runs
(``guard``'s first middleware); and a request no route takes, whose body is never invited
(``uninvited_without_route``)."""

from __future__ import annotations

from http import HTTPStatus

from aiohttp import HttpVersion10, HttpVersion11, web
from aiohttp.web_urldispatcher import MatchInfoError

from broker_edge.http.json_errors import refuse

__all__ = ["uninvited_without_route", "unserved_request"]


class _UninvitingRouter(web.UrlDispatcher):
    """An app's router whose refusals of a path no route serves (404) and of a method its path does not take
    (405) never answer ``Expect: 100-continue``: aiohttp's own expect handler, which such a request gets,
    invited the body before the refusal (before a stranger's 401, the app's middlewares running after it)."""

    async def resolve(self, request: web.Request) -> web.UrlMappingMatchInfo:
        match = await super().resolve(request)
        if isinstance(match, MatchInfoError):  # (a new route each time: changing it changes no other request)
            match.route._expect_handler = _not_invited
        return match


async def _not_invited(_request: web.Request) -> None:
    return None


def uninvited_without_route(app: web.Application) -> None:
    """Make ``app`` invite no body (``Expect: 100-continue``) of a request no route takes (RFC 9110 10.1.1:
    its refusal comes at once)."""
    app.router.__class__ = _UninvitingRouter


def unserved_request(request: web.Request) -> web.Response | None:
    """The refusal of ``request`` (``_request_line_refusal``, then a body in a ``Content-Encoding``: 415,
    read as sent it would be taken for the body it encodes); None: a handler may serve it."""
    refusal = _request_line_refusal(request)
    if refusal is not None:
        return refusal
    coding = ",".join(request.headers.getall("Content-Encoding", ())).strip()
    if request.body_exists and coding.lower() not in ("", "identity"):
        shown = coding if len(coding) <= 40 else coding[:40] + "..."
        answer = refuse(
            request,
            f"Content-Encoding {shown!r} is not accepted: send the body unencoded",
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            "unsupported_encoding",
        )
        answer.headers["Accept-Encoding"] = "identity"  # the only coding taken (RFC 9110, 15.5.16)
        return answer
    return None


def _request_line_refusal(request: web.Request) -> web.Response | None:
    """The refusal of a request line of another HTTP version than 1.0 and 1.1 (505: a handler would answer
    it in a framing it does not have) or of a body in a transfer coding other than ``chunked`` (501, RFC
    9112 6.1: read as if it had none, its bytes would be taken for the body); None for any other."""
    version = request.version
    if version not in (HttpVersion10, HttpVersion11):
        return refuse(
            request,
            f"HTTP/{version.major}.{version.minor} is not served here: send HTTP/1.1",
            HTTPStatus.HTTP_VERSION_NOT_SUPPORTED,
            "http_version_not_supported",
        )
    codings = [
        coding.strip().lower()
        for header in request.headers.getall("Transfer-Encoding", ())
        for coding in header.split(",")
    ]
    if codings and codings != ["chunked"]:
        shown = ", ".join(codings)
        return refuse(
            request,
            f"Transfer-Encoding {shown[:40]!r} is not served: send the body chunked or with Content-Length",
            HTTPStatus.NOT_IMPLEMENTED,
            "not_implemented",
        )
    return None
