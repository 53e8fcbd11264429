"""The HTTP offsets API of an edge broker: `server` (aiohttp, over a LogStore) and `client` (blocking).

`serve`, `serve_app` and `create_app` are importable from here but load the server (and aiohttp) only when
first used, so a Spark executor importing the client never pays for it.
"""

from __future__ import annotations

from typing import Any

_SERVER_NAMES = ("ApiLimits", "create_app", "serve", "serve_app")


def __getattr__(name: str) -> Any:
    if name in _SERVER_NAMES:
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
