"""A lazy HTTP endpoint imports what its app needs off the event loop, before building the app.

Importing aiohttp held the loop for over 100 ms when the first reader came; the endpoint now imports the
modules it is given in the loop's executor. A module written for the test records the thread that imported
it, and the endpoint's `serve` finds it imported when the first connection comes.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from pathlib import Path

import pytest

from broker_edge.http.lazy_endpoint import LazyHttpEndpoint

MODULE = "timestone_lazy_endpoint_probe"


class _Served:
    async def cleanup(self) -> None:
        return None


def test_the_modules_are_imported_off_the_loop_before_the_app_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    module_text = "import threading\nIMPORTED_IN = threading.current_thread().name\n"
    (tmp_path / f"{MODULE}.py").write_text(module_text)
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: dict[str, str] = {}

    async def serve(sock: socket.socket) -> _Served:
        seen["imported before serve"] = str(MODULE in sys.modules)
        seen["imported in"] = sys.modules[MODULE].IMPORTED_IN
        seen["served in"] = threading.current_thread().name
        return _Served()

    async def scenario() -> None:
        endpoint = await LazyHttpEndpoint.start(serve, "127.0.0.1", 0, (MODULE,))
        assert MODULE not in sys.modules  # nothing loaded until a connection comes
        _reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
        for _ in range(500):
            if "served in" in seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
        await endpoint.cleanup()

    try:
        asyncio.run(scenario())
    finally:
        sys.modules.pop(MODULE, None)

    assert seen["imported before serve"] == "True"
    assert seen["imported in"] != seen["served in"]  # an executor thread, not the loop's
