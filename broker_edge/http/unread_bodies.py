"""A request answered before its body has arrived (refused on its headers: 401, 403, 413, a 404...): its
answer says ``Connection: close`` and its connection is closed right after it, the rest of the body neither
read nor waited for. aiohttp read that rest for up to its ``lingering_time`` (``request_timeout_s``) to keep
the connection, so a stranger who declared a body and never sent it held a connection, and its share of
the loop's reads, that long for each 401. ``guard`` serves its apps with no lingering; a request whose body
has arrived (or that has none) keeps its connection as its answer says."""

from __future__ import annotations

from aiohttp import hdrs, web

__all__ = ["closed_before_unread_bodies"]


async def _close_if_body_unread(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """As ``response`` is prepared (its headers made, not yet written): ``Connection: close`` when the
    request's body has not all arrived; aiohttp, told too, closes the connection once the answer is
    written."""
    if not request.content.is_eof():
        response.force_close()
        response.headers[hdrs.CONNECTION] = "close"


def closed_before_unread_bodies(app: web.Application) -> None:
    """Have every answer of ``app`` given before its request's body arrived say ``Connection: close``
    (the site's runner, with no ``lingering_time``, closes the connection after it)."""
    app.on_response_prepare.append(_close_if_body_unread)
