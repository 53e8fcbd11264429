"""An HTTP client's failures said with the address and the reason (``http.client_errors.failure_text``), on
real failures: a closed port, a server whose certificate the client does not trust, a refused upgrade."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import aiohttp
from aiohttp import web

from broker_edge.http.client_errors import failure_text
from broker_edge.runtime.launcher import free_port
from tests.tls_certs import make_test_pki


async def failure_of(url: str, context: ssl.SSLContext | bool = True, websocket: bool = False) -> str:
    async with aiohttp.ClientSession() as session:
        try:
            if websocket:
                await session.ws_connect(url, ssl=context)
            else:
                await session.get(url, ssl=context)
        except aiohttp.ClientError as error:
            return failure_text(error)
    raise AssertionError(f"{url} answered")


def test_a_closed_port_is_named_without_the_tls_context() -> None:
    port = free_port()
    said = asyncio.run(failure_of(f"https://127.0.0.1:{port}/v1/uplink", ssl.create_default_context()))
    assert said == f"cannot connect to 127.0.0.1:{port}: Connection refused"  # not "Connect call failed"
    assert "SSLContext" not in said and "ssl:" not in said


def test_an_untrusted_certificate_says_tls_failed_and_why(tmp_path: Path) -> None:
    pki = make_test_pki(tmp_path)

    async def run() -> str:
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_context.load_cert_chain(str(pki.server_cert), str(pki.server_key))
        server = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0, ssl=server_context)
        port = server.sockets[0].getsockname()[1]
        try:
            said = await failure_of(
                f"https://127.0.0.1:{port}/", ssl.create_default_context(cafile=str(pki.other_ca_cert))
            )
        finally:
            server.close()
        return f"{port} {said}"

    port, said = asyncio.run(run()).split(" ", 1)
    assert said.startswith(f"TLS with 127.0.0.1:{port} failed: ")
    assert "CERTIFICATE_VERIFY_FAILED" in said


def test_a_refused_websocket_upgrade_says_the_status() -> None:
    async def run() -> str:
        async def refuse(_request: web.Request) -> web.Response:
            return web.Response(status=403)

        app = web.Application()
        app.router.add_get("/v1/peer", refuse)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            return await failure_of(f"http://127.0.0.1:{port}/v1/peer", False, websocket=True)
        finally:
            await runner.cleanup()

    assert asyncio.run(run()) == "answered 403 Forbidden"
