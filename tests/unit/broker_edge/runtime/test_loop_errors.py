"""The loop's handler of unawaited errors (``runtime.main.quiet_closed_transports``): uvloop's TLS write on a
connection already closed is said at DEBUG; every other error still reaches asyncio's handler (an ERROR)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from broker_edge.runtime.main import quiet_closed_transports

CLOSED = RuntimeError(
    "unable to perform operation on <TCPTransport closed=True reading=False 0x558cd0987520>; "
    "the handler is closed"
)


def test_a_write_on_a_closed_tls_connection_is_debug_and_anything_else_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.DEBUG):
            quiet_closed_transports(loop, {"message": "Fatal error on SSL protocol", "exception": CLOSED})
            quiet_closed_transports(
                loop, {"message": "Fatal error on SSL protocol", "exception": ValueError("x")}
            )
            quiet_closed_transports(
                loop, {"message": "Task exception was never retrieved", "exception": CLOSED}
            )
    finally:
        loop.close()
    levels = [(record.levelname, record.getMessage().split(":")[0]) for record in caplog.records]
    assert levels == [
        ("DEBUG", "TLS write on a connection already closed"),
        ("ERROR", "Fatal error on SSL protocol"),
        ("ERROR", "Task exception was never retrieved"),
    ]
