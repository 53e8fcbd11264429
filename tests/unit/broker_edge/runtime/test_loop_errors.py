"""The loop's handler of unawaited errors (``runtime.main.quiet_closed_transports``): uvloop's TLS write on a
connection already closed, and its handshake future left holding the reset of a connection whose dial was
cancelled, are said at DEBUG; every other error still reaches asyncio's handler (an ERROR)."""

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


def raised_in(filename: str, error: BaseException) -> BaseException:
    """``error`` as raised by code of ``filename`` (its traceback's last frame; uvloop's Cython frames are
    named ``uvloop/sslproto.pyx`` as here)."""
    try:
        exec(compile("raise error", filename, "exec"), {"error": error})
    except BaseException as raised:
        return raised
    raise AssertionError("not raised")


def test_a_tls_handshake_future_left_with_its_connections_reset_is_debug_and_anything_like_it_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As a member logged it when the peer it dialed was SIGKILLed mid-handshake (``Future exception was
    never retrieved``, ConnectionResetError raised in ``uvloop/sslproto.pyx``, ``_on_handshake_complete``):
    said at DEBUG. The same error held by a task (ours), raised elsewhere, or another error is an ERROR."""
    unretrieved = "Future exception was never retrieved"
    loop = asyncio.new_event_loop()

    async def nothing() -> None:
        return None

    task = loop.create_task(nothing())
    try:
        future = loop.create_future()
        with caplog.at_level(logging.DEBUG):
            for context in (
                {"exception": raised_in("uvloop/sslproto.pyx", ConnectionResetError()), "future": future},
                {"exception": raised_in("uvloop/sslproto.pyx", ConnectionAbortedError()), "future": future},
                {"exception": raised_in("uvloop/sslproto.pyx", ConnectionResetError()), "future": task},
                {"exception": raised_in("broker_edge/x.py", ConnectionResetError()), "future": future},
                {"exception": raised_in("uvloop/sslproto.pyx", ValueError("x")), "future": future},
                {"exception": ConnectionResetError(), "future": future},  # never raised: no traceback
            ):
                quiet_closed_transports(loop, {"message": unretrieved, **context})
        loop.run_until_complete(task)
    finally:
        loop.close()
    lines = [(record.levelname, record.getMessage().splitlines()[0]) for record in caplog.records]
    levels = [(level, line.split(":")[0]) for level, line in lines]
    debug = ("DEBUG", "TLS handshake of a dial no longer awaited ended with its connection")
    assert levels == [debug, debug] + [("ERROR", unretrieved)] * 4
