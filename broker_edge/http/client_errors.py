"""An HTTP client's failure in one line an operator can act on: the address, then what went wrong.

aiohttp's own text for a connection that failed prints the TLS context object
(``Cannot connect to host hub:9886 ssl:<ssl.SSLContext object at 0x7f...> [Connection refused]``), and a
refused WebSocket upgrade a Python repr of the message. The links between brokers (the uplink, the peer
links) log failures with ``failure_text`` instead.
"""

from __future__ import annotations

import os
from http import HTTPStatus

__all__ = ["failure_text"]


def failure_text(error: BaseException) -> str:
    """``error`` said plainly: ``cannot connect to hub.example.com:9886: Connection refused``,
    ``TLS with hub.example.com:9886 failed: certificate verify failed: ...``, ``answered 403 Forbidden``."""
    import aiohttp

    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        return f"TLS with {error.host}:{error.port} failed: {error.certificate_error}"
    if isinstance(error, aiohttp.ClientConnectorSSLError):
        return f"TLS with {error.host}:{error.port} failed: {error.os_error}"
    if isinstance(error, aiohttp.ClientConnectorError):
        os_error = error.os_error
        # asyncio's "Connect call failed ('10.0.0.5', 9886)" says no reason: its errno's name does
        why = os.strerror(os_error.errno) if os_error.errno else os_error.strerror
        why = why or str(os_error) or type(os_error).__name__
        return f"cannot connect to {error.host}:{error.port}: {why}"
    if isinstance(error, aiohttp.ClientResponseError):
        try:
            reason = HTTPStatus(error.status).phrase
        except ValueError:
            reason = error.message
        return f"answered {error.status} {reason}".rstrip()
    return str(error) or type(error).__name__
